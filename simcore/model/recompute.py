"""Activation recomputation policies: what each keeps per layer and what it re-runs.

``training.recompute`` names one of the policies the training stacks offer; each is charged
twice, in memory (the bytes a layer keeps for its backward, and the working set a recomputed
layer rebuilds) and in time (the forward ops re-run before the backward):

- ``none``: every layer keeps all it saves (``simcore.model.workload.activation_bytes_per_layer``).
- ``selective``: Megatron's core-attention recompute (Korthikanti et al. 2022, Sec. 5,
  ``--recompute-granularity selective``): the s x s softmax tensors are dropped and the
  attention core re-run; with flash attention there is nothing left to drop and little to re-run.
- ``full``: Megatron's ``--recompute-granularity full`` with ``--recompute-method`` and
  ``--recompute-num-layers N`` (megatron/core/transformer/transformer_block.py,
  ``_checkpointed_forward``): *uniform* checkpoints groups of N consecutive layers, keeping
  only each group's input, and rebuilds a whole group (N layers' activations) in its
  backward; every layer is re-run. *block* checkpoints the first N layers of each model
  chunk and runs the others plainly. Plain ``full`` is uniform with N = 1.
- ``layer:N``: torchtitan's ``selective_ac_option = "N"`` (torchtitan/distributed/
  activation_checkpoint.py ``_apply_layer_sac``; llama3/infra/parallelize.py before it):
  every Nth layer (``layer_count % N == 0``) is wrapped in ``checkpoint_wrapper`` in full,
  the others keep everything.
- ``op``: torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``,
  ``_apply_op_sac`` / ``_custom_policy`` with ``_save_list``): the outputs of the matmuls
  and of SDPA are saved (MUST_SAVE), except every second ``aten.mm`` of a layer
  (``mm_count % 2 == 0``), and everything else (norms, RoPE, activations, the residual adds)
  is recomputed. In a Llama block the matmuls run wq, wk, wv, wo, w1, w3, w2: wq, wv, w1
  and w2 are kept, wk, wo and w3 re-run (a plain MLP's fc2 is the sixth mm, but nothing
  after it is needed by the backward and torch.utils.checkpoint stops the recomputation
  there, ``_StopRecomputationError``).
- ``dots``: JAX's ``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims``, MaxText's
  ``remat_policy: minimal`` (AI-Hypercomputer/maxtext MaxText/layers/models.py @e64f6813:
  ``if cfg.remat_policy == "minimal": policy = ...checkpoint_dots_with_no_batch_dims``): the
  outputs of the dot products without batch dimensions that the backward reads, the projections
  (q, k, v, out; the MLP's wi, both halves when gated; the router and the experts'; not wo, which
  only the layer's output reads: ``dots_kept_bytes``), are saved and all else is re-run before
  the layer's backward: the norms, RoPE, the activation function, the
  first residual add (the MLP's norm reads it) and the attention kernel, whose output is no
  dot's (MaxText's ``minimal_flash`` policy exists to save it as "context"). Under tensor
  parallelism with the activations sharded (``sequence_parallel``), XLA re-runs the
  all-gathers that feed the projections whose weight gradients read the recomputed norms.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from simcore.model import workload as wl
from simcore.model.gdn import hybrid_mean
from simcore.plan.spec import ModelSpec, Recompute, RecomputeMethod, TrainingSpec

#: The attention core's ops (``workload.attention_core_ops``), which selective recompute re-runs.
_CORE = ("attn_scores", "softmax_dropout", "attn_context")
#: The attention core's ops with or without flash attention (``workload.attention_core_ops``).
ATTENTION_CORE_OPS = _CORE + ("flash_attention",)
#: The projections: dot products without batch dimensions, which ``dots`` saves.
PROJECTIONS = frozenset({"qkv", "attn_proj", "mlp_in", "mlp_out", "router", "expert_in", "expert_out",
                         "shared_in", "shared_out"})
#: The policies that re-run part of every layer and keep the rest.
PER_LAYER = (Recompute.SELECTIVE, Recompute.OP, Recompute.DOTS)
#: The policies that keep matmul outputs only (the norms' inputs and casts are re-run).
SAVES_MATMULS = (Recompute.OP, Recompute.DOTS)


def full_layers(tr: TrainingSpec, n: int) -> int:
    """Layers of a model chunk of ``n`` layers whose whole forward is re-run."""
    if tr.recompute == Recompute.FULL:
        return n if tr.recompute_method == RecomputeMethod.UNIFORM else min(tr.recompute_layers, n)
    if tr.recompute == Recompute.LAYER:
        return n // tr.recompute_layers
    return 0


def recomputed_layers(tr: TrainingSpec, n: int) -> int:
    """Layers of a chunk of ``n`` that run ``layer_recompute_ops`` before their backward."""
    if tr.recompute in PER_LAYER:
        return n
    return full_layers(tr, n)


def tp_reruns(recompute: Recompute, sequence_parallel: bool) -> dict[str, int]:
    """Forward TP collectives (kind -> calls) one layer re-runs under a per-layer policy:
    torchtitan's per-op SAC (``op_sac_tp_reruns``); ``dots`` under sharded activations the
    all-gathers of the attention's and the MLP's inputs (their norms are re-run, and the
    projections' weight gradients read the gathered outputs), none with the activations
    replicated (the saved projection outputs are the reduced ones)."""
    if recompute == Recompute.OP:
        return op_sac_tp_reruns(sequence_parallel)
    if recompute == Recompute.DOTS and sequence_parallel:
        return {"all_gather": 2}
    return {}


def op_sac_tp_reruns(sequence_parallel: bool) -> dict[str, int]:
    """Forward TP collectives (kind -> calls) one layer re-runs under torchtitan's per-op SAC.
    Its save list holds the reduce-scatters but not the all-gathers or all-reduces
    (``comm_ops``, torchtitan/distributed/activation_checkpoint.py): under SP the all-gathered
    inputs of the attention and the MLP are gathered again, since the recomputed wk and w3
    read them; without SP wo's output is all-reduced again, since the next norm's backward
    reads the residual it feeds; w2's all-reduce lies past the last tensor the backward
    needs, where non-reentrant checkpointing stops recomputing (its early stop)."""
    return {"all_gather": 2} if sequence_parallel else {"all_reduce": 1}


def layer_recompute_ops(ops: list[wl.Op], m: ModelSpec, recompute: Recompute) -> list[wl.Op]:
    """The forward ops one recomputed layer re-runs (``ops``: ``workload.layer_forward_ops``)."""
    if recompute in (Recompute.FULL, Recompute.LAYER):
        return list(ops)
    if recompute == Recompute.SELECTIVE:
        return [op for op in ops if op.name in _CORE]
    if recompute == Recompute.OP:
        return _op_sac_recompute(ops, m)
    if recompute == Recompute.DOTS:   # the layer's output add is no input of its backward
        return [op for op in ops if op.name not in PROJECTIONS and op.name != "dropout_add_2"]
    return []


def _op_sac_recompute(ops: list[wl.Op], m: ModelSpec) -> list[wl.Op]:
    """torchtitan's per-op SAC: every non-matmul op, wk of the QKV projection, wo, and w3 of
    a gated MLP (half of its input GEMM); SDPA and the other matmuls are saved."""
    h, kv = m.hidden, wl.kv_width(m)
    out = []
    for op in ops:
        if op.name in ATTENTION_CORE_OPS or op.name in ("router",):
            continue
        if not op.matmul:
            out.append(op)
        elif op.name == "qkv":
            out.append(_scaled(op, kv / (h + 2 * kv)))
        elif op.name == "attn_proj":
            out.append(op)
        elif op.name in ("mlp_in", "expert_in") and m.gated_mlp:
            out.append(_scaled(op, 0.5))
    return out


def _scaled(op: wl.Op, share: float) -> wl.Op:
    return replace(op, flops=op.flops * share, bytes=op.bytes * share)


def recompute_flops_per_layer(m: ModelSpec, tokens: float, s: int, recompute: Recompute) -> float:
    """Counted FLOPs one recomputed layer re-runs for ``tokens`` tokens (whole model, no split)."""
    if recompute in (Recompute.FULL, Recompute.LAYER):
        return wl.forward_flops_per_layer(m, tokens, s)
    if recompute in (Recompute.SELECTIVE, Recompute.DOTS):   # the softmax layers' core; a Gated DeltaNet's kept
        return hybrid_mean(m, 4 * tokens * s * m.hidden, 0.0)
    if recompute == Recompute.OP:
        h, kv, f = m.hidden, wl.kv_width(m), m.ffn_hidden
        w3 = 2 * tokens * h * f * (m.top_k if m.moe else 1) if m.gated_mlp else 0.0
        return 2 * tokens * h * kv + 2 * tokens * h * h + w3
    return 0.0


@functools.lru_cache(maxsize=1024)
def hardware_flops_per_step(m: ModelSpec, tr: TrainingSpec, layers_per_chunk: tuple[int, ...]) -> float:
    """Model FLOPs plus what the policy re-runs over all chunks of the model."""
    tokens = tr.global_batch * m.seq_len
    per_size = {n: recomputed_layers(tr, n) for n in set(layers_per_chunk)}
    layers = sum(per_size[n] for n in layers_per_chunk)
    return wl.model_flops_per_step(m, tr.global_batch) + layers * recompute_flops_per_layer(m, tokens, m.seq_len,
                                                                                           tr.recompute)


# --------------------------------------------------------------------------- memory

@dataclass(frozen=True, slots=True)
class LayerActivations:
    """One layer's activation bytes for one micro-batch on one GPU."""

    whole: float
    """All a layer saves without recomputation."""
    kept: float
    """What a layer keeps under a per-layer policy (selective, op; ``whole`` otherwise)."""
    boundary: float
    """A checkpointed layer's (or group's) input, all that full recompute keeps."""


def op_sac_kept_bytes(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False,
                      flash: bool = True, ep: int = 1, compiled: bool = False) -> float:
    """Bytes a layer keeps under torchtitan's per-op SAC: the block's input (checkpoint's
    input), the saved matmul outputs (wq: h, wv: kv width, w1: f (x top_k for MoE), w2: h)
    and SDPA's output and fp32 log-sum-exp (or, without a flash kernel, its s x s scores).
    Under TP the column-parallel outputs are split over tp, but w2 is row-parallel: its
    matmul's output is the whole (s x h) partial sum on every rank; with sequence parallelism
    the outputs of the two reduce-scatters (wo's and w2's, 1/tp of the sequence each) are
    saved too (torchtitan/distributed/activation_checkpoint.py: ``comm_ops`` keeps
    ``_c10d_functional.reduce_scatter_tensor`` so the backward does not re-communicate), and
    under expert parallelism the outputs of the dispatch and combine all-to-alls (``comm_ops``
    keeps ``all_to_all_single``): the routed tokens' buffer, twice.

    Eager, torch.utils.checkpoint's ``_CachingTorchDispatchMode`` stores every MUST_SAVE
    output. Compiled (``compiled``: torchtitan's per-block torch.compile, ``training.kernels:
    fused``), AOTAutograd's partitioner saves only what the backward reads, and nothing reads
    w2's output (it feeds the residual add alone), nor, under sequence parallelism, the
    reduce-scatter that follows it; wo's is read (the MLP's norm is recomputed from the sum).
    tests/model/test_compiled_sac.py traces a Llama block both ways on this host."""
    h, f, sb, e = m.hidden, m.ffn_hidden, s * b, wl.ACT_BYTES
    sp = tp if sequence_parallel else 1
    mlp = f * (m.top_k * m.capacity_factor if m.moe else 1)
    split = e * sb * (h + wl.kv_width(m) + h + mlp)        # wq, wv, SDPA out, w1 (or fc1)
    split += 4 * b * m.heads * s if flash else 5 * m.heads * s * s * b
    outs = 1 if compiled else 2                            # w2's (and its reduce-scatter's) kept eagerly only
    scattered = outs * e * sb * h / tp if sequence_parallel and tp > 1 else 0.0
    routed = 2 * e * sb * h * m.top_k * m.capacity_factor / sp if m.moe and ep > 1 else 0.0
    w2 = 0.0 if compiled else e * sb * h
    return e * sb * h / sp + split / tp + w2 + scattered + routed   # input, the above, w2's out, comm outs


def dots_kept_bytes(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False) -> float:
    """Bytes a layer keeps under ``dots``: its input (the scanned stack's carry) and the projection
    outputs the re-run forward reads: q, k and v (the attention kernel's inputs) and the MLP's
    input projection (fc1, or both halves of a gated one; the routed token copies of an MoE's
    experts and the router's logits: the activation function's inputs), split over tp by heads and
    width; and the attention's output projection, reduced, so split like the input (over tp with
    sequence parallelism, whole without), from which the residual add the MLP's norm reads is
    re-run. The MLP's output projection is saved by no one: only the layer's output reads it,
    which its backward does not need (JAX keeps the residuals the backward reads, the policy
    choosing which of them are stored rather than re-run)."""
    h, sb, e = m.hidden, s * b, wl.ACT_BYTES
    sp = tp if sequence_parallel else 1
    width = m.ffn_hidden * (wl.mlp_matrices(m) - 1)
    if m.moe:
        width = width * m.top_k * m.capacity_factor + m.experts + (m.shared_ffn_hidden or 0) * (wl.mlp_matrices(m) - 1)
    split = wl.q_width(m) + 2 * wl.kv_width(m) + width
    return e * sb * (2 * h / sp + split / tp)


def chunk_stash_bytes(tr: TrainingSpec, n: float, act: LayerActivations) -> float:
    """Bytes one micro-batch leaves on a model chunk of ``n`` layers until its backward."""
    k = full_layers(tr, int(round(n)))
    if tr.recompute == Recompute.FULL and tr.recompute_method == RecomputeMethod.UNIFORM:
        groups = n if tr.recompute_layers == 1 else math.ceil(n / tr.recompute_layers)
        return groups * act.boundary
    return k * act.boundary + (n - k) * act.kept


#: Layers of an offloaded stretch on the GPU at once: the one whose backward runs and the one
#: reloaded ahead of it. Megatron-Core's ``--cpu-offloading`` runs Transformer Engine's
#: ``AsyncDoubleBufferGroupOffloadHandler`` (transformer_engine/pytorch/cpu_offload.py: double
#: buffers, "bulk offloading with delay and bulk reloading with prefetch"). torchtune's
#: ``OffloadActivations`` (training/_activation_offloading.py @bd2a0fc7c) holds less: at most
#: ``max_fwd_stash_size`` (5) tensors while their copies run, and each tensor brought back when
#: its backward node unpacks it; two layers bound it from above.
OFFLOAD_RESIDENT_LAYERS = 2


def offloaded_layers(tr: TrainingSpec, n: float) -> int:
    """Layers of a model chunk of ``n`` whose saved activations go to host memory."""
    return min(tr.activation_offload, max(1, int(round(n))))


def offload_split(tr: TrainingSpec, n: float, stash: float) -> tuple[float, float]:
    """A chunk's stash of ``n`` layers as (bytes on the GPU at its peak, bytes on the host).
    The peak is the forward's end, holding the layers kept on the GPU, or the backward in the
    offloaded stretch, holding ``OFFLOAD_RESIDENT_LAYERS`` of its layers (the kept layers'
    backward has freed theirs by then)."""
    o = offloaded_layers(tr, n)
    if o == 0:
        return stash, 0.0
    per = stash / max(n, 1.0)
    return per * max(n - o, min(o, OFFLOAD_RESIDENT_LAYERS)), per * o


def working_bytes(tr: TrainingSpec, n: float, act: LayerActivations) -> float:
    """What recomputation adds to a chunk's peak beyond its stash: the layer (uniform: the
    group) it rebuilds in its backward, less what that backward has already freed (the
    group's own input, and every plain layer after the last checkpointed one)."""
    n_int = max(1, int(round(n)))
    if tr.recompute == Recompute.FULL and tr.recompute_method == RecomputeMethod.UNIFORM:
        return max(0.0, min(tr.recompute_layers, n_int) * act.whole - act.boundary)
    k = full_layers(tr, n_int)
    if k > 0:   # block: the first k layers; layer:N: every Nth, the last at index k*N - 1
        last = k if tr.recompute == Recompute.FULL else k * tr.recompute_layers
        return max(0.0, act.whole - act.boundary - (n_int - last) * act.kept)
    if tr.recompute in PER_LAYER:
        return max(0.0, act.whole - act.kept)
    return 0.0
