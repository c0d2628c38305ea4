"""torchtitan 0.3's ``qwen3`` module as an export target and an import: which named config a Plan's
model is, and what that module cannot run that the Plan asks.

What the module builds was read from the torchtitan 0.3.0 wheel (the same files as
pytorch/torchtitan@4f9e9a47, ``torchtitan_configs.yaml``):

- torchtitan/models/qwen3/config_registry.py: ``qwen3_0_6b``, ``qwen3_1_7b``, ``qwen3_14b``,
  ``qwen3_30b_a3b`` and ``qwen3_32b`` each call ``model_registry(flavor)`` with no converter and no
  model option (attention flex, MoE all-to-all ``standard``); its other qwen3 configs build debug
  models, or a flavor (8B, 4B) only with SFT, varlen attention or NVFP4, which no export writes.
- torchtitan/models/qwen3/__init__.py ``qwen3_configs``: every block is RMSNorm (eps 1e-6), a fused
  bias-free QKV, RoPE theta 1e6 for 40960 positions, an RMSNorm over head_dim on queries and on keys
  (``qk_norm``), a bias-free output projection and a SwiGLU FeedForward (w1, w2, w3), or in
  30B-A3B an MoE in every layer: a bias-free softmax router over 128 experts, top-8, renormalised,
  grouped experts of width 768, no shared expert, dropless (no ``non_blocking_capacity_factor``),
  balanced by the expert bias (``load_balance_coeff``, a buffer). 0.6B and 1.7B tie the embedding
  and the output weight (``enable_weight_tying``). No dropout anywhere (torchtitan/models/qwen3/model.py).
- torchtitan/models/qwen3/parallelize.py: TP (sequence parallel always), CP, EP, activation
  checkpointing, compile and FSDP2/HSDP as llama3's, and the experts' FSDP over ``efsdp`` where
  ep > 1; torchtitan/config/configs.py ``expert_parallel_degree``: EP borrows ranks from FSDP and
  TP, efsdp = dp_shard x cp x tp / ep, so an expert is whole on its rank (expert TP 1), and under
  TP without EP the experts split over TP (torchtitan/models/common/moe_sharding.py).
- torchtitan/models/common/decoder.py ``Decoder.Config.update_from_config``: weight tying is refused
  under pipeline parallel, and a training.seq_len above the RoPE's max_seq_len raises.
"""
from __future__ import annotations

from simcore.plan.torchtitan_named import config_of, expert_layout_refusals, shape_refusal

#: The five named configs an export writes, as Plan fields (``head_dim`` is the model's head width,
#: ``model.kv_channels``; MoE ``ffn_hidden`` is an expert's width): torchtitan/models/qwen3/__init__.py.
CONFIGS = {
    "qwen3_0_6b": {"flavor": "0.6B", "layers": 28, "hidden": 1024, "heads": 16, "kv_heads": 8, "head_dim": 128,
                   "ffn_hidden": 3072, "vocab": 151936, "tied_embeddings": True, "experts": 0, "top_k": 0},
    "qwen3_1_7b": {"flavor": "1.7B", "layers": 28, "hidden": 2048, "heads": 16, "kv_heads": 8, "head_dim": 128,
                   "ffn_hidden": 6144, "vocab": 151936, "tied_embeddings": True, "experts": 0, "top_k": 0},
    "qwen3_14b": {"flavor": "14B", "layers": 40, "hidden": 5120, "heads": 40, "kv_heads": 8, "head_dim": 128,
                  "ffn_hidden": 17408, "vocab": 151936, "tied_embeddings": False, "experts": 0, "top_k": 0},
    "qwen3_30b_a3b": {"flavor": "30B-A3B", "layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128,
                      "ffn_hidden": 768, "vocab": 151936, "tied_embeddings": False, "experts": 128, "top_k": 8},
    "qwen3_32b": {"flavor": "32B", "layers": 64, "hidden": 5120, "heads": 64, "kv_heads": 8, "head_dim": 128,
                  "ffn_hidden": 25600, "vocab": 151936, "tied_embeddings": False, "experts": 0, "top_k": 0},
}
ROPE_THETA, MAX_SEQ_LEN = 1_000_000.0, 40960   # every config's CosSinRoPE.Config (theta, max_seq_len)
_INIT = "torchtitan/models/qwen3/__init__.py"
_DECODER = "torchtitan/models/common/decoder.py"
_BLOCK = (f"torchtitan 0.3's qwen3 model is RMSNorm, bias-free, SwiGLU, RoPE theta 1e6, with an RMSNorm over "
          f"each head's queries and keys, full causal attention and no dropout ({_INIT})")


def is_qwen3(m) -> bool:
    """Whether a Plan's model goes to torchtitan's qwen3 module: Qwen3's per-head QK norm, or a
    model named Qwen3 (the llama3 module has neither)."""
    return m.qk_norm.value == "head" or m.name.lower().startswith("qwen3")


