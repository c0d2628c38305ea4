"""A Gated DeltaNet layer's parameters, FLOPs and saved bytes (``model.linear_attention``), and
the mean over a hybrid model's layers; the kernels it runs are ``simcore.model.linear_attention``.

The layer (Yang, Kautz, Hatamizadeh, "Gated Delta Networks", ICLR 2025, arXiv 2412.06464; as
transformers' ``Qwen3NextGatedDeltaNet`` and Megatron-LM's ``GatedDeltaNet`` build it,
megatron/core/ssm/gated_delta_net.py @00caa53a): an input projection h -> 2 k_dim + 2 v_dim +
2 n_v (q, k, v, the output gate z, beta and the decay's a), a depthwise causal convolution of
``conv_kernel_dim`` taps over q, k, v (2 k_dim + v_dim channels, no bias), A_log and dt_bias
(n_v each), a gated RMSNorm of ``value_head_dim`` and an output projection v_dim -> h.

The recurrence runs as flash-linear-attention's chunked kernels (fla-org/flash-linear-attention
fla/ops/gated_delta_rule/chunk.py @92396f25 ``chunk_gated_delta_rule_fwd``: chunks of
``CHUNK`` = 64 tokens, ``chunk_local_cumsum(g, chunk_size=64)``; the paper's Sec. 3.3 chunkwise
form with the WY representation). Per value head (q and k repeated to the n_v value heads, as
both stacks do before the kernel), head widths K and V, per token of a chunk of C tokens:
``chunk_scaled_dot_kkt_fwd`` beta K K^T (2CK), ``solve_tril`` the C x C triangular inverse
(2C^2/3), ``recompute_w_u_fwd`` w = A (beta k) and u = A (beta v) (2C(K+V)),
``chunk_gated_delta_rule_fwd_h`` v_new = u - w h and the state update h += k^T v_new (4KV), and
``chunk_fwd_o`` q h, the chunk's q k^T and its product with v_new (2KV + 2CK + 2CV): in all
6KV + 6CK + 4CV + 2C^2/3 FLOPs, linear in the sequence. The tiles are computed whole (the
causal mask is applied inside them), so the counted FLOPs are the executed ones. Its backward
(``chunk_gated_delta_rule_bwd``: w, u and h recomputed, then dv, dh, dq/dk/dw and the WY
backward) is charged twice the forward, as every weightless batched kernel is.
"""
from __future__ import annotations

from simcore.plan.linear_attention import linear_share

#: Tokens per chunk of fla's chunked gated delta rule (module docstring: chunk.py @92396f25).
CHUNK = 64


def gdn_params(m) -> int:
    """Parameters of one Gated DeltaNet layer's mixer (the norms and MLP are the layer's as any)."""
    la, h = m.linear_attention, m.hidden
    in_proj = h * (2 * la.key_dim + 2 * la.value_dim + 2 * la.num_value_heads)
    conv = (2 * la.key_dim + la.value_dim) * la.conv_kernel_dim
    return in_proj + conv + 2 * la.num_value_heads + la.value_head_dim + la.value_dim * h


def core_flops_per_token(m) -> float:
    """Forward FLOPs of the chunked gated delta rule per token, all value heads (module docstring)."""
    la, c = m.linear_attention, CHUNK
    k, v = la.key_head_dim, la.value_head_dim
    return la.num_value_heads * (6 * k * v + 6 * c * k + 4 * c * v + 2 * c * c / 3)


def forward_flops(m, tokens: float) -> float:
    """Counted forward FLOPs of one Gated DeltaNet mixer for ``tokens`` tokens: the projections,
    the convolution's taps and the chunked recurrence (no s^2 term)."""
    la, h = m.linear_attention, m.hidden
    projections = h * (2 * la.key_dim + 2 * la.value_dim + 2 * la.num_value_heads) + la.value_dim * h
    conv = (2 * la.key_dim + la.value_dim) * la.conv_kernel_dim
    return 2 * tokens * (projections + conv) + tokens * core_flops_per_token(m)


def saved_elements_per_token(m, gemm_input: float) -> float:
    """Bytes per token one Gated DeltaNet mixer keeps for its backward (all heads, before TP's split):
    the convolution's input and output (2 k_dim + v_dim each, 16-bit; the output is v and the L2
    norm's input), the L2-normed q and k repeated to the value heads that fla's
    ``ChunkGatedDeltaRuleFunction`` saves, g and beta in fp32, the WY matrix A (C per head, 16-bit),
    the gate z and the recurrence's output (the gated norm's inputs), and the output projection's
    input (``gemm_input`` bytes an element). Linear in the sequence: no s^2 term."""
    la = m.linear_attention
    conv = 2 * la.key_dim + la.value_dim
    n_v = la.num_value_heads
    return (2 * 2 * conv + 2 * 2 * n_v * la.key_head_dim + 4 * 2 * n_v + 2 * n_v * CHUNK
            + 2 * 2 * la.value_dim + gemm_input * la.value_dim)


def recurrent_state_bytes(m, state_bytes: float = 4.0) -> float:
    """One sequence's fixed state in one Gated DeltaNet layer: the K x V matrix per value head
    (fp32, as transformers' cache keeps the kernel's final state) and the convolution's last
    ``conv_kernel_dim - 1`` inputs per channel (16-bit)."""
    la = m.linear_attention
    conv = (2 * la.key_dim + la.value_dim) * (la.conv_kernel_dim - 1) * 2
    return la.num_value_heads * la.key_head_dim * la.value_head_dim * state_bytes + conv


def hybrid_mean(m, full: float, linear) -> float:
    """A per-layer figure of model ``m`` as the mean over its layers: ``full`` for a softmax layer,
    ``linear`` (a value, or a function called only where there are linear layers) for a Gated
    DeltaNet layer."""
    share = linear_share(m)
    if not share:
        return full
    return (1 - share) * full + share * (linear() if callable(linear) else linear)
