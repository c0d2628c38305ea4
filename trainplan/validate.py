"""Validate: predict a plan, run it for real, compare phase by phase.

``validate_plan`` closes the loop for one Plan: calibrate this host if the plan runs on
``localhost`` and no profile exists, predict with the event engine, run with the
executor, ``compare``. ``validate_matrix`` does it for every layout of a matrix file
(``validation/local.yaml``: a ``base`` Plan document and ``layouts`` merged into it).
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from reports.compare import Comparison, compare
from simcore.plan.load import load_plan, plan_from_dict, read_yaml_file
from simcore.plan.spec import Plan, PlanError
from simcore.planner.uncertainty import layout_class
from topologies.profile import default_profile_path


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_matrix(path: str | os.PathLike) -> list[tuple[str, dict]]:
    """(layout name, Plan document) for every layout of a matrix file."""
    path = Path(path)
    doc = read_yaml_file(path, "matrix file")
    if not isinstance(doc, dict) or not isinstance(doc.get("layouts"), dict) or not doc["layouts"]:
        raise PlanError(f"matrix file {path} needs a 'layouts' mapping of name -> plan fields")
    base = doc.get("base") or {}
    return [(name, {"name": name, **_merge(base, over or {})}) for name, over in doc["layouts"].items()]


def matrix_layouts(path: str | os.PathLike, only: list[str] | None = None) -> list[tuple[str, dict]]:
    """The layouts of a matrix file to validate (the ``only`` ones); PlanError naming an unknown
    one. Checked before anything is measured or written (a mistyped --only once re-measured
    the cached profile first)."""
    layouts = load_matrix(path)
    if only:
        unknown = sorted(set(only) - {n for n, _ in layouts})
        if unknown:
            raise PlanError(f"unknown layout '{unknown[0]}' (known: {', '.join(n for n, _ in layouts)})")
        layouts = [(n, d) for n, d in layouts if n in only]
    return layouts


def ensure_profile(*, progress: bool = True) -> None:
    """Calibrate this host first when a localhost plan has no profile yet."""
    path = default_profile_path()
    if path.exists():
        return
    from executors.calibrate.profile import calibrate

    calibrate(path, quick=True, progress=progress)


def _is_localhost(doc: dict) -> bool:
    cluster = doc.get("cluster") or {}
    return isinstance(cluster, dict) and cluster.get("node") == "localhost" and "profile" not in cluster


def default_start_method() -> str:
    """``fork`` on a CPU host (ranks start in a second, no torch re-import), else ``spawn``."""
    import torch

    return "spawn" if torch.cuda.is_available() else "fork"


def validate_plan(plan: Plan, *, steps: int = 10, warmup: int = 3, engine: str = "des", seed: int = 0,
                  trace_dir: str | os.PathLike | None = None, start_method: str | None = None) -> Comparison:
    """Predict (event engine) and run (executor) one plan; compare them."""
    from executors.launch import run
    from simcore.engine.predict import simulate
    from simcore.results import write_chrome_trace

    predicted = simulate(plan, engine=engine)
    trace_path = None
    if trace_dir is not None:
        trace_path = Path(trace_dir) / f"{plan.name or 'plan'}-measured.json"
        write_chrome_trace(predicted.spans, Path(trace_dir) / f"{plan.name or 'plan'}-predicted.json",
                           f"{plan.name} predicted")
    measured = run(plan, steps=steps, warmup=warmup, seed=seed, trace_path=trace_path,
                   start_method=start_method or default_start_method())
    return compare(predicted, measured, plan=plan)


@dataclass(frozen=True, slots=True)
class MatrixResult:
    table: pd.DataFrame
    """One row per layout: predicted and measured step time, compute, memory, and their errors."""
    comparisons: tuple[Comparison, ...]
    failures: tuple[tuple[str, str], ...]
    """(layout, one-sentence reason) for layouts that could not be run."""


def summary_row(name: str, c: Comparison, plan: Plan | None = None) -> dict:
    p, m = c.predicted, c.measured
    iv = c.intervals.get("step_time_s")
    return {
        "layout": name, "class": layout_class(plan.parallel) if plan is not None else "",
        "pred_step_s": p.step_time_s, "meas_step_s": m.step_time_s, "step_err": c.error("step_time_s"),
        "pred_compute_s": p.compute_s, "meas_compute_s": m.compute_s,
        "pred_comm_s": p.exposed_comm_s, "meas_comm_s": m.exposed_comm_s,
        "pred_bubble_s": p.bubble_s, "meas_bubble_s": m.bubble_s,
        "pred_mem_gib": p.memory_per_gpu_gib, "meas_mem_gib": m.memory_per_gpu_gib,
        "mem_err": c.error("memory_per_gpu_gib"),
        "step_lo_s": iv.lo if iv else float("nan"), "step_hi_s": iv.hi if iv else float("nan"),
        "in_interval": bool(iv and iv.lo <= m.step_time_s <= iv.hi),
    }


def validate_matrix(path: str | os.PathLike, *, steps: int = 8, warmup: int = 3, only: list[str] | None = None,
                    progress: bool = True, start_method: str | None = None,
                    trace_dir: str | os.PathLike | None = None) -> MatrixResult:
    """Validate every layout of a matrix file (or the ``only`` ones); a failing layout is reported, not fatal.
    With ``trace_dir``, each layout's predicted and measured Chrome traces go there, named by the layout."""
    from tqdm import tqdm

    layouts = matrix_layouts(path, only)
    if any(_is_localhost(d) for _, d in layouts):
        ensure_profile(progress=progress)
    rows, comps, failures = [], [], []
    for name, doc in tqdm(layouts, desc="validate", disable=not progress, unit="layout"):
        try:
            plan = plan_from_dict(doc, Path(path).parent)
            comp = validate_plan(plan, steps=steps, warmup=warmup, start_method=start_method, trace_dir=trace_dir)
        except (PlanError, ValueError, RuntimeError) as exc:
            failures.append((name, str(exc).splitlines()[0] if str(exc) else type(exc).__name__))
            continue
        comps.append(comp)
        rows.append(summary_row(name, comp, plan))
    return MatrixResult(table=pd.DataFrame(rows), comparisons=tuple(comps), failures=tuple(failures))


def load_plan_for_validate(path: str | os.PathLike, *, progress: bool = True) -> Plan:
    """Load a plan, calibrating this host first if the plan needs its profile."""
    plan = load_plan(path)
    if plan.cluster.node.name == "localhost" and not plan.cluster.node.calibrated:
        ensure_profile(progress=progress)
        plan = load_plan(path)
    return plan
