"""What-if sweeps: a grid over hardware, layout fields and prices, the best layout per cell.

A sweep file (YAML) names a base (model, cluster, global batch, tokens) and a ``grid``
of axes; every combination of the axes' values is one cell. Each cell is searched
(``simcore.planner.search``) for its best layout and priced (``simcore.planner.runcost``), so a cell
answers "with this hardware and these prices, how long and how much?". Axes:

- ``gpu``: a catalog GPU; the cell uses the catalog node built on it (first listed);
- ``node``, ``nodes``, ``fabric``, ``storage``, ``gpus_per_node``: the Plan's cluster fields;
- ``fabric.nic_gbit_per_s``, ``fabric.latency_us``, ``storage.read_gbyte_per_s``,
  ``storage.write_gbyte_per_s``, ``storage.per_client_gbyte_per_s``: a cluster figure
  changed in place (datasheet units, as the catalog writes them);
- ``price.<field>``: a price, energy or failure figure (``runcost.PriceSheet`` fields);
- ``model.<field>``, ``training.<field>``, ``global_batch``, ``tokens``: the base;
- ``parallel.<axis>`` / ``layout.<axis>``: pin a search axis (tp, pp, cp, zero, micro_batch,
  schedule, recompute, offload, ...) to one value.

Example: ``sweeps/example.yaml``. Every figure used is from the catalog with its source;
``WhatIfResult.assumptions`` lists them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path

import pandas as pd

from simcore.plan.load import read_yaml_file
from simcore.plan.spec import Offload, PlanError, Recompute, Schedule, ZeroStage
from topologies.hardware import load_catalog

_CLUSTER_KEYS = ("node", "nodes", "fabric", "storage", "gpus_per_node")
_FIGURES = {
    "fabric.nic_gbit_per_s": ("fabric", "nic_bytes_per_s", 1e9 / 8),
    "fabric.latency_us": ("fabric", "latency_s", 1e-6),
    "storage.read_gbyte_per_s": ("storage", "read_bytes_per_s", 1e9),
    "storage.write_gbyte_per_s": ("storage", "write_bytes_per_s", 1e9),
    "storage.per_client_gbyte_per_s": ("storage", "per_client_bytes_per_s", 1e9),
}
_SPACE_PARSERS = {"tp": int, "pp": int, "cp": int, "ep": int, "vpp": int, "micro_batch": int,
                  "zero": lambda v: ZeroStage(int(v)), "schedule": Schedule, "recompute": Recompute,
                  "offload": Offload, "sequence_parallel": bool}


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    name: str
    model: dict
    cluster: dict
    global_batch: int
    tokens: float
    training: dict = field(default_factory=dict)
    grid: dict[str, list] = field(default_factory=dict)
    space: dict[str, list] = field(default_factory=dict)
    """Search axes restricted for every cell (SearchSpace field -> values)."""
    top_k: int = 0
    objective: str = "time"
    jobs: int = 1
    monte_carlo: int = 0
    failures: bool = True
    prices: dict[str, float] = field(default_factory=dict)


def _known_axis(key: str) -> bool:
    head = key.split(".", 1)[0]
    return (key in ("gpu", "global_batch", "tokens") or key in _CLUSTER_KEYS or key in _FIGURES
            or (head in ("price", "model", "training") and "." in key)
            or (head in ("parallel", "layout") and key.split(".", 1)[-1] in _SPACE_PARSERS))


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Read a sweep YAML file; PlanError with one sentence on a problem."""
    path = Path(path)
    doc = read_yaml_file(path, "sweep file")
    if not isinstance(doc, dict):
        raise PlanError(f"sweep file {path} must hold a mapping")
    return sweep_from_dict(doc, default_name=path.stem)


def sweep_from_dict(doc: dict, default_name: str = "sweep") -> Sweep:
    known = set(Sweep.__dataclass_fields__)
    for key in doc:
        if key not in known:
            raise PlanError(f"unknown sweep field '{key}' (known: {', '.join(sorted(known))})")
    for key in ("model", "cluster", "global_batch", "tokens"):
        if key not in doc:
            raise PlanError(f"the sweep needs '{key}'")
    grid = doc.get("grid") or {}
    if not isinstance(grid, dict):
        raise PlanError("sweep.grid must map axes to lists of values")
    for key, values in grid.items():
        if not _known_axis(key):
            raise PlanError(f"unknown sweep axis 'grid.{key}' (see simcore/planner/whatif.py for the axes)")
        if not isinstance(values, list) or not values:
            raise PlanError(f"sweep axis grid.{key} must be a non-empty list")
    model = {"name": doc["model"]} if isinstance(doc["model"], str) else dict(doc["model"])
    return Sweep(name=str(doc.get("name", default_name)), model=model, cluster=dict(doc["cluster"]),
                 global_batch=int(doc["global_batch"]), tokens=float(doc["tokens"]),
                 training=dict(doc.get("training") or {}), grid=grid, space=dict(doc.get("space") or {}),
                 top_k=int(doc.get("top_k", 0)), objective=str(doc.get("objective", "time")),
                 jobs=int(doc.get("jobs", 1)), monte_carlo=int(doc.get("monte_carlo", 0)),
                 failures=bool(doc.get("failures", True)), prices=dict(doc.get("prices") or {}))


