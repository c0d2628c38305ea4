"""Per-layer device times of one micro-batch: forward, backward (input and weight gradients),
recomputation, the attention core, the logits, and the time a host-bound layer's GPU waits
for its host (what asynchronous NCCL kernels fill). Cached per (model, shape, device).
"""
from __future__ import annotations

import functools

from simcore.model import compute as cmp
from simcore.model import eager_ops as eager
from simcore.model import linear_attention as la
from simcore.model import mtp
from simcore.model import recompute as rcp
from simcore.model import workload as wl


def _megatron_softmax(dev) -> bool:
    """A GPU stack's non-flash softmax is Megatron's (fused where its kernel takes the shape); a CPU
    host (``dispatch_s``) and the executor's eager stack (``eager_autocast``) run their own."""
    return dev.dispatch_s is None and not dev.eager_autocast


def _layer_ops(model, b, s, tp, cp, ep, sp, flash, dev, cp_comm, fp8_dynamic, etp, python_eager, autocast,
               unpad=False) -> list:
    """One layer's forward ops as the stack runs them (``layer_times``' arguments)."""
    chunk = wl.attention_chunk(s, cp, cp_comm)
    ops = la.layer_forward_ops(model, b=b, s=s, tp=tp, cp=cp, ep=ep, sequence_parallel=sp, flash=flash, chunk=chunk,
                               etp=etp, megatron_softmax=_megatron_softmax(dev), unpad=unpad)
    if dev.linear_peak_flops:   # an FP8 recipe: its linear layers in FP8, and their casts
        ops += wl.fp8_cast_ops(model, b, s, tp, fp8_dynamic, dev.linear_format or "fp8", dev.fp8_transpose)
    if dev.eager_autocast:      # the executor's eager autocast stack on a GPU
        return ops + eager.layer_ops(model, b=b, s=s, tp=tp)
    if autocast:                # torch.autocast over fp32 parameters (training.autocast)
        ops += eager.autocast_ops(model, b=b, s=s, tp=tp)
    if python_eager:
        ops += eager.python_layer_ops(model, b=b, s=s, tp=tp, sequence_parallel=sp)
    return ops


@functools.lru_cache(maxsize=4096)
def layer_times(model, b, s, tp, cp, ep, sp, flash, recompute, dev, cp_comm: str = "p2p",
                 fp8_dynamic: bool = False, etp: int = 0, python_eager: bool = False, autocast: bool = False,
                 unpad: bool = False) -> tuple[float, float, float, float, float]:
    """(forward, backward-input, backward-weight, recompute, attention-core forward) of one layer;
    ``python_eager``: uncompiled PyTorch modules (``training.kernels: eager``); ``autocast``:
    torch.autocast over fp32 parameters (``training.autocast``); ``unpad``: flash-attn's varlen
    path (``training.attention_unpad``). A hybrid model's layer is the mean of its kinds' (``linear_attention``)."""
    if la.mixed(model):
        return la.mix(model, lambda v: layer_times(v, b, s, tp, cp, ep, sp, flash, recompute, dev, cp_comm, fp8_dynamic,
                                                   etp, python_eager, autocast, unpad))
    ops = _layer_ops(model, b, s, tp, cp, ep, sp, flash, dev, cp_comm, fp8_dynamic, etp, python_eager, autocast, unpad)
    f, bi, bw = cmp.ops_time_s(ops, dev)
    r = cmp.ops_time_s(rcp.layer_recompute_ops(ops, model, recompute), dev)[0]
    core = sum(cmp.op_forward_s(o, dev) for o in ops if o.name in rcp.ATTENTION_CORE_OPS)
    return f, bi, bw, r, core


@functools.lru_cache(maxsize=4096)
def layer_slack(model, b, s, tp, cp, ep, sp, flash, recompute, dev, cp_comm: str = "p2p",
                 fp8_dynamic: bool = False, etp: int = 0, python_eager: bool = False, autocast: bool = False,
                 unpad: bool = False) -> tuple[float, float, float]:
    """(forward, backward, recomputation) time one layer's GPU waits for the host
    (``compute.ops_host_slack_s``; 0 where the phase is device-bound or on a CPU host)."""
    if la.mixed(model):
        return la.mix(model, lambda v: layer_slack(v, b, s, tp, cp, ep, sp, flash, recompute, dev, cp_comm, fp8_dynamic,
                                                   etp, python_eager, autocast, unpad))
    ops = _layer_ops(model, b, s, tp, cp, ep, sp, flash, dev, cp_comm, fp8_dynamic, etp, python_eager, autocast, unpad)
    return *cmp.ops_host_slack_s(ops, dev), cmp.ops_host_slack_s(rcp.layer_recompute_ops(ops, model, recompute), dev)[0]


@functools.lru_cache(maxsize=1024)
def logits_times(model, b, s, tp, dev) -> tuple[float, float, float]:
    """(forward, backward-input, backward-weight) of the output layer and its loss, and of the MTP
    modules' norms, projections and output layers again (``mtp.head_ops``)."""
    extra = eager.logits_ops(model, b=b, s=s, tp=tp) if dev.eager_autocast else []
    ops = wl.logits_forward_ops(model, b=b, s=s, tp=tp) + extra + mtp.head_ops(model, b=b, s=s, tp=tp)
    return cmp.ops_time_s(ops, dev)
