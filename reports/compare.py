"""Predicted against measured: one pure function over two StepResults.

The error of each field is signed and relative to the measurement,
``(predicted - measured) / measured``: +10% means the simulator predicted 10% more
than was measured (for a time, too slow). Fields whose measurement is zero get an
absolute difference only.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from simcore.trace import StepResult

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    plan_name: str
    predicted: StepResult
    measured: StepResult
    table: pd.DataFrame
    """One row per field and per phase: predicted, measured, error (relative), abs_diff."""

    def error(self, field: str) -> float:
        row = self.table[self.table["field"] == field]
        return float(row["error"].iloc[0]) if len(row) else float("nan")

    def to_json(self) -> dict:
        return {
            "plan": self.plan_name,
            "predicted": self.predicted.to_json(),
            "measured": self.measured.to_json(),
            "errors": {r["field"]: r["error"] for r in self.table.to_dict(orient="records")},
        }


def _row(field: str, unit: str, kind: str, pred: float, meas: float) -> dict:
    err = (pred - meas) / meas if meas else float("nan")
    return {"field": field, "kind": kind, "unit": unit, "predicted": pred, "measured": meas,
            "error": err, "abs_diff": pred - meas}


def compare(predicted: StepResult, measured: StepResult) -> Comparison:
    """Field by field and phase by phase, predicted against measured."""
    rows = [_row(f, unit, "scalar", getattr(predicted, f), getattr(measured, f)) for f, unit in FIELDS]
    for kind in sorted(set(predicted.memory_bytes) & set(measured.memory_bytes)):
        rows.append(_row(f"memory.{kind}", "GiB", "memory", predicted.memory_bytes[kind] / 2**30,
                         measured.memory_bytes[kind] / 2**30))
    for phase in sorted(set(predicted.time_s) & set(measured.time_s)):
        rows.append(_row(f"phase.{phase}", "s", "phase", predicted.time_s[phase], measured.time_s[phase]))
    return Comparison(plan_name=measured.plan_name or predicted.plan_name, predicted=predicted,
                      measured=measured, table=pd.DataFrame(rows))
