"""The report jobs and the main demo: compute, build the report, render it.

Each job runs the stage functions (search, simulate, run cost, run, compare), hands the
results to a builder in ``reports.build`` and renders ``index.html`` + ``report.md``.
``demo`` is the README's main job on its embedded default: plan a realistic model on a
catalog cluster, price it, run a small what-if, validate a tiny plan for real here.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

from reports.render import render
from trainplan.common import SEARCH_TOP_K

ROOT = Path(__file__).resolve().parents[1]

#: The demo's embedded default: Llama 3 70B at 8k context on 32 DGX H100 (256 GPUs), 15T
#: tokens (the Llama 3 pre-training budget, Dubey et al. 2024, Sec. 3), global batch 1024.
DEMO_PLAN = {"model": "llama3-70b", "cluster": "dgx-h100", "nodes": 32, "global_batch": 1024,
             "seq_len": 8192, "tokens": 15e12}
DEMO_SWEEP = ROOT / "sweeps" / "example.yaml"
DEMO_MATRIX = ROOT / "validation" / "local.yaml"
DEMO_LAYOUTS = ("dp2", "pp2-1f1b", "tp2")


def plan_job(**kwargs) -> Path:
    """Search, price and explain the best layout; write the planning report (``planning``)."""
    return planning(**kwargs)[0]


def planning(*, model: str, cluster: str, nodes: int, global_batch: int, tokens: float, out,
             seq_len: int | None = None, top_k: int = SEARCH_TOP_K, jobs: int = 1,
             progress: bool = True) -> tuple[Path, tuple]:
    """The planning report written, and its answer: the report's cards (the recommendation,
    days and $ with their intervals, MFU, step, headroom)."""
    from reports.build import plan_report
    from reports.plots import topology_figure
    from simcore.planner.runcost import run_cost
    from simcore.planner.search import search
    from simcore.engine.predict import simulate
    from simcore.model.step_costs import memory_report
    from simcore.plan.load import dump_plan
    from simcore.results import atomic_write_text
    from topologies.build import build_cluster

    from trainplan.common import model_doc
    res = search(model_doc(model, seq_len), {"node": cluster, "nodes": nodes}, global_batch, top_k=top_k, jobs=jobs,
                 tokens=tokens, progress=progress)
    best = res.best
    prediction = simulate(best, engine="des")
    cost = run_cost(best, prediction, tokens, monte_carlo=50)
    figure = topology_figure(build_cluster(best.cluster), best.cluster)
    report = plan_report(res, cost, prediction, memory_report(best), cluster_figure=figure, tokens=tokens)
    out = Path(out)
    html = render(report, out)
    atomic_write_text(out / "best-plan.yaml", dump_plan(best))
    atomic_write_text(out / "layouts.csv", res.table.to_csv(index=False))
    return html, report.summary


def whatif_job(sweep, out, *, progress: bool = True) -> Path:
    from simcore.planner.whatif import run_whatif

    return write_whatif_report(run_whatif(sweep, progress=progress), out)


def write_whatif_report(res, out) -> Path:
    """The what-if report, the same files from every command that writes one (`whatif
    --report`, `report whatif`, the demo): index.html, report.md, its figures and cells.csv."""
    return whatif_answer(res, out)[0]


def whatif_answer(res, out) -> tuple[Path, tuple]:
    """The what-if report written, and its cards (the fastest and cheapest cells)."""
    from reports.build import whatif_report
    from simcore.results import atomic_write_text

    report = whatif_report(res)
    html = render(report, out)
    atomic_write_text(Path(out) / "cells.csv", res.table.to_csv(index=False))
    return html, report.summary


def write_procure_report(res, out) -> Path:
    """The procurement report: index.html, report.md, the frontier figure and options.csv."""
    from reports.procurement import procure_report
    from simcore.results import atomic_write_text

    html = render(procure_report(res), out)
    atomic_write_text(Path(out) / "options.csv", res.options.to_csv(index=False))
    return html


#: Load per core above which other work shares this host's cores: a rank's speed then moves
#: from minute to minute (bench/RESULTS.md), and the host speed is re-measured first.
LOADED_PER_CORE = 0.5
#: A host speed older than this is re-measured before a validation (the load changes hourly).
STALE_HOST_SPEED_S = 3600.0


def _one_rank_rate(profile: dict) -> float | None:
    rates = (profile.get("oversubscription") or {}).get("matmul_flops_per_s_per_rank") or {}
    rate = rates.get(1, rates.get("1"))
    return float(rate) if rate else None


def _age_s(profile: dict) -> float:
    import datetime as dt

    when = (profile.get("measured_on") or {}).get("refreshed") or (profile.get("measured_on") or {}).get("date")
    try:
        stamp = dt.datetime.fromisoformat(str(when).replace("Z", "+00:00"))
    except ValueError:
        return float("inf")
    stamp = stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.timezone.utc)
    return (dt.datetime.now(dt.timezone.utc) - stamp).total_seconds()


def host_conditions(profile_path: Path, *, refresh: bool = True) -> list[str]:
    """What a reader needs to trust a local validation, one sentence each: the host's load
    now, the host speed re-measured when the host is loaded or the figure is stale (as the
    benchmark does), how it compares with the profile's, and how far to trust the comparison."""
    import yaml

    if not profile_path.exists():
        return []
    profile = yaml.safe_load(profile_path.read_text()) or {}
    if (profile.get("measured_on") or {}).get("device") != "cpu":
        return []
    cores = os.cpu_count() or 1
    per_core = os.getloadavg()[0] / cores
    lines = [f"host load when validation started: {per_core * cores:.1f} on {cores} cores ({per_core:.0%} per core); "
             f"profile calibrated {profile['measured_on'].get('date', '?')} in "
             f"{profile['measured_on'].get('calibration_s', '?')} s"]
    if refresh and (per_core > LOADED_PER_CORE or _age_s(profile) > STALE_HOST_SPEED_S):
        from executors.calibrate.profile import refresh_host_speed

        before = _one_rank_rate(profile)
        after = _one_rank_rate(refresh_host_speed(profile_path) or {})
        if before and after:
            lines.append(f"host speed re-measured before the runs: one rank computes {after / before:.2f}x as fast "
                         "as when the profile was last measured")
    if per_core > LOADED_PER_CORE:
        lines.append("the host is shared with other work: errors here measure the load as well as the model, so "
                     "trust the comparison to within the residual intervals (validation/residuals.yaml), not to "
                     "the percent; rerun on an idle host for the model's own error")
    return lines


