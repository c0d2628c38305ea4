"""Hybrid sharding (``parallel.dp_replicate``): ZeRO shards over one replica's ranks and the
replicas all-reduce each reduce-scattered shard, as torch's FSDP2 on a (replicate, shard) mesh
(``_fsdp_collectives.foreach_reduce``'s ``all_reduce_group``) and Megatron-LM's distributed
optimizer instances run it; in memory, time, the collectives list and the byte ledger alike,
its rules, its Plan round trip, and that it cannot win for nothing."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import memory as mem
from simcore.model.collective_plan import by_kind_axis, expected_calls
from simcore.model.comm_ledger import step_bytes
from simcore.model.step_costs import memory_report
from simcore.plan.load import dump_plan, plan_from_dict
from simcore.plan.spec import PlanError


def _plan(r=1, zero=3, nodes=4, dp=None, fabric="ib-ndr", model="llama3-8b", **par):
    cluster = {"node": "dgx-h100", "nodes": nodes, **({"fabric": fabric} if nodes > 1 else {})}
    dp = dp or 8 * nodes
    return plan_from_dict({"model": {"name": model, "seq_len": 4096}, "cluster": cluster,
                           "parallel": {"dp": dp, "zero": zero, "dp_replicate": r, **par},
                           "training": {"global_batch": 4 * dp, "micro_batch": 2, "recompute": "full",
                                        "flash_attention": True}})


def test_zero_shards_over_one_replica():
    """Optimizer states (and, ZeRO-3, the weights) are sharded over dp / dp_replicate ranks."""
    full, hybrid = _plan(1), _plan(4)
    assert hybrid.parallel.shard_ranks == 8 and full.parallel.shard_ranks == 32
    sp = mem.stage_params(full)[0]
    s_full, s_hybrid = mem.model_state_bytes(full, sp), mem.model_state_bytes(hybrid, sp)
    for kind in ("weights", "gradients", "optimizer_states"):
        assert s_hybrid[kind] == pytest.approx(4 * s_full[kind])
    assert memory_report(hybrid)["max_gpu_bytes"] > memory_report(full)["max_gpu_bytes"]


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp2_all_reduces_each_shard_over_the_replicas(zero):
    """Every reduce-scatter on the shard group is followed by an all-reduce of its output over
    the replicas: as many calls, 1/shard of the bytes; the gathers stay on the shard group."""
    calls = expected_calls(_plan(4, zero), 0)
    rs = {c: n for c, n in calls.items() if c.kind == "reduce_scatter"}
    ar = {c: n for c, n in calls.items() if c.kind == "all_reduce"}
    assert {c.axis for c in rs} == {"dp_shard"} and {c.axis for c in ar} == {"dp_replicate"}
    assert sum(rs.values()) == sum(ar.values()) > 0
    assert sum(c.bytes * n for c, n in ar.items()) == pytest.approx(sum(c.bytes * n for c, n in rs.items()) / 8, rel=1e-6)
    assert {c.axis for c in calls if c.kind == "all_gather"} == {"dp_shard"}
    ledger = step_bytes(_plan(4, zero))
    assert ledger["dp_replicate", "all_reduce"] == pytest.approx(ledger["dp_shard", "reduce_scatter"] / 8)


def test_megatron_instances_reduce_scatter_all_reduce_and_gather_once():
    calls = by_kind_axis(expected_calls(_plan(4, 1), 0))
    assert calls == {("reduce_scatter", "dp_shard"): 1, ("all_reduce", "dp_replicate"): 1, ("all_gather", "dp_shard"): 1}


def test_shard_inside_the_node_keeps_the_gathers_off_the_network():
    """Sharding inside each node (8 ranks, NVLink) makes ZeRO-3's per-layer gathers cheaper than
    over all 32 ranks across the network; the replicas' all-reduce crosses it instead."""
    from simcore.model.step_costs import step_costs
    full, hybrid = step_costs(_plan(1, fabric="eth-100")), step_costs(_plan(4, fabric="eth-100"))
    assert hybrid.forward_gather_s[0] < 0.5 * full.forward_gather_s[0]
    assert hybrid.grad_reduce_per_step_s[0] > 0


