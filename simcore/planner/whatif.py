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
  schedule, recompute, offload, ..., ``compression``: a communication compression method of
  ``simcore.planner.compression``, each cell's best layout that takes it) to one value.

Example: ``sweeps/example.yaml``. Every figure used is from the catalog with its source;
``WhatIfResult.assumptions`` lists them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path

import pandas as pd

from simcore.plan.bounds import check_tokens
from simcore.plan.load import read_yaml_file
from simcore.plan.choices import NoLayoutFits
from simcore.plan.spec import Offload, PlanError, Precision, Recompute, Schedule, ZeroStage
from simcore.planner.stacks import checked_stack
from simcore.planner.ranking import engine_prefix
from topologies.hardware import load_catalog

_CLUSTER_KEYS = ("node", "nodes", "fabric", "storage", "gpus_per_node")
_FIGURES = {
    "fabric.nic_gbit_per_s": ("fabric", "nic_bytes_per_s", 1e9 / 8),
    "fabric.latency_us": ("fabric", "latency_s", 1e-6),
    "storage.read_gbyte_per_s": ("storage", "read_bytes_per_s", 1e9),
    "storage.write_gbyte_per_s": ("storage", "write_bytes_per_s", 1e9),
    "storage.per_client_gbyte_per_s": ("storage", "per_client_bytes_per_s", 1e9),
}


def _method(value) -> str:
    """A compression axis value (``simcore.planner.compression.METHODS``); one sentence if unknown."""
    from simcore.planner.compression import check_methods

    try:
        return check_methods([value], "compression")[0]
    except ValueError as exc:
        raise PlanError(str(exc)) from None


_SPACE_PARSERS = {"tp": int, "pp": int, "cp": int, "ep": int, "vpp": int, "micro_batch": int,
                  "precision": lambda v: "all" if v == "all" else Precision.parse(v, "space.precision").value,
                  "zero": lambda v: ZeroStage(int(v)), "schedule": Schedule, "recompute": Recompute,
                  "offload": Offload, "sequence_parallel": bool, "activation_offload": bool, "hybrid": bool,
                  "compression": _method}


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
    stack: str | None = None
    """Rank only layouts this stack runs (``simcore.planner.stacks.STACKS``); None: any."""


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
                 global_batch=int(doc["global_batch"]), tokens=check_tokens(doc["tokens"], "sweep.tokens"),
                 training=dict(doc.get("training") or {}), grid=grid, space=dict(doc.get("space") or {}),
                 top_k=int(doc.get("top_k", 0)), objective=str(doc.get("objective", "time")),
                 jobs=int(doc.get("jobs", 1)), monte_carlo=int(doc.get("monte_carlo", 0)),
                 failures=bool(doc.get("failures", True)), prices=dict(doc.get("prices") or {}),
                 stack=checked_stack(doc.get("stack"), "sweep.stack"))


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
    from simcore.planner.space import derive_space, precisions_of

    space = derive_space(base)
    pins = {k: v for k, v in sweep.space.items()}
    pins.update({k.split(".", 1)[1]: [v] for k, v in cell.items() if k.split(".", 1)[0] in ("parallel", "layout")})
    for key, values in pins.items():
        if key not in _SPACE_PARSERS:
            raise PlanError(f"unknown search axis '{key}' (known: {', '.join(_SPACE_PARSERS)})")
        values = values if isinstance(values, list) else [values]
        space = replace(space, **{key: tuple(_SPACE_PARSERS[key](v) for v in values)})
    if "all" in space.precision:   # each cell: every precision its GPU has (the others are skipped there)
        space = replace(space, precision=precisions_of(base.cluster.node.gpu))
    return space


def _prediction_of(row):
    """The step figures run_cost needs, from the engine where it ran, else the analytic path."""
    from types import SimpleNamespace

    pre = engine_prefix(row)
    return SimpleNamespace(step_time_s=float(row[pre + "step_time_s"]), compute_s=float(row[pre + "compute_s"]))


