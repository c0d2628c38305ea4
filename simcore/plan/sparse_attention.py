"""DeepSeek Sparse Attention (plan key ``model.sparse_attention``): a lightning indexer picks the
``topk`` keys each query's multi-latent attention reads.

DeepSeek-V3.2 (DeepSeek-AI, "DeepSeek-V3.2: Pushing the Frontier of Open Large Language Models",
2025, Sec. 2.1) adds to every MLA layer an indexer of ``heads`` small query heads of ``head_dim``
(projected from MLA's query latent), one shared key of ``head_dim`` (projected from the layer
input, LayerNorm'd) and a weight per head (projected from the layer input); its score of a key is
the weighted sum over heads of ReLU(q . k), and the attention reads the top ``topk`` keys (2048).
The indexer is trained by a KL loss against the main attention's distribution over the selected
keys, its input detached from the model's graph. Hugging Face's ``deepseek_v32`` config names the
widths ``index_n_heads``, ``index_head_dim``, ``index_topk`` (transformers 5.24.0
modeling_deepseek_v32.py ``DeepseekV32Indexer``); Megatron-Core runs it as ``dsa``
(megatron/core/transformer/experimental_attention_variant/dsa.py @d98e8a64: ``dsa_indexer_n_heads``,
``dsa_indexer_head_dim``, ``dsa_indexer_topk``).

This module holds the value, its parsing and its rules; the parameters, FLOPs, bytes and the
loss's communication are ``simcore.model.dsa``.
"""
from __future__ import annotations

from dataclasses import dataclass

from simcore.plan.choices import PlanError

FIELDS = ("topk", "heads", "head_dim")
#: The Hugging Face config keys of each field (``DeepseekV32Config``).
HF_KEYS = {"topk": "index_topk", "heads": "index_n_heads", "head_dim": "index_head_dim"}
#: GlmMoeDsaConfig's keys for which layers run the indexer (``hf_families.refuse_unstated`` refuses
#: a config where some reuse an earlier layer's top-k; all-``full`` is this model).
HF_LAYER_KEYS = ("indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset")
#: ``DeepseekV32Config``'s defaults (transformers 5.24.0 configuration_deepseek_v32.py), which a config
#: that leaves a width out gets.
HF_DEFAULTS = {"topk": 2048, "heads": 64, "head_dim": 128}


@dataclass(frozen=True, slots=True, kw_only=True)
class SparseAttention:
    """The lightning indexer of every layer and the keys its attention keeps."""

    topk: int
    """Keys each query attends to (``index_topk``; DeepSeek-V3.2: 2048)."""
    heads: int
    """Indexer query heads (``index_n_heads``: 64)."""
    head_dim: int
    """Width of an indexer head and of its one shared key (``index_head_dim``: 128)."""


def parse(value) -> SparseAttention | None:
    """``model.sparse_attention`` from a Plan document (None where absent), one sentence on a bad field."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PlanError(f"model.sparse_attention must be a mapping of {', '.join(FIELDS)}, got {value!r}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise PlanError(f"unknown field 'model.sparse_attention.{unknown[0]}' (known: {', '.join(FIELDS)})")
    out = {}
    for key in FIELDS:
        v = value.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanError(f"model.sparse_attention.{key} must be a whole number at least 1, got {v!r}")
        out[key] = v
    return SparseAttention(**out)


def rules(plan) -> list[tuple[bool, str]]:
    """The rules of a model with the indexer: it reads MLA's query latent, so multi-latent attention
    with a query rank; its rotary part is MLA's, so head_dim at least qk_rope_head_dim; the sparse
    kernels are flash-style (FlashMLA's, Megatron's tilelang ones), so flash attention; no other
    attention variant; and no context parallel or per-op recompute, which trainplan does not price
    for it (Megatron's DSA all-gathers the indexer's keys over CP: not priced)."""
    m, par, tr = plan.model, plan.parallel, plan.training
    sa = m.sparse_attention
    if sa is None:
        return []
    return [
        (m.mla and m.q_lora_rank > 0, "model.sparse_attention needs multi-latent attention with a query latent "
         "(model.kv_lora_rank and model.q_lora_rank above 0): the indexer's queries are projected from it"),
        (sa.head_dim >= m.qk_rope_head_dim, f"model.sparse_attention.head_dim={sa.head_dim} must be at least "
         f"model.qk_rope_head_dim={m.qk_rope_head_dim}: the indexer rotates that part of its query and key"),
        (tr.flash_attention, "model.sparse_attention needs training.flash_attention: true (the sparse attention "
         "runs in FlashMLA-style kernels over the selected keys)"),
        (m.linear_attention is None and not m.sliding_window, "model.sparse_attention cannot be combined with "
         "model.linear_attention or model.sliding_window (no stack builds such a layer)"),
        (par.cp == 1, f"parallel.cp={par.cp} is refused for model.sparse_attention: the indexer's key all-gather over "
         "CP ranks is not priced, so cp must be 1"),
        (tr.recompute.value != "op", "training.recompute=op is torchtitan's per-op SAC, and torchtitan has no DSA "
         "layer: give selective, full or layer:N"),
        (tr.recompute.value != "dots", "training.recompute=dots is MaxText's remat policy, and MaxText has no DSA "
         "layer: give selective, full or layer:N"),
    ]


def hf_section(cfg: dict) -> dict | None:
    """``model.sparse_attention`` of a Hugging Face config that names the indexer (``index_topk``),
    else None."""
    if not cfg.get("index_topk"):
        return None
    return {key: int(cfg.get(hf) or HF_DEFAULTS[key]) for key, hf in HF_KEYS.items()}
