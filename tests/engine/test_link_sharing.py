"""The analytic path's closed-form link sharing agrees with the topology graph's analysis.

The fast path (simcore/collectives.group_net) never builds a graph: it reasons that the
data-parallel groups of one node share that node's NICs. The graph (topologies/routes)
routes every channel of every group over real links and counts the flows on each. Where
the fabric is non-blocking the two must give the same bus bandwidth; under leaf
oversubscription the graph's d-mod-k spine routing is uneven, so they agree to 15%.
"""
from __future__ import annotations

import pytest

from simcore.model.collectives import group_net
from simcore.model.compute import device_model
from simcore.plan.load import plan_from_dict
from topologies.build import build_cluster
from topologies.placement import rank_grid
from topologies.routes import group_ring_bandwidths

CASES = [
    ("dgx-a100-80gb", 4, None, {"tp": 8, "dp": 4}, 0.0),
    ("dgx-a100-80gb", 4, None, {"tp": 4, "dp": 8}, 0.0),
    ("dgx-a100-80gb", 4, None, {"tp": 2, "dp": 16}, 0.0),
    ("dgx-h100", 8, None, {"tp": 8, "pp": 2, "dp": 4}, 0.0),
    ("dgx-a100-80gb", 16, "roce-200", {"tp": 4, "dp": 32}, 0.0),
    ("dgx-a100-80gb", 16, "eth-100", {"tp": 8, "dp": 16}, 0.15),
]


@pytest.mark.parametrize("node, nodes, fabric, parallel, tolerance", CASES)
def test_dp_ring_bandwidth_closed_form_matches_graph(node, nodes, fabric, parallel, tolerance):
    cluster = {"node": node, "nodes": nodes, **({"fabric": fabric} if fabric else {})}
    plan = plan_from_dict({"model": "gpt-1.7b", "cluster": cluster, "parallel": parallel,
                           "training": {"global_batch": 256}})
    par = plan.parallel
    dev = device_model(plan.cluster.node.gpu, "bf16")
    net = group_net(plan.cluster, dev, par.dp, par.tp * par.cp)
    efficiency = dev.nic_efficiency if net.nodes > 1 else dev.nvlink_efficiency
    closed = net.bus_bytes_per_s / efficiency  # the graph carries raw link rates
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    graph = min(group_ring_bandwidths(build_cluster(plan.cluster), grid.groups("dp"), plan.cluster.gpus_per_node))
    assert graph == pytest.approx(closed, rel=tolerance or 1e-9)


def test_each_member_of_a_node_brings_its_rail_nic():
    plan = plan_from_dict({"model": "gpt-1.7b", "cluster": {"node": "dgx-a100-80gb", "nodes": 4},
                           "parallel": {"tp": 2, "dp": 16}, "training": {"global_batch": 256}})
    grid = rank_grid(1, 16, 1, 2)
    one_group = group_ring_bandwidths(build_cluster(plan.cluster), grid.groups("dp")[:1], 8)
    both = group_ring_bandwidths(build_cluster(plan.cluster), grid.groups("dp"), 8)
    nic = plan.cluster.fabric.nic_bytes_per_s
    # 4 members per node: 4 channels leave the node on 4 rail NICs; the other group's
    # members sit on the other 4 rails, so running both at once costs neither anything
    assert one_group[0] == pytest.approx(4 * nic) and both == pytest.approx([4 * nic] * 2)
