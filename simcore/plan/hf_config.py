"""A Hugging Face ``config.json`` as ModelSpec fields, family by family.

The field names are those of the ``transformers`` configuration classes (read from
huggingface/transformers ``src/transformers/models/<family>/configuration_<family>.py``):
Llama 2/3 (``llama``), Mistral, Mixtral (``num_local_experts``), Qwen2 / Qwen2.5, Qwen3
(``head_dim``), Qwen2-MoE and Qwen3-MoE (``moe_intermediate_size``,
``shared_expert_intermediate_size``, ``mlp_only_layers``), Gemma 2 (``head_dim``),
DeepSeek-V2/V3 (multi-latent attention ``q_lora_rank`` / ``kv_lora_rank`` /
``qk_nope_head_dim`` / ``qk_rope_head_dim`` / ``v_head_dim``, ``n_routed_experts``,
``n_shared_experts``, ``first_k_dense_replace``), Phi-3, GPT-2 (``n_layer``, ``n_embd``)
and GPT-NeoX.

``max_position_embeddings`` is the context the model can take, not the sequence a run
trains on: ``seq_len`` becomes min(max_position_embeddings, DEFAULT_SEQ_LEN) and the
capacity is returned as ``max_positions`` so that the importer can say what it chose.
"""
from __future__ import annotations

import json
from pathlib import Path

from simcore.plan import linear_attention, sparse_attention
from simcore.plan.hf_families import (HYBRID_LINEAR, USED_HERE, global_attention_share, language_model, moe_layout,
                                      refuse_unstated)
from simcore.plan.model_props import unconventional
from simcore.plan.spec import PlanError

DEFAULT_SEQ_LEN = 8192
"""The training sequence length assumed when none is given: Llama 3's pre-training
sequence (Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783, Sec. 3.4.1: 8K
tokens), capped by the model's max_position_embeddings."""

#: The dropout probabilities a config.json may give (hidden, residual, embedding, attention); the
#: model's ``dropout`` is the largest given: GPT2Config's defaults are 0.1, and the rotary
#: families' configs give ``attention_dropout`` 0.0 and have no other dropout layer.
DROPOUT_KEYS = ("hidden_dropout", "hidden_dropout_prob", "resid_pdrop", "embd_pdrop", "attention_dropout",
                "attn_pdrop", "attention_probs_dropout_prob")

#: Every config.json field this module reads (the importer lists the others as not mapped).
USED = {"model_type", "_name_or_path", "num_hidden_layers", "n_layer", "hidden_size", "n_embd",
        "num_attention_heads", "n_head", "num_key_value_heads", "intermediate_size", "n_inner",
        "ffn_dim", "vocab_size", "max_position_embeddings", "n_positions", "n_ctx", "seq_length",
        "num_local_experts", "num_experts", "num_experts_per_tok", "tie_word_embeddings", "head_dim",
        "rope_theta", "moe_intermediate_size", "shared_expert_intermediate_size", "decoder_sparse_step",
        "mlp_only_layers", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
        "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "moe_layer_freq", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
        "sliding_window_pattern", "num_nextn_predict_layers", *DROPOUT_KEYS, *USED_HERE,
        "hidden_act", "hidden_activation", "activation_function", "attention_bias", "mlp_bias", "qkv_bias",
        "use_qk_norm", "swiglu_alpha", "swiglu_limit", *sparse_attention.HF_KEYS.values(),
        *sparse_attention.HF_LAYER_KEYS}

