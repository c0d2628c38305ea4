"""DeepSeek Sparse Attention's work in a layer: the lightning indexer's parameters, kernels and
saved tensors, the sparse attention's share of the score block, and the TP all-reduce of its loss.

As Megatron-Core trains it (megatron/core/transformer/experimental_attention_variant/dsa.py
@d98e8a64, the tilelang kernels in ``ops/`` there), per layer and micro-batch on one GPU:

- **Indexer projections**, duplicated on every TP rank (``DSAIndexer``: ``linear_wq_b``,
  ``linear_wk``, ``linear_weights_proj`` built with ``parallel_mode="duplicated"``): the query
  latent to ``heads x head_dim``, the layer input to one key of ``head_dim`` and to one weight a
  head. Their input is detached (the DeepSeek-V3.2 report, Sec. 2.1: "we detach the indexer input
  from the computational graph"), so their backward computes weight gradients only.
- **Index scores**: every query against every causal key, ``heads`` dot products of ``head_dim``
  (``tilelang_indexer_fwd.py``: bf16 operands, its key loop bounded by the query block's causal
  end), written to HBM as an fp32 [s, s_kv] logits tensor that ``clean_logits_`` masks and the
  top-k reads. Its backward (``tilelang_indexer_bwd.py``, the sparse loss) runs over the selected
  keys only: the scores recomputed and their two input gradients, three such products a pair.
- **The sparse attention**: the sparse MLA kernels loop over the ``topk`` selected keys of each
  query, masked entries included (``tilelang_sparse_mla_fwd.py``: ``T.Pipelined(NI)`` over
  ``ceil(topk / block_I)`` blocks, masks from the indices), so a query costs min(topk, s_kv) keys:
  a share min(topk, s_kv) / s_kv of the score block, and so all of it (twice a causal flash
  kernel's half) while the sequence is no longer than ``topk``.
- **The indexer loss**: the main attention's scores over the selected keys for this rank's heads,
  softmaxed and summed over heads (``compute_dsa_indexer_loss``), all-reduced over TP ("attention
  scores are scattered to TP ranks in head dimension") in fp32; its backward recomputes them and
  all-reduces again (``bwd_fused_indexer_loss_naive``).
- **Model FLOPs** (MFU) count dense attention, as Megatron-LM's ``num_floating_point_operations``
  does (training.py @d98e8a64 has no DSA term): the time model prices the kernels above.
- **Saved for the backward** (``FusedDSAIndexerLoss.forward``: ``save_for_backward(q, weights, k,
  query, key, topk_indices)``): the indexer's query (bf16), weights (fp32), key (bf16) and the
  int32 indices; the main query and key are the attention's own.
"""
from __future__ import annotations

from dataclasses import replace

from simcore.model.kernel import Op, _eltwise, _gemm
from simcore.plan.spec import ModelSpec

#: Bytes of an element: the indexer's bf16 query and key, its fp32 weights and logits, the int32
#: indices (Megatron-Core's tilelang kernels' dtypes, above).
BF16, FP32, INDEX = 2, 4, 4
#: Products of ``heads x head_dim`` per selected key in the indexer's backward: the recomputed
#: score, its query gradient and its key gradient (``tilelang_indexer_bwd.py``).
BACKWARD_PRODUCTS = 3


def indexer_params(m: ModelSpec) -> int:
    """One layer's indexer: wq_b (q_lora x heads*head_dim), wk (h x head_dim), the key's LayerNorm
    (scale and shift), weights_proj (h x heads); no biases (transformers 5.24.0
    ``DeepseekV32Indexer``: 13,959,424 a layer for DeepSeek-V3.2)."""
    sa = m.sparse_attention
    if sa is None:
        return 0
    return m.q_lora_rank * sa.heads * sa.head_dim + m.hidden * sa.head_dim + 2 * sa.head_dim + m.hidden * sa.heads


def selected(m: ModelSpec, s_kv: int) -> int:
    """Keys a query's sparse attention reads (the kernel's top-k width: min(topk, s_kv))."""
    return min(m.sparse_attention.topk, s_kv)


def attention_share(m: ModelSpec, s_kv: int) -> float:
    """The share of the (queries x ``s_kv`` keys) score block the sparse MLA kernel computes."""
    return selected(m, s_kv) / s_kv


def causal_pairs(s: int) -> float:
    """Query-key pairs of a causal block of ``s`` queries over their own ``s`` keys."""
    return s * (s + 1) / 2


def selected_pairs(m: ModelSpec, s: int) -> float:
    """Pairs whose gradient the indexer's loss takes: each query's selected keys that it can see
    (the causal prefix, at most ``topk``)."""
    k = min(m.sparse_attention.topk, s)
    return causal_pairs(k) + (s - k) * k


def saved_bytes_per_token(m: ModelSpec, s: int) -> float:
    """Bytes a token's indexer keeps for the backward (the module docstring), not split over TP."""
    sa = m.sparse_attention
    if sa is None:
        return 0.0
    return BF16 * sa.heads * sa.head_dim + FP32 * sa.heads + BF16 * sa.head_dim + INDEX * min(sa.topk, s)


def loss_all_reduce_bytes(m: ModelSpec, b: int, s: int) -> float:
    """Bytes of the indexer loss's TP all-reduce (one forward, one backward): the fp32 sums over
    this rank's heads of the attention probabilities on each query's selected keys."""
    return FP32 * b * s * min(m.sparse_attention.topk, s) if m.sparse_attention is not None else 0.0


def indexer_ops(m: ModelSpec, b: int, s: int, tp: int) -> list[Op]:
    """The indexer's and its loss's kernels of one layer's forward for ``b`` sequences of ``s``
    tokens on one of ``tp`` ranks (the module docstring; context parallel is refused with DSA, so
    the keys are the queries' own ``s``). Each carries its backward's share: the projections' weight
    gradients only, the scores' over the selected pairs, the loss's scores recomputed once, the
    top-k none."""
    sa, tokens = m.sparse_attention, b * s
    causal = causal_pairs(s) * b
    chosen = selected_pairs(m, s) * b
    scores = Op(name="dsa_index_scores", flops=2.0 * b * sa.heads * sa.head_dim * s * s, bytes=FP32 * b * s * s,
                matmul=True, count=1, batched=True, exec_fraction=causal / (b * s * s),
                backward_scale=BACKWARD_PRODUCTS * chosen / (2 * causal))
    qk = m.kv_channels + m.qk_rope_head_dim
    loss = Op(name="dsa_loss_scores", flops=2.0 * b * (m.heads // tp) * qk * s * selected(m, s),
              bytes=FP32 * b * s * selected(m, s) * 2, matmul=True, count=1, batched=True, backward_scale=0.5)
    topk = _eltwise("dsa_topk", tokens * s, FP32 / 2)   # the fp32 logits read once (passes of 16-bit)
    return [replace(_gemm("dsa_wq_b", tokens, sa.heads * sa.head_dim, m.q_lora_rank), detached=True),
            replace(_gemm("dsa_wk", tokens, sa.head_dim, m.hidden), detached=True),
            replace(_gemm("dsa_weights", tokens, sa.heads, m.hidden), detached=True),
            scores, replace(topk, backward_scale=0.0), loss]
