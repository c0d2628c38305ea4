"""Hugging Face configs whose language model is nested or whose layers are not all alike:
read as ``transformers`` reads them, or refused in one sentence naming the field.

Multimodal wrappers (Llama 4 ``llama4``, Gemma 3 ``gemma3``, Gemma 4 ``gemma4``, Qwen3.5
``qwen3_5``) keep the language model in ``text_config``; transformers builds it from
``<Family>TextConfig(**text_config)``, so a field the file leaves out takes the class's
default (the defaults below are read from huggingface/transformers
``src/transformers/models/<family>/configuration_<family>.py``). The vision (and audio)
tower is not modelled: the plan is the language model.

The rule for a field the plan's model cannot state: if it changes the parameter count by
more than ``MAX_DROPPED_SHARE`` (0.5%) or the layer layout, the import is refused naming it;
otherwise it is listed as not mapped, as every other dropped field is.
"""
from __future__ import annotations

from pathlib import Path

from simcore.plan.spec import PlanError

MAX_DROPPED_SHARE = 0.005
"""The largest share of the parameters a dropped field may carry (issue 55)."""

#: ``<Family>TextConfig`` defaults for the fields that shape the model (transformers
#: configuration_llama4.py Llama4TextConfig, configuration_gemma3.py Gemma3TextConfig,
#: configuration_gemma4.py Gemma4TextConfig, configuration_qwen3_5.py Qwen3_5TextConfig,
#: configuration_qwen3_5_moe.py Qwen3_5MoeTextConfig; transformers 5.24.0).
TEXT_DEFAULTS = {
    "llama4_text": {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
                    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 4096 * 32,
                    "rope_theta": 500000.0, "num_experts_per_tok": 1, "num_local_experts": 16,
                    "interleave_moe_layer_step": 1, "tie_word_embeddings": False},
    "gemma3_text": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                    "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 256, "max_position_embeddings": 131_072, "rope_theta": 1_000_000.0,
                    "sliding_window": 4096, "sliding_window_pattern": 6, "tie_word_embeddings": True},
    "gemma4_text": {"vocab_size": 262_144, "hidden_size": 2304, "intermediate_size": 9216,
                    "num_hidden_layers": 30, "num_attention_heads": 8, "num_key_value_heads": 4,
                    "head_dim": 256, "max_position_embeddings": 131_072, "sliding_window": 512,
                    "tie_word_embeddings": True, "hidden_size_per_layer_input": 256, "global_head_dim": 512,
                    "attention_k_eq_v": False, "num_kv_shared_layers": 0, "enable_moe_block": False,
                    "use_double_wide_mlp": False},
    "qwen3_5_text": {"vocab_size": 248_320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
                     "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                     "max_position_embeddings": 32768, "tie_word_embeddings": False},
    "qwen3_5_moe_text": {"vocab_size": 248_320, "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
                         "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 32768,
                         "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                         "num_experts_per_tok": 8, "num_experts": 256, "tie_word_embeddings": False},
}

#: Text model types whose layers default to a hybrid of linear and full attention when the
#: config gives no ``layer_types`` (Qwen3-Next, Qwen3.5: three Gated DeltaNet layers in four;
#: ``simcore.plan.linear_attention.hf_section`` reads them).
HYBRID_LINEAR = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text")

#: Fields ``hf_fields`` reads from a language model's config beyond the classic ones.
USED_HERE = {"text_config", "vision_config", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
             "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval", "attn_output_gate", "top_k_experts", "enable_moe_block", "interleave_moe_layer_step",
             "intermediate_size_mlp", "moe_layers", "global_head_dim", "num_global_key_value_heads",
             "attention_k_eq_v", "hidden_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp"}


def language_model(cfg: dict) -> tuple[dict, list[str]]:
    """The language model's config (``text_config`` over its class's defaults, with the
    wrapper's name and tied-embedding flag where the text config gives none) and notes."""
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        return cfg, []
    mtype = str(text.get("model_type") or f"{cfg.get('model_type', '')}_text").lower()
    flat = {**TEXT_DEFAULTS.get(mtype, {}), **text, "model_type": mtype}
    for key in ("_name_or_path", "tie_word_embeddings"):
        if key in cfg and key not in text:
            flat[key] = cfg[key]
    if mtype == "gemma4_text" and not text.get("layer_types"):   # Gemma4TextConfig.__post_init__
        layers = int(flat["num_hidden_layers"])
        flat["layer_types"] = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)]
        flat["layer_types"][-1] = "full_attention"
    towers = [k for k in ("vision_config", "audio_config") if cfg.get(k)]
    notes = [f"the {' and '.join(t.split('_')[0] for t in towers)} tower ({', '.join(towers)}) is not modelled: "
             f"the plan is text_config's language model ({mtype})"] if towers else []
    return flat, notes


