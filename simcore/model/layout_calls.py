"""The collectives of context parallel, expert parallel and tied embeddings, per rank and step,
as the executor issues them (``executors/ring_attention.py``, ``executors/moe.py``,
``executors/tied.py``, ``executors/groups.py``); ``simcore.model.collective_plan`` adds them
to the data, tensor and pipeline parallel calls. Each entry is (kind, axis, bytes, issuer,
calls per step).

- Ring attention, per block and micro-batch: forward ``cp - 1`` sends (and receives) of the
  stacked K and V of this rank's tokens; backward ``cp - 1`` of K/V again and ``cp`` of
  their fp32 gradient; a recomputed attention (every policy's, ``recompute.recomputed_layers``)
  rotates K/V again.
- Expert parallel, per MoE block and micro-batch (none for an MoE model's first, dense,
  blocks): a dispatch and a combine ``all_to_all_single`` of the (experts x capacity, hidden)
  buffer forward, their transposes backward; the experts' gradients are all-reduced once per
  step over the ranks holding the same experts (expert data parallel), when there are several.
- Tied embeddings under pipelining: one all-reduce per step of the shared weight's local
  gradient between the first and the last stage (Megatron's embedding group).

Axis names are the recorder's: a group equal to a mesh axis's group takes that axis's name
(the ep group of ep == cp is the cp group), the others the name ``executors.groups`` gives.
"""
from __future__ import annotations

import math

from simcore.model.param_layout import ParamTensor, StagePart, _numel, block_params, fsdp_padded_numel, local_shape
from simcore.model.recompute import recomputed_layers
from simcore.plan.spec import Plan, ZeroImpl, ZeroStage

#: fp32: the executor's parameters and gradients, and the ring's K/V gradient buffers.
FP32_BYTES = 4


def grad_axis(plan: Plan) -> str:
    """The axis of the data-parallel gradient reduction: dp, or cp when dp is 1 (dp x cp); under
    hybrid sharding the shard group, ``dp_shard`` (torchtitan's mesh name), the replicas ``dp_replicate``."""
    par = plan.parallel
    if par.dp_replicate > 1:
        return "cp" if par.dp == par.dp_replicate else "dp_shard"
    return "cp" if par.dp == 1 and par.cp > 1 else "dp"


def ep_axis(plan: Plan) -> str:
    """The expert-parallel group's name: consecutive (dp, cp) ranks (``executors.groups``)."""
    par = plan.parallel
    if par.cp > 1 and par.ep == par.cp:
        return "cp"
    if par.cp == 1 and par.ep == par.dp:
        return "dp"
    return "ep"


def is_expert(p: ParamTensor) -> bool:
    return ".experts." in p.name


def ring_calls(plan: Plan, part: StagePart, act_bytes: int) -> list[tuple]:
    """Ring attention's sends and receives of one chunk in one step."""
    par, m, tr = plan.parallel, plan.model, plan.training
    if par.cp == 1:
        return []
    tokens = tr.micro_batch * (m.seq_len // par.cp)
    kv = 2 * tokens * (m.kv_heads // par.tp) * m.head_dim
    per_mb = len(part.layers) * plan.num_microbatches
    redo = recomputed_layers(tr, len(part.layers)) * plan.num_microbatches
    kv_sends = (par.cp - 1) * (2 * per_mb + redo)
    grad_sends = par.cp * per_mb
    out = []
    for kind in ("send", "recv"):
        out.append((kind, "cp", kv * act_bytes, "ring", kv_sends))
        out.append((kind, "cp", kv * FP32_BYTES, "ring", grad_sends))
    return out


def moe_capacity(plan: Plan) -> int:
    """Slots per expert of one MoE call (``executors.moe.capacity``)."""
    m, par, tr = plan.model, plan.parallel, plan.training
    tokens = tr.micro_batch * (m.seq_len // par.cp)
    return max(1, math.ceil(m.capacity_factor * tokens * m.top_k / m.experts))


def expert_calls(plan: Plan, part: StagePart, act_bytes: int, tp_rank: int,
                 grad_bytes: int = FP32_BYTES) -> list[tuple]:
    """Dispatch and combine all-to-alls, and the experts' gradient all-reduce (``grad_bytes`` an
    element: the executor's fp32 by default), of one chunk."""
    par, m = plan.parallel, plan.model
    moe = [i for i in part.layers if not m.is_dense_layer(i)]   # an MoE model's dense layers: no experts
    if not m.moe or par.ep == 1 or not moe:
        return []
    buf = m.experts * moe_capacity(plan) * m.hidden * act_bytes
    out = [("all_to_all", ep_axis(plan), buf, "moe", 4 * len(moe) * plan.num_microbatches)]
    edp = par.dp * par.cp // par.ep
    if edp > 1:
        experts = [p for i in moe for p in block_params(m, i) if is_expert(p)]
        numel = sum(_numel(local_shape(p, par.tp, tp_rank)) for p in experts) // par.ep   # E / ep experts each
        out.append(("all_reduce", "dp", numel * grad_bytes, "moe", 1))
    return out


def tied_calls(plan: Plan, part: StagePart, tp_rank: int, grad_bytes: int = FP32_BYTES) -> list[tuple]:
    """The embedding group's all-reduce of the tied weight's local gradient (``grad_bytes`` an
    element), on a pipeline end (none under DualPipeV, whose rank 0 holds both ends)."""
    par, m = plan.parallel, plan.model
    if not (m.tied_embeddings and par.pp > 1 and (part.embed or part.head)) or par.v_shape:
        return []
    shape = local_shape(ParamTensor(name="embed.tok.weight", shape=(m.vocab, m.hidden), tp_dim=0), par.tp, tp_rank)
    nd = par.shard_ranks
    fsdp = nd > 1 and par.zero >= ZeroStage.GRADIENTS
    numel = fsdp_padded_numel(shape, nd) // nd if fsdp else _numel(shape)
    return [("all_reduce", "pp", numel * grad_bytes, "tied", 1)]


def fp8_scale_calls(plan: Plan, part: StagePart) -> list[tuple]:
    """torchao's ``precompute_float8_dynamic_scale_for_fsdp`` after each optimizer step under
    ``training.fp8_param_gather`` with FSDP2 (ZeRO-2/3): the amax of every FP8-gathered weight of the
    part's blocks (its linear weights), stacked and all-reduced once over the shard group, fp32
    (torchao/float8/fsdp_utils.py @ v0.17.0: ``torch._foreach_norm`` of the shards, one
    ``torch.clamp`` of the Partial stack); torchtitan calls it once per model part."""
    par = plan.parallel
    if not (plan.training.fp8_param_gather and par.zero >= ZeroStage.GRADIENTS and par.zero_impl == ZeroImpl.FSDP2
            and par.shard_ranks > 1):
        return []
    linears = sum(1 for i in part.layers for p in block_params(plan.model, i) if not p.norm and not is_expert(p))
    return [("all_reduce", grad_axis(plan), linears * FP32_BYTES, "torchao", 1)] if linears else []
