"""The work of one transformer layer: parameters, FLOPs, HBM bytes, activation memory.

Sources:
- FLOPs of every matmul follow Narayanan et al., "Efficient Large-Scale Language Model
  Training on GPU Clusters Using Megatron-LM", SC'21 (arXiv 2104.04473), Sec. 5.1 and
  Appendix: a forward layer is 24*b*s*h^2 + 4*b*s^2*h FLOPs (4h MLP, multi-head
  attention), the backward twice that, full recomputation one more forward, the logits
  2*b*s*h*V forward; so one step is 96*B*s*L*h^2*(1 + s/6h + V/16Lh) with full
  recompute (their Eq. 3). Grouped-query attention (K/V projections of width g*d),
  gated MLPs (three matrices) and top-k MoE generalise the same terms as Megatron-Core's
  ``num_floating_point_operations`` (megatron/training/training.py) does. No causal
  halving in the counted FLOPs (as both sources).
- Activation memory follows Korthikanti et al., "Reducing Activation Recomputation in
  Large Transformer Models", MLSys 2023 (arXiv 2205.05198), Sec. 4: per layer
  s*b*h*(34 + 5*a*s/h) bytes in 16-bit training, s*b*h*(10 + 24/t + 5*a*s/(h*t)) with
  tensor parallel, s*b*h/t*(34 + 5*a*s/h) with tensor + sequence parallel, the 5*a*s/h
  term dropped by selective recomputation and by flash attention, 2*s*b*h (/t with SP)
  with full recomputation.
All sizes: ONE micro-batch on ONE GPU, ``b`` sequences of ``s`` tokens (per cp rank), /tp.
"""
from __future__ import annotations

from simcore.model import dsa, gdn, params as _params
from simcore.model.attention_window import attention_fraction
from simcore.model.kernel import ACT_BYTES, Op, _eltwise, _gemm  # noqa: F401 (Op re-exported)
from simcore.model.softmax import FP32_SOFTMAX_BYTES, FP32_SOFTMAX_KERNELS, fused_softmax
from simcore.model.params import attention_in_params, attention_out_width, kv_width, mlp_matrices, q_width
from simcore.plan.spec import ModelSpec, Recompute

# The parameter counts live in simcore.model.params; their names here are the ones callers use.
ParamCounts = _params.ParamCounts
param_counts = _params.param_counts
active_params_per_token = _params.active_params_per_token

#: The GEMMs an FP8 recipe runs in FP8: the linear layers of the transformer blocks
#: (Transformer Engine's te.Linear / LayerNormLinear / LayerNormMLP under fp8_autocast, as
#: Megatron-Core's --fp8-format uses them; torchao's float8 training converts nn.Linear).
#: The router, the attention core and the output layer stay 16-bit.
FP8_LINEAR_OPS = frozenset({"qkv", "attn_proj", "mlp_in", "mlp_out", "expert_in", "expert_out",
                            "shared_in", "shared_out"})


#: The low-precision formats of the linear layers' GEMM inputs: (bytes per element, elements
#: per scale block, bytes per block scale; 0: one scale per tensor). MXFP8: OCP Microscaling
#: Formats spec v1.0 (E4M3 elements, one E8M0 scale per 32); NVFP4: E2M1 elements with one
#: E4M3 scale per 16 and an FP32 per-tensor scale (NVIDIA, "Pretraining Large Language Models
#: with NVFP4", arXiv 2509.25149, Sec. 2; Transformer Engine ``NVFP4BlockScaling``).
#: The FP8 recipes (``Fp8Recipe`` values) of Transformer Engine's per-tensor scaling and of
#: torchao's float8 (which casts per GEMM and keeps no quantized copies of its own).
TE_TENSOR_SCALING = ("delayed", "current")
TORCHAO_FLOAT8 = ("tensorwise", "rowwise")
LOW_PRECISION_FORMATS = {"fp8": (1.0, 0, 0.0), "mxfp8": (1.0, 32, 1.0), "nvfp4": (0.5, 16, 1.0)}