#: Text model types whose layers have four RMSNorms, the MLP between pre- and post-feedforward ones
#: (transformers 5.24.0 Gemma2DecoderLayer, Gemma3DecoderLayer, Gemma4TextDecoderLayer).
SANDWICH_NORM_TYPES = ("gemma2", "gemma3_text", "gemma4_text")
#: Text model types built with LayerNorm (GPT2Block's ln_1/ln_2, GPTNeoXLayer's input_layernorm); the
#: others the importer reads are RMSNorm (transformers 5.24.0 modeling_<family>.py).
LAYERNORM_TYPES = ("gpt2", "gpt_neox")
#: The config classes' activation defaults where a file may leave it out (GPT2Config.activation_function,
#: GPTNeoXConfig.hidden_act, Gemma2Config/Gemma3TextConfig/Gemma4TextConfig.hidden_activation); else silu.
ACT_DEFAULTS = {"gpt2": "gelu_new", "gpt_neox": "gelu", "gemma": "gelu_pytorch_tanh", "gemma2": "gelu_pytorch_tanh",
                "gemma3_text": "gelu_pytorch_tanh", "gemma4_text": "gelu_pytorch_tanh"}
#: Text model types whose attention has q_norm/k_norm over each head's width (Qwen3Attention,
#: Qwen3NextAttention, Qwen3_5Attention, Gemma3Attention, Gemma4TextAttention), or over the whole
#: projections (Olmo2Attention).
QK_NORM_TYPES = {"qwen3": "head", "qwen3_moe": "head", "qwen3_next": "head", "qwen3_5_text": "head",
                 "qwen3_5_moe_text": "head", "gemma3_text": "head", "gemma4_text": "head", "olmo2": "projection"}
GELUS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python")


def rope_theta(cfg: dict):
    """The RoPE base: ``rope_theta``, or inside ``rope_parameters``, where transformers 5 writes it
    (``PreTrainedConfig``'s ``rope_parameters``: ``{"rope_theta": ..., "rope_type": "default"}``)."""
    rope = cfg.get("rope_parameters")
    return cfg.get("rope_theta", rope.get("rope_theta") if isinstance(rope, dict) else None)


def not_mapped(cfg: dict) -> list[str]:
    """The fields of ``cfg`` no Plan field holds: those this module does not read (``USED``), and
    ``rope_parameters`` where it holds more than the base of a plain RoPE (YaRN's or Llama 3's
    scaling: no Plan field states it; the base is read, ``rope_theta``)."""
    rope = cfg.get("rope_parameters")
    plain = isinstance(rope, dict) and set(rope) <= {"rope_theta", "rope_type"} \
        and rope.get("rope_type", "default") == "default"
    return sorted(k for k in cfg if k not in USED and not (k == "rope_parameters" and plain))


