"""The transformer block's properties beside its shapes (plan keys ``model.norm``, ``model.bias``,
``model.activation``, ``model.qk_norm``, ``model.attention_sinks``): what an import reads from a
config and an export must build, so that neither builds a different model unsaid (issue 55).

Unset, each takes the convention the Plan had before it had these fields, which every existing
Plan keeps: rotary models as Llama (RMSNorm, no linear biases, SwiGLU where ``gated_mlp``), learned
positions as GPT-2/3 and Megatron-LM's defaults (LayerNorm, every linear layer biased, GeLU, or
SwiGLU where gated); no QK norm, no sinks. The names are those the configs use: Hugging Face
``hidden_act``/``hidden_activation`` with a gated MLP, ``attention_bias``/``mlp_bias``/``qkv_bias``,
``q_norm``/``k_norm``, GPT-OSS's ``sinks`` (transformers 5.24.0 modeling_<family>.py); Megatron-LM's
--normalization, --disable-bias-linear, --add-qkv-bias, --swiglu, --quick-geglu, --squared-relu,
--qk-layernorm, --qk-l2-norm, --softmax-type (NVIDIA/Megatron-LM@d98e8a64
megatron/training/argument_utils.py ``core_transformer_config_from_args``, arguments.py).
The parameters they add are ``simcore.model.params``'; the exports' options ``megatron_writer``.
"""
from __future__ import annotations

from simcore.plan.choices import PlanError, _Choice


class Norm(_Choice):
    """The block's norms: RMSNorm (a scale per channel) or LayerNorm (a scale and a shift)."""

    RMSNORM = "rmsnorm"
    LAYERNORM = "layernorm"


class Bias(_Choice):
    """Which linear layers carry a bias: none; the query/key/value projections (Qwen2, Megatron
    --disable-bias-linear --add-qkv-bias); the attention's four projections (Llama's
    ``attention_bias`` without ``mlp_bias``); all, the MLP's (and experts') too (GPT-2, GPT-NeoX,
    GPT-OSS, Megatron's default)."""

    NONE = "none"
    QKV = "qkv"
    ATTENTION = "attention"
    ALL = "all"


class Activation(_Choice):
    """The MLP's activation. Gated (three matrices, ``gated_mlp``): SwiGLU (silu), GeGLU (GeLU, as
    Gemma's ``gelu_pytorch_tanh``), quick-GeGLU (x * sigmoid(1.702 x), Megatron --quick-geglu) and
    GPT-OSS's clamped form of it (gate and up clamped at 7, the up branch offset by 1). Ungated:
    GeLU, ReLU, squared ReLU (Megatron --squared-relu, Hugging Face ``relu2``)."""

    SWIGLU = "swiglu"
    GEGLU = "geglu"
    QUICK_GEGLU = "quick_geglu"
    OSS_GLU = "oss_glu"
    GELU = "gelu"
    RELU = "relu"
    SQUARED_RELU = "squared_relu"


GATED = (Activation.SWIGLU, Activation.GEGLU, Activation.QUICK_GEGLU, Activation.OSS_GLU)


class QkNorm(_Choice):
    """A norm on queries and keys before the scores: none; ``head``, a learned norm of the model's
    kind over each head's width (Qwen3, Gemma 3, Megatron --qk-layernorm); ``projection``, over the
    whole query and key projections (OLMo 2's q_norm/k_norm); ``l2``, parameter-free (Llama 4's
    ``use_qk_norm``, Megatron --qk-l2-norm)."""

    NONE = "none"
    HEAD = "head"
    PROJECTION = "projection"
    L2 = "l2"


#: The fields this module owns, in the order a Plan document writes them.
FIELDS = ("norm", "bias", "activation", "qk_norm", "attention_sinks")


def conventions(rope: bool, gated: bool) -> dict:
    """The values an unset field takes: the Plan's convention before these fields existed."""
    return {"norm": Norm.RMSNORM if rope else Norm.LAYERNORM, "bias": Bias.NONE if rope else Bias.ALL,
            "activation": Activation.SWIGLU if gated else Activation.GELU, "qk_norm": QkNorm.NONE,
            "attention_sinks": False}


def resolve(m) -> None:
    """Fill a new ModelSpec's unset (None) fields with ``conventions`` (its ``__post_init__``)."""
    for key, value in conventions(m.position_embedding == "rope", m.gated_mlp).items():
        if getattr(m, key) is None:
            object.__setattr__(m, key, value)


def parse(doc: dict) -> dict:
    """The five fields of a Plan's model section (None: the convention), or PlanError in one
    sentence: an unknown value, or an activation that disagrees with ``gated_mlp``."""
    out = {key: cls.parse(doc[key], f"model.{key}") if doc.get(key) is not None else None
           for key, cls in (("norm", Norm), ("bias", Bias), ("activation", Activation), ("qk_norm", QkNorm))}
    sinks = doc.get("attention_sinks", False)
    if not isinstance(sinks, bool):
        raise PlanError(f"model.attention_sinks must be true or false, got {sinks!r}")
    act, gated = out["activation"], doc.get("gated_mlp", False)
    if act is not None and (act in GATED) != bool(gated):
        raise PlanError(f"model.activation={act.value} is {'' if act in GATED else 'not '}a gated activation but "
                        f"model.gated_mlp={'true' if gated else 'false'} (gated: "
                        f"{', '.join(a.value for a in GATED)})")
    return out | {"attention_sinks": sinks}


def defaults(m) -> dict:
    """The fields' values as a written document holds them where ``m`` keeps its convention
    (``plan_to_dict`` leaves those out)."""
    return {k: getattr(v, "value", v) for k, v in
            conventions(m.position_embedding == "rope", m.gated_mlp).items()}


def unconventional(fields: dict, rope: bool, gated: bool) -> dict:
    """Of an import's block fields, those that differ from the convention (the rest stay unset, so an
    imported document names only what sets the model apart)."""
    conv = {k: getattr(v, "value", v) for k, v in conventions(rope, gated).items()}
    return {k: v for k, v in fields.items() if v != conv[k]}
