"""matplotlib figures. Each figure function returns a ``matplotlib.figure.Figure`` built
without pyplot (no global state, no display backend: the Agg canvas renders it), and
``save_figure`` writes it atomically (temporary file, then ``os.replace``).

The topology figure lays the cluster graph of ``topologies.build`` out in layers, from
the spines at the top down to the hosts; edges are coloured by link kind.
"""
from __future__ import annotations

import math
from collections import defaultdict
import os
import tempfile
from pathlib import Path

import networkx as nx
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from simcore.results import STREAMS
from topologies.build import describe

DETAILED_MAX_NODES = 4
"""Clusters up to this many servers are drawn GPU by GPU; larger ones one box per server."""

KIND_COLOURS = {
    "nvswitch": "tab:green", "nvlink": "tab:green", "xgmi": "tab:olive", "shared-memory": "tab:green",
    "pcie": "tab:orange", "nic": "tab:blue", "leaf-spine": "tab:purple", "spine-core": "tab:red",
    "global": "tab:red",
    "storage": "tab:brown", "server": "tab:blue",
}
LAYER_STYLE = {  # layer: (y, marker, colour, size)
    "storage": (7.6, "D", "tab:brown", 60), "core": (6.8, "s", "tab:red", 70),
    "spine": (6.0, "s", "tab:purple", 70),
    "leaf": (5.0, "s", "tab:blue", 60), "nic": (4.0, "o", "tab:cyan", 25),
    "server": (4.0, "s", "lightgray", 80), "nvswitch": (3.5, "h", "tab:green", 70),
    "gpu": (3.0, "o", "black", 35), "pcie": (2.0, "^", "tab:orange", 35),
    "cpu": (1.0, "s", "tab:gray", 50), "local-storage": (0.0, "D", "tab:brown", 30),
}


def _row(items: list, x0: float, width: float) -> dict:
    """Spread ``items`` evenly over [x0, x0 + width]."""
    return {v: x0 + (i + 0.5) * width / len(items) for i, v in enumerate(items)}


def _server_positions(graph: nx.Graph, n: int, x0: float, width: float) -> dict:
    """Positions of one server's GPUs, NVSwitch, PCIe switches, NICs, CPU and local storage."""
    members = sorted(v for v in graph if graph.nodes[v].get("node") == n and v[0] != "storage")
    pos = {}
    for layer in ("gpu", "pcie", "nic", "nvswitch", "cpu"):
        row = [v for v in members if v[0] == layer]
        y = LAYER_STYLE[layer][0]
        pos.update({v: (x, y) for v, x in _row(row, x0, width).items()})
    gpus = [v for v in members if v[0] == "gpu"]
    if any(graph.edges[e]["kind"] in ("nvlink", "xgmi") for e in graph.edges(gpus[:1])):
        for i, v in enumerate(gpus):  # a full mesh on an ellipse, so that no two links overlap
            angle = 2 * math.pi * i / len(gpus)
            pos[v] = (x0 + width / 2 * (1 + 0.9 * math.sin(angle)), LAYER_STYLE["gpu"][0] + 0.4 * math.cos(angle))
    if ("storage", n) in graph:
        pos[("storage", n)] = (x0 + width * 0.9, LAYER_STYLE["local-storage"][0])
    return pos


def _switch_positions(graph: nx.Graph, total_width: float) -> dict:
    pos = {}
    for layer in ("leaf", "spine", "core"):
        row = sorted(v for v in graph if v[0] == layer)
        pos.update({v: (x, LAYER_STYLE[layer][0]) for v, x in _row(row, 0.0, total_width).items()})
    if ("storage", "shared") in graph:
        pos[("storage", "shared")] = (total_width / 2, LAYER_STYLE["storage"][0])
    return pos


def detailed_layout(graph: nx.Graph) -> tuple[dict, list[tuple]]:
    """Every graph node placed in its layer; edges as (u, v, kind)."""
    nodes, width = graph.graph["nodes"], max(graph.graph["gpus_per_node"], 4)
    pos = {}
    for n in range(nodes):
        pos.update(_server_positions(graph, n, n * (width + 1), width))
    pos.update(_switch_positions(graph, nodes * (width + 1) - 1))
    return pos, [(u, v, kind) for u, v, kind in graph.edges(data="kind")]


