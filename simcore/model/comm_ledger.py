"""The bytes the model charges per step, per mesh axis and collective kind, on one rank.

``step_costs`` prices each collective from its size (``collectives.py``); this ledger
states the same sizes and counts, from the same helpers, as bytes: the whole buffer of each
call (all-gather output, reduce-scatter input, the all-reduced tensor, a send's message),
as ``simcore.model.collective_plan`` counts the calls the executor issues. Both engines
read one ``StepCosts``, so the ledger is what the analytic path and the event engine charge;
``tests/model/test_comm_ledger.py`` holds it against the executor's list, each difference
between the two stacks named there.

Modelled stacks: Megatron-Core's TP/SP/CP/EP and pipeline, ZeRO/FSDP2 as ``dp_costs``
prices them. Not covered (ValueError): folded expert TP, DeepEP's dispatch, the all-gather
and all-to-all context-parallel variants, DeepSpeed's ZeRO.
"""
from __future__ import annotations

import math
from collections import Counter

from simcore.model import collectives as coll
from simcore.model import ddp_hooks as hooks
from simcore.model import dsa
from simcore.model import dp_costs as dpm
from simcore.model import end_comm as ec
from simcore.model import int8_scatter as i8
from simcore.model import kv_replication as kvr
from simcore.model import memory as mem
from simcore.model import moe_layers as ml
from simcore.model import recompute as rcp
from simcore.model import workload as wl
from simcore.model.layout_calls import grad_axis
from simcore.model.schedules import Op, add_communication, build_schedule
from simcore.plan.rules import int8_scatters
from simcore.plan.spec import CpComm, MoeDispatcher, Plan, ZeroImpl, ZeroStage


def _check(plan: Plan) -> None:
    par = plan.parallel
    rules = [(par.etp == par.tp, "parallel.expert_tp"), (par.moe_dispatcher == MoeDispatcher.ALLTOALL,
                                                         "parallel.moe_dispatcher=deepep"),
             (par.cp == 1 or par.cp_comm == CpComm.P2P, f"parallel.cp_comm={par.cp_comm.value}"),
             (par.zero_impl == ZeroImpl.FSDP2 or par.zero < ZeroStage.GRADIENTS, "parallel.zero_impl=deepspeed")]
    for ok, field in rules:
        if not ok:
            raise ValueError(f"{field}: the byte ledger does not cover it")


def _layer_bytes(plan: Plan, layers: int, dense: int = 0) -> Counter:
    """One micro-batch through ``layers`` layers, ``dense`` of them an MoE model's dense layers:
    TP, CP ring and EP bytes (``layer_comm.layer_comm`` and ``step_costs._layer_blocking``: the recomputed
    layers re-run their forward's)."""
    m, par, tr = plan.model, plan.parallel, plan.training
    b, s = tr.micro_batch, m.seq_len // par.cp
    act = coll.tp_act_bytes(plan)
    redo, attention = rcp.full_layers(tr, layers), rcp.recomputed_layers(tr, layers)
    out: Counter = Counter()
    if par.tp > 1:   # per forward: 2 all-reduces, or under SP 2 all-gathers and 2 reduce-scatters;
        # the backward mirrors them, a recomputed layer's forward repeats them, and per-op SAC
        # and dots repeat those they do not save
        size = coll.tp_call_bytes(plan)   # the all-gathers in FP8 under TE
        for kind in ("all_gather", "reduce_scatter") if par.sequence_parallel else ("all_reduce",):
            out["tp", kind] += 2 * size[kind] * (2 * layers + redo)
        for kind, n in rcp.tp_reruns(tr.recompute, par.sequence_parallel).items():
            out["tp", kind] += n * size[kind] * layers
        out["tp", "all_reduce"] += dsa.loss_all_reduce_bytes(m, b, s) * (2 * layers + redo)   # DSA's indexer loss
    if par.cp > 1:   # forward K/V; backward K/V and dK/dV; K/V again where the attention is recomputed
        kv = 2 * coll.comm_act_bytes(tr.precision) * b * s * wl.kv_width(m) / par.tp
        out["cp", "send"] += (par.cp - 1) * kv * (3 * layers + attention)
    if m.moe and par.ep > 1 and layers > dense:   # dispatch and combine each way (every MoE layer)
        routed = act * m.top_k * m.capacity_factor / (par.tp if par.sequence_parallel else 1)
        out["ep", "all_to_all"] += 2 * routed * (layers - dense) * (2 + redo / layers)
    return out


def _pp_sends(plan: Plan, pp_rank: int) -> int:
    """Sends per step of pipeline rank ``pp_rank`` (activations forward, gradients backward)."""
    par = plan.parallel
    if par.pp == 1:
        return 0
    schedule = build_schedule(par.schedule, par.pp, plan.num_microbatches, par.vpp, par.microbatch_group)
    return sum(a.op in (Op.SEND_F, Op.SEND_B) for a in add_communication(schedule, par.pp, par.vpp)[pp_rank])


