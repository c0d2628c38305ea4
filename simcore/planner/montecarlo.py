"""The whole-run Monte-Carlo, drawn per failure event with numpy (no loop over steps or nodes).

The model is Daly's (FGCS 22(3), 2006, Sec. 2), the one ``simcore.engine.runs`` plays out
event by event on SimPy: useful work in segments of ``interval_s`` each closed by a blocking
checkpoint of ``checkpoint_s`` (none after the last); interruptions arrive as a Poisson process
of rate r; one loses the segment in progress and costs a recovery of ``recover_s``, which an
interruption starts over. Under that model the draws factor exactly:

- a segment of length a survives with probability e^{-ra}, so the interruptions of n equal
  segments are negative-binomial NB(n, e^{-ra}) (the failures before n successes);
- each interrupted attempt lasted an exponential time truncated to [0, a], drawn by inverse
  transform;
- each interruption's recovery fails NB(1, e^{-rR}) times, each failed try an exponential
  truncated to [0, R].

So a run costs O(interruptions) draws whatever its steps, segments or nodes, and the mean
agrees with Daly's closed form (``failures.expected_wall_s``; tests check both it and the
SimPy runs). Noticed spot preemptions (``spot.py``) add downtimes of D at rate q: their count
is Poisson(q U) for a run of U, each restarted NB(1, e^{-qD}) times, likewise truncated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: Events (interruptions and failed recoveries) all runs of one scenario may draw together;
#: numpy draws ~10-20 M per second here, so this keeps a scenario well under a second.
EVENT_BUDGET = 5_000_000
#: The fewest runs kept whatever the event count (percentiles need a sample).
MIN_RUNS = 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Runs:
    """Monte-Carlo runs of one scenario: per-run arrays."""

    wall_s: np.ndarray
    interruptions: np.ndarray
    lost_work_s: np.ndarray


def runs_for_budget(requested: int, expected_events_per_run: float) -> int:
    """Runs to draw: ``requested``, cut so that all of them together draw about EVENT_BUDGET
    events (at least MIN_RUNS); 0 when even MIN_RUNS runs would exceed the budget 10 times."""
    if expected_events_per_run * MIN_RUNS > 10 * EVENT_BUDGET:
        return 0
    return min(requested, max(MIN_RUNS, int(EVENT_BUDGET / max(1.0, expected_events_per_run))))


def _truncated_exp_sum(rng: np.random.Generator, counts: np.ndarray, mean_s: float, cap_s: float) -> np.ndarray:
    """Per run, the sum of ``counts[i]`` exponential times (mean ``mean_s``) truncated to [0, cap_s]."""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(len(counts))
    u = rng.random(total)
    draws = -mean_s * np.log1p(-u * -np.expm1(-cap_s / mean_s))   # inverse CDF of the truncated law
    owner = np.repeat(np.arange(len(counts)), counts)
    return np.bincount(owner, weights=draws, minlength=len(counts))


def _interrupted(rng, runs: int, segments: float, length_s: float, rate: float) -> np.ndarray:
    """Interruptions of ``segments`` segments of ``length_s`` each, per run."""
    if segments <= 0 or rate == 0:
        return np.zeros(runs, dtype=np.int64)
    return rng.negative_binomial(segments, math.exp(-rate * length_s), size=runs)


def daly_runs(runs: int, seed: int, *, work_s: float, interval_s: float, checkpoint_s: float,
              recover_s: float, rate_per_s: float) -> Runs:
    """``runs`` draws of a run of ``work_s`` useful seconds under Daly's model (see the module)."""
    rng = np.random.default_rng(seed)
    mean = 1.0 / rate_per_s if rate_per_s > 0 else math.inf
    full = max(0, math.ceil(work_s / interval_s) - 1) if math.isfinite(interval_s) else 0
    last = work_s - full * interval_s
    period = interval_s + checkpoint_s
    k_full = _interrupted(rng, runs, full, period, rate_per_s)
    k_last = _interrupted(rng, runs, 1 if last > 0 else 0, last, rate_per_s)
    wall = np.full(runs, full * period + last)
    lost = np.zeros(runs)
    if rate_per_s > 0:
        lost = _truncated_exp_sum(rng, k_full, mean, period) + _truncated_exp_sum(rng, k_last, mean, last)
        fails = k_full + k_last
        retries = np.where(fails > 0, rng.negative_binomial(np.maximum(fails, 1), math.exp(-rate_per_s * recover_s)), 0)
        wall = wall + lost + fails * recover_s + _truncated_exp_sum(rng, retries, mean, recover_s)
        return Runs(wall_s=wall, interruptions=fails + retries, lost_work_s=lost)
    return Runs(wall_s=wall, interruptions=np.zeros(runs, dtype=np.int64), lost_work_s=lost)


def with_downtimes(r: Runs, seed: int, *, rate_per_s: float, downtime_s: float, availability: float) -> Runs:
    """Noticed preemptions on top of ``r``: Poisson(q x wall) of them, each a downtime of
    ``downtime_s`` that a preemption within it starts over; then the waits for a whole pool."""
    if rate_per_s == 0:     # availability > 0: the Monte-Carlo runs only feasible scenarios
        return Runs(wall_s=r.wall_s / availability, interruptions=r.interruptions, lost_work_s=r.lost_work_s)
    rng = np.random.default_rng([seed, 1])
    count = rng.poisson(rate_per_s * r.wall_s)
    retries = np.where(count > 0, rng.negative_binomial(np.maximum(count, 1), math.exp(-rate_per_s * downtime_s)), 0)
    extra = count * downtime_s + _truncated_exp_sum(rng, retries, 1.0 / rate_per_s, downtime_s)
    return Runs(wall_s=(r.wall_s + extra) / availability, interruptions=r.interruptions + count + retries,
                lost_work_s=r.lost_work_s)


def summary(r: Runs, usd_per_s: float, seed: int, level: float) -> dict[str, float]:
    """Percentiles of days and $ (the ``level`` interval and the median), means of the rest."""
    lo, hi = 50 * (1 - level), 50 * (1 + level)
    days = r.wall_s / 86400.0
    q = np.percentile(days, [lo, 50, hi])
    return {"runs": len(days), "seed": seed, "level": level,
            "days_lo": float(q[0]), "days_p50": float(q[1]), "days_hi": float(q[2]),
            "days_p90": float(np.percentile(days, 90)),
            "usd_lo": float(q[0] * 86400 * usd_per_s), "usd_p50": float(q[1] * 86400 * usd_per_s),
            "usd_hi": float(q[2] * 86400 * usd_per_s), "usd_p90": float(np.percentile(days, 90) * 86400 * usd_per_s),
            "interruptions_mean": float(r.interruptions.mean()), "lost_work_s_mean": float(r.lost_work_s.mean())}