def qwen3_config(m) -> str | None:
    """The named config that builds this model's shape, or None."""
    return config_of(m, CONFIGS)


def _block_refusals(m) -> list[tuple]:
    """The block every config builds (the module docstring); the first the Plan's model breaks."""
    return [(m.norm.value != "rmsnorm", "model.norm", m.norm.value, _BLOCK),
            (m.bias.value != "none", "model.bias", m.bias.value, _BLOCK),
            (not m.gated_mlp, "model.gated_mlp", "false", _BLOCK),
            (m.activation.value != "swiglu", "model.activation", m.activation.value, _BLOCK),
            (m.qk_norm.value != "head", "model.qk_norm", m.qk_norm.value, _BLOCK),
            (m.position_embedding.value != "rope", "model.position_embedding", m.position_embedding.value, _BLOCK),
            (m.rope_base != ROPE_THETA, "model.rope_base", m.rope_base, _BLOCK),
            (m.attention_sinks, "model.attention_sinks", "true", _BLOCK),
            (m.sliding_window > 0, "model.sliding_window", m.sliding_window, _BLOCK),
            (m.kv_lora_rank > 0, "model.kv_lora_rank", m.kv_lora_rank, _BLOCK + ": grouped-query attention"),
            (m.dropout != 0, "model.dropout", m.dropout, _BLOCK)]


def _moe_refusals(plan, name: str) -> list[tuple]:
    """qwen3_30b_a3b's MoE and how torchtitan lays its experts out (the module docstring)."""
    m, par = plan.model, plan.parallel
    moe = (f"{name} routes every layer's tokens to {m.top_k} of {m.experts} experts, dropless, with no shared "
           f"expert ({_INIT})")
    return [
        (m.shared_ffn_hidden > 0, "model.shared_ffn_hidden", m.shared_ffn_hidden, moe),
        (m.dense_layers > 0, "model.dense_layers", m.dense_layers, moe),
        (bool(m.moe_layers), "model.moe_layers", list(m.moe_layers), moe),
        (m.capacity_factor != 1.0, "model.capacity_factor", m.capacity_factor, moe),
        (par.moe_dispatcher.value != "alltoall", "parallel.moe_dispatcher", par.moe_dispatcher.value,
         f"{name}'s config_registry function leaves moe_comm_backend at standard, torch's all-to-all "
         f"({_INIT}), and the command line cannot change it"),
        (par.moe_a2a_overlap, "parallel.moe_a2a_overlap", "true", "its expert all-to-alls block (Megatron-Core's "
         "combined 1F1B schedule pairs them)"),
        (plan.training.precision.value == "fp32", "training.precision", "fp32",
         f"{name}'s experts cast their grouped GEMMs to bfloat16 whatever the parameters' dtype "
         "(torchtitan/models/common/moe.py GroupedExperts)"),
    ] + expert_layout_refusals(plan, "qwen3", "torchtitan/models/common/moe_sharding.py")


def qwen3_refusals(plan) -> list[tuple]:
    """(broken, field, value, why) for what torchtitan 0.3's qwen3 module cannot build or run as the
    Plan says: the block, then the shape (the nearest config named), then the MoE, tying and RoPE."""
    m, par = plan.model, plan.parallel
    block = _block_refusals(m)
    if any(bad for bad, *_ in block):
        return block
    name = qwen3_config(m)
    if name is None:
        return [shape_refusal(m, CONFIGS, "qwen3")]
    out = _moe_refusals(plan, name) if m.moe else []
    return out + [
        (m.tied_embeddings and par.pp > 1, "parallel.pp", par.pp,
         f"{name} ties its embedding and output weights, which torchtitan 0.3 refuses under pipeline parallel "
         f"(\"Weight tying is not supported with Pipeline Parallel\", {_DECODER})"),
        (m.seq_len > MAX_SEQ_LEN, "model.seq_len", m.seq_len,
         f"{name}'s RoPE is built for {MAX_SEQ_LEN} positions and a longer training.seq_len raises ({_DECODER})"),
    ]


def qwen3_fields(flavor: str) -> dict | None:
    """A ``--module qwen3`` flavor as Plan keys (the registry's config functions, ``CONFIGS``), or None."""
    c = next((c for c in CONFIGS.values() if c["flavor"] == flavor), None)
    if c is None:
        return None
    keys = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "tied_embeddings")
    f = {f"model.{k}": c[k] for k in keys}
    if c["experts"]:
        f.update({"model.experts": c["experts"], "model.top_k": c["top_k"]})
    return {**f, "model.kv_channels": c["head_dim"], "model.gated_mlp": True, "model.position_embedding": "rope",
            "model.rope_base": ROPE_THETA, "model.qk_norm": "head", "model.dropout": 0.0}