def search_cell(sweep: Sweep, cell: dict):
    """The cell's layout search: (the cell's row so far, SearchResult, tokens, price overrides);
    the SearchResult is None, and the row says why, when no layout fits. ``run_cell`` prices its
    best; ``simcore.planner.procure_mixed`` reuses it for cells it simulates its own way."""
    from simcore.planner.search import search
    from simcore.planner.space import base_plan

    model = dict(sweep.model, **{k.split(".", 1)[1]: v for k, v in cell.items() if k.startswith("model.")})
    training = dict(sweep.training, **{k.split(".", 1)[1]: v for k, v in cell.items() if k.startswith("training.")})
    gb = int(cell.get("global_batch", sweep.global_batch))
    tokens = float(cell.get("tokens", sweep.tokens))
    prices = dict(sweep.prices, **{k.split(".", 1)[1]: v for k, v in cell.items() if k.startswith("price.")})
    cluster = _cluster_of(sweep, cell)
    base = base_plan(model, cluster, gb, training)
    row = _cell_row(cell, cluster)
    try:
        res = search(model, cluster, gb, objective=sweep.objective, top_k=sweep.top_k, jobs=sweep.jobs,
                     tokens=tokens, progress=False, training=training, space=_space_of(base, sweep, cell), explain=0,
                     stack=sweep.stack)
    except PlanError as exc:   # no layout fits (NoLayoutFits), or the cell's Plan is invalid on its GPU
        status = "does not fit" if isinstance(exc, NoLayoutFits) else "invalid plan"
        return {**row, "layout": None, "fits": False, "status": status, "note": str(exc)}, None, tokens, prices
    return row, res, tokens, prices


def _cell_row(cell: dict, cluster) -> dict:
    return {**cell, "gpu": cluster.node.gpu.name, "node": cluster.node.name, "nodes": cluster.nodes,
            "gpus": cluster.gpus, "fabric": cluster.fabric.name if cluster.fabric else "none",
            "storage": cluster.storage.name}


def run_cell(sweep: Sweep, cell: dict) -> tuple[dict, object | None]:
    """Search the cell's best layout and price its run: (table row, RunCost or None)."""
    from simcore.planner.formatting import hbm_gib
    from simcore.planner.headroom import headroom_note
    from simcore.planner.runcost import run_cost

    row, res, tokens, prices = search_cell(sweep, cell)
    if res is None:
        return row, None
    top = res.table.iloc[0]
    rc = run_cost(res.best, _prediction_of(top), tokens, prices=prices, failures=sweep.failures,
                  monte_carlo=sweep.monte_carlo)
    row.update(layout=top["layout"], fits=True, **_cost_fields(rc, top, res.best.cluster), layouts=res.tally.simulated,
               thin_headroom=" ".join(headroom_note(res.table, hbm_gib(res.best))))
    return row, rc


def _cost_fields(rc, top, cluster) -> dict:
    """A cell's figures: each time, day and $ with its interval (``*_lo``/``*_hi``), the spot
    run or why it is infeasible, the memory headroom."""
    from simcore.planner.formatting import headroom_gib

    od, sp = rc.on_demand, rc.spot
    iv, pre = od.interval, engine_prefix(top)   # every figure of the cell from the engine its step came from
    lo_hi = lambda key, i: iv[key][i] if key in iv else float("nan")  # noqa: E731
    fields = dict(step_time_s=rc.step_time_s, step_time_s_lo=lo_hi("step_time_s", 0),
                  step_time_s_hi=lo_hi("step_time_s", 1), mfu=float(top[pre + "mfu"]),
                  engine="event" if pre else "analytic",
                  memory_per_gpu_gib=float(top["memory_per_gpu_gib"]),
                  headroom_gib=headroom_gib(cluster.node.gpu.hbm_bytes / 2**30, float(top["memory_per_gpu_gib"])),
                  days=od.days, days_lo=lo_hi("days", 0), days_hi=lo_hi("days", 1), gpu_hours=od.gpu_hours,
                  usd=od.usd, usd_lo=lo_hi("usd", 0), usd_hi=lo_hi("usd", 1), usd_reserved=rc.reserved.usd,
                  usd_spot=sp.usd, spot_days=sp.days, spot_spare_nodes=sp.spare_nodes,
                  spot_infeasible=sp.infeasible, infeasible=od.infeasible, energy_kwh=rc.energy_kwh,
                  energy_usd=rc.energy_usd, goodput=od.goodput, checkpoint_write_s=rc.checkpoint.write_s,
                  checkpoint_interval_s=rc.checkpoint.interval_s, storage_bound=bool(rc.data["storage_bound"]),
                  compute_s=float(top[pre + "compute_s"]), exposed_comm_s=float(top[pre + "exposed_comm_s"]),
                  bubble_s=float(top[pre + "bubble_s"]), offload_s=float(top[pre + "offload_s"]),
                  interval_source=iv.get("source", ""))
    mc = od.monte_carlo
    if "runs" in mc:
        fields.update(days_p50=mc["days_p50"], days_p90=mc["days_p90"], usd_p50=mc["usd_p50"], usd_p90=mc["usd_p90"])
    return fields


