"""The layout search's bound: a first pass over a sample of the families, then the rest
evaluated only where their step floor can come near the best of it.

Most of a large search's layouts are far off the best (GPT-3 175B on 1,536 A100: 61% of
the layouts timed took over twice the best layout's step), and timing one is most of
its cost. ``analytic.step_floor`` bounds a family's step from below by its stages'
compute and blocking communication in the pipeline span its schedule gives them. A
family is left (counted in ``Tally.bounded``) where even the low end of its floor's 90%
interval lies above the high end of the best step's of the sample's layouts that fit
with the memory model's margin (and leave the headroom asked, and run on the stack
asked): the intervals the ranked table prints (``uncertainty``, each layout's own, widened
for what it extrapolates), so no layout the ranking could put first by its error is lost
(branch and bound, with the closed forms' floor as the bound).

Deterministic: the sample and the bound do not depend on the processes or batches.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Callable

from simcore.plan.spec import Plan
from simcore.planner.evaluate import _without_micro_batch
from simcore.planner.headroom import FITS
from simcore.planner.space import Layout
from simcore.planner.uncertainty import class_log_bounds, interval_key, load_residuals, residual_kind

#: One group of families in this many goes into the first pass (a group: the families of one
#: layout at every micro-batch, kept together for ``evaluate._evaluate_chunk``'s shortcut).
SAMPLE_STRIDE = 32


def split_sample(fams: list[Layout]) -> tuple[list[Layout], list[Layout]]:
    """(the first pass's families, the others): every ``SAMPLE_STRIDE``-th group of the
    families that differ only in micro-batch, each group whole and in order."""
    groups: dict[tuple, list[Layout]] = {}
    for fam in fams:
        groups.setdefault(_without_micro_batch(fam), []).append(fam)
    first, rest = [], []
    for i, group in enumerate(groups.values()):
        (first if i % SAMPLE_STRIDE == 0 else rest).extend(group)
    return first, rest


def log_ends(base: Plan, layouts: list[Layout], tables: dict | None = None) -> dict[tuple, tuple[float, float]]:
    """Per ``uncertainty.interval_key`` of ``layouts``, the log bounds (lo, hi) of its 90% step-time
    interval as the ranked table gives them (``uncertainty.class_log_bounds``; NaN where none)."""
    tables = load_residuals() if tables is None else tables
    kind, out = residual_kind(base.cluster), {}
    # what ``interval_key`` reads of a layout, to compute each key once
    one = {(lay.tp, lay.pp, lay.cp, lay.ep, lay.dp, lay.zero, lay.dp_replicate): lay for lay in layouts}
    for lay in one.values():
        if (key := interval_key(lay)) not in out:
            out[key] = class_log_bounds(tables, kind, lay, base)
    return out


def bound_of(rows: list[dict], objective: str, room_gib: float, ends: dict[tuple, tuple[float, float]],
             runs: Callable[[dict], bool] | None = None) -> tuple[float, bool, dict[tuple, float]]:
    """(value, per GPU, lows): ``_evaluate_chunk``'s bound from the first pass's rows. The best
    step (GPU-seconds with the cost objective, per GPU then) of the rows that fit with the memory
    model's margin within ``room_gib`` GiB per GPU and that ``runs`` accepts, times the high end
    of its interval (``ends``, ``log_ends``), is ``value``; ``lows`` holds exp(lo) per interval key,
    so a family is left where its floor times that is over ``value`` (hi at least 0 and lo at most
    0: a layout left is also slower than the best on the model's own figures). Infinite for the Pareto
    objective, whose front can hold any step, or where no such row or interval is."""
    none = (math.inf, False, {})
    if objective == "pareto":
        return none
    per_gpu = objective == "cost"
    keys = sorted((r["step_time_s"] * (r["gpus"] if per_gpu else 1), i) for i, r in enumerate(rows)
                  if r["fit"] == FITS and r["memory_per_gpu_gib"] <= room_gib)
    for key, i in keys:
        if runs is None or runs(rows[i]):
            hi = ends.get(interval_key(SimpleNamespace(**rows[i])), (math.nan, math.nan))[1]
            # never inside the best's own step: a layout left is slower on the model's own figures too
            lows = {k: math.exp(min(lo, 0.0)) for k, (lo, _) in ends.items() if math.isfinite(lo)}
            return (key * math.exp(max(hi, 0.0)), per_gpu, lows) if math.isfinite(hi) else none
    return none
