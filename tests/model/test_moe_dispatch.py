"""Where MoE tokens travel (``simcore.model.moe_dispatch``): the ranks and nodes a token's experts
lie on per gate (``training.moe_routing``), all-to-alls that leave the node at each GPU's own NIC
share, DeepEP's once-per-node RDMA, and Megatron-Core's combined 1F1B hiding the all-to-alls
behind another micro-batch's compute (``parallel.moe_a2a_overlap``)."""
from __future__ import annotations

import unittest.mock as um

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import layer_comm as lcm
from simcore.model import moe_dispatch as md
from simcore.model import step_costs as sc
from simcore.model.step_costs import memory_report
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan, megatron_args

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
#: Qwen3-30B-A3B's shape: 128 experts of 768, top-8, on one layer count small enough to be quick.
QWEN = {"name": "qwen3-moe-like", "layers": 8, "hidden": 2048, "heads": 32, "kv_heads": 4, "kv_channels": 128,
        "ffn_hidden": 768, "vocab": 151936, "seq_len": 4096, "gated_mlp": True, "experts": 128, "top_k": 8,
        "position_embedding": "rope", "tied_embeddings": False, "dropout": 0.0}


def _plan(nodes=2, *, training=None, model=None, **parallel):
    par = {"ep": 16, "dp": 8 * nodes, "zero": 1, **parallel}
    return plan_from_dict({"model": {**QWEN, **(model or {})}, "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": par, "training": {"global_batch": 64 * nodes, "flash_attention": True,
                                                         **(training or {})}})


def _dev(plan):
    return cmp.device_model(plan.cluster.node.gpu, plan.training.precision.value)


@given(experts=st.sampled_from([8, 64, 128, 256]), top_k=st.sampled_from([1, 2, 6, 8]),
       groups=st.sampled_from([1, 2, 4, 8, 16, 64]), routing=st.sampled_from(["balanced", "round_robin"]))
def test_a_token_reaches_between_one_group_and_one_per_expert(experts, top_k, groups, routing):
    if groups > experts or experts % groups or top_k > experts:
        return
    hit = md.groups_hit(experts, top_k, groups, routing)
    assert 1.0 - 1e-12 <= hit <= min(top_k, groups) + 1e-12


def test_round_robin_routing_by_hand():
    # AutoModel's fake gate: token t runs experts 8t .. 8t+7, so with 16 experts a rank (Qwen3-30B on
    # EP 8) a token stays on one rank; DeepSeek-V3's 256 on EP 64 (4 a rank) on two ranks of one node
    assert md.groups_hit(128, 8, 8, "round_robin") == 1.0
    assert md.groups_hit(256, 8, 64, "round_robin") == 2.0
    assert md.groups_hit(256, 8, 8, "round_robin") == 1.0
    assert md.groups_hit(8, 2, 8, "round_robin") == 2.0
    # 6 consecutive of 64 experts on 8 ranks of 8: starts 0, 2 (mod 8) stay on one rank, 4 and 6 span two
    assert md.groups_hit(64, 6, 8, "round_robin") == pytest.approx(1.5)
    assert md.dispatch_ranks(128, 8, 8) == md.groups_hit(128, 8, 8, "balanced") > 5


def test_an_all_to_all_leaving_the_node_runs_at_each_gpus_nic_share():
    plan = _plan(nodes=2)
    dev = _dev(plan)
    cl = plan.cluster
    net = coll.group_net(cl, dev, 16, 1)
    own = cl.node.nics_per_node * cl.fabric.nic_bytes_per_s * dev.nic_efficiency / cl.gpus_per_node
    assert net.nodes == 2 and net.nic_bytes_per_s == pytest.approx(own)
    size = 1e9
    latency = net.base_latency_s + 15 * net.hop_s
    # half of each rank's buffer leaves the node; the NVLink share moves beside it
    assert coll.all_to_all_s(size, net) == pytest.approx(latency + 0.5 * size / own)
    assert coll.all_to_all_s(size, net) > latency + coll.ring_bytes_s(size, net)   # not a ring's bus bandwidth
    inside = coll.group_net(cl, dev, 8, 1)   # one node: unchanged
    assert coll.all_to_all_s(size, inside) == pytest.approx(inside.base_latency_s + 7 * inside.hop_s
                                                             + coll.ring_bytes_s(size, inside))


@SETTINGS
@given(nodes=st.sampled_from([1, 2, 4]), ep=st.sampled_from([2, 8, 16, 32]), routing=st.sampled_from(["balanced",
                                                                                                     "round_robin"]))
def test_deepep_never_moves_more_than_a_copy_per_expert(nodes, ep, routing):
    try:
        a2a = _plan(nodes, ep=ep, training={"moe_routing": routing})
        deep = _plan(nodes, ep=ep, moe_dispatcher="deepep", training={"moe_routing": routing})
    except PlanError:
        return
    ta, td = (lcm.layer_comm(p, _dev(p))["ep_f"] for p in (a2a, deep))
    assert 0 < td <= ta * (1 + 1e-12)
    # the all-to-all dispatcher sends a copy per expert whatever the gate: routing moves nothing there
    assert ta == pytest.approx(lcm.layer_comm(_plan(nodes, ep=ep), _dev(a2a))["ep_f"])


