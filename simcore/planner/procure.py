"""Procurement: what to buy or rent to train a model on T tokens by a deadline for the least
money, or fastest within a budget. Hardware and layout are searched together.

Each hardware cell (GPU type x cluster size x fabric) is one what-if cell
(``simcore.planner.whatif.run_cell``): the layout search on the analytic engine, pruned by
the rules, memory and dominance (``simcore.planner.evaluate``), priced by
``simcore.planner.runcost`` (on-demand, reserved, spot with spares and elastic restarts,
``simcore.planner.spot``). A cell whose model states alone overflow its GPUs is skipped
before any search. Each priced cell gives one option per way of paying (``MODES``): the
three rents and buying (capex over the life and utilisation, facility, energy:
``simcore.planner.prices.BuySheet``). The options' Pareto front of days against dollars,
and the options that answer the deadline and the budget questions, are then re-simulated
on the event engine (the cell's best layout, ``search(top_k=1)``) and re-priced, until the
front and the answers rest on the event engine. The answers, sentences and tables are in
``simcore.planner.procure_answer``.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import pandas as pd

from simcore.planner.procure_input import Candidates, buy_sheet_of, purchase_priced, sweep_of
from simcore.planner.whatif import node_for_gpu, run_cell

#: The columns of one option (a cell and a way of paying), besides the cell's own. ``usd`` is
#: what the run costs (a purchase: its amortised share); ``cash_usd`` what the buyer pays out for
#: it (a rental: the bill; a purchase: the capex of GPUs, servers and fabric before the run, then
#: the facility and energy while it runs), which a budget is held against.
OPTION_KEYS = ("mode", "days", "days_lo", "days_hi", "usd", "usd_lo", "usd_hi", "usd_per_gpu_hour", "infeasible",
               "cash_usd", "cash_usd_lo", "cash_usd_hi")


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcureResult:
    candidates: Candidates
    cells: pd.DataFrame
    """One row per hardware cell: whatif's columns (best layout, step time, headroom, ...)."""
    options: pd.DataFrame
    """One row per priced cell and way of paying: days, $ and their intervals, engine."""
    assumptions: list[str]
    seconds: float
    resimulated: int
    """Cells re-simulated on the event engine (the front and the answers)."""
    serving: object = None
    """The serving capacity search (``serving_search.SearchResult``) where the candidates ask it."""
    left_out: tuple[str, ...] = ()
    """What the answer could not weigh, a sentence each (``procure_answer.left_out_lines``)."""


def hardware_cells(c: Candidates) -> list[dict]:
    """Every GPU type x cluster size x fabric (``default``: no fabric key, the node's own), then
    the mixed pipelines (``simcore.planner.procure_mixed``)."""
    from simcore.planner.procure_mixed import mixed_cells

    return [{"gpu": g, "nodes": n, **({} if f == "default" else {"fabric": f})}
            for g in c.gpus for f in c.fabrics for n in c.nodes] + mixed_cells(c)


def states_overflow(c: Candidates, cell: dict) -> str:
    """One sentence when the model's states (weights, gradients, optimizer states and master
    weights, ``simcore.model.memory``'s bytes per parameter), fully sharded, overflow every GPU
    of the cell: no layout can fit, so no search is run. Empty otherwise."""
    from simcore.model import memory as mem
    from simcore.model.params import param_counts
    from simcore.planner.space import base_plan

    base = base_plan(c.model, {"node": node_for_gpu(cell["gpu"]), "nodes": cell["nodes"]}, c.global_batch,
                     c.training)
    tr = base.training
    per_param = 2 * mem.param_bytes(tr) + mem.optimizer_bytes_per_param(tr, base.model.hidden)
    need = param_counts(base.model).trained * per_param / base.cluster.gpus
    hbm = base.cluster.node.gpu.hbm_bytes
    if need <= hbm:
        return ""
    return (f"{base.model.name}'s weights, gradients and Adam states need {need / 2**30:,.0f} GiB per GPU even fully "
            f"sharded over {base.cluster.gpus} GPUs, more than their {hbm / 2**30:.0f} GiB")