def quantized_bytes(fmt: str) -> float:
    """Bytes per element of one quantized copy of a tensor in ``fmt``, its block scales included."""
    element, block, scale = LOW_PRECISION_FORMATS[fmt]
    return element + (scale / block if block else 0.0)


def saved_gemm_input_bytes(precision: str, fp8_recipe: str) -> float:
    """Bytes an element of a linear layer's input kept for its weight gradient: the quantized
    copy under Transformer Engine's recipes (module/linear.py, layernorm_mlp.py save ``inputmat``
    / ``ln_out`` / ``act_out`` quantized: FP8 delayed and current, MXFP8, NVFP4); 16-bit under
    torchao's float8 (tensorwise, rowwise: float8_linear.py casts the saved input again)."""
    if precision not in LOW_PRECISION_FORMATS or fp8_recipe in TORCHAO_FLOAT8:
        return ACT_BYTES
    return quantized_bytes(precision)


def cast_passes(fmt: str, dynamic: bool, transpose: bool = True) -> float:
    """HBM traffic of quantizing one GEMM input, in 16-bit passes over it: read it, write its
    rowwise and its columnwise (transposed) copy for the backward; a per-tensor scale taken
    from this tensor's amax (FP8 ``dynamic`` recipes, NVFP4's FP32 second-level scale) reads it
    once more first. MXFP8's block scales come from the block at hand (TE ``MXFP8Quantizer``),
    no extra pass; NVFP4's random Hadamard transform of the wgrad inputs is fused into the cast
    (TE's Hadamard-cast kernel), so it adds no traffic here. A per-tensor FP8 cast on a GPU
    whose FP8 GEMMs take any layout writes no transpose (``transpose`` False: Blackwell)."""
    amax = dynamic or fmt == "nvfp4"
    copies = 2 if transpose or fmt != "fp8" else 1   # block scales run along one direction: both copies
    return (ACT_BYTES + copies * quantized_bytes(fmt) + (ACT_BYTES if amax else 0.0)) / ACT_BYTES


