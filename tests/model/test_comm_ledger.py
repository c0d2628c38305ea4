"""The bytes the model charges per step (``simcore.model.comm_ledger``) against the calls the
executor issues (``simcore.model.collective_plan``, which tests/executors holds against the
calls recorded in real runs): per rank, mesh axis and collective kind, in fp32 and bf16 plans
of a Llama-style model (no biases, as the executor's).

The model prices Megatron-Core's stack and the executor runs torch's; each difference
between the two is named in ``_as_megatron`` and converted, and nothing else may differ.
Before it passed, the ledger found three costs the model left out (TP's embedding and head
collectives, FSDP2's root group and the tied embedding's all-reduce: ``end_comm``) and one it
charged that no stack pays (the experts' gradients reduced over every data-parallel rank)."""
from __future__ import annotations

from collections import Counter

import pytest

from simcore.model import collective_plan as cplan
from simcore.model import collectives as coll
from simcore.model import comm_ledger as ledger
from simcore.model import memory as mem
from simcore.model import recompute as rcp
from simcore.model.layout_calls import ep_axis
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import Plan, ZeroStage
from topologies.placement import rank_grid

LAYOUTS = {
    "dp2": ({"dp": 2}, {}, {}),
    "zero1-dp2": ({"dp": 2, "zero": 1}, {}, {}),
    "zero2-dp2": ({"dp": 2, "zero": 2}, {}, {}),
    "zero3-dp4": ({"dp": 4, "zero": 3}, {}, {}),
    "zero3-dp2-pp2": ({"dp": 2, "pp": 2, "zero": 3}, {}, {}),
    "zero3-dp2-pp2-interleaved": ({"dp": 2, "pp": 2, "vpp": 2, "zero": 3, "schedule": "interleaved-1f1b"}, {}, {}),
    "tp2": ({"tp": 2}, {}, {}),
    "dp2-tp2": ({"dp": 2, "tp": 2}, {}, {}),                 # replicate: one all-reduce per step, as DDP
    "zero3-dp2-tp2-sp": ({"dp": 2, "tp": 2, "zero": 3, "sequence_parallel": True}, {}, {}),
    "tp4-sp": ({"tp": 4, "sequence_parallel": True}, {}, {}),
    "tp2-full-recompute": ({"tp": 2}, {}, {"recompute": "full"}),
    "tp2-sp-layer2": ({"tp": 2, "sequence_parallel": True}, {}, {"recompute": "layer:2"}),
    "tp2-op": ({"tp": 2}, {}, {"recompute": "op"}),
    "tp4-sp-op": ({"tp": 4, "sequence_parallel": True}, {}, {"recompute": "op"}),
    "tp4-sp-dots": ({"tp": 4, "sequence_parallel": True}, {}, {"recompute": "dots"}),
    "cp2-tp2-dots": ({"cp": 2, "tp": 2}, {}, {"recompute": "dots"}),
    "cp2-selective": ({"cp": 2}, {}, {"recompute": "selective"}),
    "cp2-tp2-op": ({"cp": 2, "tp": 2}, {}, {"recompute": "op"}),
    "ep2-dp2-op": ({"dp": 2, "ep": 2}, {"experts": 4, "top_k": 2}, {"recompute": "op"}),
    "pp2-1f1b": ({"pp": 2}, {}, {}),
    "pp4-interleaved": ({"pp": 4, "vpp": 2, "schedule": "interleaved-1f1b"}, {"layers": 8}, {}),
    "tp2-pp2": ({"tp": 2, "pp": 2}, {}, {}),
    "tp2-sp-pp2": ({"tp": 2, "pp": 2, "sequence_parallel": True}, {}, {}),
    "cp2": ({"cp": 2}, {}, {}),
    "cp2-dp2-zero3": ({"cp": 2, "dp": 2, "zero": 3}, {}, {}),
    "ep2-dp2": ({"dp": 2, "ep": 2}, {"experts": 4, "top_k": 2}, {}),
    "ep2-dp4": ({"dp": 4, "ep": 2}, {"experts": 4, "top_k": 2}, {}),
    # an MoE model's first layer dense (DeepSeek's first_k_dense_replace): no all-to-all, a dense MLP's gathers
    "ep2-dp2-dense1": ({"dp": 2, "ep": 2}, {"experts": 4, "top_k": 2, "dense_layers": 1, "dense_ffn_hidden": 384}, {}),
    "ep2-dp4-pp2-zero1-dense3": ({"dp": 4, "ep": 2, "pp": 2, "zero": 1},
                                 {"experts": 4, "top_k": 2, "dense_layers": 3, "dense_ffn_hidden": 384}, {}),
    "tied-pp2": ({"pp": 2}, {"tied_embeddings": True}, {}),
    "tied-pp2-dp2-zero3": ({"pp": 2, "dp": 2, "zero": 3}, {"tied_embeddings": True}, {}),
    # the int8 hook: an all-to-all and an all-gather of int8 and scales a DDP bucket, over 2 and 4 ranks
    "dp2-int8": ({"dp": 2}, {}, {"grad_compression": "int8"}),
    "dp4-int8-big": ({"dp": 4}, {"hidden": 512, "layers": 8, "ffn_hidden": 2048}, {"grad_compression": "int8"}),
    "dp2-pp2-int8-big": ({"dp": 2, "pp": 2}, {"hidden": 512, "layers": 8, "ffn_hidden": 2048},
                         {"grad_compression": "int8"}),
    "dp2-int8-tied": ({"dp": 2}, {"tied_embeddings": True}, {"grad_compression": "int8"}),
    # FSDP2's int8 reduce-scatter: an all-to-all a group (blocks and the root), ZeRO-2 and 3, with pipelining
    "zero2-dp2-int8": ({"dp": 2, "zero": 2}, {}, {"grad_compression": "int8"}),
    "zero3-dp4-int8-big": ({"dp": 4, "zero": 3}, {"hidden": 512, "layers": 8, "ffn_hidden": 2048},
                           {"grad_compression": "int8"}),
    "zero3-dp2-pp2-int8": ({"dp": 2, "pp": 2, "zero": 3}, {}, {"grad_compression": "int8"}),
    "dp4-int4-big": ({"dp": 4}, {"hidden": 512, "layers": 8, "ffn_hidden": 2048}, {"grad_compression": "int4"}),
    "zero3-dp4-int4-big": ({"dp": 4, "zero": 3}, {"hidden": 512, "layers": 8, "ffn_hidden": 2048},
                           {"grad_compression": "int4"}),
    # under hybrid sharding: the all-to-all over the shard group, the fp32 shard all-reduced over the replicas
    "hsdp2-zero3-dp4-int8": ({"dp": 4, "zero": 3, "dp_replicate": 2}, {}, {"grad_compression": "int8"}),
    "hsdp2-zero2-dp4-int4": ({"dp": 4, "zero": 2, "dp_replicate": 2}, {}, {"grad_compression": "int4"}),
}