def _evaluate(args) -> tuple[dict, object | None]:
    """One cell (a worker of ``search._run``): (whatif row, RunCost or None)."""
    c, cell, top_k = args
    why = states_overflow(c, cell)
    if why:
        return {**cell, "layout": None, "fits": False, "note": why, "pruned": True}, None
    if "stage_gpu" in cell:
        from simcore.planner.procure_mixed import evaluate_mixed

        return evaluate_mixed(c, cell)
    return run_cell(replace(sweep_of(c, cell["gpu"]), top_k=top_k), cell)   # its row names its figures' engine


def _scenario_option(mode: str, s, gpus: int) -> dict:
    iv = s.interval or {}
    days_iv, usd_iv = iv.get("days", [math.nan, math.nan]), iv.get("usd", [math.nan, math.nan])
    return {"mode": mode, "days": s.days, "days_lo": days_iv[0], "days_hi": days_iv[1], "usd": s.usd,
            "usd_lo": usd_iv[0], "usd_hi": usd_iv[1], "usd_per_gpu_hour": s.usd_per_gpu_hour,
            "infeasible": s.infeasible, "cash_usd": s.usd, "cash_usd_lo": usd_iv[0], "cash_usd_hi": usd_iv[1],
            "extrapolated": iv.get("extrapolated") or ""}


def buy_option(c: Candidates, row: dict, rc) -> dict:
    """Owning the cell's GPUs for the run: its share of the capex (life, utilisation), of the
    facility (per kW of the nodes' system power) and the energy it draws; days as on-demand
    (owned GPUs fail alike) plus the lead time. Intervals follow the on-demand run's days.
    The cash it needs is the whole capex up front (or the capex the run wears out, where it
    outlasts the life) and the facility and energy while it runs."""
    from topologies.hardware import load_catalog

    sheet = buy_sheet_of(c, row)
    node = load_catalog().node(row["node"])
    od = rc.on_demand
    if od.infeasible:
        return {"mode": "buy", **{k: math.nan for k in OPTION_KEYS if k not in ("mode", "infeasible")},
                "infeasible": od.infeasible}
    hours = od.wall_s / 3600 * rc.gpus
    share = hours * sheet.capex_usd_per_gpu_hour()
    running = hours * sheet.facility_usd_per_gpu_hour(node.system_power_w / node.gpus_per_node) + rc.energy_usd
    usd, capex = share + running, sheet.capex_per_gpu * rc.gpus
    iv = od.interval.get("days", [math.nan, math.nan])
    scale = [d / od.days if od.days else math.nan for d in iv]
    cash = [max(capex, share * k) + running * k for k in (1.0, *scale)]
    return {"mode": "buy", "days": od.days + sheet.lead_time_days, "days_lo": iv[0] + sheet.lead_time_days,
            "days_hi": iv[1] + sheet.lead_time_days, "usd": usd, "usd_lo": usd * scale[0], "usd_hi": usd * scale[1],
            "usd_per_gpu_hour": usd / hours, "infeasible": "", "capex_usd": capex, "cash_usd": cash[0],
            "cash_usd_lo": cash[1], "cash_usd_hi": cash[2]}


def options_of(c: Candidates, row: dict, rc) -> list[dict]:
    """The cell's options, one per way of paying asked for (none when nothing fits)."""
    if rc is None:
        return []
    keep = ("gpu", "node", "nodes", "gpus", "fabric", "layout", "mfu", "step_time_s", "memory_per_gpu_gib",
            "headroom_gib", "energy_kwh", "engine", "interval_source", "stage_gpu")
    base = {k: row.get(k) for k in keep}
    scen = {"on_demand": rc.on_demand, "reserved": rc.reserved, "spot": rc.spot}
    out = [{**base, **_scenario_option(m, scen[m], rc.gpus)} for m in c.modes if m in scen]
    kinds = [row[k] for k in ("base_gpu", "stage_gpu") if isinstance(row.get(k), str)] or [row["gpu"]]
    if "buy" in c.modes and all(purchase_priced(c, g) for g in kinds):
        out.append({**base, **buy_option(c, row, rc)})
    return out