def refuse_unstated(cfg: dict, mtype: str, path: Path) -> None:
    """A PlanError naming the first field that changes the parameter count by more than
    MAX_DROPPED_SHARE, or the layer layout, in a way the plan's model cannot state."""
    types, kinds = cfg.get("layer_types"), ("full_attention", "sliding_attention", "linear_attention")
    if cfg.get("index_topk") and isinstance(types, list) and set(types) == {"indexed_attention"}:
        types = None   # DeepSeek-V3.2's, GLM-5's indexer on every layer: model.sparse_attention
    pattern = cfg.get("indexer_types") or cfg.get("index_topk_pattern") or ""
    if cfg.get("index_topk") and ("shared" in pattern or "S" in pattern or int(cfg.get("index_topk_freq") or 1) > 1):
        raise PlanError(f"model config {path}: indexer_types / index_topk_freq reuse an earlier layer's top-k on some "
                        "layers (GlmMoeDsaConfig's shared layers), which model.sparse_attention cannot state (an "
                        "indexer on every layer)")
    if isinstance(types, list) and any(t not in kinds for t in types):
        other = sorted({str(t) for t in types} - set(kinds))
        raise PlanError(f"model config {path}: layer_types has {', '.join(other)} layers, which the plan's "
                        "model cannot state (softmax attention, full or windowed, or Gated DeltaNet linear attention)")
    if isinstance(types, list) and "linear_attention" in types and "sliding_attention" in types:
        raise PlanError(f"model config {path}: layer_types mixes sliding_attention and linear_attention layers, "
                        "which the plan's model cannot state (its windowed share counts the softmax layers alone)")
    for key in ("hidden_size_per_layer_input", "num_kv_shared_layers", "use_double_wide_mlp"):
        if cfg.get(key):
            raise PlanError(f"model config {path}: {key}={cfg[key]} (Gemma's per-layer inputs, shared key/value "
                            "layers or double-wide MLPs) changes the parameters in a way the plan's model cannot state")
    if mtype == "gemma4_text":
        share = global_attention_share(cfg)
        if abs(share) > MAX_DROPPED_SHARE:
            raise PlanError(f"model config {path}: global_head_dim={cfg.get('global_head_dim')} changes the "
                            f"parameters by {share:+.1%} on the full-attention layers, which the plan's model "
                            "cannot state (one head width for every layer)")


def global_attention_share(cfg: dict) -> float:
    """Gemma 4's full-attention layers (``global_head_dim`` wide heads, ``num_global_key_value_heads``
    key heads, values = keys under ``attention_k_eq_v``) less the sliding layers' attention the plan
    counts for them, as a share of a rough total (attention, MLPs, experts, embeddings)."""
    h, heads, kv, dh = (int(cfg[k]) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"))
    g_dh = int(cfg.get("global_head_dim") or dh)
    k_eq_v = bool(cfg.get("attention_k_eq_v"))
    g_kv = int(cfg.get("num_global_key_value_heads") or kv) if k_eq_v else kv
    full = sum(t == "full_attention" for t in cfg.get("layer_types") or [])
    sliding_attn = h * dh * (2 * heads + 2 * kv)
    global_attn = h * g_dh * (2 * heads + (1 if k_eq_v else 2) * g_kv)
    layers = int(cfg["num_hidden_layers"])
    mlp = 3 * h * int(cfg["intermediate_size"])
    if cfg.get("enable_moe_block"):
        mlp += 3 * h * int(cfg.get("moe_intermediate_size") or 0) * int(cfg.get("num_experts") or 0)
    embeddings = int(cfg["vocab_size"]) * h * (1 if cfg.get("tie_word_embeddings", True) else 2)
    total = layers * (sliding_attn + mlp) + embeddings
    return full * (global_attn - sliding_attn) / total


def moe_layout(cfg: dict, mtype: str) -> tuple[dict, list[int] | None]:
    """Llama 4's and Gemma 4's experts as ModelSpec fields, and the dense layers (None: the
    caller's Qwen/DeepSeek rules). Llama 4 (modeling_llama4.py Llama4TextDecoderLayer): layer i
    is MoE when in ``moe_layers`` (default every ``interleave_moe_layer_step``-th from step-1),
    with ``intermediate_size``-wide experts and one shared expert as wide; the other layers are
    ``intermediate_size_mlp`` wide. Gemma 4 (modeling_gemma4.py): with ``enable_moe_block``
    every layer runs its ``intermediate_size`` MLP beside ``top_k_experts`` of ``num_experts``
    ``moe_intermediate_size``-wide experts, which is a shared expert as wide as that MLP."""
    if mtype == "llama4_text":
        layers, experts = int(cfg["num_hidden_layers"]), int(cfg.get("num_local_experts") or 0)
        if not experts:
            return {}, None
        step = int(cfg.get("interleave_moe_layer_step") or 1)
        moe = cfg.get("moe_layers") or list(range(step - 1, layers, step))
        width = cfg.get("intermediate_size")
        out = {"experts": experts, "top_k": cfg.get("num_experts_per_tok") or 1, "ffn_hidden": width,
               "shared_ffn_hidden": width, "dense_ffn_hidden": cfg.get("intermediate_size_mlp")}
        return out, [i for i in range(layers) if i not in set(moe)]
    if mtype == "gemma4_text":
        if not cfg.get("enable_moe_block"):
            return {}, []
        out = {"experts": cfg.get("num_experts"), "top_k": cfg.get("top_k_experts") or cfg.get("num_experts_per_tok"),
               "ffn_hidden": cfg.get("moe_intermediate_size"), "shared_ffn_hidden": cfg.get("intermediate_size")}
        return out, []
    return {}, None
