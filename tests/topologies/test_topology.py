"""The cluster graph, its routes and contention, and its picture (topologies/build.py,
topologies/routes.py, reports/plots.py). Expected numbers are worked by hand from the
catalog: dgx-a100-80gb has 8 A100s on one NVSwitch (300 GB/s per GPU per direction),
4 PCIe Gen4 switches (32 GB/s per direction) and 8 HDR NICs (200 Gb/s = 25 GB/s); ib-hdr
is a rail-optimized fat tree of radix-40 switches (20 ports down per leaf)."""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from reports.plots import save_figure, topology_figure
from simcore.plan.load import plan_from_dict
from topologies.build import build_cluster, gpu_id
from topologies.routes import (
    bisection_bytes_per_s, bottleneck, cluster_summary, concurrent_ring_bandwidths, group_ring_bandwidths,
    path, ring_bus_bandwidth, ring_flows, ring_order, shared_links,
)
from topologies.placement import rank_grid

NIC = 25e9  # ib-hdr: 200 Gb/s per direction


def cluster(nodes: int, node: str = "dgx-a100-80gb", **extra):
    doc = {"model": "gpt3-175b", "cluster": {"node": node, "nodes": nodes, **extra},
           "parallel": {"tp": 8, "dp": nodes}, "training": {"global_batch": 16 * nodes}}
    return plan_from_dict(doc).cluster


def with_fabric(cl, **changes):
    return dataclasses.replace(cl, fabric=dataclasses.replace(cl.fabric, **changes))


def layers(graph) -> Counter:
    return Counter(layer for _, layer in graph.nodes(data="layer"))


@pytest.fixture(scope="module")
def two():
    cl = cluster(2)
    return cl, build_cluster(cl)


def test_catalog_figures_the_hand_numbers_rest_on(two):
    cl, _ = two
    assert cl.fabric.nic_bytes_per_s == NIC and cl.fabric.switch_radix == 40
    assert cl.node.gpu.intra_link_bytes_per_s == 300e9 and cl.node.gpu.pcie_bytes_per_s == 32e9
    assert (cl.node.nics_per_node, cl.node.pcie_switches, cl.fabric.topology) == (8, 4, "rail-optimized-fat-tree")


def test_counts_two_dgx_a100(two):
    _, g = two
    # 8 rails x 1 leaf (2 nodes < 20 ports down); each leaf has 2 uplinks, one per spine.
    assert layers(g) == Counter(gpu=16, nic=16, nvswitch=2, pcie=8, cpu=2, leaf=8, spine=2, storage=2)


def test_counts_192_dgx_a100():
    cl = cluster(192)
    g = build_cluster(cl)
    # 8 rails x ceil(192 / 20) = 80 leaves: more than a 40-port spine can take, so three tiers
    # (issue 28.9): 4 pods of 20 leaves, each with 20 spines (one per leaf uplink), and core
    # group j of ceil(4 pods x 20 ports / 40) = 2 switches above spine j of every pod.
    counts = layers(g)
    assert (counts["gpu"], counts["nic"], counts["nvswitch"], counts["pcie"]) == (1536, 1536, 192, 768)
    assert (counts["leaf"], counts["spine"], counts["core"]) == (80, 80, 40)
    for v in g:                                  # no switch uses more ports than it has
        if v[0] in ("leaf", "spine", "core"):
            ports = sum(g.edges[v, u]["bandwidth_bytes_per_s"] for u in g[v] if u[0] != "storage") / NIC
            assert ports <= cl.fabric.switch_radix + 1e-9, (v, ports)
    summary = cluster_summary(g, cl)
    assert summary["gpus"] == 1536 and summary["network_switches"] == 200
    assert summary["bisection_tbyte_per_s"] == pytest.approx(96 * 8 * NIC / 1e12)
    # GPT-3 175B's layout (tp 8, pp 12, dp 16): the 96 DP rings, all at once, are shift
    # permutations that d-mod-k routes without collisions on this non-blocking tree.
    dp_groups = rank_grid(pp=12, dp=16, cp=1, tp=8).groups("dp")
    assert group_ring_bandwidths(g, dp_groups, 8) == [NIC] * 96


def test_every_edge_has_bandwidth_latency_and_kind(two):
    _, g = two
    for _, _, data in g.edges(data=True):
        assert data["bandwidth_bytes_per_s"] > 0 and data["latency_s"] >= 0 and data["kind"]


