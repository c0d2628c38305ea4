"""A rack-scale NVLink domain (GB200 NVL72: 72 GPUs over 18 trays of 4): groups inside it
run at NVLink rate across trays, groups leaving it take the scale-out NICs."""
from __future__ import annotations

import pytest

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model.compute import device_model
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError
from simcore.planner.space import derive_space


def _plan(node="gb200-nvl72", nodes=16, domain=None, tp=8, pp=2, cp=4, precision="bf16"):
    cluster = {"node": node, "nodes": nodes, **({"nvlink_domain_gpus": domain} if domain else {})}
    return plan_from_dict({"model": {"name": "llama3-405b"}, "cluster": cluster,
                           "parallel": {"tp": tp, "pp": pp, "cp": cp, "sequence_parallel": True, "zero": 1},
                           "training": {"global_batch": 72, "recompute": "full", "flash_attention": True,
                                        "precision": precision}})


def test_the_catalog_gives_nvl72_its_rack_as_the_nvlink_domain():
    plan = _plan()
    assert plan.cluster.gpus_per_node == 4 and plan.cluster.node.nvlink_domain_gpus == 72
    assert plan.cluster.nvlink_domain == 64          # 16 trays of one rack: the whole cluster
    assert _plan(nodes=36, cp=1, pp=2, tp=8).cluster.nvlink_domain == 72
    assert _plan(node="dgx-b200", nodes=8).cluster.nvlink_domain == 8


def test_a_group_across_trays_of_one_rack_runs_at_nvlink_rate():
    """Llama 3 405B, tp 8 x cp 4 x pp 2 on 64 GB200s: each CP group spans 8 trays. In the
    NVL72 rack its ring runs at NVLink rate; with an 8-GPU domain it crosses the NICs."""
    rack, eight = _plan(), _plan(domain=8)
    dev = device_model(rack.cluster.node.gpu, "bf16")
    nvlink = rack.cluster.node.gpu.intra_link_bytes_per_s * dev.nvlink_efficiency
    cp_rack, cp_eight = (coll.group_net(p.cluster, dev, 4, 8) for p in (rack, eight))
    assert (cp_rack.nodes, cp_rack.bus_bytes_per_s) == (1, nvlink)
    assert cp_eight.nodes == 4 and cp_eight.bus_bytes_per_s < nvlink / 10
    tp_rack, tp_eight = (coll.group_net(p.cluster, dev, 8, 1) for p in (rack, eight))
    assert tp_rack.bus_bytes_per_s == tp_eight.bus_bytes_per_s == nvlink   # tp 8 spans 2 trays, inside both


def test_nvl72_is_faster_than_the_same_gpus_with_a_smaller_domain():
    rack, eight, tray = (simulate(_plan(domain=d), engine="analytic") for d in (None, 8, 4))
    b200 = simulate(_plan(node="dgx-b200", nodes=8), engine="analytic")
    assert rack.step_time_s < eight.step_time_s < tray.step_time_s
    assert rack.exposed_comm_s < eight.exposed_comm_s
    assert rack.step_time_s < b200.step_time_s


def test_a_group_straddling_two_racks_leaves_the_domain():
    """Blocks of 16 ranks on 72-GPU racks: ranks 64-79 sit in two racks, so the group is charged NICs."""
    assert coll.blocks_in_domain(8, 72, 288) and coll.blocks_in_domain(24, 72, 288)
    assert not coll.blocks_in_domain(16, 72, 288)
    assert coll.blocks_in_domain(16, 64, 64) and not coll.blocks_in_domain(128, 72, 288)


def test_the_planner_lets_tp_span_the_domain_and_the_domain_is_checked():
    from simcore.plan.load import plan_from_dict as load
    doc = {"model": {"name": "gpt-175b"}, "cluster": {"node": "gb200-nvl72", "nodes": 18},
           "parallel": {"tp": 1}, "training": {"global_batch": 144}}
    assert max(derive_space(load(doc)).tp) > 4          # tp beyond one 4-GPU tray
    doc["cluster"]["nvlink_domain_gpus"] = 4
    assert max(derive_space(load(doc)).tp) == 8          # two 4-GPU domains at most (over the NICs)
    doc["cluster"]["nvlink_domain_gpus"] = 6
    with pytest.raises(PlanError, match=r"^cluster.nvlink_domain_gpus=6 must be a multiple of cluster.gpus_per_node=4"):
        load(doc)
    with pytest.raises(PlanError, match=r"^cluster.nvlink_domain_gpus=16 spans several nodes, which needs NVLink"):
        load({**doc, "cluster": {"node": "mi300x-8", "nodes": 2, "nvlink_domain_gpus": 16}})


def test_a_job_on_part_racks_can_say_how_many_gpus_of_each_it_uses():
    # 256 GB200s as four racks of 16 trays (64 GPUs each, two trays spare): a 16-rank group
    # stays in its rack; filled in order, 72 to a rack, ranks 64-79 straddle two racks
    def plan(domain=None):
        cluster = {"node": "gb200-nvl72", "nodes": 64, **({"nvlink_domain_gpus": domain} if domain else {})}
        return plan_from_dict({"model": {"name": "llama3-405b"}, "cluster": cluster,
                               "parallel": {"tp": 8, "pp": 16, "zero": 1},
                               "training": {"global_batch": 64, "recompute": "full"}})
    filled, spare = plan(), plan(64)
    dev = device_model(filled.cluster.node.gpu, "bf16")
    assert coll.group_net(filled.cluster, dev, 16, 1).nodes == 2
    assert coll.group_net(spare.cluster, dev, 16, 1).nodes == 1