def collapsed_layout(graph: nx.Graph) -> tuple[dict, list[tuple]]:
    """One box per server (``("server", n)``), leaves, spines and shared storage; each edge
    from inside a server to a switch becomes one server-to-switch edge."""
    nodes = graph.graph["nodes"]
    pos = {("server", n): (x, LAYER_STYLE["server"][0])
           for n, x in enumerate(_row(list(range(nodes)), 0.0, float(nodes)).values())}
    pos.update(_switch_positions(graph, float(nodes)))

    def outer(v):
        return ("server", graph.nodes[v]["node"]) if "node" in graph.nodes[v] else v

    edges = {}
    for u, v, kind in graph.edges(data="kind"):
        a, b = outer(u), outer(v)
        if a != b and a in pos and b in pos:
            edges.setdefault(tuple(sorted((a, b), key=repr)), kind)
    return pos, [(a, b, kind) for (a, b), kind in edges.items()]


def _layer_of(graph: nx.Graph, v) -> str:
    if v[0] == "server":
        return "server"
    if v[0] == "storage" and v != ("storage", "shared"):
        return "local-storage"
    return graph.nodes[v]["layer"]


def topology_figure(graph: nx.Graph, cluster=None) -> Figure:
    """The cluster graph in layers; edge colour by link kind, with a legend."""
    nodes = graph.graph["nodes"]
    collapsed = nodes > DETAILED_MAX_NODES
    pos, edges = collapsed_layout(graph) if collapsed else detailed_layout(graph)
    xs = [x for x, _ in pos.values()]
    fig = Figure(figsize=(min(16.0, max(9.0, 0.25 * (max(xs) - min(xs)) + 6)), 6.5), layout="constrained")
    ax = fig.add_subplot()
    kinds = sorted({kind for _, _, kind in edges})
    for kind in kinds:
        segments = [(pos[u], pos[v]) for u, v, k in edges if k == kind]
        alpha = max(0.05, min(0.8, 150 / len(segments)))  # dense bundles stay see-through
        ax.add_collection(LineCollection(segments, colors=KIND_COLOURS.get(kind, "gray"),
                                         linewidths=0.5 if collapsed else 1.0, alpha=alpha, zorder=1))
    for layer, (_, marker, colour, size) in LAYER_STYLE.items():
        members = [v for v in pos if _layer_of(graph, v) == layer]
        if members:
            ax.scatter([pos[v][0] for v in members], [pos[v][1] for v in members], marker=marker,
                       c=colour, s=size, zorder=2, label=layer, edgecolors="black", linewidths=0.3)
    if not collapsed or nodes <= 32:
        for n in range(nodes):
            x = pos[("server", n)][0] if collapsed else pos[("cpu", n)][0]
            ax.annotate(f"node {n}", (x, 3.5 if collapsed else 0.55), ha="center", fontsize=7)
    handles = [Line2D([], [], color=KIND_COLOURS.get(k, "gray"), label=k) for k in kinds]
    layer_legend = ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7,
                             title="devices", title_fontsize=7)
    ax.add_artist(layer_legend)
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(1.0, 0.0), fontsize=7,
              title="links", title_fontsize=7)
    title = describe(cluster) if cluster is not None else graph.graph.get("description", "cluster")
    if collapsed:
        title += f" - {nodes} nodes collapsed to one box each"
    ax.set_title(title, fontsize=9)
    ax.set_yticks([])
    ax.set_xticks([])
    ax.margins(0.03, 0.12)
    return fig


def save_figure(fig: Figure, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix, PNG by default) atomically."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format=fmt, dpi=dpi)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


# --------------------------------------------------------------------------- pipeline Gantt
# Drawn like the schedule figures of Narayanan et al. 2021 (Fig. 3-4): time left to right,
# one lane per (rank, stream); bars of one kind in one lane are one broken_barh (fast).

KIND_COLOURS = {
    "forward": "tab:blue", "backward": "tab:green", "backward_input": "tab:green",
    "backward_weight": "tab:olive", "recompute": "tab:cyan", "optimizer": "tab:purple",
    "all_reduce": "tab:red", "reduce_scatter": "tab:red", "all_gather": "tab:orange",
    "all_to_all": "tab:pink", "broadcast": "tab:pink", "send": "tab:gray", "recv": "silver",
    "offload": "tab:brown", "idle": "white",
}

