"""Hybrid linear attention (plan key ``model.linear_attention``): which layers are Gated DeltaNet
layers and their widths, and the full-attention layers' output gate.

Qwen3-Next and Qwen3.5 (transformers ``modeling_qwen3_next.py``, ``modeling_qwen3_5.py``)
interleave Gated DeltaNet layers (Yang, Kautz, Hatamizadeh, "Gated Delta Networks: Improving
Mamba2 with Delta Rule", ICLR 2025, arXiv 2412.06464) with gated softmax-attention layers:
``layer_types`` names each layer ``linear_attention`` or ``full_attention`` (by default three
linear in four: ``full_attention_interval`` 4, ``Qwen3NextConfig.__post_init__``). A linear layer
is ``Qwen3NextGatedDeltaNet``: an input projection to q, k (``num_key_heads`` x ``key_head_dim``),
v and the output gate z (``num_value_heads`` x ``value_head_dim``), b and a (one per value head),
a depthwise causal convolution of ``conv_kernel_dim`` taps over q, k, v, the chunked gated delta
rule, a gated RMSNorm of ``value_head_dim`` and the output projection; ``A_log`` and ``dt_bias``
one per value head. The full-attention layers' ``attn_output_gate`` doubles the query
projection (a sigmoid gate per query channel on the attention output). Megatron-LM builds the
same layer (megatron/core/ssm/gated_delta_net.py @00caa53a ``GatedDeltaNet``; its options
--experimental-attention-variant gated_delta_net, --linear-attention-freq, --linear-num-key-heads,
... and --attention-output-gate are in megatron_args.yaml).

This module holds the value, its parsing from a Plan document and its rules; the FLOPs, bytes
and parameters are ``simcore.model.gdn`` and ``simcore.model.linear_attention``.
"""
from __future__ import annotations

from dataclasses import dataclass

from simcore.plan.choices import PlanError

#: The section's keys besides ``layers`` (the integers) and ``attn_output_gate``.
WIDTHS = ("num_key_heads", "num_value_heads", "key_head_dim", "value_head_dim", "conv_kernel_dim")

#: ``Qwen3NextConfig``, ``Qwen3_5TextConfig`` and ``Qwen3_5MoeTextConfig`` defaults of the linear
#: layers' widths (transformers 5.24.0 configuration_qwen3_next.py and its Qwen3.5 siblings).
HF_DEFAULTS = {"num_key_heads": 16, "num_value_heads": 32, "key_head_dim": 128, "value_head_dim": 128,
               "conv_kernel_dim": 4}


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearAttention:
    """Gated DeltaNet layers of a hybrid model and its full-attention layers' output gate."""

    layers: tuple[int, ...] = ()
    """Indices of the Gated DeltaNet layers (Hugging Face ``layer_types`` == ``linear_attention``)."""
    num_key_heads: int = 0
    num_value_heads: int = 0
    key_head_dim: int = 0
    value_head_dim: int = 0
    conv_kernel_dim: int = 0
    """Hugging Face ``linear_num_key_heads``, ``linear_num_value_heads``, ``linear_key_head_dim``,
    ``linear_value_head_dim``, ``linear_conv_kernel_dim`` (Megatron ``--linear-*`` alike)."""
    attn_output_gate: bool = False
    """The softmax-attention layers' sigmoid output gate (``attn_output_gate``; Qwen3-Next's always)."""

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim


def linear_share(m) -> float:
    """The share of model ``m``'s layers that are Gated DeltaNet layers (0 for softmax attention only)."""
    la = m.linear_attention
    return len(la.layers) / m.layers if la is not None and la.layers else 0.0


def output_gated(m) -> bool:
    """Whether ``m``'s softmax-attention layers gate their output (a query projection twice as wide)."""
    return m.linear_attention is not None and m.linear_attention.attn_output_gate