def step_bytes(plan: Plan, pp_rank: int = 0) -> Counter:
    """(axis, kind) -> bytes per step that the model charges on pipeline rank ``pp_rank`` (replicated
    key/value heads: the model NxD builds and its kv shared group's all-reduces, ``kv_replication``)."""
    plan, replicated = kvr.as_run(plan), plan
    _check(plan)
    m, par, tr = plan.model, plan.parallel, plan.training
    stages = plan.layers_per_stage
    mine = par.rank_stages(pp_rank) if par.pp > 1 else (0,)   # virtual stage v on rank v % pp, or the V
    mbs = plan.num_microbatches
    dense = ml.stage_dense_layers(m, stages)
    out: Counter = Counter()
    for v in mine:
        for key, n in _layer_bytes(plan, stages[v], dense[v]).items():
            out[key] += n * mbs
        out[kvr.KV_AXIS, "all_reduce"] += kvr.sync_bytes(replicated) * stages[v] * mbs
    (embed, head), end = ec.tp_end_calls(plan), coll.tp_act_bytes(plan)
    for side, holds in ((embed, 0 in mine), (head, len(stages) - 1 in mine)):
        for kind in (k for kinds in side for k in kinds) if holds else ():
            out["tp", kind] += end * mbs
    if len(stages) - 1 in mine:   # the vocabulary-parallel loss
        out["tp", "all_reduce"] += ec.LOSS_ALL_REDUCES * ec.tp_loss_bytes(plan) * mbs
    if par.pp > 1:   # Megatron's scatter/gather: each TP rank sends 1/tp of the activation
        act = coll.comm_act_bytes(tr.precision) * tr.micro_batch * (m.seq_len // par.cp) * m.hidden / par.tp
        out["pp", "send"] += act * _pp_sends(plan, pp_rank)
    out.update(_dp_bytes(plan, pp_rank, mine))
    if ec.tied_bytes(plan) and (0 in mine or len(stages) - 1 in mine):
        out["pp", "all_reduce"] += ec.tied_bytes(plan)
    return +out


def _dp_bytes(plan: Plan, pp_rank: int, mine: range) -> Counter:
    """The data-parallel wrappers' bytes (``dp_costs.dp_costs`` and ``end_comm``'s root group)."""
    par, tr = plan.parallel, plan.training
    nd = par.dp * par.cp
    out: Counter = Counter()
    if nd == 1:
        return out
    axis = grad_axis(plan)   # dp, cp where dp is 1; the shard group under hybrid sharding
    sp = mem.stage_params(plan)[pp_rank]
    wb, gb = mem.param_bytes(tr), coll.grad_wire_bytes(plan)
    # the experts' gradients over the expert data-parallel ranks (the executor's group name: dp), if several
    expert_axis = "dp" if nd // par.ep > 1 else None
    dense_l, expert_l = mem.layer_params_per_gpu(plan)
    replicated = 0.0   # HSDP under int8: the fp32 shards' bytes FSDP2 all-reduces over the replicas

    def add(kind: str, dense: float, expert: float) -> None:
        out[axis, kind] += dense
        if expert_axis:
            out[expert_axis, kind] += expert

    if par.zero == ZeroStage.NONE and tr.grad_compression.bits and not sp.expert:
        # the int8 hook (``ddp_hooks``): an all-to-all and an all-gather a DDP bucket, as dp_costs prices them
        shapes = dpm.grad_shapes(plan, sp, sum(mem.layer_params_per_gpu(plan)), exact=True)
        for members in hooks.bucket_members([hooks.FP32 * math.prod(s) for s in shapes]):
            for kind, nbytes in hooks.bucket_collectives(tr.grad_compression.value, [shapes[i] for i in members], 1,
                                                            hooks.FP32, nd):
                out[axis, kind] += nbytes
    elif par.zero == ZeroStage.NONE:
        add("all_reduce", gb * sp.dense, gb * sp.expert)
    elif par.zero == ZeroStage.OPTIMIZER_STATES:
        add("reduce_scatter", gb * sp.dense, gb * sp.expert)
        add("all_gather", *(mem.stored_weight_bytes(plan, n, e) for n, e in ((sp.dense, sp.ends), (sp.expert, 0.0))))
    else:
        calls = dpm.fsdp_calls(plan, len(plan.layers_per_stage))
        flat = mem.layer_params_per_gpu(ml.dense_plan(plan))[0]   # an MoE model's dense layer
        dense = ml.stage_dense_layers(plan.model, plan.layers_per_stage)
        for v in mine:
            f_ag, b_ag, scatters = calls[v]
            n, d = plan.layers_per_stage[v] - dense[v], dense[v]   # MoE (or all) layers, dense layers
            add("all_gather", wb * (dense_l * n + flat * d) * (f_ag + b_ag), wb * expert_l * (f_ag + b_ag) * n)
            if int8_scatters(plan):   # FSDP2's int8 reduce-scatter: an all-to-all a block (no experts: the rule)
                bits = tr.grad_compression.bits
                out[axis, "all_to_all"] += (i8.call_bytes(dense_l + expert_l, par.shard_ranks, bits) * n
                                            + (i8.call_bytes(flat, par.shard_ranks, bits) * d if d else 0)) * scatters
                replicated += gb * (dense_l * n + flat * d) * scatters   # HSDP: the fp32 shard all-reduced
            else:
                add("reduce_scatter", gb * (dense_l * n + flat * d) * scatters, gb * expert_l * scatters * n)
        ag, rs = ec.fsdp_root_bytes(plan, sp)
        f_ag, b_ag, scatters = calls[pp_rank]
        out[axis, "all_gather"] += ag * (f_ag + b_ag)
        if int8_scatters(plan):
            out[axis, "all_to_all"] += (i8.call_bytes(sp.ends, par.shard_ranks, tr.grad_compression.bits)
                                        if sp.ends > 0 else 0) * scatters
            replicated += rs * scatters
        else:
            out[axis, "reduce_scatter"] += rs * scatters
    if par.dp_replicate > 1:   # hybrid sharding: each reduce-scattered shard all-reduced over the replicas
        out["dp_replicate", "all_reduce"] += (out[axis, "reduce_scatter"] + replicated) / par.shard_ranks
    return out
