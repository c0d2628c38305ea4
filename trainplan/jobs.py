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

from reports.render import render

ROOT = Path(__file__).resolve().parents[1]

#: The demo's embedded default: Llama 3 70B at 8k context on 32 DGX H100 (256 GPUs), 15T
#: tokens (the Llama 3 pre-training budget, Dubey et al. 2024, Sec. 3), global batch 1024.
DEMO_PLAN = {"model": "llama3-70b", "cluster": "dgx-h100", "nodes": 32, "global_batch": 1024,
             "seq_len": 8192, "tokens": 15e12}
DEMO_SWEEP = ROOT / "sweeps" / "example.yaml"
DEMO_MATRIX = ROOT / "validation" / "local.yaml"
DEMO_LAYOUTS = ("dp2", "pp2-1f1b", "tp2")


def plan_job(*, model: str, cluster: str, nodes: int, global_batch: int, tokens: float, out,
             seq_len: int | None = None, top_k: int = 5, jobs: int = 1, progress: bool = True) -> Path:
    """Search, price and explain the best layout; write the planning report."""
    from reports.build import plan_report
    from reports.plots import topology_figure
    from simcore.planner.runcost import run_cost
    from simcore.planner.search import search
    from simcore.engine.predict import simulate
    from simcore.model.step_costs import memory_report
    from simcore.plan.load import dump_plan
    from simcore.results import atomic_write_text
    from topologies.build import build_cluster

    model_doc = {"name": model, **({"seq_len": seq_len} if seq_len else {})}
    res = search(model_doc, {"node": cluster, "nodes": nodes}, global_batch, top_k=top_k, jobs=jobs,
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
    return html


def whatif_job(sweep, out, *, progress: bool = True) -> Path:
    from simcore.planner.whatif import run_whatif

    return write_whatif_report(run_whatif(sweep, progress=progress), out)


def write_whatif_report(res, out) -> Path:
    """The what-if report, the same files from every command that writes one (`whatif
    --report`, `report whatif`, the demo): index.html, report.md, its figures and cells.csv."""
    from reports.build import whatif_report
    from simcore.results import atomic_write_text

    html = render(whatif_report(res), out)
    atomic_write_text(Path(out) / "cells.csv", res.table.to_csv(index=False))
    return html


def validate_job(matrix, out, *, steps: int = 8, warmup: int = 3, only=None, progress: bool = True) -> Path:
    import yaml

    from reports.build import validate_report
    from trainplan.validate import validate_matrix
    from simcore.results import atomic_write_text
    from topologies.profile import default_profile_path

    result = validate_matrix(matrix, steps=steps, warmup=warmup, only=list(only) if only else None,
                             progress=progress)
    path = default_profile_path()
    profile = yaml.safe_load(path.read_text()) if path.exists() else None
    html = render(validate_report(result, profile=profile), out)
    atomic_write_text(Path(out) / "layouts.csv", result.table.to_csv(index=False))
    return html


def demo(out="out/demo", *, progress: bool | None = None) -> dict[str, Path]:
    """The main job on its embedded default; returns the report paths."""
    progress = sys.stderr.isatty() if progress is None else progress
    out = Path(out)
    reports, t0 = {}, time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)

    d = DEMO_PLAN
    say(f"1/3 planning {d['model']} on {d['nodes']} x {d['cluster']} ({d['tokens']:.3g} tokens): "
        "searching every layout, pricing the best")
    reports["plan"] = plan_job(model=d["model"], cluster=d["cluster"], nodes=d["nodes"],
                               global_batch=d["global_batch"], seq_len=d["seq_len"], tokens=d["tokens"],
                               out=out / "plan", progress=progress)
    say(f"2/3 what-if over GPU type x node count ({DEMO_SWEEP.name})")
    reports["whatif"] = whatif_job(DEMO_SWEEP, out / "whatif", progress=progress)
    say(f"3/3 validating {len(DEMO_LAYOUTS)} tiny layouts for real on this machine "
        "(calibrates it first if needed)")
    reports["validate"] = validate_job(DEMO_MATRIX, out / "validate", steps=6, warmup=2, only=DEMO_LAYOUTS,
                                       progress=progress)
    say("done")
    return reports


def open_hint(path: Path) -> str:
    return f"file://{os.path.abspath(path)}"
