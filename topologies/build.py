"""The cluster as a networkx graph: GPUs, NVLink/NVSwitch, PCIe, hosts, NICs, leaf/spine, storage.

Builders are pure functions composed the way ``networkx/generators/classic.py`` composes
its generators: ``build_cluster`` = one ``add_server`` per node, then ``add_fabric`` and
``add_storage`` on top. The graph is an undirected ``nx.Graph`` of full-duplex links:
every edge carries, per direction,

- ``bandwidth_bytes_per_s``: what one direction of the link carries,
- ``latency_s``: one-way latency added by crossing it,
- ``kind``: ``nvswitch``, ``nvlink`` (or ``xgmi``), ``pcie``, ``shared-memory``, ``nic``,
  ``leaf-spine``, ``spine-core``, ``global`` (dragonfly+ spine-to-spine) or ``storage``.

Contention is counted per *directed* link ``(u, v)`` in ``topologies.routes``.

Node ids are tuples whose first element is the node's ``layer`` attribute:

    ("gpu", node, local)   ("nvswitch", node)   ("pcie", node, switch)   ("cpu", node)
    ("nic", node, rail)    ("leaf", j)          ("spine", k)         ("core", c)
    ("storage", node) for node-local NVMe, ("storage", "shared") for a shared tier.

Every figure comes from the ClusterSpec's catalog dataclasses (``GPU.intra_link_bytes_per_s``,
``GPU.pcie_bytes_per_s``, ``Fabric.nic_bytes_per_s``, ``Fabric.latency_s``, ...). Modelling
choices (not hardware figures), each stated where it is made:

- One logical NVSwitch per NVLink domain: NVSwitch systems are non-blocking, so the six
  (A100) or four (H100) physical switch chips act as one crossbar with
  ``intra_link_bytes_per_s`` per GPU port (NVIDIA DGX A100 / H100 user guides). A rack-scale
  domain (``ClusterSpec.nvlink_domain`` over ``gpus_per_node``: a GB200/GB300 NVL72 rack, 18
  compute trays of 4 GPUs on 9 NVLink switch trays, 130 TB/s all-to-all) is one crossbar
  ``("nvswitch", first node of the domain)`` that every GPU of its trays hangs off; each GPU
  names its switch in its ``switch`` attribute.
- A ``*-mesh`` node (nvlink-mesh, xgmi-mesh) links every GPU pair directly and splits the
  GPU's intra-node bandwidth evenly over its ``gpus_per_node - 1`` peers (AMD MI300X
  platform: seven xGMI links per GPU).
- GPUs and NICs are spread evenly over the node's PCIe switches, each switch with one
  upstream link to the host; a NIC's PCIe hop runs at the node's PCIe rate.
- Switch ports run at NIC speed. A leaf of radix R and oversubscription o gives
  ``floor(R*o/(1+o))`` ports down and carries ``down/o`` ports' worth of bandwidth up, one
  port to each spine (``add_spines``). When the leaves outnumber a spine's R ports, a fat
  tree takes a third tier (``add_three_tier``: pods of R/2 leaves under their own spines,
  core switches above); a leaf-spine fabric keeps two tiers, a spine then standing for a
  spine plane of the same capacity.
- The catalog's ``Fabric.latency_s`` is the end-to-end NIC-to-NIC latency; half sits on
  each NIC's link and the switch hops add none of their own. The catalog has no NVLink,
  PCIe or storage-link latency, so those edges carry 0 (the collective model's alpha
  term supplies the per-message start-up cost).
"""
from __future__ import annotations

import dataclasses

import math

import networkx as nx

from topologies.components import Fabric, Node
from topologies.placement import device_of

SHARED_STORAGE = ("storage", "shared")
TOPOLOGIES = ("rail-optimized-fat-tree", "fat-tree", "leaf-spine", "dragonfly+")
_SHARED_MEMORY = "shared-memory"
_LOCAL_STORAGE_KINDS = ("local", "local-nvme", "nvme")


def gpu_id(node: int, local: int) -> tuple:
    return ("gpu", node, local)


def gpu_of_rank(rank: int, gpus_per_node: int) -> tuple:
    """The GPU node id that global ``rank`` sits on (placement.device_of)."""
    return gpu_id(*device_of(rank, gpus_per_node))


def _link(g: nx.Graph, u, v, kind: str, bandwidth_bytes_per_s: float, latency_s: float = 0.0) -> None:
    g.add_edge(u, v, kind=kind, bandwidth_bytes_per_s=float(bandwidth_bytes_per_s), latency_s=float(latency_s))


def _spread(i: int, count: int, buckets: int) -> int:
    """Bucket of item ``i`` when ``count`` items are split evenly (in order) over ``buckets``."""
    return i * buckets // count


def is_localhost(node: Node) -> bool:
    """One host whose ranks talk through shared memory (node ``localhost``)."""
    return node.gpu.name == "uncalibrated-host" or node.intra == _SHARED_MEMORY or node.name == "localhost"


# --------------------------------------------------------------------------- one server

def add_host(g: nx.Graph, n: int, node: Node, gpus_per_node: int) -> None:
    """CPU and host memory, the PCIe switches under it and the GPUs under those switches
    (``localhost``: the ranks hang straight off the host, joined by shared memory)."""
    cpu = ("cpu", n)
    g.add_node(cpu, layer="cpu", node=n, host_memory_bytes=node.host_memory_bytes)
    num_switches = 0 if is_localhost(node) else node.pcie_switches
    switches = [("pcie", n, s) for s in range(num_switches)]
    pcie_bw = node.gpu.pcie_bytes_per_s
    for sw in switches:
        g.add_node(sw, layer="pcie", node=n, up=cpu)
        _link(g, sw, cpu, "pcie", pcie_bw)
    for i in range(gpus_per_node):
        up = switches[_spread(i, gpus_per_node, num_switches)] if switches else cpu
        g.add_node(gpu_id(n, i), layer="gpu", node=n, local=i, up=up)
        if is_localhost(node):
            _link(g, gpu_id(n, i), up, _SHARED_MEMORY, node.gpu.intra_link_bytes_per_s)
        else:
            _link(g, gpu_id(n, i), up, "pcie", pcie_bw)


def add_nics(g: nx.Graph, n: int, node: Node, gpus_per_node: int) -> None:
    """NICs spread over the PCIe switches; each GPU's rail NIC is the one matching its slot."""
    nics = node.nics_per_node
    switches = sorted(v for v in g[("cpu", n)] if v[0] == "pcie")
    for r in range(nics):
        up = switches[_spread(r, nics, len(switches))] if switches else ("cpu", n)
        g.add_node(("nic", n, r), layer="nic", node=n, rail=r, up=up)
        _link(g, ("nic", n, r), up, "pcie", node.gpu.pcie_bytes_per_s)
    for i in range(gpus_per_node):
        g.nodes[gpu_id(n, i)]["nic"] = ("nic", n, _spread(i, gpus_per_node, nics)) if nics else None


