"""A hybrid model's layers as the kernels they run: Gated DeltaNet layers beside (gated) softmax
attention layers (``model.linear_attention``; the layer's math is ``simcore.model.gdn``).

A hybrid model's per-layer figures (times, the GPU's waits, activation bytes, parameters) are the
mean over its layers of its two kinds of layer (``variants``): the softmax layer (the model with
no linear layers) and the Gated DeltaNet layer (the model with every layer linear), weighted by
their shares, as the sliding-window share is (``attention_window``). Every path reads them so:
``layer_times`` (the analytic closed forms and the event engine alike, through ``StepCosts``),
``activations``, ``params``, ``overlap``. A pipeline stage is charged its layers times the mean
layer: exact where the stages hold whole periods of the pattern (Qwen3-Next's 48 layers over 2,
3, 4, 6 or 12 stages), within one layer's difference of the two kinds elsewhere.

A Gated DeltaNet layer runs Megatron-LM's kernels (megatron/core/ssm/gated_delta_net.py @00caa53a):
the column-parallel input projection (``qkv``: its heads split over TP, as the softmax layer's
QKV), the depthwise causal convolution (``causal_conv1d_fn``), the L2 norms and gates, fla's chunked
gated delta rule, the gated RMSNorm and the row-parallel output projection (``attn_proj``, which
all-reduces or reduce-scatters as the softmax layer's does): TP's collectives are the softmax
layer's. The softmax layers' output gate (``attn_output_gate``) is a sigmoid and a product over the
attention output (one pass reading two tensors, writing one) and keeps the gate and the attention
output for the backward.
"""
from __future__ import annotations

import functools
from dataclasses import replace

from simcore.model import dsa, gdn
from simcore.model import workload as wl
from simcore.model.params import q_width
from simcore.plan.linear_attention import linear_share, output_gated
from simcore.plan.spec import Recompute


@functools.lru_cache(maxsize=256)
def variants(m) -> tuple[tuple[float, object], ...]:
    """(share, model) of each kind of layer of ``m``: ((1.0, m),) unless it mixes both kinds."""
    share = linear_share(m)
    if share in (0.0, 1.0):
        return ((1.0, m),)
    la = m.linear_attention
    full = replace(m, linear_attention=replace(la, layers=()))
    linear = replace(m, linear_attention=replace(la, layers=tuple(range(m.layers))))
    return ((1.0 - share, full), (share, linear))


def mixed(m) -> bool:
    """Whether ``m`` has layers of both kinds (its figures are ``mix``'s)."""
    return len(variants(m)) > 1


def mix(m, of) -> tuple:
    """The share-weighted mean of ``of(variant)`` (a tuple of numbers) over ``m``'s kinds of layer."""
    parts = [(w, of(v)) for w, v in variants(m)]
    return tuple(sum(w * p[i] for w, p in parts) for i in range(len(parts[0][1])))


def layer_forward_ops(m, **kw) -> list[wl.Op]:
    """One layer's forward kernels (``workload.layer_forward_ops``' arguments) of a model whose layers
    are all of one kind: softmax attention (with its output gate where gated) or Gated DeltaNet."""
    ops = wl.layer_forward_ops(m, **kw)
    share = linear_share(m)
    if share not in (0.0, 1.0):
        raise ValueError("a hybrid model's layer ops are per kind of layer: take linear_attention.variants")
    first = next(i for i, op in enumerate(ops) if op.name == "qkv")
    last = next(i for i, op in enumerate(ops) if op.name == "attn_proj")
    tokens, tp = kw["b"] * kw["s"], kw.get("tp", 1)
    if share == 1.0:
        return ops[:first] + _gdn_ops(m, tokens, tp) + ops[last + 1:]
    if output_gated(m):
        gate = wl.Op(name="attn_output_gate", flops=0.0, bytes=wl.ACT_BYTES * 3 * tokens * q_width(m) / tp,
                     matmul=False)
        return ops[:last] + [gate] + ops[last:]
    return ops


