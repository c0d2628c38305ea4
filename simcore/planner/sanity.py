"""Warnings and refusals for answers no one should act on without being told.

``plan_warnings`` (``simcore.plan.rules``) flags a model asked beyond its catalog entry;
this module looks at the prediction and the run: a plan that does not fit or fits with
almost no headroom, a single step longer than a day, a run whose goodput is a few percent.
``refusal`` names what has no sensible answer at all (a step or memory figure that is not a
finite number). Each is one sentence; the command line prints them on stderr.
"""
from __future__ import annotations

import math

from simcore.plan.rules import plan_warnings
from simcore.planner.formatting import binary_bytes, hbm_gib, headroom_gib
from simcore.planner.headroom import is_thin, memory_margin
from simcore.planner.spot import LOW_GOODPUT

#: A step longer than this (one day) is not a training step anyone runs: check the inputs.
LONG_STEP_S = 86400.0
#: A step longer than a year has no sensible answer: refused, not priced.
LONGEST_STEP_S = 365 * 86400.0


def refusal(plan, prediction) -> str:
    """One sentence when the prediction has no sensible answer (a non-finite figure), else ''."""
    for name in ("step_time_s", "memory_per_gpu_gib"):
        value = getattr(prediction, name)
        if not math.isfinite(value) or value < 0:
            return (f"the prediction of {plan.name} has no sensible {name.replace('_', ' ')} ({value}): "
                    "check model.layers, model.seq_len and training.global_batch")
    if prediction.step_time_s > LONGEST_STEP_S:
        return (f"one step of {plan.name} would take {prediction.step_time_s / 86400 / 365:,.3g} years, which "
                "no run can train: check model.layers, model.seq_len and training.global_batch")
    return ""


def prediction_warnings(plan, prediction) -> list[str]:
    """The plan's own warnings, then the prediction's: memory, headroom, step length."""
    out = plan_warnings(plan)
    hbm = hbm_gib(plan)
    peak = prediction.memory_per_gpu_gib
    room = headroom_gib(hbm, peak)
    if room < 0:
        out.append(f"the plan does not fit: {binary_bytes(peak * 2**30)} per GPU against {hbm:.0f} GiB "
                   f"({peak / hbm:,.3g}x the GPU's memory); its time and cost are for a run that cannot start")
    elif is_thin(room, hbm):
        out.append(f"only {room:.1f} GiB of {hbm:.0f} GiB left per GPU ({room / hbm:.1%}): within the memory "
                   f"model's error of the limit ({memory_margin().describe()})")
    if prediction.step_time_s > LONG_STEP_S:
        out.append(f"one step takes {prediction.step_time_s / 86400:,.3g} days: check model.layers, "
                   "model.seq_len and training.global_batch")
    return out


def cost_warnings(rc) -> list[str]:
    """A run that is priced but mostly buys restarts (on-demand goodput below LOW_GOODPUT)."""
    od = rc.on_demand
    if not od.infeasible and od.goodput < LOW_GOODPUT:
        return [f"goodput is {od.goodput:.1%}: most of the {rc.days:,.0f} days and the money go to failures and "
                "restarts; fewer nodes or faster restarts would cost less"]
    return []
