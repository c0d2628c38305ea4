"""Alpha-beta collectives on closed-form routes."""
import dataclasses

import pytest

from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.plan.load import plan_from_dict


def cluster(nodes=2, node="dgx-a100-80gb", **kw):
    doc = {"model": "gpt3-175b", "cluster": {"node": node, "nodes": nodes, **kw},
           "parallel": {"tp": 8, "pp": 1, "dp": nodes}, "training": {"global_batch": nodes}}
    p = plan_from_dict(doc)
    return p.cluster, cmp.device_model(p.cluster.node.gpu, "bf16")


def no_latency(net):
    return dataclasses.replace(net, base_latency_s=0.0, intra_hop_s=0.0, inter_hop_s=0.0)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_moves_2_n_minus_1_over_n(n):
    cl, d = cluster(1)
    net = no_latency(coll.group_net(cl, d, n, 1))
    size = 1e9
    assert coll.ring_all_reduce_s(size, net) == pytest.approx(2 * (n - 1) / n * size / net.bus_bytes_per_s)
    assert coll.all_gather_s(size, net) == pytest.approx((n - 1) / n * size / net.bus_bytes_per_s)
    assert coll.reduce_scatter_s(size, net) + coll.all_gather_s(size, net) == \
        pytest.approx(coll.ring_all_reduce_s(size, net))


def test_two_node_all_reduce_limited_by_nic_not_nvlink():
    cl, d = cluster(2)
    intra = coll.group_net(cl, d, 8, 1)
    # DP group of the 8 TP ranks: one rank per node, 8 such rings share the node's 8 NICs
    inter = coll.group_net(cl, d, 2, 8)
    nic_share = cl.node.nics_per_node * cl.fabric.nic_bytes_per_s * d.nic_efficiency / cl.gpus_per_node
    assert inter.nodes == 2 and inter.bus_bytes_per_s == pytest.approx(nic_share)
    assert inter.bus_bytes_per_s < intra.bus_bytes_per_s / 5
    size = 1e9
    assert coll.ring_all_reduce_s(size, inter) > 5 * coll.ring_all_reduce_s(size, intra)


def test_group_spanning_nodes_gets_all_nics_of_a_node():
    cl, d = cluster(2)
    net = coll.group_net(cl, d, 16, 1)   # 8 ranks on each of 2 nodes, no other group on them
    full = cl.node.nics_per_node * cl.fabric.nic_bytes_per_s * d.nic_efficiency
    assert net.bus_bytes_per_s == pytest.approx(min(full, cl.node.gpu.intra_link_bytes_per_s * d.nvlink_efficiency))


def test_oversubscription_applies_beyond_one_leaf():
    cl, d = cluster(64, fabric="eth-100")
    small = coll.group_net(cl, d, 2, 8)
    big = coll.group_net(cl, d, 64, 8)
    assert big.bus_bytes_per_s == pytest.approx(small.bus_bytes_per_s / cl.fabric.oversubscription)


def test_latency_counts_ring_steps():
    cl, d = cluster(1)
    net = coll.group_net(cl, d, 8, 1)
    assert coll.ring_all_reduce_s(1.0, net) == pytest.approx(
        net.base_latency_s + 14 * net.intra_hop_s + 2 * 7 / 8 / net.bus_bytes_per_s)


def test_tree_wins_small_messages_across_many_nodes_and_auto_picks_it():
    cl, d = cluster(64)
    net = coll.group_net(cl, d, 64, 8)
    assert coll.tree_all_reduce_s(1e3, net) < coll.ring_all_reduce_s(1e3, net)
    assert coll.all_reduce_s(1e3, net) == coll.tree_all_reduce_s(1e3, net)
    assert coll.all_reduce_s(1e10, net) == coll.ring_all_reduce_s(1e10, net)


def test_hierarchical_equals_rs_inter_ag():
    cl, d = cluster(4)
    net = no_latency(coll.group_net(cl, d, 32, 1))
    k = 8
    intra = 2 * (k - 1) / k * 1e9 / net.intra_bytes_per_s
    inter = 2 * 3 / 4 * (1e9 / k) / (net.bus_bytes_per_s / k)
    assert coll.hierarchical_all_reduce_s(1e9, net) == pytest.approx(intra + inter)


def test_all_to_all_and_send_recv():
    cl, d = cluster(1)
    net = no_latency(coll.group_net(cl, d, 4, 1))
    assert coll.all_to_all_s(1e9, net) == pytest.approx(0.75e9 / net.bus_bytes_per_s)
    assert coll.send_recv_s(1e9, 1e10, 1e-6) == pytest.approx(0.1 + 1e-6)
    assert coll.broadcast_s(1e9, net) == pytest.approx(1e9 / net.bus_bytes_per_s)


@pytest.mark.parametrize("node", ["atlas-800t-a2", "mi300x-8"])
def test_a_full_mesh_group_reaches_one_link_per_peer(node):
    # a full-mesh node (Atlas 800T A2's HCCS, MI300X's xGMI) links each pair directly at the GPU's rate
    # over its 7 peers: a TP 2 group has one link, a group of 4 three, the whole node seven
    from topologies.build import build_cluster, gpu_id

    cl, d = cluster(1, node=node)
    whole = coll.group_net(cl, d, 8, 1).bus_bytes_per_s
    assert whole == pytest.approx(cl.node.gpu.intra_link_bytes_per_s * d.nvlink_efficiency)
    assert coll.group_net(cl, d, 2, 1).bus_bytes_per_s == pytest.approx(whole / 7)
    assert coll.group_net(cl, d, 4, 2).bus_bytes_per_s == pytest.approx(whole * 3 / 7)   # stride 2: 4 on the node
    g = build_cluster(cl)
    link = g.edges[gpu_id(0, 0), gpu_id(0, 1)]["bandwidth_bytes_per_s"]
    assert coll.group_net(cl, d, 2, 1).bus_bytes_per_s == pytest.approx(link * d.nvlink_efficiency)
    switch, sd = cluster(1, node="dgx-h100")   # NVSwitch: every group its GPU's whole port
    assert coll.group_net(switch, sd, 2, 1).bus_bytes_per_s == coll.group_net(switch, sd, 8, 1).bus_bytes_per_s