#: Lanes label F/B micro-batch names inside bars when a lane has at most this many bars.
LABEL_MAX_BARS = 64


def gantt_figure(spans, title: str = "", width_in: float = 12.0) -> Figure:
    """A Gantt chart of ``spans`` (``simcore.results.Span``); returns the Figure."""
    lanes: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    names: dict[tuple[int, int], list[tuple[float, float, str]]] = defaultdict(list)
    for s in spans:
        lane = (s.rank, STREAMS.index(s.stream) if s.stream in STREAMS else len(STREAMS))
        lanes[lane][s.kind].append((s.start_s, s.duration_s))
        names[lane].append((s.start_s, s.duration_s, s.name))
    order = sorted(lanes)
    fig = Figure(figsize=(width_in, max(2.0, 0.35 * len(order) + 1.2)), layout="constrained")
    ax = fig.add_subplot()
    kinds_seen: list[str] = []
    for y, lane in enumerate(order):
        for kind, bars in lanes[lane].items():
            # edges only where bars are few enough to be told apart; otherwise they drown the colours
            edge = "black" if len(bars) <= LABEL_MAX_BARS else "none"
            ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=KIND_COLOURS.get(kind, "black"),
                           edgecolor=edge, linewidth=0.3)
            if kind not in kinds_seen:
                kinds_seen.append(kind)
        if lane[1] == 0 and len(names[lane]) <= LABEL_MAX_BARS:
            for start, dur, name in names[lane]:
                ax.text(start + dur / 2, y, name, ha="center", va="center", fontsize=6, clip_on=True)
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([f"rank {r} {STREAMS[t] if t < len(STREAMS) else 'other'}" for r, t in order], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(title)
    ax.legend(handles=[Patch(facecolor=KIND_COLOURS.get(k, "black"), label=k) for k in kinds_seen],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    return fig


# --------------------------------------------------------------------------- validation and memory

def predicted_vs_measured_figure(table, *, band: float = 0.10, title: str = "Predicted against measured step time") -> Figure:
    """Scatter of predicted against measured step time per layout, the y=x line and a +-band."""
    fig = Figure(figsize=(6.4, 5.6), layout="constrained")
    ax = fig.add_subplot()
    meas, pred = table["meas_step_s"].to_numpy(), table["pred_step_s"].to_numpy()
    lo, hi = min(meas.min(), pred.min()) * 0.8, max(meas.max(), pred.max()) * 1.2
    xs = [lo, hi]
    ax.plot(xs, xs, color="black", lw=1, label="y = x")
    ax.fill_between(xs, [x * (1 - band) for x in xs], [x * (1 + band) for x in xs], color="tab:green",
                    alpha=0.15, label=f"±{band:.0%}")
    ax.scatter(meas, pred, s=36, color="tab:blue", zorder=3, label="layouts")
    for name, x, y in zip(table["layout"], meas, pred):
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    decades = math.log10(hi / lo)       # labelled ticks, several per axis even over a narrow range
    subs = tuple(range(1, 10)) if decades < 1 else (1.0, 2.0, 5.0) if decades < 3 else (1.0,)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=subs))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (s)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    return fig


MEMORY_COLOURS = {"weights": "tab:blue", "gradients": "tab:orange", "optimizer_states": "tab:green",
                  "activations": "tab:red", "comm_buffers": "tab:purple", "framework": "tab:gray"}


def memory_figure(ranks: list[dict], hbm_bytes: float, title: str = "Memory per GPU") -> Figure:
    """Stacked bars of bytes per GPU by kind for each pipeline rank, against the HBM line."""
    gib = 1024**3
    fig = Figure(figsize=(max(4.5, 0.6 * len(ranks) + 3), 4.2), layout="constrained")
    ax = fig.add_subplot()
    xs = list(range(len(ranks)))
    bottom = [0.0] * len(ranks)
    for kind, colour in MEMORY_COLOURS.items():
        vals = [r.get(kind, 0.0) / gib for r in ranks]
        ax.bar(xs, vals, bottom=bottom, color=colour, label=kind.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.axhline(hbm_bytes / gib, color="black", ls="--", lw=1.2, label=f"HBM {hbm_bytes / gib:.0f} GiB")
    ax.set_xticks(xs, [f"pp {r.get('pp_rank', i)}" for i, r in enumerate(ranks)])
    ax.set_ylabel("GiB per GPU")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig
