"""What the executor's own model (``executors.model``) saves for backward, tensor by tensor, as
``executors.measure.SavedActivations`` counts them (storages once, parameters excluded): the
activation model of a calibrated host, whose runs are the executor's.

Two stacks: plain fp32 (CPU hosts) and torch autocast over fp32 master weights (a GPU in bf16
or fp16). Under autocast the embedding's output and so the residual stream stay fp32, the
norms run in fp32, every linear casts its own input to 16 bits (the attention norm's output
three times, for wq, wk and wv; the MLP norm's for w1 and w3) and saves that copy and the
16-bit copy of its weight (autocast's weight cache lives as long as the saved tensors); the
attention and MLP tensors are 16-bit. On an H100 (validation/gpu_runs.csv, 0.9B Llama-style,
16 layers, 4 x 2048 tokens) the runs saved 14.62 GiB (bf16), 4.90 GiB (one sequence a
micro-batch) and 2.19 GiB (full recompute): 14.57, 4.87 and 2.19 GiB by these counts.
"""
from __future__ import annotations

from simcore.model.params import kv_width, param_counts
from simcore.plan.spec import ModelSpec, PositionEmbedding, Recompute

#: Bytes of a saved int64 index tensor element (token ids, labels, position ids).
INDEX_BYTES = 8
#: Bytes of an fp32 statistic (norm mean / rstd, attention log-sum-exp), whatever the precision.
STAT_BYTES = 4
#: Bytes of an fp32 tensor element: the fp32 stack's tensors and autocast's residual stream.
FP32_BYTES = 4
#: Bytes of a 16-bit tensor element: what autocast's linears, attention and MLP save.
HALF_BYTES = 2


def layer_bytes(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False,
                recompute: Recompute = Recompute.NONE, autocast: bool = False) -> float:
    """Bytes one layer of ``executors.model.Block`` saves for backward.

    No dropout (no masks), PyTorch's fused SDPA (saves Q, K, V, its output, which is also the
    projection's input, and an fp32 log-sum-exp per query and head; never the s x s scores),
    norms keep fp32 statistics. fp32: the two norm inputs and outputs (4sbh), Q (sbh), K and V
    (2sb*g*d), the attention output (sbh), the MLP's two (GeLU) or four (SwiGLU) sbf tensors.
    Autocast: the norm inputs in fp32, one 16-bit copy of a norm output per linear that reads
    it, the rest 16-bit, and the layer's weights' 16-bit copies. DTensor TP splits Q, K, V,
    the output, the MLP tensors and the weights; with sequence parallel the norm inputs are
    sharded but the all-gathered inputs of QKV and the MLP are saved whole. Selective
    recompute drops the log-sum-exp (the core is rebuilt); full keeps the layer input (fp32
    under autocast: the residual stream)."""
    h, f, sb = m.hidden, m.ffn_hidden, s * b
    sp = tp if sequence_parallel else 1
    if recompute == Recompute.FULL:
        return FP32_BYTES * sb * h / sp
    e = HALF_BYTES if autocast else FP32_BYTES
    stats = 2 * (1 if m.gated_mlp else 2) * STAT_BYTES * sb / sp          # two norms
    mlp = (4 if m.gated_mlp else 2) * f * (m.top_k if m.moe else 1)
    split = e * sb * (2 * h + 2 * kv_width(m) + mlp) / tp
    lse = 0.0 if recompute == Recompute.SELECTIVE else STAT_BYTES * b * m.heads * s / tp
    norm_inputs = FP32_BYTES * sb * 2 * h / sp
    if not autocast:
        return norm_inputs + FP32_BYTES * sb * 2 * h + stats + split + lse
    readers = 3 + (2 if m.gated_mlp else 1)      # wq, wk, wv; w1 (and w3)
    pc = param_counts(m)
    weights = HALF_BYTES * (pc.attention + pc.mlp) / tp
    return norm_inputs + HALF_BYTES * sb * h * readers + stats + split + lse + weights


def embedding_bytes(m: ModelSpec, *, b: int, s: int) -> float:
    """The executor's first stage: the token ids (and position ids) the embeddings save."""
    learned = m.position_embedding == PositionEmbedding.LEARNED
    return INDEX_BYTES * (b * s + (s if learned else 0))


def logits_bytes(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False,
                 autocast: bool = False) -> float:
    """The executor's last stage: the final norm's input and statistics, the output layer's input
    (gathered whole under SP; a 16-bit copy under autocast, with the head's 16-bit weight), the
    fp32 log-softmax of the full vocabulary (the output layer's logits are replicated,
    ``ColwiseParallel(output_layouts=Replicate())``; the loss upcasts them), and the labels."""
    sb = s * b
    sp = tp if sequence_parallel else 1
    stats = (1 if m.gated_mlp else 2) * STAT_BYTES * sb / sp
    norm = FP32_BYTES * sb * m.hidden / sp + (HALF_BYTES if autocast else FP32_BYTES) * sb * m.hidden
    head = HALF_BYTES * m.vocab * m.hidden / tp if autocast else 0.0
    return norm + stats + head + STAT_BYTES * sb * m.vocab + INDEX_BYTES * sb