def test_intra_node_route_uses_nvswitch_only(two):
    _, g = two
    route = path(g, gpu_id(0, 0), gpu_id(0, 5))
    assert route == [(gpu_id(0, 0), ("nvswitch", 0)), (("nvswitch", 0), gpu_id(0, 5))]
    assert bottleneck(g, route).bandwidth_bytes_per_s == 300e9


def test_inter_node_route_crosses_two_nics_on_the_gpus_own_pcie_switch(two):
    cl, g = two
    a, b = gpu_id(0, 3), gpu_id(1, 6)
    route = path(g, a, b)
    hops = [u for u, _ in route] + [route[-1][1]]
    nics = [v for v in hops if v[0] == "nic"]
    assert nics == [("nic", 0, 3), ("nic", 1, 6)]
    assert g.nodes[nics[0]]["up"] == g.nodes[a]["up"] and g.nodes[nics[1]]["up"] == g.nodes[b]["up"]
    assert "nvswitch" not in {v[0] for v in hops}
    # rail 3 -> rail 6: leaf 3 -> spine -> leaf 6; latency = the fabric's end to end figure
    assert [v[0] for v in hops] == ["gpu", "pcie", "nic", "leaf", "spine", "leaf", "nic", "pcie", "gpu"]
    assert bottleneck(g, route).latency_s == pytest.approx(cl.fabric.latency_s)
    back = path(g, b, a)  # the same NICs; the spine is the one d-mod-k picks for NIC (0, 3)
    assert back[:3] == [(v, u) for u, v in reversed(route[-3:])]
    assert back[-3:] == [(v, u) for u, v in reversed(route[:3])]


def test_ring_order_crosses_each_node_boundary_once(two):
    _, g = two
    ring = ring_order(g, [9, 0, 8, 1, 15, 7], gpus_per_node=8)
    assert ring == [gpu_id(0, 0), gpu_id(0, 1), gpu_id(0, 7), gpu_id(1, 0), gpu_id(1, 1), gpu_id(1, 7)]
    assert sum(a[1] != b[1] for a, b in ring_flows(ring)) == 2
    with pytest.raises(ValueError, match="outside the cluster"):
        ring_order(g, [0, 16], gpus_per_node=8)


def test_two_node_ring_is_bound_by_the_nic_not_nvlink(two):
    _, g = two
    ring = ring_order(g, list(range(16)), gpus_per_node=8)
    assert ring_bus_bandwidth(g, [ring], 0) == NIC
    slowest = min((l for a, b in ring_flows(ring) for l in path(g, a, b)),
                  key=lambda l: g.edges[l]["bandwidth_bytes_per_s"])
    assert g.edges[slowest]["kind"] == "nic"
    one_node = ring_order(g, list(range(8)), gpus_per_node=8)
    assert ring_bus_bandwidth(g, [one_node], 0) == 300e9


def test_rings_sharing_a_nic_get_half_the_bandwidth():
    cl = cluster(2)
    shared = dataclasses.replace(cl, node=dataclasses.replace(cl.node, nics_per_node=4))
    g = build_cluster(shared)  # 4 NICs for 8 GPUs: GPUs 0 and 1 both use NIC 0
    ring_a, ring_b = [gpu_id(0, 0), gpu_id(1, 0)], [gpu_id(0, 1), gpu_id(1, 1)]
    assert ring_bus_bandwidth(g, [ring_a], 0) == NIC
    assert ring_bus_bandwidth(g, [ring_a, ring_b], 0) == NIC / 2
    assert concurrent_ring_bandwidths(g, [ring_a, ring_b]) == [NIC / 2, NIC / 2]
    counts = shared_links(g, [ring_a, ring_b])
    assert counts[(("nic", 0, 0), ("leaf", 0))] == 2 and counts[(("leaf", 0), ("nic", 0, 0))] == 2
    # with a NIC per GPU (the real DGX) the same two rings do not contend
    full = build_cluster(cl)
    assert concurrent_ring_bandwidths(full, [ring_a, ring_b]) == [NIC, NIC]


def test_data_parallel_rings_of_a_rank_grid():
    cl = cluster(2)
    grid = rank_grid(pp=1, dp=2, cp=1, tp=8)  # DP pairs (i, 8 + i): one ring per rail
    assert group_ring_bandwidths(build_cluster(cl), grid.groups("dp"), 8) == [NIC] * 8
    half_nics = dataclasses.replace(cl, node=dataclasses.replace(cl.node, nics_per_node=4))
    assert group_ring_bandwidths(build_cluster(half_nics), grid.groups("dp"), 8) == [NIC / 2] * 8
    tp_rings = group_ring_bandwidths(build_cluster(cl), grid.groups("tp"), 8)
    assert tp_rings == [300e9, 300e9]  # each TP ring stays on its node's NVSwitch