def _cell_key(row) -> tuple:
    return (row["gpu"], int(row["nodes"]), row.get("fabric_asked") or "default")


def _run_cells(c: Candidates, cells: list[dict], top_k: int, progress: bool, desc: str) -> list[tuple[dict, object]]:
    from simcore.planner.search import _run

    out = _run(_evaluate, [(c, cell, top_k) for cell in cells], c.jobs, progress, desc)
    return [({**row, "fabric_asked": cell.get("fabric", "default")}, rc) for cell, (row, rc) in zip(cells, out)]


def run_procure(c: Candidates, *, progress: bool = True) -> ProcureResult:
    """Every cell on the analytic engine, then the front and the answers on the event engine."""
    from simcore.planner.procure_answer import assumptions_of, left_out_lines, to_resimulate

    t0 = time.perf_counter()
    cells = hardware_cells(c)
    results = {_cell_key(row): (row, rc) for row, rc in _run_cells(c, cells, 0, progress, "procure: cells")}
    analytic = dict(results)   # every cell's analytic figures, kept beside the event engine's
    done = {k for k, (row, _) in results.items() if isinstance(row.get("stage_gpu"), str)}   # event engine already
    while c.resimulate:
        options = _options_table(c, results)
        todo = [k for k in to_resimulate(options, c) if k not in done and results[k][1] is not None]
        if not todo:
            break
        again = [{"gpu": g, "nodes": n, **({} if f == "default" else {"fabric": f})} for g, n, f in todo]
        for row, rc in _run_cells(c, again, 1, progress, "procure: event engine"):
            results[_cell_key(row)] = (row, rc)
        done |= set(todo)
    rows = list(results.values())
    table = pd.DataFrame([r for r, _ in rows])
    serving = None
    if c.serving is not None:
        from simcore.planner.procure_serving import serving_search

        serving = serving_search(c.model, c.serving, c.gpus, c.modes, c.jobs)
    return ProcureResult(candidates=c, cells=table, options=_options_table(c, results, analytic),
                         assumptions=assumptions_of(c, [(r, rc) for r, rc in rows if rc is not None]),
                         seconds=time.perf_counter() - t0, resimulated=len(done), serving=serving,
                         left_out=left_out_lines(c, table))


#: An option's figures from the analytic pass, kept as ``analytic_*`` beside those of the engine
#: it rests on (``days``, ``usd``, ...: the event engine's where it re-simulated the cell), so
#: that a table gives each engine its own columns (``simcore.planner.ranking``).
ANALYTIC_KEYS = ("days", "days_lo", "days_hi", "usd", "usd_lo", "usd_hi", "cash_usd", "mfu", "energy_kwh")


def _options_table(c: Candidates, results: dict, analytic: dict | None = None) -> pd.DataFrame:
    first = {(key, o["mode"]): o for key, (row, rc) in (analytic or {}).items() for o in options_of(c, row, rc)}
    rows = []
    for key, (row, rc) in results.items():
        for o in options_of(c, row, rc):
            a = first.get((key, o["mode"]))
            # a mixed pipeline has no analytic pass; a cell whose engine picked another layout, none of this one
            a = a if a is not None and a.get("engine") != "event" and a.get("layout") == o.get("layout") else {}
            rows.append({**o, "fabric_asked": key[2], **{f"analytic_{k}": a.get(k, math.nan) for k in ANALYTIC_KEYS}})
    cols = ["gpu", "node", "nodes", "gpus", "fabric", "fabric_asked", "layout", *OPTION_KEYS]
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=cols)