def read_config(path: Path) -> dict:
    """The JSON object of a config.json; PlanError with one sentence if it is not one."""
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as exc:
        raise PlanError(f"model config {path} cannot be read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"model config {path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise PlanError(f"model config {path} must hold a JSON object")
    return cfg


def model_section(model) -> dict:
    """A Plan ``model`` section from a catalog name or a config.json path (anything else as it is)."""
    if isinstance(model, str):
        return {"hf_config": model} if model.endswith(".json") else {"name": model}
    return model


def hf_config_fields(path: Path, seq_len_given: bool = True) -> dict:
    """ModelSpec fields of the config.json at ``path`` (plus ``max_positions``); without
    ``seq_len_given`` (a Plan's model section), a config with no context length is refused."""
    out = hf_fields(read_config(path), path)
    if "seq_len" not in out and not seq_len_given:
        raise PlanError(f"model config {path} gives no context length (max_position_embeddings): give model.seq_len")
    return out


def hf_fields(cfg: dict, path: Path) -> dict:
    """ModelSpec fields of a parsed config.json (``path`` names it in messages); a nested
    ``text_config`` is the language model (``hf_families.language_model``)."""
    cfg, _ = language_model(cfg)
    mtype = str(cfg.get("model_type", "")).lower()

    def pick(*keys):
        return next((cfg[k] for k in keys if cfg.get(k) is not None), None)

    max_pos = pick("max_position_embeddings", "n_positions", "n_ctx", "seq_length")
    out = {
        "name": cfg.get("_name_or_path") or path.parent.name or mtype or "hf-model",
        "layers": pick("num_hidden_layers", "n_layer"),
        "hidden": pick("hidden_size", "n_embd"),
        "heads": pick("num_attention_heads", "n_head"),
        "kv_heads": pick("num_key_value_heads", "num_attention_heads", "n_head"),
        "ffn_hidden": pick("intermediate_size", "n_inner", "ffn_dim"),
        "vocab": pick("vocab_size"),
        "seq_len": min(max_pos, DEFAULT_SEQ_LEN) if isinstance(max_pos, int) else None,
        "max_positions": max_pos,
        "kv_channels": pick("head_dim"),
        "mtp_layers": pick("num_nextn_predict_layers"),   # DeepSeek-V3's MTP modules (transformers builds none)
        "source": f"Hugging Face config {path}",
    }
    if mtype == "gpt2":
        out.update(gated_mlp=False, tied_embeddings=cfg.get("tie_word_embeddings", True),
                   position_embedding="learned", seq_len=max_pos)  # learned positions: the table's size
        if out["ffn_hidden"] is None and out["hidden"]:
            out["ffn_hidden"] = 4 * out["hidden"]  # GPT2Config: n_inner None means 4 * n_embd
    else:  # Llama, Mistral, Qwen, Gemma, DeepSeek and Phi-3 are gated and rotary; NeoX is ungated
        out.update(gated_mlp=mtype != "gpt_neox",
                   tied_embeddings=bool(cfg.get("tie_word_embeddings", mtype.startswith("gemma"))),
                   position_embedding="rope")
        if (theta := rope_theta(cfg)) is not None:
            out["rope_base"] = float(theta)
    given = [cfg[k] for k in DROPOUT_KEYS if isinstance(cfg.get(k), (int, float)) and not isinstance(cfg[k], bool)]
    out["dropout"] = float(max(given)) if given else (0.1 if mtype == "gpt2" else 0.0)
    out.update(_moe_fields(cfg, mtype))
    out.update(_window_fields(cfg, mtype))
    out.update(unconventional(block_fields(cfg, mtype, out["gated_mlp"], path), mtype != "gpt2", out["gated_mlp"]))
    if cfg.get("kv_lora_rank"):
        out.update(_mla_fields(cfg))
    out["linear_attention"] = linear_attention.hf_section(cfg, mtype in HYBRID_LINEAR)
    out["sparse_attention"] = sparse_attention.hf_section(cfg)
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if out[k] is None]
    if missing:
        raise PlanError(f"model config {path} lacks the field for model.{missing[0]}")
    refuse_unstated(cfg, mtype, path)
    return {k: v for k, v in out.items() if v is not None}   # no seq_len without a context: the caller's


def block_fields(cfg: dict, mtype: str, gated: bool, path: Path) -> dict:
    """The block's norm, biases, MLP activation, QK norm and sinks (``simcore.plan.model_props``) as
    the family's modeling code builds them, or PlanError naming the field the Plan cannot state."""
    def refuse(key, why):
        return PlanError(f"model config {path}: {key}={cfg.get(key)} {why}, which the plan's model cannot state")
    out = {"norm": "layernorm" if mtype in LAYERNORM_TYPES else "rmsnorm",
           "qk_norm": QK_NORM_TYPES.get(mtype, "none"), "attention_sinks": mtype == "gpt_oss"}
    if mtype == "llama4_text" and cfg.get("use_qk_norm", True):   # Llama4TextConfig's default; Llama4TextL2Norm
        out["qk_norm"] = "l2"
    attn, mlp = bool(cfg.get("attention_bias", mtype in ("gpt_neox", "gpt_oss"))), bool(cfg.get("mlp_bias"))
    if mtype in ("gpt2", "gpt_neox", "gpt_oss"):   # their MLPs (experts) are always biased
        if not attn and mtype != "gpt2":
            raise refuse("attention_bias", "leaves the attention unbiased beside a biased MLP")
        out["bias"] = "all"
    elif mtype in ("qwen2", "qwen2_moe"):   # Qwen2Attention: q, k, v biased, o not
        out["bias"] = "qkv" if cfg.get("qkv_bias", True) else "none"
    elif mtype in ("glm4", "glm4_moe") and not mlp:   # Glm4(Moe)Attention: attention_bias on q, k, v; o_proj never
        out["bias"] = "qkv" if attn else "none"
    elif mlp and not attn:
        raise refuse("mlp_bias", "biases the MLP alone")
    elif attn and cfg.get("kv_lora_rank"):
        raise refuse("attention_bias", "biases multi-latent attention's down-projections")
    else:
        out["bias"] = "all" if mlp else "attention" if attn else "none"
    act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or cfg.get("activation_function")
              or ACT_DEFAULTS.get(mtype, "silu"))
    key = next((k for k in ("hidden_activation", "hidden_act", "activation_function") if cfg.get(k)), "hidden_act")
    if mtype == "gpt_oss":   # GptOssExperts._apply_gate: its own clamped GLU, whatever hidden_act says
        if (cfg.get("swiglu_alpha", 1.702), cfg.get("swiglu_limit", 7.0)) != (1.702, 7.0):
            raise refuse("swiglu_limit", f"with swiglu_alpha={cfg.get('swiglu_alpha')} is a GLU other than GPT-OSS's")
        out["activation"] = "oss_glu"
    elif gated and act in ("silu", "swish") or not gated and act in ("relu", "relu2"):
        out["activation"] = {"silu": "swiglu", "swish": "swiglu", "relu": "relu", "relu2": "squared_relu"}[act]
    elif act in GELUS:
        out["activation"] = "geglu" if gated else "gelu"
    else:
        raise refuse(key, f"is an {'gated ' if gated else ''}MLP activation")
    return out


