"""One format per kind of number, shared by the terminal tables, the reports and the CSV.

Money is dollars with a unit suffix (``$3.59M``), never scientific notation; days one
decimal; MFU a percent everywhere (the tables' fraction columns are shown as percents);
an interval follows its value as ``lo-hi``; a figure that cannot be had is the word
``infeasible``; float noise of a computation (``1.4e-17`` where 0 is meant) is 0. Memory
headroom, GPU memory less the predicted peak, comes from ``headroom_gib`` alone, so a
margin the memory model adds reaches every table through this one function.
"""
from __future__ import annotations

import math

#: |x| below this share of the largest figure in its column is arithmetic noise, shown as 0.
NOISE = 1e-9
INFEASIBLE = "infeasible"


def headroom_gib(hbm_gib: float, peak_gib: float) -> float:
    """GPU memory less the predicted peak (GiB); negative: does not fit. The one place the
    headroom is computed: every table and report calls it with the memory result's fields."""
    return hbm_gib - peak_gib


def hbm_gib(plan) -> float:
    """The plan's GPU memory in GiB (the catalog's, or the calibrated profile's)."""
    return plan.cluster.node.gpu.hbm_bytes / 2**30


def is_missing(x) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def money(x: float) -> str:
    """$1.23B, $3.59M, $12.3k, $950; ``infeasible`` for NaN/inf."""
    if is_missing(x):
        return INFEASIBLE
    if abs(x) >= 1e15:   # past any budget: no 300-digit figure
        return f"${x:.3g}"
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"${x / scale:,.3g}{unit}" if abs(x) < 1000 * scale else f"${x / scale:,.0f}{unit}"
    return f"${x:,.0f}"


def days(x: float) -> str:
    if is_missing(x):
        return INFEASIBLE
    return f"{x:,.1f}" if abs(x) < 1e9 else f"{x:.3g}"   # past any deadline: no 300-digit figure


def percent(x: float) -> str:
    """A fraction (0.54) as a percent (54.0%)."""
    return "n/a" if is_missing(x) else f"{100 * x:.1f}%"


def span(lo: float, hi: float, fmt) -> str:
    """``lo-hi`` in ``fmt``; an end that cannot be had reads ``infeasible``."""
    if is_missing(lo) and is_missing(hi):
        return ""
    return f"{fmt(lo)}-{fmt(hi)}"


def with_interval(value: float, lo: float, hi: float, fmt) -> str:
    """``value (lo-hi)``, or the value alone where no interval exists."""
    if is_missing(value):
        return INFEASIBLE
    s = span(lo, hi, fmt)
    return f"{fmt(value)} ({s})" if s else fmt(value)


def clean(x: float, scale: float) -> float:
    """0 where ``x`` is noise next to ``scale`` (the column's largest magnitude)."""
    return 0.0 if isinstance(x, float) and math.isfinite(x) and abs(x) <= NOISE * scale else x


def si(x: float, unit: str) -> str:
    """An adaptive SI prefix: 12.3 GFLOP/s, 850 MFLOP/s, 1.2 PFLOP/s."""
    if is_missing(x):
        return "n/a"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def binary_bytes(x: float) -> str:
    """An adaptive binary prefix: 78.4 GiB, 512 MiB, 12 KiB."""
    if is_missing(x):
        return "n/a"
    for scale, prefix in ((2**40, "Ti"), (2**30, "Gi"), (2**20, "Mi"), (2**10, "Ki")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}B"
    return f"{x:.0f} B"


def ranking_overlap(values: list[tuple[str, float, float]]) -> str:
    """A sentence when the first entry's interval (name, lo, hi) overlaps the next ones':
    their order is then within the model's error. Empty when it stands apart or no intervals."""
    if len(values) < 2 or any(is_missing(v) for _, lo, hi in values[:1] for v in (lo, hi)):
        return ""
    name, lo, hi = values[0]
    close = [n for n, l2, h2 in values[1:] if not (is_missing(l2) or is_missing(h2)) and l2 <= hi and h2 >= lo]
    if not close:
        return ""
    shown = ", ".join(close[:4]) + (f" and {len(close) - 4} more" if len(close) > 4 else "")
    return (f"the interval of {name} overlaps that of {shown}: the ranking between them is within "
            "the model's error")


def json_safe(x):
    """``x`` with every NaN and inf (an infeasible or missing figure) as None: JSON has no NaN."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x
