"""``trainplan compare PLAN --trace DIR``: PyTorch profiler (Kineto) traces of one or more ranks
against the event engine's prediction, part by part and phase by phase in the ``StepResult``
schema (issue 52, item 2). With ``--out DIR``: one Chrome trace of both timelines
(``trace.json``) and the report page (``index.html``, ``report.md``)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from simcore.plan.load import load_plan
from trainplan.common import UsageError, check_prediction, fmt_s, print_json

#: Per-rank step columns printed (the rest go to the report and --json).
STEP_COLUMNS = ("step", "rank", "step_s", "compute_s", "gemm_s", "attention_s", "other_kernels_s",
                "exposed_comm_s", "hidden_comm_s", "pipeline_idle_s", "host_gaps_s")


def trace_comparison(plan, path):
    """(comparison, per-rank step rows, collectives by group, notes, files) of the traces under ``path``."""
    from reports.compare import compare
    from simcore.engine.predict import simulate
    from simcore.runlogs import LogError
    from simcore.runlogs.kineto import parse_traces
    from reports.trace_steps import AxisMap, collective_rows, measure, measured_result

    try:
        traces = parse_traces(path)
        rows, spans, axes = measure(traces, plan)
    except LogError as exc:
        raise UsageError(str(exc)) from None
    notes = [f"{n} ({c} kernels)" for n, c in axes.notes.items()]
    worlds = {t.world for t in traces if t.world}
    if worlds and worlds != {plan.parallel.gpus}:
        notes.append(f"the traces' world size is {', '.join(map(str, sorted(worlds)))}; the Plan has "
                     f"{plan.parallel.gpus} GPUs")
    bad = [t.rank for t in traces if t.rank >= plan.parallel.gpus]
    if bad:
        notes.append(f"rank {bad[0]} lies outside the Plan's {plan.parallel.gpus} ranks: its groups are guessed")
    devices = sorted({t.device for t in traces if t.device})
    if devices and not any(plan.cluster.node.gpu.name.lower().split("-")[0] in d.lower() for d in devices):
        notes.append(f"the traces ran on {', '.join(devices)}; the Plan's GPU is {plan.cluster.node.gpu.name}")
    notes.append(f"{len(traces)} rank trace{'s' if len(traces) > 1 else ''}, "
                 f"{len({r['step'] for r in rows})} profiled steps; per step the slowest rank, averaged; "
                 "no memory in the traces (memory not compared)")
    predicted = simulate(plan, engine="des")
    check_prediction(plan, predicted)
    measured = measured_result(plan, rows, spans, notes)
    colls = collective_rows(traces, AxisMap(plan))
    return compare(predicted, measured), rows, colls, notes, [t.path for t in traces]


def cmd_compare_trace(args) -> None:
    from reports.trace_compare import phase_rows, verdict

    if args.out is not None and Path(args.out).exists() and not Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a file, not a folder")
    plan = load_plan(args.plan)
    comp, rows, colls, notes, files = trace_comparison(plan, args.trace)
    steps, coll = pd.DataFrame(rows), pd.DataFrame(colls)
    written = write_outputs(comp, steps, coll, files, notes, args.out) if args.out else []
    if args.json:
        print_json({"plan": plan.name, "files": files, "verdict": verdict(comp), "notes": notes,
                    "phases": phase_rows(comp).to_dict(orient="records"), "steps": rows,
                    "collectives": colls,
                    "written": [str(p) for p in written]})
        return
    print(f"{plan.name} vs {len(files)} profiler trace{'s' if len(files) > 1 else ''} ({args.trace})")
    print(f"  {verdict(comp)}")
    print(f"  {'':<24}{'predicted':>12}{'measured':>12}{'pred-meas':>12}{'error':>9}")
    for r in phase_rows(comp).itertuples():
        err = "" if pd.isna(r.error) else f"{r.error:+.1%}"
        print(f"  {r.field.removeprefix('phase.'):<24}{fmt_s(r.predicted):>12}{fmt_s(r.measured):>12}"
              f"{('-' if r.abs_diff < 0 else '+') + fmt_s(abs(r.abs_diff)):>12}{err:>10}")
    print("  per rank and step (s):")
    cols = [c for c in STEP_COLUMNS if c in steps]
    print("    " + steps[cols].to_string(index=False, float_format=lambda v: f"{v:.4f}").replace("\n", "\n    "))
    if len(coll):
        print("  collectives by process group (per step):")
        print("    " + coll.to_string(index=False, float_format=lambda v: f"{v:.4g}").replace("\n", "\n    "))
    for note in notes:
        print(f"  note: {note}")
    for path in written:
        print(f"  wrote {path}")


def write_outputs(comp, steps: pd.DataFrame, coll: pd.DataFrame, files: list[str], notes: list[str], out) -> list[Path]:
    """trace.json (both timelines; open in https://ui.perfetto.dev) and the report page."""
    from reports.render import render
    from reports.trace_compare import combined_trace, trace_report
    from simcore.results import atomic_write_text

    out = Path(out)
    trace = out / "trace.json"
    atomic_write_text(trace, json.dumps(combined_trace(comp.predicted.spans, comp.measured.spans, comp.plan_name)))
    html = render(trace_report(comp, steps, coll, files=files, notes=tuple(notes)), out)
    return [trace, html, out / "report.md"]