def _window_fields(cfg: dict, mtype: str) -> dict:
    """Sliding-window attention: ``sliding_window`` tokens on the layers ``layer_types`` marks
    ``sliding_attention`` (transformers' newer configs); else Gemma 2's alternation, Gemma 3's
    ``sliding_window_pattern`` (one global layer in that many), Qwen's ``use_sliding_window``
    above ``max_window_layers``, and every layer where a config names a window alone (Mistral
    7B v0.1, Phi-3: ``modeling_mistral``/``modeling_phi3`` window every layer)."""
    window, layers = cfg.get("sliding_window"), cfg.get("num_hidden_layers") or 0
    if not isinstance(window, int) or window <= 0 or cfg.get("use_sliding_window") is False or not layers:
        return {}
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        share = sum(t == "sliding_attention" for t in types) / len(types)
    elif mtype.startswith("gemma3"):
        pattern = int(cfg.get("sliding_window_pattern") or 6)
        share = (pattern - 1) / pattern
    elif mtype.startswith("gemma2"):
        share = 0.5
    elif cfg.get("use_sliding_window"):
        share = max(0, layers - int(cfg.get("max_window_layers") or 0)) / layers
    else:
        share = 1.0
    return {"sliding_window": window, "sliding_window_layers": share} if share > 0 else {}