# --------------------------------------------------------------------------- the sweep

@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIfResult:
    sweep: Sweep
    table: pd.DataFrame
    """One row per cell: the axes, the best layout, time, $, energy, goodput."""
    assumptions: list[str]

    def display_table(self) -> pd.DataFrame:
        """The cells as a reader sees them (terminal, reports): the grid's axes, the layout,
        each figure formatted once with its interval, spot's figure or 'infeasible'."""
        return display_table(self.table, list(self.sweep.grid))

    def notes(self) -> list[str]:
        """Why cells could not be priced, and cells whose best layout leaves thin headroom: one sentence each
        (spot included), deduplicated."""
        out = []
        for row in self.table.to_dict(orient="records"):
            label = ", ".join(f"{a}={row[a]}" for a in self.sweep.grid)
            for key in ("note", "infeasible", "spot_infeasible", "thin_headroom"):
                if isinstance(row.get(key), str) and row[key]:
                    out.append(f"{label}: {row[key]}")
        return out


def display_table(table: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """One formatted row per cell (``simcore.planner.formatting``): no scientific notation,
    MFU in percent, $ with units, intervals beside their values."""
    from simcore.planner import formatting as f
    from simcore.planner.headroom import headroom_text

    out = pd.DataFrame({a: table[a].astype(str) for a in axes if a in table})
    if "gpus" in table and "gpus" not in axes:   # a GB200 node is 4 GPUs, a B200 node 8: nodes alone mislead
        out["GPUs"] = table["gpus"].map(lambda g: f"{int(g):,}" if pd.notna(g) else "")
    get = lambda row, key: row.get(key, float("nan"))  # noqa: E731
    rows = table.to_dict(orient="records")
    if "layout" in table:
        out["layout"] = [r["layout"] if isinstance(r.get("layout"), str) else
                         r.get("status") if isinstance(r.get("status"), str) else "does not fit" for r in rows]
    if "step_time_s" in table:
        engines = set(table.loc[table["fits"].fillna(False).astype(bool), "engine"]) if "engine" in table else set()
        tag = f" [{engines.pop()}]" if len(engines) == 1 else ""   # one engine per column, named in its heading
        if len(engines) > 1:
            out["engine"] = [r.get("engine") if r.get("fits") else "" for r in rows]
        out["step s" + tag] = [f.with_interval(get(r, "step_time_s"), get(r, "step_time_s_lo"),
                                               get(r, "step_time_s_hi"), lambda v: f"{v:.2f}") for r in rows]
        out["MFU" + tag] = [f.percent(get(r, "mfu")) for r in rows]
        out["headroom GiB"] = [headroom_text(get(r, "headroom_gib"), get(r, "headroom_gib") + get(r, "memory_per_gpu_gib"))
                               if r.get("fits") else "" for r in rows]
        out["days" + tag] = [f.with_interval(get(r, "days"), get(r, "days_lo"), get(r, "days_hi"), f.days)
                             for r in rows]
        out["$ on-demand" + tag] = [f.with_interval(get(r, "usd"), get(r, "usd_lo"), get(r, "usd_hi"), f.money)
                                    for r in rows]
        out["$ spot" + tag] = [f.money(get(r, "usd_spot")) for r in rows]
        out["goodput"] = [f.percent(get(r, "goodput")) for r in rows]
        missing = [not r.get("fits") for r in rows]
        figures = [c for c in out.columns if c not in axes and c not in ("layout", "GPUs", "engine")]
        out.loc[missing, figures] = ""
    return out


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
