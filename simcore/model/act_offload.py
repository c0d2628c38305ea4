"""Activation offload's copies (``training.activation_offload``): each offloaded layer's saved
activations go to host memory after its forward and come back before its backward, on copy
streams beside the compute, so a layer waits only for the part of its copy the compute of the
layer next to it does not hide.

Transformer Engine's ``AsyncDoubleBufferGroupOffloadHandler`` (transformer_engine/pytorch/
cpu_offload.py, which Megatron-Core's ``--cpu-offloading`` runs): "D2h and h2d copying are
completely hidden behind computation if computation time of a layer is longer than host-device
communication time"; the offload of layer k runs beside layer k+1's forward, the reload of
layer k-1 beside layer k's backward. The bytes are the layer's stash as the memory model keeps
it (``recompute.chunk_stash_bytes``), over the GPU's host link (``dp_costs.host_link_bytes_per_s``).
This is Megatron-Core's timing; torchtune's ``OffloadActivations`` brings each tensor back only
when its backward node asks for it (the compute stream waits for that copy), which costs more
than the prefetch charged here.
"""
from __future__ import annotations

from simcore.model import activations as acts
from simcore.model import recompute as rcp
from simcore.model.dp_costs import host_link_bytes_per_s
from simcore.plan.spec import Plan


def layer_copy_s(plan: Plan, n: float) -> float:
    """One offloaded layer's copy, one way, on a model chunk of ``n`` layers."""
    stash = rcp.chunk_stash_bytes(plan.training, n, acts.layer_activations(plan)) / max(n, 1.0)
    return stash / host_link_bytes_per_s(plan)


def activation_copies_s(plan: Plan, stages: tuple[int, ...], forward: tuple[float, float],
                        backward: tuple[float, float]) -> tuple[tuple[float, float], ...]:
    """Per virtual stage of ``stages`` layers, the (forward, backward) wait of one micro-batch:
    each offloaded layer's copy less what one layer's (compute, blocking communication) hides
    in the ``forward`` and in the ``backward`` (recomputation included). Empty without offload."""
    if not plan.training.activation_offload:
        return ()
    f, b = sum(forward), sum(backward)
    out = []
    for n in stages:
        copy, o = layer_copy_s(plan, n), rcp.offloaded_layers(plan.training, n)
        out.append((o * max(0.0, copy - f), o * max(0.0, copy - b)))
    return tuple(out)
