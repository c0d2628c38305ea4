"""The transformer block's properties (``simcore.plan.model_props``) as Megatron-LM's options, both
ways: ``block_args`` and ``activation_args`` for the export, ``read_block`` for the import, each the
other's inverse (tests/plan/test_model_props.py round-trips every value). The options are those of
NVIDIA/Megatron-LM@d98e8a64 (``megatron_args.yaml``) as megatron/training/argument_utils.py
``core_transformer_config_from_args`` and arguments.py ``validate_args`` turn them into the
TransformerConfig: --normalization (default LayerNorm), every linear layer biased unless
--disable-bias-linear (--add-qkv-bias then restores q, k, v), --swiglu / --quick-geglu / --squared-relu
(default F.gelu), --qk-layernorm (a norm of the model's kind over each head; with multi-latent attention
the q/kv latent norms), --qk-l2-norm, --softmax-type learnable (``softmax_offset``, one per head).
"""
from __future__ import annotations

from simcore.plan.spec import PlanError


def refuse(field_: str, value, why: str) -> ValueError:
    return ValueError(f"{field_}={value} has no Megatron-LM option: {why}")


#: The activations' options (argument_utils.py ``core_transformer_config_from_args`` @d98e8a64); GPT-OSS's
#: is quick-GeGLU with the up branch offset by 1 and both clamped at 7 (mlp.py, transformer_config.py).
_ACTIVATIONS = {"swiglu": [("--swiglu", None)], "quick_geglu": [("--quick-geglu", None)],
                "oss_glu": [("--quick-geglu", None), ("--glu-linear-offset", 1.0), ("--activation-func-clamp-value", 7.0)],
                "squared_relu": [("--squared-relu", None)], "gelu": []}


def block_args(m) -> list:
    """--normalization, the biases, QK norm and sinks (the activation is ``_ACTIVATIONS``'), or the
    refusal naming the field Megatron has no option for."""
    if m.bias.value == "attention":
        raise refuse("model.bias", "attention", "--disable-bias-linear drops every linear bias and "
                     "--add-qkv-bias restores q, k and v only, never the output projection alone")
    if m.qk_norm.value == "projection":
        raise refuse("model.qk_norm", "projection", "--qk-layernorm normalizes each head, not the whole projection")
    if m.mla and m.qk_norm.value != "none":
        raise refuse("model.qk_norm", m.qk_norm.value, "with multi-latent attention --qk-layernorm is the latent norms")
    args = [("--normalization", "RMSNorm")] if m.norm.value == "rmsnorm" else []
    args += {"none": [("--disable-bias-linear", None)], "qkv": [("--disable-bias-linear", None), ("--add-qkv-bias", None)],
             "all": []}[m.bias.value]
    if m.qk_norm.value != "none" or m.mla:   # MLA's q/kv latent norms are Megatron's qk_layernorm
        args.append(("--qk-l2-norm" if m.qk_norm.value == "l2" else "--qk-layernorm", None))
    return args + ([("--softmax-type", "learnable")] if m.attention_sinks else [])


def activation_args(m) -> list:
    """The MLP activation's options, or the refusal naming ``model.activation``."""
    if m.activation.value not in _ACTIVATIONS:
        raise refuse("model.activation", m.activation.value, "its activations are --swiglu, --quick-geglu "
                     "(x*sigmoid(1.702x) gated, not GeLU), --squared-relu and GeLU (its default)")
    return _ACTIVATIONS[m.activation.value]


def read_block(a: _Args, mla: bool) -> dict:
    """The block's properties (``simcore.plan.model_props``) as Megatron builds them from its options
    (argument_utils.py ``core_transformer_config_from_args``, arguments.py ``validate_args``: without
    --disable-bias-linear every linear layer is biased @d98e8a64); the inverse of ``megatron_writer._block_args``.
    Off-by-one softmax (a fixed sink, no parameter) is left unread: the importer lists it as not mapped."""
    norm = a.value("--normalization", str) or "LayerNorm"
    out = {"norm": norm.lower(), "bias": "all", "qk_norm": "none", "attention_sinks": False}
    if a.flag("--disable-bias-linear"):
        out["bias"] = "qkv" if a.flag("--add-qkv-bias") else "none"
    else:
        a.flag("--add-qkv-bias")   # implied by the biases (validate_args keeps add_qkv_bias in sync)
    if a.flag("--qk-l2-norm"):
        out["qk_norm"] = "l2"
    if a.flag("--qk-layernorm") and not mla:   # with MLA: the latent norms, the Plan's MLA counts them
        out["qk_norm"] = "head"
    if a.opts.get("--softmax-type") in (["vanilla"], ["learnable"]):
        out["attention_sinks"] = a.value("--softmax-type", str) == "learnable"
    offset, clamp = a.value("--glu-linear-offset", float), a.value("--activation-func-clamp-value", float)
    if a.flag("--squared-relu"):
        out["activation"] = "squared_relu"
    elif a.flag("--swiglu"):
        out["activation"] = "swiglu"
    elif a.flag("--quick-geglu"):
        out["activation"] = "oss_glu" if (offset, clamp) == (1.0, 7.0) else "quick_geglu"
    else:
        out["activation"] = "gelu"
    if (offset or clamp) and out["activation"] != "oss_glu":
        raise PlanError(f"megatron --glu-linear-offset={offset} --activation-func-clamp-value={clamp}: only GPT-OSS's "
                        "(1.0 and 7.0 with --quick-geglu) has a model.activation equivalent (oss_glu)")
    return out