def parse(value) -> LinearAttention | None:
    """``model.linear_attention`` from a Plan document (None where absent), one sentence on a bad field."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PlanError(f"model.linear_attention must be a mapping of {', '.join(('layers',) + WIDTHS)}, "
                        f"attn_output_gate, got {value!r}")
    unknown = sorted(set(value) - {"layers", "attn_output_gate", *WIDTHS})
    if unknown:
        raise PlanError(f"unknown field 'model.linear_attention.{unknown[0]}' (known: layers, attn_output_gate, "
                        f"{', '.join(WIDTHS)})")
    layers = value.get("layers", [])
    if not isinstance(layers, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers):
        raise PlanError(f"model.linear_attention.layers must be a list of layer indices (integers), got {layers!r}")
    widths = {}
    for key in WIDTHS:
        v = value.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise PlanError(f"model.linear_attention.{key} must be a whole number at least 0, got {v!r}")
        widths[key] = v
    gate = value.get("attn_output_gate", False)
    if not isinstance(gate, bool):
        raise PlanError(f"model.linear_attention.attn_output_gate must be true or false, got {gate!r}")
    return LinearAttention(layers=tuple(layers), attn_output_gate=gate, **widths)


def tidy_model_doc(model: dict) -> None:
    """A written model section's lists as YAML lists: ``moe_layers`` (dropped where empty) and the
    ``linear_attention`` section (dropped where None)."""
    if model.get("moe_layers"):
        model["moe_layers"] = list(model["moe_layers"])
    else:
        model.pop("moe_layers", None)
    la = model.get("linear_attention")
    if la is None:
        model.pop("linear_attention", None)
    else:
        model["linear_attention"] = {**la, "layers": list(la["layers"])}


def rules(plan) -> list[tuple[bool, str]]:
    """The rules of a hybrid model: valid layer indices, widths where there are linear layers, TP
    splitting whole key and value heads (Megatron's ``GatedDeltaNet`` splits ``num_value_heads`` and
    the q/k heads over TP ranks), and no context parallel: Megatron-LM's GDN has none
    (gated_delta_net.py @00caa53a: "TODO: support CP"), nor does transformers' model."""
    m, par, tr = plan.model, plan.parallel, plan.training
    la = m.linear_attention
    if la is None:
        return []
    n = len(la.layers)
    return [
        (list(la.layers) == sorted(set(la.layers)) and all(0 <= i < m.layers for i in la.layers),
         f"model.linear_attention.layers must be increasing layer indices from 0 to model.layers-1={m.layers - 1}"),
        (not n or all(getattr(la, k) > 0 for k in WIDTHS),
         "model.linear_attention needs num_key_heads, num_value_heads, key_head_dim, value_head_dim and "
         "conv_kernel_dim above 0 where it lists layers"),
        (not n or la.num_value_heads % max(1, la.num_key_heads) == 0,
         f"model.linear_attention.num_key_heads={la.num_key_heads} must divide "
         f"num_value_heads={la.num_value_heads} (each key head serves a group of value heads)"),
        (not n or (la.num_key_heads % par.tp == 0 and la.num_value_heads % par.tp == 0),
         f"parallel.tp={par.tp} does not divide model.linear_attention's heads ({la.num_key_heads} key, "
         f"{la.num_value_heads} value): Megatron-LM's GatedDeltaNet splits them over the TP ranks"),
        (not n or par.cp == 1,
         f"parallel.cp={par.cp} is refused for a model with Gated DeltaNet layers: no stack runs their "
         "recurrence context-parallel (Megatron-LM's GatedDeltaNet @00caa53a has no CP), so cp must be 1"),
        (not n or tr.recompute.value != "op",
         "training.recompute=op is torchtitan's per-op SAC of its Llama-style blocks, and torchtitan has no "
         "Gated DeltaNet layer: give selective, full or layer:N"),
        (not n or tr.recompute.value != "dots",
         "training.recompute=dots is MaxText's remat policy, and MaxText has no Gated DeltaNet layer: give "
         "selective, full or layer:N"),
    ]


def hf_layers(cfg: dict) -> list[int] | None:
    """The Gated DeltaNet layers of a Hugging Face config: ``layer_types``' ``linear_attention``
    entries, else (Qwen3-Next, Qwen3.5) every layer but each ``full_attention_interval``-th
    (default 4: ``Qwen3NextConfig.__post_init__``); None where the config has no linear layers."""
    types = cfg.get("layer_types")
    layers = int(cfg.get("num_hidden_layers") or 0)
    if isinstance(types, list):
        out = [i for i, t in enumerate(types) if t == "linear_attention"]
        return out or None
    interval = int(cfg.get("full_attention_interval") or 4)
    return [i for i in range(layers) if (i + 1) % interval]


def hf_section(cfg: dict, hybrid: bool) -> dict | None:
    """``model.linear_attention`` of a Qwen3-Next / Qwen3.5 config (``hybrid``: its model type
    defaults to linear layers), or of any config whose ``layer_types`` names linear layers."""
    types = cfg.get("layer_types")
    if not hybrid and not (isinstance(types, list) and "linear_attention" in types):
        return None
    layers = hf_layers(cfg) or []
    # transformers' Qwen3NextAttention / Qwen3_5Attention build the doubled q_proj whatever the config says
    section = {"layers": layers, "attn_output_gate": hybrid or bool(cfg.get("attn_output_gate"))}
    if layers:   # a field left out takes the class default, alike in the three families
        section.update({k: cfg.get(f"linear_{k}", HF_DEFAULTS[k] if hybrid else None) for k in WIDTHS})
    return section
