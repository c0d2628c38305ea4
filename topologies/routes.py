"""Routes, ring orders and link sharing on the cluster graph of ``topologies.build``.

A route is the list of *directed* links ``(u, v)`` one flow crosses. Routing follows
what NCCL does on a rail-optimized cluster (NCCL ``src/graph/search.cc``, ``paths.cc``):

- inside a node, GPU to GPU over NVLink: one hop through the node's NVSwitch, or the
  direct link of a mesh; without NVLink, through the PCIe switches and the host;
- inside a rack-scale NVLink domain (GB200/GB300 NVL72), across its trays too: one hop
  through the domain's NVSwitch (NCCL's multi-node NVLink, MNNVL), never the NICs;
- across nodes, each GPU uses its rail NIC (the NIC on its own PCIe switch):
  GPU -> PCIe switch -> NIC -> leaf -> (spine -> leaf) -> NIC -> PCIe switch -> GPU.
  Among equal spines, the spine is picked by destination-mod-k routing, as InfiniBand's
  OpenSM fat-tree routing engine does (Zahavi, "D-Mod-K Routing Providing Non-Blocking
  Traffic for Shift Permutations on Real Life Fat Trees", 2010): spine = the destination
  NIC's port on its leaf mod the number of candidate spines. Ring steps are shift
  permutations, so rings on a non-blocking tree do not collide on the spines.

Contention is counted per directed link (links are full duplex). A ring all-reduce's
step time is set by its slowest flow, so a ring's bus bandwidth when several rings
run at once is min over its links of bandwidth / flows sharing the link: the beta
term of the alpha-beta cost model (Thakur, Rabenseifner and Gropp, IJHPCA 2005) with
each link's bandwidth shared equally among the flows that cross it.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import NamedTuple

import networkx as nx

from topologies.build import gpu_of_rank, is_localhost

Link = tuple  # (u, v): a directed link between two graph nodes


class RouteCost(NamedTuple):
    """The alpha-beta figures of one route: bottleneck bandwidth and summed latency."""

    bandwidth_bytes_per_s: float
    latency_s: float


def _to_root(graph: nx.Graph, v) -> list:
    """``v`` and its ancestors in its server's host tree (GPU/NIC -> PCIe switch -> CPU)."""
    chain = [v]
    while "up" in graph.nodes[chain[-1]]:
        chain.append(graph.nodes[chain[-1]]["up"])
    return chain


def host_path(graph: nx.Graph, a, b) -> list:
    """Nodes from ``a`` to ``b`` through their lowest common ancestor in the host tree."""
    up_a, up_b = _to_root(graph, a), _to_root(graph, b)
    common = next(v for v in up_a if v in up_b)
    return up_a[: up_a.index(common) + 1] + list(reversed(up_b[: up_b.index(common)]))


def fabric_path(graph: nx.Graph, leaf_a, leaf_b, key: int) -> list:
    """Switches from ``leaf_a`` to ``leaf_b``: same leaf, a shared spine (chosen by ``key``),
    or spine -> global link -> spine (dragonfly+)."""
    if leaf_a == leaf_b:
        return [leaf_a]
    spines = sorted(s for s in graph[leaf_a] if s[0] == "spine")
    common = [s for s in spines if graph.has_edge(s, leaf_b)]
    if common:
        return [leaf_a, common[key % len(common)], leaf_b]
    pairs = [(s, t) for s in spines for t in sorted(graph[s]) if t[0] == "spine" and graph.has_edge(t, leaf_b)]
    ups = [(s, c, t) for s in spines for c in sorted(graph[s]) if c[0] == "core"     # three tiers
           for t in sorted(graph[c]) if t[0] == "spine" and graph.has_edge(t, leaf_b)]
    if ups and not pairs:
        s, c, t = ups[key % len(ups)]
        return [leaf_a, s, c, t, leaf_b]
    if not pairs:
        raise ValueError(f"no route between {leaf_a} and {leaf_b} in the fabric")
    s, t = pairs[key % len(pairs)]
    return [leaf_a, s, t, leaf_b]


def _nodes_path(graph: nx.Graph, a, b) -> list:
    if a == b:
        return [a]
    ga, gb = graph.nodes[a], graph.nodes[b]
    if ga["node"] == gb["node"] and graph.has_edge(a, b):   # NVLink / xGMI mesh
        return [a, b]
    if ga.get("switch") is not None and ga.get("switch") == gb.get("switch"):   # one NVLink domain
        return [a, ga["switch"], b]
    if ga["node"] == gb["node"]:
        return host_path(graph, a, b)
    nic_a, nic_b = ga.get("nic"), gb.get("nic")
    if nic_a is None or nic_b is None or "leaf" not in graph.nodes[nic_a]:
        raise ValueError(f"{a} and {b} are on different nodes but the cluster has no fabric")
    key = graph.nodes[nic_b]["port"]
    middle = fabric_path(graph, graph.nodes[nic_a]["leaf"], graph.nodes[nic_b]["leaf"], key)
    return host_path(graph, a, nic_a) + middle + list(reversed(host_path(graph, b, nic_b)))