def node_for_gpu(gpu: str) -> str:
    """The first catalog node built on ``gpu``."""
    cat = load_catalog()
    for name, raw in cat.nodes.items():
        if raw.get("gpu") == gpu:
            return name
    raise PlanError(f"no catalog node has GPU '{gpu}' (GPUs with nodes: "
                    f"{', '.join(sorted({r.get('gpu') for r in cat.nodes.values() if r.get('gpu')}))})")


def cells(sweep: Sweep) -> list[dict]:
    """Every combination of the grid's values, in grid order."""
    keys = list(sweep.grid)
    return [dict(zip(keys, values)) for values in product(*(sweep.grid[k] for k in keys))]


# --------------------------------------------------------------------------- one cell

def _cluster_of(sweep: Sweep, cell: dict):
    """The cell's ClusterSpec: base cluster, cell's cluster fields, then changed figures."""
    from simcore.plan.load import plan_from_dict

    doc = dict(sweep.cluster)
    if "gpu" in cell:
        doc["node"] = node_for_gpu(cell["gpu"])
    doc.update({k: cell[k] for k in _CLUSTER_KEYS if k in cell})
    probe = plan_from_dict({"model": "gpt-1.7b", "cluster": doc, "parallel": {"tp": 1, "pp": 1, "dp": 1},
                            "training": {"global_batch": 1}})
    cluster = probe.cluster
    for key, (part, attr, scale) in _FIGURES.items():
        if key in cell:
            obj = getattr(cluster, part)
            if obj is None:
                raise PlanError(f"grid.{key}: the cluster has no {part} to change")
            value = float(cell[key])
            obj = replace(obj, **{attr: value * scale}, name=f"{obj.name}[{key.split('.')[1]}={value:g}]")
            cluster = replace(cluster, **{part: obj})
    return cluster


def _space_of(base, sweep: Sweep, cell: dict):
    from simcore.planner.space import derive_space

    space = derive_space(base)
    pins = {k: v for k, v in sweep.space.items()}
    pins.update({k.split(".", 1)[1]: [v] for k, v in cell.items() if k.split(".", 1)[0] in ("parallel", "layout")})
    for key, values in pins.items():
        if key not in _SPACE_PARSERS:
            raise PlanError(f"unknown search axis '{key}' (known: {', '.join(_SPACE_PARSERS)})")
        values = values if isinstance(values, list) else [values]
        space = replace(space, **{key: tuple(_SPACE_PARSERS[key](v) for v in values)})
    return space


def _prediction_of(row):
    """The step figures run_cost needs, from the engine where it ran, else the analytic path."""
    from types import SimpleNamespace

    des = "des_step_time_s" in row and pd.notna(row.get("des_step_time_s"))
    pre = "des_" if des else ""
    return SimpleNamespace(step_time_s=float(row[pre + "step_time_s"]), compute_s=float(row[pre + "compute_s"]))


def run_cell(sweep: Sweep, cell: dict) -> tuple[dict, object | None]:
    """Search the cell's best layout and price its run: (table row, RunCost or None)."""
    from simcore.planner.runcost import run_cost
    from simcore.planner.search import search
    from simcore.planner.space import base_plan

    model = dict(sweep.model, **{k.split(".", 1)[1]: v for k, v in cell.items() if k.startswith("model.")})
    training = dict(sweep.training, **{k.split(".", 1)[1]: v for k, v in cell.items() if k.startswith("training.")})
    gb = int(cell.get("global_batch", sweep.global_batch))
    tokens = float(cell.get("tokens", sweep.tokens))
    prices = dict(sweep.prices, **{k.split(".", 1)[1]: v for k, v in cell.items() if k.startswith("price.")})
    cluster = _cluster_of(sweep, cell)
    base = base_plan(model, cluster, gb, training)
    row = {**cell, "gpu": cluster.node.gpu.name, "node": cluster.node.name, "nodes": cluster.nodes,
           "gpus": cluster.gpus, "fabric": cluster.fabric.name if cluster.fabric else "none",
           "storage": cluster.storage.name}
    try:
        res = search(model, cluster, gb, objective=sweep.objective, top_k=sweep.top_k, jobs=sweep.jobs,
                     tokens=tokens, progress=False, training=training, space=_space_of(base, sweep, cell),
                     explain=0)
    except PlanError as exc:
        return {**row, "layout": None, "fits": False, "note": str(exc)}, None
    top = res.table.iloc[0]
    rc = run_cost(res.best, _prediction_of(top), tokens, prices=prices, failures=sweep.failures,
                  monte_carlo=sweep.monte_carlo)
    row.update(layout=top["layout"], fits=True, step_time_s=rc.step_time_s, mfu=float(top["mfu"]),
               memory_per_gpu_gib=float(top["memory_per_gpu_gib"]), days=rc.days, gpu_hours=rc.gpu_hours,
               usd=rc.on_demand.usd, usd_reserved=rc.reserved.usd, usd_spot=rc.spot.usd,
               spot_days=rc.spot.wall_s / 86400.0, energy_kwh=rc.energy_kwh, energy_usd=rc.energy_usd,
               goodput=rc.on_demand.goodput, checkpoint_write_s=rc.checkpoint.write_s,
               checkpoint_interval_s=rc.checkpoint.interval_s, storage_bound=bool(rc.data["storage_bound"]),
               compute_s=float(top["compute_s"]), exposed_comm_s=float(top["exposed_comm_s"]),
               bubble_s=float(top["bubble_s"]), offload_s=float(top["offload_s"]), layouts=res.tally.simulated)
    if sweep.monte_carlo:
        row.update(days_p50=rc.on_demand.monte_carlo["days_p50"], days_p90=rc.on_demand.monte_carlo["days_p90"],
                   usd_p50=rc.on_demand.monte_carlo["usd_p50"], usd_p90=rc.on_demand.monte_carlo["usd_p90"])
    return row, rc