@pytest.mark.parametrize("fields, message", [
    ({"dp_replicate": 3}, "dp_replicate=3 does not divide parallel.dp=32"),
    ({"dp_replicate": 4, "zero": 0}, "needs parallel.zero 1, 2 or 3"),
    ({"dp_replicate": 4, "zero_impl": "deepspeed"}, "needs parallel.zero_impl=fsdp2"),
    ({"dp_replicate": 32}, "leaves each shard on one rank"),
])
def test_rules_name_the_field(fields, message):
    doc = {"model": {"name": "llama3-8b", "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": 4, "fabric": "ib-ndr"},
           "parallel": {"dp": 32, "zero": 3, **fields}, "training": {"global_batch": 128, "micro_batch": 1}}
    with pytest.raises(PlanError, match=message):
        plan_from_dict(doc)


def test_ep_is_refused():
    doc = {"model": {"name": "mixtral-8x7b", "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": 4, "fabric": "ib-ndr"},
           "parallel": {"dp": 32, "zero": 3, "ep": 8, "dp_replicate": 4}, "training": {"global_batch": 128, "micro_batch": 1}}
    with pytest.raises(PlanError, match="dp_replicate=4 with parallel.ep=8 is not modelled"):
        plan_from_dict(doc)


def test_plan_file_round_trip():
    plan = _plan(4)
    text = dump_plan(plan)
    assert "dp_replicate: 4" in text
    assert plan_from_dict(yaml.safe_load(text)).parallel.dp_replicate == 4
    assert "dp_replicate" not in dump_plan(_plan(1))


def test_the_event_engine_prices_it_alike():
    """Within 5% of the analytic path where the backward's gathers and reductions hide behind it
    (InfiniBand). On a slow network the analytic path queues a layer's backward gather and its
    reduction one after the other, the event engine on their own streams: 16% apart on 100 GbE."""
    plan = _plan(4, zero=3)
    des = simulate(plan, engine="des").step_time_s
    assert des == pytest.approx(simulate(plan).step_time_s, rel=0.05)
    assert des > simulate(_plan(1, zero=3), engine="des").step_time_s   # the replicas' all-reduce is charged


def test_the_executor_says_what_it_does_not_run():
    """FSDP2 on a (replicate, shard) mesh runs (tests/model/test_collective_plan.py records it);
    Megatron's ZeRO-1 instances do not."""
    from executors.support import check_executable
    check_executable(_plan(4), "cpu")
    with pytest.raises(ValueError, match="parallel.dp_replicate=4 runs with parallel.zero 2 or 3 and cp 1"):
        check_executable(_plan(4, zero=1), "cpu")


def _free(mp):
    for name in ("all_gather_s", "reduce_scatter_s", "all_reduce_s"):
        mp.setattr(coll, name, lambda *a, **k: 0.0)


@settings(max_examples=10, deadline=None)
@given(zero=st.sampled_from([1, 2, 3]), r=st.sampled_from([2, 4]), model=st.sampled_from(["llama3-8b", "gpt-1.7b"]))
def test_it_cannot_win_for_nothing(zero, r, model):
    """On one NVLink domain (every link alike) hybrid sharding moves no fewer bytes per link than
    sharding over all ranks, so it is never faster; it never holds less memory; with the
    communication free it is never faster either (a replica's shard is more to step)."""
    full, hybrid = _plan(1, zero, nodes=1, model=model), _plan(r, zero, nodes=1, model=model)
    assert memory_report(hybrid)["max_gpu_bytes"] >= memory_report(full)["max_gpu_bytes"]
    assert simulate(hybrid).step_time_s >= simulate(full).step_time_s * (1 - 1e-9)
    with pytest.MonkeyPatch.context() as mp:
        _free(mp)
        assert simulate(_plan(r, zero, nodes=1, model=model)).step_time_s >= \
            simulate(_plan(1, zero, nodes=1, model=model)).step_time_s * (1 - 1e-9)
