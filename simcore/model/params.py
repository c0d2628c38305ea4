"""The parameters of a model, by part: attention (grouped-query, a set head width, or
multi-latent attention), the dense MLP or an MoE layer's experts, router and shared experts,
the first dense layers of an MoE model, norms, embeddings and the output layer.

Re-exported by ``simcore.model.workload``, whose FLOP and byte counts use the same widths.
The published sizes of the families the Hugging Face importer reads (Llama 3, Mistral,
Mixtral, Qwen2.5, Qwen2-MoE, Qwen3, Gemma 2, DeepSeek-V3, Phi-3, GPT-2) hold these counts
to within 1% (tests/plan/test_hf_families.py).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from simcore.model.dsa import indexer_params
from simcore.model.gdn import gdn_params, hybrid_mean
from simcore.plan.linear_attention import output_gated
from simcore.plan.model_props import Bias, Norm, QkNorm
from simcore.plan.spec import ModelSpec, PositionEmbedding


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamCounts:
    """Parameters of the model, by part (counts, not bytes)."""

    attention: int
    """One layer's attention: QKV and output projections (and biases; MLA's down/up projections; DSA's
    indexer, ``dsa.indexer_params``); a hybrid model's the mean over its softmax and Gated DeltaNet
    layers (``gdn.hybrid_mean``)."""
    mlp: int
    """One layer's dense MLP, or ALL experts of an MoE layer plus the router and shared experts."""
    norms: int
    """One layer's layer norms."""
    embedding: int
    """Token (and learned position) embeddings."""
    output: int
    """Untied output projection (0 when tied) plus the final norm."""
    layers: int
    shared: int = 0
    """MoE: the shared experts of one layer (inside ``mlp``)."""
    dense_layers: int = 0
    """MoE: the first layers that are dense; each has ``dense_mlp`` MLP parameters instead of ``mlp``."""
    dense_mlp: int = 0
    mtp: int = 0
    """The MTP modules' own parameters (``model.mtp_layers`` blocks of the last layer's kind, their
    2h -> h projections and three norms each; the embedding and output layer are the model's):
    stated apart from ``total``, the main model's, which is what transformers builds and the
    published sizes count (DeepSeek-V3's 671B; its checkpoint's 685B holds the MTP module)."""

    @property
    def per_layer(self) -> int:
        """An MoE layer (or any layer of a dense model)."""
        return self.attention + self.mlp + self.norms

    @property
    def total(self) -> int:
        dense = self.dense_layers * (self.attention + self.dense_mlp + self.norms)
        return round((self.layers - self.dense_layers) * self.per_layer + dense + self.embedding + self.output)

    @property
    def trained(self) -> int:
        """Every parameter the run trains and checkpoints: the main model's and the MTP modules'."""
        return self.total + self.mtp


def norm_params(m: ModelSpec, width: int) -> int:
    """One norm over ``width`` channels: a scale, and a shift under LayerNorm (``model.norm``)."""
    return 2 * width if m.norm == Norm.LAYERNORM else width


def _mlp_bias(m: ModelSpec) -> bool:
    return m.bias == Bias.ALL


def attention_extras(m: ModelSpec) -> int:
    """A softmax-attention layer's parameters beside its weights (``simcore.plan.model_props``):
    the q/k/v biases (``model.bias`` qkv and up) and the output's (attention, all); the QK norms
    (``head``: one of head_dim each for queries and keys, Qwen3's q_norm/k_norm; ``projection``:
    over the whole projections, OLMo 2's; ``l2`` has none); a learned sink logit per head (GPT-OSS's
    ``sinks``, Megatron's --softmax-type learnable ``softmax_offset``)."""
    qkv = attention_in_params(m) // m.hidden
    bias = (qkv if m.bias != Bias.NONE else 0) + (m.hidden if m.bias in (Bias.ATTENTION, Bias.ALL) else 0)
    qk = {QkNorm.HEAD: 2 * m.head_dim, QkNorm.PROJECTION: (m.heads + m.kv_heads) * m.head_dim}.get(m.qk_norm, 0)
    return bias + (norm_params(m, qk) if qk else 0) + (m.heads if m.attention_sinks else 0)


def kv_width(m: ModelSpec) -> int:
    """Width of the K (or V) projection: kv_heads * head_dim (grouped-query attention)."""
    return m.kv_heads * m.head_dim


def q_width(m: ModelSpec) -> int:
    """Width of the query projection and of the attention output: heads * head_dim (equal
    to hidden unless the config sets a head width, as Gemma 2 and Qwen3 do)."""
    return m.heads * m.head_dim