def fp8_cast_ops(m: ModelSpec, b: int, s: int, tp: int, dynamic: bool = False, fmt: str = "fp8",
                 transpose: bool = True) -> list[Op]:
    """The casts a low-precision recipe adds to a layer: each FP8 GEMM's input is quantized and
    transposed for the backward (Transformer Engine's fused cast-transpose: read 16-bit,
    write FP8 and its FP8 transpose, 4 bytes an element; its backward casts the incoming
    gradient the same way). Delayed scaling takes the scale from earlier steps' amax (a
    small reduction); ``dynamic`` scaling (current, tensorwise, rowwise) first reads the
    tensor once more for its own amax (TE's ``Float8CurrentScalingQuantizer``, torchao's
    ``tensor_to_scale``). MXFP8 and NVFP4 (``fmt``) write their block-scaled copies
    (``cast_passes``)."""
    h, f, tokens = m.hidden, m.ffn_hidden // tp, b * s
    inputs = tokens * h + tokens * attention_out_width(m) // tp  # qkv and attention-projection inputs
    if m.moe:
        inputs += tokens * m.top_k * m.capacity_factor * (h + f)   # the token copies the experts run (mlp_ops)
        inputs += tokens * (h + m.shared_ffn_hidden // tp) if m.shared_ffn_hidden else 0
    else:
        inputs += tokens * (h + f)                               # the MLP's two inputs
    return [_eltwise("fp8_cast_transpose", inputs, cast_passes(fmt, dynamic, transpose))]


def attention_core_ops(m: ModelSpec, b: int, s: int, tp: int, cp: int, flash: bool, chunk: int = 0,
                       megatron_softmax: bool = False, unpad: bool = False) -> list[Op]:
    """Scores Q K^T and context P V of one layer (the s^2 terms), and their softmax.

    With context parallel the local ``s`` queries attend over all ``s * cp`` keys, in
    kernels of ``chunk`` query tokens (default ``s``; see ``attention_chunk``). Without flash,
    ``megatron_softmax`` (a GPU stack) runs Megatron's fused softmax where its kernel takes the
    shape and its fp32 torch fallback elsewhere (``softmax.fused_softmax``); else one fused pass.
    ``unpad`` (flash-attn's varlen API, ``training.attention_unpad``): flash_attn.bert_padding's
    ``index_first_axis`` gathers Q, K and V (read, write) and ``pad_input`` zero-fills and scatters
    the output (three passes), as llm-foundry's ``flash_attn_fn`` runs them every layer.
    """
    heads, d, s_kv = m.heads // tp, m.head_dim, s * cp
    if flash:
        kv_local = max(1, m.kv_heads // tp)
        io = ACT_BYTES * b * (2 * s * heads * d + 2 * s_kv * kv_local * d)   # read Q, K, V; write O
        core = [Op(name="flash_attention", flops=4.0 * b * heads * s * s_kv * d, bytes=io, matmul=True,
                   exec_fraction=attention_fraction(m, s_kv), length=chunk or s)]
        if m.sparse_attention is not None:   # DeepSeek Sparse Attention's indexer and its loss
            core += dsa.indexer_ops(m, b, s, tp)
        if not unpad:
            return core
        qkv, out = b * (s * heads * d + 2 * s_kv * kv_local * d), b * s * heads * d
        return [Op(name="unpad_qkv", flops=0.0, bytes=ACT_BYTES * 2 * qkv / 3, matmul=False, count=3), *core,
                Op(name="pad_output", flops=0.0, bytes=ACT_BYTES * 3 * out / 2, matmul=False, count=2)]
    scores = b * heads * s * s_kv
    dropout = 2.5 if m.dropout > 0 else 0.0   # dropout: read, write, 1-byte mask (none at p = 0)
    if not megatron_softmax or fused_softmax(b * heads, s, s_kv):
        softmax = [_eltwise("softmax_dropout", scores, 2 + dropout)]   # fused scale-mask-softmax: read, write
    else:
        kernels = FP32_SOFTMAX_KERNELS + (dropout > 0)   # ``count`` kernels of equal traffic
        softmax = [Op(name="softmax_dropout", flops=0.0, bytes=scores * (FP32_SOFTMAX_BYTES + ACT_BYTES * dropout) / kernels,
                      matmul=False, count=kernels)]
    return [_gemm("attn_scores", s, s_kv, d, count=b * heads, batched=True), *softmax,
            _gemm("attn_context", s, d, s_kv, count=b * heads, batched=True)]


def mlp_ops(m: ModelSpec, b: int, s: int, tp: int, ep: int, etp: int = 0) -> list[Op]:
    """The dense MLP, or the router and the experts of an MoE layer (experts split over
    ``etp`` ranks, default ``tp``: a rank runs etp/tp of the micro-batch's token copies at
    1/etp of the experts' width, the same FLOPs in larger GEMMs)."""
    etp = etp or tp
    h, f, tokens = m.hidden, m.ffn_hidden // (tp if not m.moe else etp), b * s
    if not m.moe:
        first = _gemm("mlp_in", tokens, f * (mlp_matrices(m) - 1), h)
        return [first, _eltwise("activation", tokens * f, 3 if m.gated_mlp else 2),
                _gemm("mlp_out", tokens, h, f)]
    routed = tokens * m.top_k * m.capacity_factor * etp / tp   # token copies this rank computes
    local_experts = max(1, m.experts // ep)
    per_expert = routed / local_experts
    # Routing and the permutations around the experts as Megatron-Core runs them through
    # TE's fused kernels (moe/moe_utils.py topk_softmax_with_capacity, permute, unpermute ->
    # TE moe_permute / moe_unpermute): the router's top-k (read logits, write probabilities
    # and map), the gather of token copies into expert order and the weighted scatter back.
    ops = [
        _gemm("router", tokens, m.experts, h),
        _eltwise("router_topk", tokens * m.experts, 2),
        _eltwise("moe_permute", (tokens + routed) * h, 1),
        _gemm("expert_in", per_expert, f * (mlp_matrices(m) - 1), h, count=local_experts),
        _eltwise("expert_activation", routed * f, 3 if m.gated_mlp else 2),
        _gemm("expert_out", per_expert, h, f, count=local_experts),
        _eltwise("moe_unpermute", (tokens + routed) * h, 1),
    ]
    if m.shared_ffn_hidden:  # every token runs the shared experts, split over TP like a dense MLP
        sf = m.shared_ffn_hidden // tp
        ops += [_gemm("shared_in", tokens, sf * (mlp_matrices(m) - 1), h),
                _eltwise("shared_activation", tokens * sf, 3 if m.gated_mlp else 2),
                _gemm("shared_out", tokens, h, sf)]
    return ops


def attention_chunk(s: int, cp: int, cp_comm: str = "p2p") -> int:
    """Query tokens of one attention kernel for ``s`` local tokens: all of them without
    context parallel; with Ulysses (``a2a``) the whole sequence (fewer heads); with the ring
    or all-gather variants half of them, since the causal load balancing gives each rank two
    chunks of s/2 (Megatron-Core/Transformer Engine split the sequence into 2 x cp chunks)."""
    if cp == 1:
        return s
    return s * cp if cp_comm == "a2a" else max(1, s // 2)


def layer_forward_ops(m: ModelSpec, *, b: int, s: int, tp: int = 1, cp: int = 1, ep: int = 1,
                      sequence_parallel: bool = False, flash: bool = False, chunk: int = 0, etp: int = 0,
                      megatron_softmax: bool = False, unpad: bool = False) -> list[Op]:
    """Every kernel of one layer's forward for one micro-batch on one GPU (attention
    kernels of ``chunk`` query tokens, default ``attention_chunk(s, cp)``; ``megatron_softmax``
    and ``unpad`` as ``attention_core_ops``).

    Elementwise kernels follow Megatron's fused set: two LayerNorms, the QKV/MLP bias
    activations, two bias-dropout-add kernels (read x and residual, write out, 1-byte mask;
    no mask without dropout).
    LayerNorms and dropout-adds work on s/t tokens with sequence parallel, else on all s.
    """
    h, tokens = m.hidden, b * s
    norm_tokens = tokens / tp if sequence_parallel else tokens
    qkv = attention_in_params(m) / h / tp
    add = 3.5 if m.dropout > 0 else 3   # at p = 0 dropout returns its input: no mask to write
    ops = [
        _eltwise("layernorm_1", norm_tokens * h, 2),
        _gemm("qkv", tokens, qkv, h),
        *attention_core_ops(m, b, s, tp, cp, flash, chunk or attention_chunk(s, cp), megatron_softmax, unpad),
        _gemm("attn_proj", tokens, h, attention_out_width(m) // tp),
        _eltwise("dropout_add_1", norm_tokens * h, add),
        _eltwise("layernorm_2", norm_tokens * h, 2),
        *mlp_ops(m, b, s, tp, ep, etp),
        _eltwise("dropout_add_2", norm_tokens * h, add),
    ]
    return ops


def logits_forward_ops(m: ModelSpec, *, b: int, s: int, tp: int = 1) -> list[Op]:
    """The output layer (vocabulary-parallel over TP) and its fp32 cross entropy."""
    tokens, v = b * s, m.vocab / tp
    return [_gemm("logits", tokens, v, m.hidden),
            _eltwise("cross_entropy", tokens * v, 2 * 3)]  # fp32 logits: read, softmax, write


def recompute_ops(forward: list[Op], recompute: Recompute) -> list[Op]:
    """Ops re-run before the backward: the whole layer (full) or its attention core
    (selective, Korthikanti et al. Sec. 5: QK^T, softmax, dropout, attention over V)."""
    if recompute == Recompute.FULL:
        return list(forward)
    if recompute == Recompute.SELECTIVE:
        return [op for op in forward if op.name in ("attn_scores", "softmax_dropout", "attn_context")]
    return []


def flops_of(ops: list[Op]) -> float:
    return sum(op.flops * op.count for op in ops)


# --------------------------------------------------------------------------- model totals

def forward_flops_per_layer(m: ModelSpec, tokens: float, s: int) -> float:
    """Counted forward FLOPs of one layer for ``tokens`` tokens of sequences of ``s``
    (whole model, no parallel split): 2*tokens*(params touched) + 4*tokens*s*heads*head_dim.
    For an MoE model this is an MoE layer (``dense_layer_forward_flops`` the dense ones)."""
    h, f = m.hidden, m.ffn_hidden
    attn = gdn.hybrid_mean(m, 2 * tokens * (attention_in_params(m) + attention_out_width(m) * h)   # Gated DeltaNet
                           + 4 * tokens * s * m.heads * m.head_dim, lambda: gdn.forward_flops(m, tokens))
    dense = 2 * tokens * mlp_matrices(m) * h * f
    shared = 2 * tokens * mlp_matrices(m) * h * m.shared_ffn_hidden
    mlp = m.top_k * dense + 2 * tokens * h * m.experts + shared if m.moe else dense
    return attn + mlp


def layers_forward_flops(m: ModelSpec, tokens: float, s: int) -> float:
    """Counted forward FLOPs of all blocks: the MoE and dense layers and the MTP modules' blocks, of the
    last layer's kind (megatron/training/training.py @d98e8a64 ``num_floating_point_operations``)."""
    blocks, dense_blocks = m.layers + m.mtp_layers, m.dense_count + m.mtp_layers * m.is_dense_layer(m.layers - 1)
    if not dense_blocks:
        return blocks * forward_flops_per_layer(m, tokens, s)
    moe = forward_flops_per_layer(m, tokens, s)
    mats = 2 * tokens * mlp_matrices(m) * m.hidden
    moe_mlp = m.top_k * mats * m.ffn_hidden + 2 * tokens * m.hidden * m.experts + mats * m.shared_ffn_hidden
    dense = moe - moe_mlp + mats * (m.dense_ffn_hidden or m.ffn_hidden)
    return (blocks - dense_blocks) * moe + dense_blocks * dense


def model_flops_per_step(m: ModelSpec, global_batch: int) -> float:
    """Model FLOPs of one optimizer step: forward + backward (3x), logits included, no
    recompute (Chowdhery et al. 2022, PaLM, Appendix B); MTP modules add their heads as Megatron counts them."""
    tokens = global_batch * m.seq_len
    heads = 2 * tokens * (m.hidden * m.vocab * (1 + m.mtp_layers) + _params.mtp_head_params(m))
    return 3 * (layers_forward_flops(m, tokens, m.seq_len) + heads)


def hardware_flops_per_step(m: ModelSpec, global_batch: int, recompute: Recompute) -> float:
    """Model FLOPs plus the recomputed forward (full: the layers again; selective: the
    attention core, 4*tokens*s*h per layer)."""
    tokens = global_batch * m.seq_len
    extra = 0.0
    if recompute == Recompute.FULL:
        extra = layers_forward_flops(m, tokens, m.seq_len)
    elif recompute == Recompute.SELECTIVE:
        extra = gdn.hybrid_mean(m, m.layers * 4 * tokens * m.seq_len * q_width(m), 0.0)   # softmax layers'
    return model_flops_per_step(m, global_batch) + extra


def megatron_flops_per_step(m: ModelSpec, global_batch: int) -> float:
    """Narayanan et al. 2021 Eq. 3 (full recompute, 4h MLP, MHA): 96 B s l h^2 (1 + s/6h + V/16lh)."""
    b, s, l, h, v = global_batch, m.seq_len, m.layers, m.hidden, m.vocab
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


# --------------------------------------------------------------------------- activations

def activation_bytes_per_layer(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False,
                               recompute: Recompute = Recompute.NONE, flash: bool = False,
                               gemm_input: float = ACT_BYTES, unpad: bool = False) -> float:
    """Bytes one layer keeps for the backward of one micro-batch (Korthikanti et al. Sec. 4.1).

    Generalised term by term: attention keeps its input (2sbh), Q (2sbh), K and V
    (2sb*g*d each), the projection input (2sbh), a dropout mask (sbh) and, unless flash
    attention or selective recompute drops it, 5*a*s^2*b for softmax, its dropout mask and
    output; the MLP keeps its input (2sbh), the activation input and output (2sbf each,
    three such with a gated MLP) and a mask (sbh); the two LayerNorms 4sbh. Without dropout
    (``model.dropout`` 0) the masks and the attention dropout's output are not kept. With
    ``s`` = 2048, MHA, f = 4h this is sbh(34 + 5as/h). Tensor parallel splits all but the
    10sbh of layer inputs, masks and norms; sequence parallel splits those too. The inputs
    the linear layers keep for their weight gradients (QKV, projection, FC1, FC2) take
    ``gemm_input`` bytes an element (``saved_gemm_input_bytes``: quantized under TE's FP8).
    """
    h, f, sb = m.hidden, m.ffn_hidden, s * b
    if recompute == Recompute.FULL:  # only the layer input (Korthikanti et al. Sec. 5)
        return ACT_BYTES * sb * h / (tp if sequence_parallel else 1)
    masks = 2 if m.dropout > 0 else 0                       # the two residual dropouts' 1-byte masks
    replicated = (4 + masks + 2 * gemm_input) * sb * h      # LN inputs, dropout masks, QKV and FC1 inputs
    attn_split = ACT_BYTES * sb * (q_width(m) + 2 * kv_width(m))     # Q, K, V
    attn_split += gemm_input * sb * attention_out_width(m)            # projection input
    mlp_acts = ((2 if m.gated_mlp else 1) * ACT_BYTES + gemm_input) * sb * f   # FC1 outputs, FC2 input
    if m.moe:
        mlp_acts *= m.top_k * m.capacity_factor
        mlp_acts += ((2 if m.gated_mlp else 1) * ACT_BYTES + gemm_input) * sb * m.shared_ffn_hidden
    split = attn_split + mlp_acts
    if flash:
        split += 4 * b * m.heads * s                         # fp32 log-sum-exp per query and head
        # varlen flash (``unpad``) keeps its unpadded output; the projection keeps the padded one
        split += ACT_BYTES * sb * q_width(m) if unpad else 0
    elif recompute != Recompute.SELECTIVE:   # softmax out, and with dropout its mask and output
        # (Megatron's unfused fp32 softmax keeps its output in fp32: 2 bytes more an element)
        fp32 = 0 if fused_softmax(b * max(1, m.heads // tp), s, s) else 2
        split += ((5 if m.dropout > 0 else 2) + fp32) * m.heads * s * s * b
    if sequence_parallel:
        return (replicated + split) / tp
    return replicated + split / tp


def eager_activation_bytes(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False,
                           act_bytes: int = ACT_BYTES) -> float:
    """What eager PyTorch keeps per layer beyond fused kernels (``training.kernels: eager``): a
    gated MLP's activation output (``silu(x W1)``, saved by its product with ``x W3``; split
    by TP), and a Python-written RMSNorm's upcast input and normalised output (Hugging Face's
    ``LlamaRMSNorm``, torchtune's ``RMSNorm``: ``x.float()`` is saved by ``pow`` and the
    ``rsqrt`` product, the normalised tensor cast back by the weight's product): 4 bytes an
    element beside the fused norm's input, two norms a layer. A GeLU MLP (``F.gelu`` keeps its
    input, FC2 its output) and LayerNorm (torch's native kernel keeps input, mean and rstd)
    keep what the fused count does."""
    if not m.gated_mlp:
        return 0.0
    f = m.ffn_hidden * (m.top_k * m.capacity_factor if m.moe else 1) + (m.shared_ffn_hidden if m.moe else 0)
    norms = 2 * 4 * s * b * m.hidden / (tp if sequence_parallel else 1)
    return act_bytes * s * b * f / tp + norms


def embedding_activation_bytes(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False) -> float:
    """First stage: the embedding dropout mask (sbh, /t with SP; none without dropout);
    Korthikanti et al. Eq. 3."""
    return s * b * m.hidden / (tp if sequence_parallel else 1) if m.dropout > 0 else 0.0


def logits_activation_bytes(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False) -> float:
    """Last stage: final norm and logits input (4sbh, /t with SP) and the fp32 logits 4sbV/t."""
    return 4 * s * b * m.hidden / (tp if sequence_parallel else 1) + 4 * s * b * m.vocab / tp