def _moe_fields(cfg: dict, mtype: str) -> dict:
    """Experts, their width, shared experts and the dense layers of an MoE config.

    Mixtral's experts are ``intermediate_size`` wide; Qwen2-MoE's and DeepSeek's are
    ``moe_intermediate_size`` wide and their ``intermediate_size`` is the dense MLP's.
    Qwen2-MoE (modeling_qwen2_moe.py, Qwen2MoeDecoderLayer) makes layer i sparse when i is
    not in ``mlp_only_layers`` and (i + 1) % ``decoder_sparse_step`` == 0; DeepSeek
    (modeling_deepseek_v3.py) when i >= ``first_k_dense_replace``.
    """
    out, dense = moe_layout(cfg, mtype)
    layers = cfg.get("num_hidden_layers") or 0
    if dense is not None:
        return out | _dense_layers(dense, layers) if out else {}
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    if not experts:
        return {}
    out = {"experts": experts, "top_k": cfg.get("num_experts_per_tok") or cfg.get("top_k_experts") or 0}
    expert_width = cfg.get("moe_intermediate_size")
    if expert_width:
        out["ffn_hidden"], out["dense_ffn_hidden"] = expert_width, cfg.get("intermediate_size")
    shared = cfg.get("shared_expert_intermediate_size") or 0
    if cfg.get("n_shared_experts"):
        shared = cfg["n_shared_experts"] * (expert_width or cfg.get("intermediate_size"))
    if shared:
        out["shared_ffn_hidden"] = shared
    if cfg.get("first_k_dense_replace") is not None:
        dense = list(range(cfg["first_k_dense_replace"]))
    else:
        step = cfg.get("decoder_sparse_step") or 1
        only = set(cfg.get("mlp_only_layers") or [])
        dense = [i for i in range(layers) if i in only or (i + 1) % step]
    return out | _dense_layers(dense, layers)


def _dense_layers(dense: list[int], layers: int) -> dict:
    """``dense_layers`` for dense layers that are the first ones; else the MoE layers' indices
    (``moe_layers``: Llama 4 Maverick's alternate layers, Qwen2-MoE's sparse step)."""
    if dense == list(range(len(dense))):
        return {"dense_layers": len(dense)} if dense else {}
    gone = set(dense)
    return {"moe_layers": [i for i in range(layers) if i not in gone]}


def _mla_fields(cfg: dict) -> dict:
    """Multi-latent attention (DeepSeek-V2, arXiv 2405.04434, Sec. 2.1): each head's query
    and key have a non-rotary part (qk_nope_head_dim) and a rotary part (qk_rope_head_dim)."""
    return {"kv_lora_rank": cfg["kv_lora_rank"], "q_lora_rank": cfg.get("q_lora_rank") or 0,
            "kv_channels": cfg.get("qk_nope_head_dim"), "qk_rope_head_dim": cfg.get("qk_rope_head_dim"),
            "v_head_dim": cfg.get("v_head_dim"), "kv_heads": cfg.get("num_attention_heads")}


def hf_import_notes(path) -> list[str]:
    """Lines the importer adds for a wrapper config: the towers not modelled and the
    ``text_config`` fields not mapped (the top-level ones are the reader's ``ignored``)."""
    cfg = read_config(Path(path))
    lm, notes = language_model(cfg)
    if lm.get("model_type") == "gemma4_text" and (share := global_attention_share(lm)):
        full = sum(t == "full_attention" for t in lm.get("layer_types") or [])
        notes.append(f"priced with the sliding layers' attention shape: the {full} full-attention layers' "
                     f"global_head_dim={lm.get('global_head_dim')}, num_global_key_value_heads="
                     f"{lm.get('num_global_key_value_heads')}, attention_k_eq_v={lm.get('attention_k_eq_v')} "
                     f"(they hold {abs(share):.2%} {'more' if share > 0 else 'fewer'} parameters than priced; their attention "
                     "FLOPs and KV cache differ alike)")
    if lm.get("model_type") in SANDWICH_NORM_TYPES:   # Gemma2DecoderLayer's pre_/post_feedforward_layernorm
        extra = 2 * int(lm.get("num_hidden_layers") or 0) * int(lm.get("hidden_size") or 0)
        notes.append(f"not modelled: the pre- and post-feedforward RMSNorms of every layer ({extra:,} parameters, "
                     "and their elementwise kernels): the plan's block has two norms a layer")
    text = cfg.get("text_config")
    if isinstance(text, dict):
        dropped = not_mapped(text)
        if dropped:
            notes.append(f"not mapped to the plan: text_config: {', '.join(dropped)}")
    return notes
