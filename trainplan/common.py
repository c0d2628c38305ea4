"""What every command shares: the two user-error kinds, JSON and prediction printing."""
from __future__ import annotations

import json


class UsageError(ValueError):
    """A command-line argument breaks a rule."""


class RunFailed(ValueError):
    """A real run failed (a rank raised, hung past the timeout, or torch refused the layout)."""


def print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


def fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def print_prediction(result) -> None:
    """A readable breakdown of a StepResult (predicted or measured)."""
    rows = [
        ("step time", fmt_s(result.step_time_s)),
        ("  compute", fmt_s(result.compute_s)),
        ("  exposed communication", fmt_s(result.exposed_comm_s)),
        ("  pipeline bubble", fmt_s(result.bubble_s)),
        ("  offload stall", fmt_s(result.offload_s)),
        ("tokens/s", f"{result.tokens_per_s:,.0f}"),
        ("model TFLOP/s per GPU", f"{result.model_tflops_per_gpu:.1f}"),
        ("hardware TFLOP/s per GPU", f"{result.hardware_tflops_per_gpu:.1f}"),
        ("MFU / HFU", f"{result.mfu:.1%} / {result.hfu:.1%}"),
        ("memory per GPU", f"{result.memory_per_gpu_gib:.2f} GiB ({'fits' if result.fits else 'DOES NOT FIT'})"),
    ]
    print(f"{result.plan_name} ({result.source})")
    for k, v in rows:
        print(f"  {k:<28} {v}")
    if result.time_s:
        print("  time per phase (critical rank):")
        for k, v in result.time_s.items():
            if v:
                print(f"    {k:<26} {fmt_s(v)}")
    for note in result.notes:
        print(f"  note: {note}")