def _plan(par: dict, model: dict, training: dict, precision: str = "fp32") -> Plan:
    doc = {"model": {"name": "llama-like", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32,
                     "position_embedding": "rope", "tied_embeddings": False, **model},
           "cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"dp": 1, **par},
           "training": {"global_batch": 16, "micro_batch": 1, "precision": precision, **training}}
    return plan_from_dict(doc)


def _executor(plan: Plan, pp_rank: int) -> Counter:
    """(axis, kind) -> bytes per step of the first rank of pipeline stage ``pp_rank``: the
    executor's calls, in the plan's dtypes (``collective_plan.plan_wire``): autocast keeps the
    executor's parameters and gradients fp32, where Megatron's distributed optimizer and FSDP2
    under a bf16 MixedPrecisionPolicy gather 16-bit parameters and reduce the gradients at
    ``collectives.grad_wire_bytes``."""
    par = plan.parallel
    rank = rank_grid(par.pp, par.dp, par.cp, par.tp).rank(pp=pp_rank)
    out: Counter = Counter()
    for call, n in cplan.expected_calls(plan, rank, cplan.plan_wire(plan)).items():
        if call.kind != "recv":   # each send's receive, on the other rank
            out[call.axis, call.kind] += call.bytes * n
    return out


def _as_megatron(plan: Plan, pp_rank: int, exe: Counter) -> Counter:
    """The executor's bytes with each difference between its stack and the model's named and
    converted."""
    m, par, tr = plan.model, plan.parallel, plan.training
    out = Counter(exe)
    e = coll.comm_act_bytes(tr.precision)   # activations: the plan's precision in both stacks (16-bit under FP8)
    mbs, act = plan.num_microbatches, e * tr.micro_batch * (m.seq_len // par.cp) * m.hidden
    stages = plan.layers_per_stage
    holds = range(pp_rank, len(stages), par.pp)
    first = 0 in holds
    layers = sum(stages[v] for v in holds)
    if par.tp > 1 and par.sequence_parallel:
        # DTensor's norm weights hold Partial gradients, all-reduced per read; Megatron all-reduces
        # the SP norms' gradients once per step, coalesced (finalize_model_grads.py), which
        # the model leaves out (2 * hidden per layer)
        rank = rank_grid(par.pp, par.dp, par.cp, par.tp).rank(pp=pp_rank)
        wire = cplan.plan_wire(plan)
        out["tp", "all_reduce"] -= sum(c.bytes * n for c, n in cplan.expected_calls(plan, rank, wire).items()
                                       if c.axis == "tp" and c.kind == "all_reduce" and c.bytes == wire.grad * m.hidden)
        if first:   # the embedding's Partial output reaches the SP region by an all-reduce; Megatron reduce-scatters
            out["tp", "all_reduce"] -= mbs * act
            out["tp", "reduce_scatter"] += mbs * act
    redo = sum(rcp.full_layers(tr, stages[v]) for v in holds)
    if par.tp > 1 and redo:
        # torch's non-reentrant checkpoint stops recomputing once backward's tensors are
        # rebuilt: the block's last forward all-reduce (SP: reduce-scatter) is not re-run;
        # Megatron re-runs it
        out["tp", "reduce_scatter" if par.sequence_parallel else "all_reduce"] += mbs * redo * act
    if par.pp > 1 and par.tp > 1 and not par.sequence_parallel:
        # every TP rank sends the whole activation; Megatron's scatter/gather sends 1/tp each
        out["pp", "send"] /= par.tp
    if par.cp > 1:
        # the executor's ring sends dK/dV home, one hop more than K/V took (cp sends, not cp - 1),
        # and in fp32
        kv = 2 * tr.micro_batch * (m.seq_len // par.cp) * m.kv_heads * m.head_dim // par.tp
        out["cp", "send"] -= mbs * layers * (par.cp * 4 * kv - (par.cp - 1) * e * kv)
    if par.zero == ZeroStage.OPTIMIZER_STATES and par.dp * par.cp > 1:
        # DDP's all-reduce and ZeroRedundancyOptimizer's broadcasts move the buffers a
        # reduce-scatter and an all-gather (Megatron's distributed optimizer) do
        axis = "cp" if par.dp == 1 else "dp"
        out[axis, "reduce_scatter"] += out.pop((axis, "all_reduce"), 0)
        out[axis, "all_gather"] += out.pop((axis, "broadcast"), 0)
    if m.moe and par.ep > 1:
        # the executor's expert group is named after the mesh axis it equals
        axis = ep_axis(plan)
        if axis != "ep":
            out["ep", "all_to_all"] += out.pop((axis, "all_to_all"), 0)
    return +out


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_model_charges_the_bytes_the_executor_moves(name, precision):
    plan = _plan(*LAYOUTS[name], precision)
    for pp_rank in range(plan.parallel.pp):
        model = ledger.step_bytes(plan, pp_rank)
        exe = _as_megatron(plan, pp_rank, _executor(plan, pp_rank))
        assert set(model) == set(exe), (pp_rank, sorted(set(model) ^ set(exe)))
        for key in model:
            assert model[key] == pytest.approx(exe[key], rel=1e-9), (pp_rank, key)


def test_the_ends_cost_time_in_the_prediction():
    # the three end terms the ledger found missing are charged: each plan is slower than
    # the same plan with its ends' bytes priced at nothing
    from simcore.engine.predict import simulate
    from simcore.model import end_comm as ec

    import unittest.mock as um

    for name in ("tp4-sp", "zero3-dp4", "tied-pp2"):
        plan = _plan(*LAYOUTS[name])
        full = simulate(plan, engine="analytic").step_time_s
        with um.patch.object(ec, "tp_ends_s", return_value=((0.0, 0.0), (0.0, 0.0))), \
                um.patch.object(ec, "fsdp_root_s", return_value=(0.0, 0.0)), \
                um.patch.object(ec, "tied_s", return_value=0.0):
            from simcore.model import dp_costs, layer_times
            layer_times.layer_times.cache_clear()
            dp_costs.rank_costs.cache_clear()
            bare = simulate(plan, engine="analytic").step_time_s
        assert full > bare, name


def test_the_ledger_refuses_what_it_does_not_cover():
    with pytest.raises(ValueError, match="parallel.cp_comm=a2a"):
        ledger.step_bytes(_plan({"cp": 2, "cp_comm": "a2a"}, {}, {}))


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_expert_gradients_reduce_over_the_ranks_holding_the_same_experts(zero):
    # Megatron-Core's expert data-parallel group, torchtitan's dp_shard_mod_ep mesh: the dense
    # gradients over all dp ranks, the experts' over dp / ep of them; none at ep = dp
    from simcore.model import compute as cmp
    from simcore.model import dp_costs as dpm
    from simcore.model import memory as mem

    for ep in (8, 4):
        p = plan_from_dict({"model": "mixtral-8x7b", "cluster": {"node": "dgx-h100", "nodes": 4},
                            "parallel": {"dp": 8, "tp": 4, "ep": ep, "zero": zero},
                            "training": {"global_batch": 64, "micro_batch": 1}})
        dev = cmp.device_model(p.cluster.node.gpu, p.training.precision.value)
        sp = mem.stage_params(p)[0]
        layer_dense, layer_expert = mem.layer_params_per_gpu(p)
        got = dpm.dp_costs(p, dev, sp, layer_dense + layer_expert)
        gb, net = coll.grad_wire_bytes(p), coll.group_net(p.cluster, dev, 8, 4)
        assert sp.expert > sp.dense   # most of an MoE's parameters are experts
        call, key, dense, expert = {0: (coll.all_reduce_s, "grad", sp.dense, sp.expert),
                                    1: (coll.reduce_scatter_s, "grad", sp.dense, sp.expert),
                                    3: (coll.reduce_scatter_s, "layer_rs", layer_dense, layer_expert)}[zero]
        dense_only = call(gb * dense, net)
        if ep == 8:   # every rank holds its own experts: nothing to reduce for them
            assert got[key] == pytest.approx(dense_only)
        else:         # two ranks hold each expert, 4 * ep ranks apart
            enet = coll.group_net(p.cluster, dev, 2, 4 * ep)
            assert got[key] == pytest.approx(dense_only + call(gb * expert, enet))
            assert got[key] > dense_only