def path(graph: nx.Graph, gpu_a, gpu_b) -> list[Link]:
    """The directed links a flow from ``gpu_a`` to ``gpu_b`` crosses, in order."""
    nodes = _nodes_path(graph, gpu_a, gpu_b)
    return list(zip(nodes, nodes[1:]))


def bottleneck(graph: nx.Graph, route: list[Link]) -> RouteCost:
    """Min bandwidth and summed latency along ``route`` (an empty route is free)."""
    if not route:
        return RouteCost(float("inf"), 0.0)
    edges = [graph.edges[u, v] for u, v in route]
    return RouteCost(min(e["bandwidth_bytes_per_s"] for e in edges), sum(e["latency_s"] for e in edges))


# --------------------------------------------------------------------------- rings

def ring_order(graph: nx.Graph, ranks: list[int], gpus_per_node: int) -> list[tuple]:
    """The GPUs of ``ranks`` in a ring that crosses node boundaries as few times as possible:
    node by node, local GPUs in order (so PCIe neighbours stay adjacent); a ring over k
    nodes then crosses a node boundary exactly k times (0 for one node)."""
    gpus = sorted({gpu_of_rank(r, gpus_per_node) for r in ranks})
    missing = [g for g in gpus if g not in graph]
    if missing:
        raise ValueError(f"rank on {missing[0]} is outside the cluster ({graph.graph['nodes']} nodes "
                         f"x {gpus_per_node} GPUs)")
    return gpus


def ring_flows(ring: list) -> list[tuple]:
    """The (source, destination) GPU pairs of one ring step: each GPU sends to the next."""
    if len(ring) < 2:
        return []
    return list(zip(ring, ring[1:] + ring[:1]))


def ring_links(graph: nx.Graph, ring: list) -> list[Link]:
    """Every directed link the flows of ``ring`` cross (a link crossed twice appears twice)."""
    return [link for a, b in ring_flows(ring) for link in path(graph, a, b)]


def shared_links(graph: nx.Graph, rings: list[list]) -> dict[Link, int]:
    """How many flows of the simultaneous ``rings`` cross each directed link."""
    return dict(Counter(link for ring in rings for link in ring_links(graph, ring)))


def _share(graph: nx.Graph, links: list[Link], counts: dict[Link, int]) -> float:
    if not links:
        return float("inf")
    return min(graph.edges[u, v]["bandwidth_bytes_per_s"] / counts[(u, v)] for u, v in links)


def ring_bus_bandwidth(graph: nx.Graph, rings: list[list], ring_index: int) -> float:
    """Per-flow bandwidth of ``rings[ring_index]`` while all ``rings`` run at once (bytes/s):
    min over its links of bandwidth / flows sharing the link. A one-GPU ring is inf."""
    return _share(graph, ring_links(graph, rings[ring_index]), shared_links(graph, rings))


def concurrent_ring_bandwidths(graph: nx.Graph, rings: list[list]) -> list[float]:
    """``ring_bus_bandwidth`` of every ring at once, sharing one link count."""
    per_ring = [ring_links(graph, ring) for ring in rings]
    counts = Counter(link for links in per_ring for link in links)
    return [_share(graph, links, counts) for links in per_ring]


def channel_rings(graph: nx.Graph, ranks: list[int], gpus_per_node: int) -> list[list]:
    """The rings NCCL runs for one group: one channel per member a node holds, each rotated
    within every node so that a different member (and so a different rail NIC) carries the
    channel out of the node (NCCL builds several channels and spreads them over the NICs,
    NVIDIA/nccl src/graph/search.cc). A group with one member per node has one ring."""
    ring = ring_order(graph, ranks, gpus_per_node)
    blocks: list[list] = []
    for gpu in ring:
        if blocks and blocks[-1][0][1] == gpu[1]:
            blocks[-1].append(gpu)
        else:
            blocks.append([gpu])
    k = min(len(b) for b in blocks)
    if len(blocks) == 1:
        return [ring]  # inside one node every channel crosses the same NVLink ports
    return [[g for b in blocks for g in b[c:] + b[:c]] for c in range(k)]


