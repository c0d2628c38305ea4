"""A profiler trace against the prediction (``trainplan compare PLAN --trace DIR``): which phase
differs most, the report page, and one Chrome trace holding both timelines."""
from __future__ import annotations

import math

import pandas as pd

from reports.render import Report, Section
from simcore.results import to_chrome_trace

#: The parts of a step both sides have, with their words, largest difference named first.
PARTS = (("compute_s", "compute"), ("exposed_comm_s", "exposed communication"), ("bubble_s", "idle (bubble)"),
         ("offload_s", "offload stall"))

#: pid offset of the measured ranks in the combined Chrome trace (predicted ranks keep theirs).
MEASURED_PID = 1_000_000


def phase_rows(comparison) -> pd.DataFrame:
    """The step's parts and every phase both sides name: predicted, measured, difference."""
    t = comparison.table
    rows = t[t["field"].isin(["step_time_s"] + [f for f, _ in PARTS]) | (t["kind"] == "phase")]
    return rows[["field", "predicted", "measured", "abs_diff", "error"]].reset_index(drop=True)


def biggest_difference(comparison) -> tuple[str, float, float]:
    """(words, predicted - measured in s, as a share of the measured step) of the part or phase
    that differs most."""
    rows = phase_rows(comparison)
    rows = rows[rows["field"] != "step_time_s"]
    words = dict(PARTS)
    i = rows["abs_diff"].abs().idxmax()
    field = rows.loc[i, "field"]
    diff = float(rows.loc[i, "abs_diff"])
    name = words.get(field, field.removeprefix("phase.").replace("_", " "))
    return name, diff, diff / comparison.measured.step_time_s


def verdict(comparison) -> str:
    """One sentence: the step time's error and the phase that differs most."""
    name, diff, share = biggest_difference(comparison)
    err = comparison.error("step_time_s")
    step = f"step time {comparison.predicted.step_time_s:.4g} s predicted, {comparison.measured.step_time_s:.4g} s measured ({err:+.1%})"
    side = "more" if diff > 0 else "less"
    return f"{step}; {name} differs most: the prediction has {abs(diff):.4g} s {side} ({abs(share):.1%} of the measured step)"


def combined_trace(predicted_spans, measured_spans, plan_name: str) -> dict:
    """One Chrome trace: the predicted ranks, then the measured ranks (pid + MEASURED_PID), both from 0."""
    pred = to_chrome_trace(predicted_spans, f"{plan_name} predicted")
    meas = to_chrome_trace(measured_spans, f"{plan_name} measured")
    for e in meas["traceEvents"]:
        e["pid"] += MEASURED_PID
    events = pred["traceEvents"] + meas["traceEvents"]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def _fmt(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4g}"


def trace_report(comparison, steps: pd.DataFrame, collectives: pd.DataFrame, *, files: list[str], notes: tuple[str, ...] = ()) -> Report:
    """The report page: the answer (step time, the phase that differs most), the phase table,
    every rank and step measured, and where the numbers come from."""
    from reports.plots import gantt_figure

    name, diff, share = biggest_difference(comparison)
    p, m = comparison.predicted, comparison.measured
    summary = (("step time predicted", f"{p.step_time_s:.4g} s"), ("step time measured", f"{m.step_time_s:.4g} s"),
               ("error", f"{comparison.error('step_time_s'):+.1%}"),
               ("differs most", f"{name}: {diff:+.4g} s ({share:+.1%} of the step)"))
    phases = phase_rows(comparison)
    sections = [
        Section("Phase by phase", table=phases,
                text=verdict(comparison) + ". Predicted minus measured; the error is relative to the measurement. "
                     "Measured: per step the slowest rank, averaged over the steps."),
        Section("Every rank and step measured", table=steps),
        Section("Collectives by process group", table=collectives,
                text="Each rank's NCCL kernels by collective and group, the group mapped to the Plan's mesh axis "
                     "through its rank grid; kernel time and calls per profiled step, input bytes per call."),
        Section("The measured step", figure=gantt_figure(m.spans, f"{comparison.plan_name}: measured step (median)"),
                name="measured", caption="the trace's kernels: one lane per rank and stream"),
        Section("The predicted step", figure=gantt_figure(p.spans, f"{comparison.plan_name}: predicted step"),
                name="predicted", caption="event engine; representative ranks"),
    ]
    assumptions = [(f"profiler trace {f}", "PyTorch profiler (Kineto), read by simcore.runlogs.kineto") for f in files]
    assumptions.append(("kernel classes: NCCL = communication, Memcpy/Memset = memory, the rest computation "
                        "(GEMMs and attention by name)", "HolisticTraceAnalysis hta/common/types.py"))
    return Report(title=f"{comparison.plan_name}: profiler trace against the prediction",
                  subtitle="trainplan compare --trace", summary=summary, sections=tuple(sections),
                  assumptions=tuple(assumptions), notes=tuple(notes))
