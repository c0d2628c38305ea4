"""An MoE model's dense layers: which virtual stages hold them, and the dense layer itself.

``model.dense_layers`` is the first k layers of an MoE model (or, with ``model.moe_layers``,
every layer not listed there: Llama 4 Maverick's alternate layers), which run a dense MLP
(``dense_ffn_hidden``) in place of the router, the experts and their all-to-alls:
DeepSeek-V3's ``first_k_dense_replace: 3`` (its modeling_deepseek.py builds
``DeepseekV3MLP(intermediate_size)`` for ``layer_idx < first_k_dense_replace``, ``DeepseekV3MoE``
after), Megatron-Core's ``--moe-layer-freq [0]*k+[1]*(L-k)`` (``TransformerBlock`` builds a
dense ``MLP`` spec for a 0). The pipeline split is by layer index, so the stage (and, with
interleaving, the model chunk) holding the first layers holds the dense ones; interleaved
dense layers fall where their indices do.

Everything per layer (time, collectives, activations, parameters) prices a dense layer as
the layer of the same model made dense (``dense_model``): the same attention and norms, one
MLP of the dense width, no router, no experts, no expert parallel.
"""
from __future__ import annotations

import functools
from dataclasses import replace

from simcore.model.recompute import LayerActivations
from simcore.plan.spec import ModelSpec, Plan, dense_layer_mask, layer_mask, rank_sums


@functools.lru_cache(maxsize=256)
def dense_model(m: ModelSpec) -> ModelSpec:
    """The dense layer of MoE model ``m`` as a dense model's layer (``m`` itself when dense)."""
    if not m.moe:
        return m
    return replace(m, experts=0, top_k=0, capacity_factor=1.0, ffn_hidden=m.dense_ffn_hidden or m.ffn_hidden,
                   dense_layers=0, moe_layers=(), dense_ffn_hidden=0, shared_ffn_hidden=0)


def dense_plan(plan: Plan) -> Plan:
    """``plan`` with its model's dense layer in place of its MoE layer (every per-layer figure of
    the dense layers is this plan's per-layer figure)."""
    return replace(plan, model=dense_model(plan.model))


@functools.lru_cache(maxsize=1024)
def _split(dense: int, moe_layers: tuple[int, ...], layers: int, stages: tuple[int, ...]) -> tuple[int, ...]:
    """Dense layers per stage of the model whose dense layers ``spec.layer_mask`` gives."""
    mask = layer_mask(dense, moe_layers, layers)
    mask += mask[-1:] * (sum(stages) - layers)   # MTP blocks beyond the layers: the last layer's kind
    out, start = [], 0
    for n in stages:
        out.append(sum(mask[start:start + n]))
        start += n
    return tuple(out)


def stage_dense_layers(m: ModelSpec, stages: tuple[int, ...]) -> tuple[int, ...]:
    """Dense layers of each virtual stage of ``stages`` layers (model order): the first
    ``dense_layers`` of the model, or those outside ``moe_layers`` (none for a dense model,
    whose layers are all alike)."""
    if not m.moe or not (m.dense_layers or m.moe_layers):
        return (0,) * len(stages)
    return _split(m.dense_layers, m.moe_layers, m.layers, tuple(stages))


def rank_dense_layers(m: ModelSpec, stages: tuple[int, ...], pp: int, v_shape: bool = False) -> tuple[int, ...]:
    """Dense layers of each pipeline rank (virtual stage v on rank v % pp, or DualPipeV's V: ``rank_sums``)."""
    return rank_sums(stage_dense_layers(m, stages), pp, v_shape)


def moe_layers(m: ModelSpec, first: int, count: int) -> int:
    """MoE layers among layers ``first`` .. ``first + count - 1`` of the model."""
    if not m.moe:
        return 0
    return count - sum(dense_layer_mask(m)[first:first + count])


def mixed_activations(act: LayerActivations, flat: LayerActivations | None, n: float, d: float) -> LayerActivations:
    """One layer's activations in a model chunk of ``n`` layers of which ``d`` are dense: the
    mean of the MoE layer's ``act`` and the dense layer's ``flat`` over the chunk."""
    if not d or flat is None or n <= 0:
        return act
    w = min(1.0, d / n)
    return LayerActivations(whole=(1 - w) * act.whole + w * flat.whole, kept=(1 - w) * act.kept + w * flat.kept,
                            boundary=(1 - w) * act.boundary + w * flat.boundary)