def group_ring_bandwidths(graph: nx.Graph, groups: list[list[int]], gpus_per_node: int) -> list[float]:
    """Bus bandwidth (bytes/s) of each rank group (e.g. ``RankGrid.groups("dp")``) when the
    collectives of all ``groups`` run at the same time: the sum over the group's channels
    (``channel_rings``) of each channel's per-flow bandwidth under the shared-link analysis.
    The collective cost model's question, in one call."""
    chans = [channel_rings(graph, ranks, gpus_per_node) for ranks in groups]
    bws = concurrent_ring_bandwidths(graph, [r for ch in chans for r in ch])
    out, i = [], 0
    for ch in chans:
        out.append(sum(bws[i:i + len(ch)]))
        i += len(ch)
    return out


def ring_latency_s(graph: nx.Graph, ring: list) -> float:
    """The slowest hop's summed link latency: the per-step latency of the ring."""
    return max((bottleneck(graph, path(graph, a, b)).latency_s for a, b in ring_flows(ring)), default=0.0)


# --------------------------------------------------------------------------- summary

def bisection_bytes_per_s(graph: nx.Graph) -> float | None:
    """Fabric bisection bandwidth, per direction: the min cut between the NICs of the first
    half of the nodes and those of the second half (nodes in index order, so the halves
    fill whole leaves where they can, the worst case of a tree). Computed as a max flow over
    the NIC, leaf, spine and global links only (host PCIe is not part of the fabric).
    None for a single node or a cluster without a fabric."""
    nodes = graph.graph["nodes"]
    fabric = [v for v in graph if v[0] in ("nic", "leaf", "spine", "core")
              and (v[0] != "nic" or "leaf" in graph.nodes[v])]
    if nodes < 2 or not any(v[0] == "leaf" for v in fabric):
        return None
    flow = nx.DiGraph()
    for u, v, bw in graph.subgraph(fabric).edges(data="bandwidth_bytes_per_s"):
        if u[0] == "nic" or v[0] == "nic":   # a NIC has one fabric link: fold it into the
            nic, leaf = (u, v) if u[0] == "nic" else (v, u)   # source or sink edge of its leaf
            end = ("source", leaf) if nic[1] < nodes // 2 else (leaf, "sink")
            flow.add_edge(*end, capacity=flow.edges[end]["capacity"] + round(bw) if flow.has_edge(*end) else round(bw))
            continue
        flow.add_edge(u, v, capacity=round(bw))  # integer capacities: exact max flow
        flow.add_edge(v, u, capacity=round(bw))
    return float(nx.maximum_flow_value(flow, "source", "sink"))


def cluster_summary(graph: nx.Graph, cluster) -> dict:
    """The figures ``trainplan topology`` prints: sizes, link rates, bisection, switch counts."""
    node, fabric = cluster.node, cluster.fabric
    layers = Counter(layer for _, layer in graph.nodes(data="layer"))
    networked = "leaf" in layers
    bisection = bisection_bytes_per_s(graph)
    summary = {
        "cluster": graph.graph["description"],
        "gpus": cluster.gpus,
        "nodes": cluster.nodes,
        "gpus_per_node": cluster.gpus_per_node,
        "gpu": node.gpu.name,
        "intra_node_link": node.intra,
        "intra_node_gbyte_per_s_per_gpu": node.gpu.intra_link_bytes_per_s / 1e9,
        "nvlink_domain_gpus": graph.graph.get("nvlink_domain", cluster.gpus_per_node),
        "fabric": fabric.name if networked else None,
        "fabric_topology": fabric.topology if networked else None,
        "oversubscription": fabric.oversubscription if networked else None,
        "nics_per_node": node.nics_per_node if not is_localhost(node) else 0,
        "injection_gbit_per_s_per_gpu": (node.nics_per_node * fabric.nic_bytes_per_s * 8 / 1e9
                                         / cluster.gpus_per_node) if networked else None,
        "bisection_tbyte_per_s": None if bisection is None else round(bisection / 1e12, 6),
        **({"fabric_gap": f"{fabric.name}'s oversubscription is a catalog gap: its hosts are drawn under one "
                          "logical switch, and the bisection is the NICs' (an upper bound)"}
           if networked and math.isnan(fabric.oversubscription) else {}),
        "leaf_switches": layers["leaf"],
        "spine_switches": layers["spine"],
        "core_switches": layers["core"],
        "network_switches": layers["leaf"] + layers["spine"] + layers["core"],
        "nvswitches": layers["nvswitch"],
        "pcie_switches": layers["pcie"],
        "storage": f"{cluster.storage.name} ({cluster.storage.kind})",
        "graph_nodes": graph.number_of_nodes(),
        "graph_edges": graph.number_of_edges(),
    }
    return summary