def load_moves(before: float, after: float) -> list[str]:
    """The sentence a CPU host's validation report opens its notes with: the load while the
    layouts ran moves the measured figures (the terminal warns about it at the start)."""
    cores = os.cpu_count() or 1
    return [f"The host's load while the layouts ran moves these figures: the ranks share this host's {cores} cores "
            f"with whatever else runs, so the measured steps, and the errors against the prediction, move with it "
            f"(load average {before:.1f} when the runs started, {after:.1f} when they ended; "
            f"{LOADED_PER_CORE * cores:.1f} is where other work starts to show). Rerun on an idle host for the "
            "model's own error."]


def validate_job(matrix, out, **kwargs) -> Path:
    """Validate a matrix's layouts for real here; write the validation report (``validation``)."""
    return validation(matrix, out, **kwargs)[0]


def validation(matrix, out, *, steps: int = 8, warmup: int = 3, only=None, progress: bool = True,
               say=None) -> tuple[Path, tuple]:
    """The validation report written, and its cards (median and worst step-time error, memory)."""
    import yaml

    from reports.build import validate_report
    from trainplan.validate import matrix_layouts, validate_matrix
    from simcore.results import atomic_write_text
    from topologies.profile import default_profile_path

    matrix_layouts(matrix, list(only) if only else None)   # a mistyped --only refused before the profile is re-measured
    path = default_profile_path()
    conditions = host_conditions(path)
    for line in conditions if say else ():
        say(line)
    before = os.getloadavg()[0]
    result = validate_matrix(matrix, steps=steps, warmup=warmup, only=list(only) if only else None,
                             progress=progress)
    profile = yaml.safe_load(path.read_text()) if path.exists() else None
    moved = load_moves(before, os.getloadavg()[0]) if conditions else []   # a CPU host's figures
    report = validate_report(result, profile=profile, notes=tuple(moved + conditions))
    html = render(report, out)
    atomic_write_text(Path(out) / "layouts.csv", result.table.to_csv(index=False))
    return html, report.summary


class Demo(NamedTuple):
    reports: dict
    """name -> the report's index.html."""
    answers: dict
    """name -> the report's cards ((label, value) pairs): what the terminal prints."""


def demo(out="out/demo", *, progress: bool | None = None) -> Demo:
    """The main job on its embedded default: the reports written, and their answers."""
    progress = sys.stderr.isatty() if progress is None else progress
    out = Path(out)
    reports, answers, t0 = {}, {}, time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    d = DEMO_PLAN
    say(f"1/3 planning {d['model']} on {d['nodes']} x {d['cluster']} ({d['tokens']:.3g} tokens): "
        "searching every layout, pricing the best")
    reports["plan"], answers["plan"] = planning(model=d["model"], cluster=d["cluster"], nodes=d["nodes"],
                                                global_batch=d["global_batch"], seq_len=d["seq_len"],
                                                tokens=d["tokens"], out=out / "plan", progress=progress)
    say(f"2/3 what-if over GPU type x node count ({DEMO_SWEEP.name})")
    from simcore.planner.whatif import run_whatif

    reports["whatif"], answers["whatif"] = whatif_answer(run_whatif(DEMO_SWEEP, progress=progress), out / "whatif")
    say(f"3/3 validating {len(DEMO_LAYOUTS)} tiny layouts for real on this machine "
        "(calibrates it first if needed)")
    reports["validate"], answers["validate"] = validation(DEMO_MATRIX, out / "validate", steps=6, warmup=2,
                                                          only=DEMO_LAYOUTS, progress=progress, say=say)
    say("done")
    return Demo(reports, answers)


def open_hint(path: Path) -> str:
    return f"file://{os.path.abspath(path)}"