def add_intra(g: nx.Graph, n: int, node: Node, gpus_per_node: int, domain_nodes: int = 1) -> None:
    """GPU-to-GPU links inside a node: one NVSwitch crossbar (shared by the ``domain_nodes``
    nodes of a rack-scale NVLink domain), a full mesh, or none (PCIe)."""
    bw, gpus = node.gpu.intra_link_bytes_per_s, [gpu_id(n, i) for i in range(gpus_per_node)]
    if node.intra == "torus":
        # drawn as one logical crossbar per torus domain (a TPU slice, a Trainium instance) at
        # the chip's ICI rate; its per-dimension collective costs: simcore/model/torus.py
        node = dataclasses.replace(node, intra="nvswitch")
    if node.intra == "nvswitch":
        first = n - n % domain_nodes
        switch = ("nvswitch", first)
        if switch not in g:
            g.add_node(switch, layer="nvswitch", node=first, nodes=domain_nodes)
        for gpu in gpus:
            _link(g, gpu, switch, "nvswitch", bw)
            g.nodes[gpu]["switch"] = switch
    elif node.intra.endswith("-mesh"):
        kind = node.intra.removesuffix("-mesh")
        for a in range(gpus_per_node):
            for b in range(a + 1, gpus_per_node):
                _link(g, gpus[a], gpus[b], kind, bw / (gpus_per_node - 1))
    elif node.intra not in ("pcie", _SHARED_MEMORY):
        raise ValueError(f"node {node.name}: intra={node.intra!r} is not one of: "
                         "nvswitch, torus, nvlink-mesh, xgmi-mesh, pcie, shared-memory")


def add_server(g: nx.Graph, n: int, node: Node, gpus_per_node: int, domain_nodes: int = 1) -> None:
    add_host(g, n, node, gpus_per_node)
    add_intra(g, n, node, gpus_per_node, domain_nodes)
    if not is_localhost(node):
        add_nics(g, n, node, gpus_per_node)


# --------------------------------------------------------------------------- the fabric

def leaf_ports(fabric: Fabric) -> int:
    """Ports a leaf of radix R and oversubscription o gives to servers: floor(R*o/(1+o))."""
    o = fabric.oversubscription
    return max(1, math.floor(fabric.switch_radix * o / (1 + o)))


