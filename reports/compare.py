"""Predicted against measured: one pure function over two StepResults.

The error of each field is signed and relative to the measurement,
``(predicted - measured) / measured``: +10% means the simulator predicted 10% more
than was measured (for a time, too slow). Fields whose measurement is zero get an
absolute difference only.

With the Plan at hand, the prediction's step time carries a 90% interval from the
residuals of earlier validations on the same kind of hardware and layout
(``simcore.planner.uncertainty``), and the comparison says whether the measurement fell in it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from simcore.results import StepResult
from simcore.planner.uncertainty import Interval, prediction_interval

#: Predicted fields given an interval when residuals exist.
INTERVAL_FIELDS = ("step_time_s", "memory_per_gpu_gib")

#: The scalar fields compared, with their unit for the tables.
FIELDS = (
    ("step_time_s", "s"),
    ("compute_s", "s"),
    ("exposed_comm_s", "s"),
    ("bubble_s", "s"),
    ("offload_s", "s"),
    ("tokens_per_s", "tokens/s"),
    ("memory_per_gpu_gib", "GiB"),
)


#: Predicted phases that a measurement holds inside another one, where it has none of its own:
#: the executor recomputes inside its backward spans, and activation offload's copy waits fall
#: inside the forward and backward spans they delay.
MEASURED_INSIDE = {"recompute": "backward", "activation_offload": "forward", "activation_reload": "backward"}


def measurable_phases(predicted: dict[str, float], measured: dict[str, float]) -> dict[str, float]:
    """The predicted phases as the measurement can see them (``MEASURED_INSIDE`` folded in)."""
    out = dict(predicted)
    for phase, into in MEASURED_INSIDE.items():
        if phase in out and phase not in measured and into in out:
            out[into] += out.pop(phase)
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    plan_name: str
    predicted: StepResult
    measured: StepResult
    table: pd.DataFrame
    """One row per field and per phase: predicted, measured, error (relative), abs_diff."""
    intervals: dict = field(default_factory=dict)
    """field -> ``simcore.planner.uncertainty.Interval`` of the prediction (where residuals exist)."""

    def error(self, field: str) -> float:
        row = self.table[self.table["field"] == field]
        return float(row["error"].iloc[0]) if len(row) else float("nan")

    def to_json(self) -> dict:
        return {
            "plan": self.plan_name,
            "predicted": self.predicted.to_json(),
            "measured": self.measured.to_json(),
            "errors": {r["field"]: r["error"] for r in self.table.to_dict(orient="records")},
            "intervals": {f: {**iv.to_json(), "measured_inside": iv.lo <= getattr(self.measured, f) <= iv.hi}
                          for f, iv in self.intervals.items()},
        }


def relative_error(pred: float, meas: float) -> float:
    """(predicted - measured) / measured; NaN where nothing was measured."""
    return (pred - meas) / meas if meas else float("nan")


def _row(field: str, unit: str, kind: str, pred: float, meas: float) -> dict:
    return {"field": field, "kind": kind, "unit": unit, "predicted": pred, "measured": meas,
            "error": relative_error(pred, meas), "abs_diff": pred - meas}


def prediction_intervals(plan, predicted: StepResult, tables: dict | None = None) -> dict[str, Interval]:
    """The intervals of ``INTERVAL_FIELDS`` that residuals exist for."""
    out = {}
    for f in INTERVAL_FIELDS:
        iv = prediction_interval(plan, getattr(predicted, f), f, tables=tables)
        if iv is not None:
            out[f] = iv
    return out


def compare(predicted: StepResult, measured: StepResult, *, plan=None, tables: dict | None = None) -> Comparison:
    """Field by field and phase by phase, predicted against measured; with ``plan``, the
    prediction's intervals from the residual ``tables`` (default: validation/residuals.yaml)."""
    rows = [_row(f, unit, "scalar", getattr(predicted, f), getattr(measured, f)) for f, unit in FIELDS]
    for kind in sorted(set(predicted.memory_bytes) & set(measured.memory_bytes)):
        rows.append(_row(f"memory.{kind}", "GiB", "memory", predicted.memory_bytes[kind] / 2**30,
                         measured.memory_bytes[kind] / 2**30))
    phases = measurable_phases(predicted.time_s, measured.time_s)
    for phase in sorted(set(phases) & set(measured.time_s)):
        rows.append(_row(f"phase.{phase}", "s", "phase", phases[phase], measured.time_s[phase]))
    intervals = prediction_intervals(plan, predicted, tables) if plan is not None else {}
    return Comparison(plan_name=measured.plan_name or predicted.plan_name, predicted=predicted,
                      measured=measured, table=pd.DataFrame(rows), intervals=intervals)