def _gdn_ops(m, tokens: float, tp: int) -> list[wl.Op]:
    """The Gated DeltaNet mixer's kernels for ``tokens`` tokens on one of ``tp`` ranks (heads split)."""
    la, h, e = m.linear_attention, m.hidden, wl.ACT_BYTES
    in_dim = (2 * la.key_dim + 2 * la.value_dim + 2 * la.num_value_heads) / tp
    conv = (2 * la.key_dim + la.value_dim) / tp
    n_v = la.num_value_heads / tp
    qk_rep = 2 * n_v * la.key_head_dim   # q and k repeated to the value heads
    v_out = la.value_dim / tp
    # the kernels read q, k, v, g, beta and write o, and write and read back each chunk's state and A
    core_bytes = e * tokens * (qk_rep + 2 * v_out + n_v * (la.key_head_dim * la.value_head_dim * 2 / gdn.CHUNK
                                                            + 2 * gdn.CHUNK) + 4 * n_v)
    return [
        wl.Op(name="qkv", flops=2.0 * tokens * in_dim * h, bytes=e * (tokens * h + in_dim * h + tokens * in_dim),
              matmul=True),
        wl.Op(name="gdn_conv", flops=2.0 * tokens * conv * la.conv_kernel_dim, bytes=e * 2 * tokens * conv,
              matmul=False),
        wl.Op(name="gdn_l2norm_gates", flops=0.0, bytes=e * tokens * (4 * la.key_dim / tp + qk_rep + 4 * n_v),
              matmul=False),
        wl.Op(name="gdn_chunk_delta_rule", flops=tokens * gdn.core_flops_per_token(m) / tp, bytes=core_bytes,
              matmul=True, batched=True),
        wl.Op(name="gdn_gated_norm", flops=0.0, bytes=e * 3 * tokens * v_out, matmul=False),
        wl.Op(name="attn_proj", flops=2.0 * tokens * h * v_out, bytes=e * (tokens * v_out + v_out * h + tokens * h),
              matmul=True),
    ]


def activation_bytes_per_layer(m, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False,
                               recompute: Recompute = Recompute.NONE, flash: bool = False,
                               gemm_input: float = wl.ACT_BYTES, unpad: bool = False) -> float:
    """``workload.activation_bytes_per_layer`` of any model: a hybrid model's the mean over its kinds;
    a Gated DeltaNet layer keeps the flash-attention layer's bytes less its attention terms (Q, K, V,
    the projection input, the log-sum-exp) plus the mixer's (``gdn.saved_elements_per_token``), the
    same under selective recompute (Megatron's selective recompute re-runs the softmax core only);
    a gated softmax layer keeps the gate and the attention output besides, a DSA layer its indexer's tensors."""
    kw = dict(b=b, s=s, tp=tp, sequence_parallel=sequence_parallel, gemm_input=gemm_input)
    if mixed(m):
        return mix(m, lambda v: (activation_bytes_per_layer(v, recompute=recompute, flash=flash, unpad=unpad,
                                                             **kw),))[0]
    if recompute == Recompute.FULL:
        return wl.activation_bytes_per_layer(m, recompute=recompute, flash=flash, unpad=unpad, **kw)
    sb = s * b
    if linear_share(m) == 1.0:
        base = wl.activation_bytes_per_layer(m, recompute=Recompute.NONE, flash=True, **kw)
        attention = (wl.ACT_BYTES * sb * (q_width(m) + 2 * wl.kv_width(m)) + gemm_input * sb * q_width(m)
                     + 4 * b * m.heads * s)
        return base + (sb * gdn.saved_elements_per_token(m, gemm_input) - attention) / tp
    gate = 2 * wl.ACT_BYTES * sb * q_width(m) / tp if output_gated(m) else 0.0
    indexer = sb * dsa.saved_bytes_per_token(m, s)   # DeepSeek Sparse Attention's, on every TP rank
    return wl.activation_bytes_per_layer(m, recompute=recompute, flash=flash, unpad=unpad, **kw) + gate + indexer