def test_round_robin_routing_sends_a_token_to_one_rank_under_deepep():
    balanced = _plan(1, ep=8, dp=8, moe_dispatcher="deepep")
    rr = _plan(1, ep=8, dp=8, moe_dispatcher="deepep", training={"moe_routing": "round_robin"})
    net = coll.group_net(rr.cluster, _dev(rr), 8, 1)
    act = coll.tp_act_bytes(rr)
    assert md.ep_bytes(rr, act, net) == (act, None)
    assert lcm.layer_comm(rr, _dev(rr))["ep_f"] < lcm.layer_comm(balanced, _dev(rr))["ep_f"] / 3   # latency aside: 1/5


@SETTINGS
@given(nodes=st.sampled_from([2, 4]), dispatcher=st.sampled_from(["alltoall", "deepep"]),
       pp=st.sampled_from([1, 2]), micro_batch=st.sampled_from([1, 2]))
def test_the_combined_1f1b_hides_all_to_alls_but_never_for_free(nodes, dispatcher, pp, micro_batch):
    """Megatron-Core's EP all-to-all overlap: never slower than without it, never faster than the
    same plan with the expert all-to-alls priced at nothing; and one more micro-batch in flight."""
    extra = {"pp": pp, "dp": 8 * nodes // pp, "vpp": 2 if pp > 1 else 1, "moe_dispatcher": dispatcher}
    if pp > 1:
        extra["schedule"] = "interleaved-1f1b"
    training = {"micro_batch": micro_batch}
    try:
        plain = _plan(nodes, training=training, **extra)
        over = _plan(nodes, training=training, moe_a2a_overlap=True, **extra)
    except PlanError:
        return
    a, b = simulate(plain), simulate(over)
    real = lcm.layer_comm

    def no_ep(p, d):
        return {**real(p, d), "ep_f": 0.0, "ep_b": 0.0}

    with um.patch.object(lcm, "layer_comm", no_ep):
        free = simulate(over)
    assert free.step_time_s * (1 - 1e-9) <= b.step_time_s <= a.step_time_s * (1 + 1e-9)
    assert b.step_time_s < a.step_time_s   # cross-node all-to-alls: some is hidden
    chunks = [r["activations"] for r in memory_report(over)["ranks"]]
    assert all(x >= y for x, y in zip(chunks, [r["activations"] for r in memory_report(plain)["ranks"]]))
    assert max(chunks) > max(r["activations"] for r in memory_report(plain)["ranks"])


def test_the_overlap_is_checked_as_megatron_checks_it():
    with pytest.raises(PlanError, match=r"^parallel.moe_a2a_overlap needs expert parallelism"):
        _plan(1, ep=1, dp=8, moe_a2a_overlap=True)
    with pytest.raises(PlanError, match=r"^parallel.moe_a2a_overlap with parallel.pp=2 needs the interleaved"):
        _plan(2, pp=2, dp=8, ep=8, moe_a2a_overlap=True)
    with pytest.raises(PlanError, match=r"^parallel.moe_a2a_overlap needs training.recompute other than full"):
        _plan(2, moe_a2a_overlap=True, training={"recompute": "full"})
    with pytest.raises(PlanError, match=r"^training.moe_routing=round_robin needs an MoE model"):
        plan_from_dict({"model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 1},
                        "training": {"global_batch": 8, "moe_routing": "round_robin"}})


def test_the_fields_round_trip_and_are_exported_or_refused():
    plan = _plan(2, moe_a2a_overlap=True, moe_dispatcher="deepep")
    assert plan_from_dict(plan_to_dict(plan)) == plan
    assert "moe_a2a_overlap" not in plan_to_dict(_plan(2))["parallel"]
    assert "moe_routing" not in plan_to_dict(_plan(2))["training"]
    args = megatron_args(plan)
    assert ("--overlap-moe-expert-parallel-comm", None) in args
    command = export_plan(plan, "megatron")
    assert read_megatron(command).fields["parallel.moe_a2a_overlap"] is True
    rr = _plan(2, training={"moe_routing": "round_robin"})
    assert plan_from_dict(plan_to_dict(rr)).training.moe_routing.value == "round_robin"
    with pytest.raises(ValueError, match=r"^training.moe_routing=round_robin has no Megatron-LM option"):
        megatron_args(rr)
    from executors.support import check_executable
    with pytest.raises(ValueError, match=r"^parallel.moe_a2a_overlap is priced, not run"):
        check_executable(_plan(2, moe_a2a_overlap=True), "cpu")
    with pytest.raises(ValueError, match=r"^training.moe_routing=round_robin is priced, not run"):
        check_executable(rr, "cpu")