def _leaf_groups(fabric: Fabric, nodes: int, nics: int) -> list[list[tuple]]:
    """The NICs under each leaf. Rail-optimized: NIC r of every node goes to a rail-r leaf;
    otherwise whole nodes fill leaves in order. A fabric whose oversubscription is a catalog gap
    (a cloud's data-centre network: Google's DCN) has no known leaf: every NIC under one logical
    switch, which ``cluster_summary`` says (its bisection is then an upper bound)."""
    if math.isnan(fabric.oversubscription):
        return [[("nic", n, r) for n in range(nodes) for r in range(nics)]]
    down = leaf_ports(fabric)
    if fabric.topology == "rail-optimized-fat-tree":
        per_leaf = down
        return [[("nic", n, r) for n in range(start, min(nodes, start + per_leaf))]
                for r in range(nics) for start in range(0, nodes, per_leaf)]
    per_leaf = max(1, down // nics)
    return [[("nic", n, r) for n in range(start, min(nodes, start + per_leaf)) for r in range(nics)]
            for start in range(0, nodes, per_leaf)]


def add_leaves(g: nx.Graph, groups: list[list[tuple]], fabric: Fabric) -> list[tuple]:
    leaves = []
    for j, nics in enumerate(groups):
        leaf = ("leaf", j)
        rails = {g.nodes[nic]["rail"] for nic in nics}
        g.add_node(leaf, layer="leaf", rail=rails.pop() if len(rails) == 1 else None)
        for port, nic in enumerate(nics):
            _link(g, nic, leaf, "nic", fabric.nic_bytes_per_s, fabric.latency_s / 2)
            g.nodes[nic].update(leaf=leaf, port=port)
        leaves.append(leaf)
    return leaves


def add_spines(g: nx.Graph, leaves: list[tuple], fabric: Fabric, first: int = 0, group: int = 0) -> list[tuple]:
    """Spines above ``leaves``, a folded Clos: a leaf with d NICs below has u = d/o ports'
    worth of uplink, one trunk of u/ceil(u) ports to each of spines 0..ceil(u)-1; so there
    are as many spines as the fullest leaf has uplinks and a single flow never finds a
    trunk thinner than one port. Beyond two tiers (more leaves than a spine has ports)
    a spine stands for a spine plane of the same capacity."""
    up_ports = {leaf: g.degree(leaf) / fabric.oversubscription for leaf in leaves}
    spines = [("spine", first + k) for k in range(max(math.ceil(u) for u in up_ports.values()))]
    for spine in spines:
        g.add_node(spine, layer="spine", group=group)
    for leaf, ports in up_ports.items():
        trunks = math.ceil(ports)
        for spine in spines[:trunks]:
            _link(g, leaf, spine, "leaf-spine", ports / trunks * fabric.nic_bytes_per_s)
    return spines


def add_dragonfly(g: nx.Graph, leaves: list[tuple], fabric: Fabric) -> list[tuple]:
    """Dragonfly+ (Shpiner et al., HOTI 2017): groups of ``R/2`` leaves, each group a
    leaf-spine pod (``add_spines``: R/2 spines when its leaves are full). Spine k of a group
    has ``R/2`` global ports, spread evenly over one link to spine k of every other group
    (k taken mod a smaller group's spine count)."""
    per_group = max(1, fabric.switch_radix // 2)
    pods = [leaves[i:i + per_group] for i in range(0, len(leaves), per_group)]
    spines_of = []
    for group, pod in enumerate(pods):
        spines_of.append(add_spines(g, pod, fabric, first=sum(map(len, spines_of)), group=group))
        for leaf in pod:
            g.nodes[leaf]["group"] = group
    global_bw = (fabric.switch_radix // 2) * fabric.nic_bytes_per_s / max(1, len(pods) - 1)
    for a in range(len(pods)):
        for b in range(a + 1, len(pods)):
            sa, sb = spines_of[a], spines_of[b]
            for k in range(max(len(sa), len(sb))):
                _link(g, sa[k % len(sa)], sb[k % len(sb)], "global", global_bw)
    return [s for group in spines_of for s in group]


def spine_down_ports(fabric: Fabric) -> int:
    """Ports a spine gives to leaves: all R of them in a two-tier tree, R/2 in a three-tier
    one (the other half go up to the core), as in a k-ary fat tree (Al-Fares et al.,
    SIGCOMM 2008, Sec. 3.1: k/2 ports down and k/2 up per aggregation switch)."""
    return max(1, fabric.switch_radix // 2)


def add_three_tier(g: nx.Graph, leaves: list[tuple], fabric: Fabric) -> list[tuple]:
    """A three-tier fat tree for more leaves than a spine has ports: pods of R/2 leaves,
    each a leaf-spine pod (``add_spines``), and core switches above them: spine j of every
    pod carries its down capacity (over o) up to core group j, whose m switches of R ports
    each take one trunk from spine j of every pod (m = ceil(pods x uplinks / R)). Beyond
    R pods (four tiers) a core stands for a core plane of the same capacity."""
    per_pod = spine_down_ports(fabric)
    pods = [leaves[i:i + per_pod] for i in range(0, len(leaves), per_pod)]
    spines_of = []
    for group, pod in enumerate(pods):
        spines_of.append(add_spines(g, pod, fabric, first=sum(map(len, spines_of)), group=group))
        for leaf in pod:
            g.nodes[leaf]["group"] = group
    cores, first = [], 0
    for j in range(max(map(len, spines_of))):
        column = [spines[j] for spines in spines_of if j < len(spines)]
        up = {s: sum(g.edges[s, t]["bandwidth_bytes_per_s"] for t in g[s]) / fabric.oversubscription
              for s in column}
        ports = max(up.values()) / fabric.nic_bytes_per_s
        group = [("core", first + k) for k in range(math.ceil(len(column) * ports / fabric.switch_radix))]
        first += len(group)
        for core in group:
            g.add_node(core, layer="core", column=j)
            for s in column:
                _link(g, s, core, "spine-core", up[s] / len(group))
        cores += group
    return cores


def add_fabric(g: nx.Graph, nodes: int, node: Node, fabric: Fabric) -> None:
    """Leaves, then spines (two tiers), pods and a core (three tiers, when the leaves outnumber
    a spine's ports), or dragonfly+ groups."""
    if fabric.topology not in TOPOLOGIES:
        raise ValueError(f"fabric {fabric.name}: topology={fabric.topology!r} is not one of: {', '.join(TOPOLOGIES)}")
    leaves = add_leaves(g, _leaf_groups(fabric, nodes, node.nics_per_node), fabric)
    if fabric.topology == "dragonfly+":
        add_dragonfly(g, leaves, fabric)
    elif len(leaves) > fabric.switch_radix and fabric.topology != "leaf-spine":
        add_three_tier(g, leaves, fabric)
    elif len(leaves) > 1:
        add_spines(g, leaves, fabric)


def add_storage(g: nx.Graph, cluster) -> None:
    """Node-local NVMe hangs off each host; a shared tier hangs off the top switch layer
    (spines, else leaves), its aggregate bandwidth split evenly over those links, or off
    each host when there is no fabric. Edges carry read bandwidth, plus ``write_bytes_per_s``."""
    st = cluster.storage
    attrs = dict(layer="storage", name=st.name, storage_kind=st.kind)
    if st.kind in _LOCAL_STORAGE_KINDS or not any(g.nodes[v]["layer"] == "leaf" for v in g):
        for n in range(cluster.nodes):
            g.add_node(("storage", n), node=n, **attrs)
            _link(g, ("storage", n), ("cpu", n), "storage", st.read_bytes_per_s, st.latency_s)
            g.edges[("storage", n), ("cpu", n)]["write_bytes_per_s"] = st.write_bytes_per_s
        return
    top = [v for v in g if g.nodes[v]["layer"] == "spine"] or [v for v in g if g.nodes[v]["layer"] == "leaf"]
    g.add_node(SHARED_STORAGE, **attrs)
    for sw in top:
        _link(g, SHARED_STORAGE, sw, "storage", st.read_bytes_per_s / len(top), st.latency_s)
        g.edges[SHARED_STORAGE, sw]["write_bytes_per_s"] = st.write_bytes_per_s / len(top)


# --------------------------------------------------------------------------- the cluster

def build_cluster(cluster) -> nx.Graph:
    """The whole cluster of a ``simcore.plan.spec.ClusterSpec`` as an undirected ``nx.Graph``.

    Graph attributes: ``nodes``, ``gpus_per_node``, ``nvlink_domain``, ``description``.
    """
    node, fabric = cluster.node, cluster.fabric
    domain = getattr(cluster, "nvlink_domain", cluster.gpus_per_node)
    g = nx.Graph(nodes=cluster.nodes, gpus_per_node=cluster.gpus_per_node, nvlink_domain=domain,
                 description=describe(cluster))
    for n in range(cluster.nodes):
        add_server(g, n, node, cluster.gpus_per_node, max(1, domain // cluster.gpus_per_node))
    networked = fabric is not None and node.nics_per_node > 0 and not is_localhost(node)
    if cluster.nodes > 1 and not networked:
        raise ValueError(f"cluster.nodes={cluster.nodes} needs a fabric with NICs; node {node.name} "
                         "has none (set cluster.fabric or use one node)")
    if networked:
        add_fabric(g, cluster.nodes, node, fabric)
    add_storage(g, cluster)
    return g


def describe(cluster) -> str:
    node, fabric = cluster.node, cluster.fabric
    text = f"{cluster.nodes} x {node.name} ({cluster.gpus_per_node} x {node.gpu.name}, {node.intra})"
    domain = getattr(cluster, "nvlink_domain", cluster.gpus_per_node)
    if domain > cluster.gpus_per_node:
        text += f", NVLink domain {domain} GPUs"
    if fabric is not None and not is_localhost(node):
        o = fabric.oversubscription
        text += f", {fabric.name} {fabric.topology} " + ("oversubscription a gap" if math.isnan(o) else f"{o:g}:1")
    return text