def attention_in_params(m: ModelSpec) -> int:
    """Weights of the projections that make Q, K and V from the layer input.

    Multi-latent attention (DeepSeek-V2 arXiv 2405.04434 Sec. 2.1; modeling_deepseek_v3.py
    DeepseekV3Attention): q_a (h x q_lora), its norm, q_b (q_lora x heads*(nope+rope)), or
    one q_proj without q_lora; kv_a (h x (kv_lora + rope)), its norm, kv_b (kv_lora x
    heads*(nope + v))."""
    h = m.hidden
    if not m.mla:   # an output gate (Qwen3-Next's gated attention) doubles the query projection
        return h * (q_width(m) * (2 if output_gated(m) else 1) + 2 * kv_width(m))
    qk = m.heads * (m.kv_channels + m.qk_rope_head_dim)
    q = (h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * qk) if m.q_lora_rank else h * qk
    kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
    return q + kv + m.kv_lora_rank * m.heads * (m.kv_channels + m.v_head_dim)


def attention_out_width(m: ModelSpec) -> int:
    """Input width of the output projection: heads * v_head_dim (MLA) or heads * head_dim."""
    return m.heads * m.v_head_dim if m.mla else q_width(m)


def mlp_matrices(m: ModelSpec) -> int:
    return 3 if m.gated_mlp else 2


def _mlp_params(m: ModelSpec, width: int, bias: bool) -> int:
    """The MLP's matrices and, with ``bias``, fc1's (gate and up, ``mlp_matrices - 1`` of ``width``) and fc2's."""
    return mlp_matrices(m) * m.hidden * width + (((mlp_matrices(m) - 1) * width + m.hidden) if bias else 0)


def _router_params(m: ModelSpec) -> int:
    """An MoE layer's router: h x experts, and a bias per expert where every linear has one
    (``model.bias`` all: Megatron-Core's TopKRouter under ``add_bias_linear``, megatron/core/
    transformer/moe/router.py @d98e8a64; GPT-OSS's router, transformers 5.24.0 GptOssTopKRouter)."""
    return (m.hidden + _mlp_bias(m)) * m.experts


@functools.lru_cache(maxsize=256)
def param_counts(m: ModelSpec) -> ParamCounts:
    """Parameters; GPT-3 175B gives 174.6e9, Llama-3 70B 70.6e9, Qwen2-57B-A14B 57.4e9,
    DeepSeek-V3 671e9 (tests/plan/test_hf_families.py holds each family to its published size)."""
    h, f, bias = m.hidden, m.ffn_hidden, _mlp_bias(m)
    attention = attention_in_params(m) + attention_out_width(m) * h + attention_extras(m) + indexer_params(m)
    attention = hybrid_mean(m, attention, lambda: gdn_params(m))   # Gated DeltaNet layers: the mean layer's
    expert = _mlp_params(m, f, bias)
    shared = _mlp_params(m, m.shared_ffn_hidden, bias) if m.moe and m.shared_ffn_hidden else 0
    mlp = expert * m.experts + _router_params(m) + shared if m.moe else expert
    norms = 2 * norm_params(m, h)
    embedding = m.vocab * h + (m.seq_len * h if m.position_embedding == PositionEmbedding.LEARNED else 0)
    final_norm = norm_params(m, h)
    output = (0 if m.tied_embeddings else m.vocab * h) + final_norm
    dense_mlp = _mlp_params(m, m.dense_ffn_hidden or f, bias) if m.dense_count else 0
    block = attention + norms + (dense_mlp if m.is_dense_layer(m.layers - 1) else mlp)
    return ParamCounts(attention=attention, mlp=mlp, norms=norms, embedding=embedding, output=output,
                       layers=m.layers, shared=shared, dense_layers=m.dense_count,
                       dense_mlp=dense_mlp, mtp=round(m.mtp_layers * block + mtp_head_params(m)))


def mtp_head_params(m: ModelSpec) -> int:
    """An MTP module's parameters beside its block, times the depth: the 2h -> h projection
    (``eh_proj``, no bias) and three norms (``enorm``, ``hnorm``, ``final_layernorm``) a module
    (megatron/core/transformer/multi_token_prediction.py @d98e8a64 ``MultiTokenPredictionLayer``;
    DeepSeek-V3 arXiv 2412.19437 Sec. 2.2, its M_k and RMSNorms)."""
    h = m.hidden
    return m.mtp_layers * (MTP_PROJECTION_INPUTS * h * h + MTP_NORMS * norm_params(m, h))


#: An MTP module's projection takes the normed hidden state and the normed embedding
#: concatenated (2h wide), and it has three norms (multi_token_prediction.py @d98e8a64).
MTP_PROJECTION_INPUTS, MTP_NORMS = 2, 3


def active_params_per_token(m: ModelSpec) -> float:
    """Parameters one token touches (MoE: top_k experts, the shared experts and the
    router of each MoE layer; the dense layers whole)."""
    pc = param_counts(m)
    if not m.moe:
        return pc.total
    expert = (pc.mlp - _router_params(m) - pc.shared) / m.experts
    per_layer = pc.attention + pc.norms + m.top_k * expert + _router_params(m) + pc.shared
    dense = pc.dense_layers * (pc.attention + pc.norms + pc.dense_mlp)
    return (m.layers - pc.dense_layers) * per_layer + dense + pc.embedding + pc.output