def test_bisection_non_blocking_and_oversubscribed():
    base = cluster(10)
    fat = build_cluster(with_fabric(base, topology="fat-tree", oversubscription=1.0, switch_radix=64))
    assert bisection_bytes_per_s(fat) == 10 / 2 * 8 * NIC
    # 2:1 on radix 64: 42 ports down -> 5 nodes per leaf, 20 NIC-ports of uplink per leaf
    over = build_cluster(with_fabric(base, topology="leaf-spine", oversubscription=2.0, switch_radix=64))
    assert bisection_bytes_per_s(over) == 10 / 2 * 8 * NIC / 2
    assert bisection_bytes_per_s(build_cluster(cluster(1))) is None


def test_mesh_and_localhost_routes():
    g = build_cluster(cluster(1, "mi300x-8"))
    route = path(g, gpu_id(0, 0), gpu_id(0, 5))
    assert route == [(gpu_id(0, 0), gpu_id(0, 5))]
    assert g.edges[route[0]]["kind"] == "xgmi"
    assert g.edges[route[0]]["bandwidth_bytes_per_s"] == pytest.approx(448e9 / 7)
    doc = {"model": "gpt3-175b", "cluster": {"node": "localhost", "gpus_per_node": 4},
           "parallel": {"dp": 4}, "training": {"global_batch": 4}}
    local = build_cluster(plan_from_dict(doc).cluster)
    assert layers(local) == Counter(gpu=4, cpu=1, storage=1)
    kinds = {local.edges[l]["kind"] for l in path(local, gpu_id(0, 0), gpu_id(0, 3))}
    assert kinds == {"shared-memory"}


def test_dragonfly_routes_between_groups_over_a_global_link():
    cl = with_fabric(cluster(16), topology="dragonfly+", switch_radix=16)
    g = build_cluster(cl)  # 8 ports down: one node per leaf, 8 leaves per group -> 2 groups
    kinds = [g.edges[l]["kind"] for l in path(g, gpu_id(0, 0), gpu_id(15, 0))]
    assert kinds.count("global") == 1
    assert [g.edges[l]["kind"] for l in path(g, gpu_id(0, 0), gpu_id(7, 0))].count("global") == 0


def test_a_multi_node_cluster_without_a_fabric_is_refused():
    with pytest.raises(ValueError, match="needs a fabric"):
        build_cluster(dataclasses.replace(cluster(2), fabric=None))


def drawn_nodes(fig: Figure) -> int:
    return sum(len(c.get_offsets()) for ax in fig.axes for c in ax.collections if isinstance(c, PathCollection))


def test_topology_figure_draws_every_device_of_a_small_cluster(two, tmp_path):
    cl, g = two
    fig = topology_figure(g, cl)
    assert isinstance(fig, Figure)
    assert drawn_nodes(fig) == g.number_of_nodes() == 56
    out = save_figure(fig, tmp_path / "topo.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["topo.png"]


def test_topology_figure_collapses_large_clusters():
    cl = cluster(6)
    g = build_cluster(cl)
    fig = topology_figure(g, cl)
    counts = layers(g)
    assert drawn_nodes(fig) == 6 + counts["leaf"] + counts["spine"]
    assert "6 nodes collapsed" in fig.axes[0].get_title()


def test_nvl72_trays_share_one_nvswitch_and_groups_leaving_the_rack_take_nics():
    """GB200 NVL72: 18 trays of 4 GPUs hang off one rack NVSwitch; a flow between trays of one
    rack crosses only it, a flow to the next rack leaves through the NICs."""
    from simcore.plan.load import plan_from_dict
    from topologies.routes import cluster_summary

    plan = plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "gb200-nvl72", "nodes": 36},
                           "training": {"global_batch": 144}})
    g = build_cluster(plan.cluster)
    assert layers(g)["nvswitch"] == 2
    assert path(g, gpu_id(0, 0), gpu_id(17, 3)) == [(gpu_id(0, 0), ("nvswitch", 0)), (("nvswitch", 0), gpu_id(17, 3))]
    hops = {v[0] for link in path(g, gpu_id(0, 0), gpu_id(18, 0)) for v in link}
    assert "nic" in hops and "nvswitch" not in hops
    assert cluster_summary(g, plan.cluster)["nvlink_domain_gpus"] == 72