# --------------------------------------------------------------------------- the sweep

@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIfResult:
    sweep: Sweep
    table: pd.DataFrame
    """One row per cell: the axes, the best layout, time, $, energy, goodput."""
    assumptions: list[str]

    def summary_markdown(self) -> str:
        cols = [c for c in (*self.sweep.grid, "layout", "step_time_s", "mfu", "days", "usd", "usd_spot",
                            "energy_kwh", "goodput") if c in self.table]
        lines = [f"# What-if: {self.sweep.name}", "",
                 f"{self.sweep.model.get('name', 'model')}, {self.sweep.tokens:.3g} tokens, global batch "
                 f"{self.sweep.global_batch}; best layout per cell by {self.sweep.objective}.", "",
                 _markdown_table(self.table[cols]), "", "## Assumptions and sources", ""]
        return "\n".join(lines + [f"- {a}" for a in self.assumptions]) + "\n"


def _markdown_table(df: pd.DataFrame) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:,.3g}" if abs(v) < 1e4 else f"{v:,.0f}"
        return str(v)
    head = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "---|" * len(df.columns)
    body = ["| " + " | ".join(fmt(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def assumptions_of(rows: list[tuple[dict, object]]) -> list[str]:
    """Every figure a sweep leaned on, with its source (deduplicated, in first-use order)."""
    from simcore.planner.runcost import GPU_IDLE_POWER_FRACTION

    cat, out = load_catalog(), []
    for row, rc in rows:
        gpu, node = cat.gpus.get(row["gpu"]), row["node"]
        out.append(f"GPU {row['gpu']}: {gpu.source if gpu else 'calibrated profile'}")
        out.append(f"node {node}: {cat.nodes[node].get('source', '')}")
        if row["fabric"] in cat.fabrics:
            out.append(f"fabric {row['fabric']}: {cat.fabrics[row['fabric']].source}")
        if row["storage"] in cat.storage:
            out.append(f"storage {row['storage']}: {cat.storage[row['storage']].source}")
        if rc is not None:
            out.append(f"price {row['gpu']} (on-demand ${rc.prices.on_demand_usd:.2f}, reserved "
                       f"${rc.prices.reserved_usd:.2f}, spot ${rc.prices.spot_usd:.2f} per GPU-hour): "
                       f"{rc.prices.price_source}")
            out.append(f"energy ${rc.prices.usd_per_kwh}/kWh, PUE {rc.prices.pue}: {rc.prices.energy_source}")
            out.append(f"failures {rc.prices.failures_per_gpu_hour:g} per GPU-hour, restart "
                       f"{rc.prices.restart_s:.0f} s, spot preemptions {rc.prices.spot_preemptions_per_node_hour:g} "
                       f"per node-hour: {rc.prices.failures_source}")
    out += [f"GPU idle power {GPU_IDLE_POWER_FRACTION:.0%} of TDP: assumption (simcore/planner/runcost.py)",
            "days and $ include checkpoints and expected failures (Daly 2006); cloud prices include energy",
            "per cell the layout is the best of the search (simcore/planner/search.py: lightest recompute that fits, "
            "offload only where needed, GPipe dominated by 1F1B)"]
    return list(dict.fromkeys(out))


def run_whatif(sweep_path: str | os.PathLike | Sweep, *, progress: bool = True) -> WhatIfResult:
    """Every cell of the sweep: best layout, time, $, energy; with the assumptions used."""
    from tqdm import tqdm

    sweep = sweep_path if isinstance(sweep_path, Sweep) else load_sweep(sweep_path)
    results = [run_cell(sweep, cell) for cell in tqdm(cells(sweep), desc="what-if", unit="cell",
                                                      disable=not progress, leave=False)]
    table = pd.DataFrame([row for row, _ in results])
    return WhatIfResult(sweep=sweep, table=table, assumptions=assumptions_of(results))
