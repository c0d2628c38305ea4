"""Spot capacity as operators run it: spares, elastic restarts, checkpoints on notice.

A spot run does not restart the whole job from the queue on every preemption. As operators
run it (torchrun's elastic agent, ``--nnodes=MIN:MAX``, re-forms the group when a node
leaves, https://pytorch.org/docs/stable/elastic/run.html; Bamboo, Thorpe et al. NSDI'23,
and Oobleck, Jang et al. SOSP'23, keep training on preemptible instances the same way):

- the job holds ``S`` spare nodes beside its ``N``; a preempted node is replaced by a spare
  and the job restarts elastically (``spot_elastic_restart_s``) and restores the last
  checkpoint (``restore_s``), instead of the full ``restart_s`` of a failed job;
- the provider warns before it takes a node (``spot_notice_s``: two minutes on AWS); when a
  checkpoint (its blocking part, plus the step in flight) fits in the notice, the job writes
  one and loses no work; otherwise a preemption loses the work since the last checkpoint,
  like a failure;
- the spot market refills the spare pool: each preempted node comes back after a mean
  ``spot_reacquire_s``. The nodes out at any moment form an M/M/inf queue (arrivals at
  ``p (N + S)`` per hour, each out for ``spot_reacquire_s``), so their number is Poisson with
  mean ``L = p (N + S) spot_reacquire_s``; the job is whole while at most ``S`` are out, a
  share ``A = P(Poisson(L) <= S)`` of the time, and waits otherwise. Spares are the fewest
  that give ``A >= spot_availability`` (at most ``N``), or the number given.

Expected wall time, with U the failure-only wall time (Daly's model) and preemptions at
rate ``q = p N`` while the job runs: a noticed preemption costs a downtime D (the notice
checkpoint, the elastic restart and the restore), and a preemption during a downtime starts
it over, so a downtime lasts (e^{qD} - 1)/q in expectation (the renewal argument of Daly
2006, Sec. 2, with nothing to lose but the downtime), and wall = U e^{qD} / A. Without a
usable notice, failures and preemptions join one Daly model at the summed rate, recovering
in the rate-weighted mean of the two recoveries.

A configuration is infeasible when its goodput (useful time over wall time) falls below
``INFEASIBLE_GOODPUT`` or the spare pool cannot keep the job whole even with as many spares
as nodes: ``SpotPlan.infeasible`` then says why in one sentence, and no figure is priced.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: Below this share of wall time doing useful steps a run makes no meaningful progress
#: (it would take over 100x its work): the run is reported infeasible, not priced.
INFEASIBLE_GOODPUT = 0.01
#: Below this goodput the run is priced but a warning says most of the money buys restarts.
LOW_GOODPUT = 0.10


@dataclass(frozen=True, slots=True, kw_only=True)
class SpotPlan:
    """How a spot run is operated and what it costs in time, before pricing."""

    nodes: int
    spare_nodes: int
    availability: float
    """Share of the time the job has all its nodes."""
    preemptions_per_s: float
    """Preemptions of the job's own nodes (the spares' come back through the pool)."""
    notice_saves: bool
    """A checkpoint fits in the notice: preemptions lose no work."""
    downtime_s: float
    """One noticed preemption: notice checkpoint + elastic restart + restore."""
    recover_s: float
    """Recovery of one interruption in the combined model (no usable notice)."""
    infeasible: str = ""


def spare_pool(nodes: int, per_node_per_s: float, reacquire_s: float, target: float,
               given: float = math.nan) -> tuple[int, float]:
    """(spares, availability): the fewest spares (at most ``nodes``) that keep the job whole
    a ``target`` share of the time, or ``given`` spares; availability P(Poisson(L) <= S)."""
    def avail(s: int) -> float:
        mean_out = per_node_per_s * (nodes + s) * reacquire_s
        return poisson_cdf(s, mean_out)
    if not math.isnan(given):
        return int(given), avail(int(given))
    lo, hi = 0, nodes
    if avail(hi) < target:
        return hi, avail(hi)
    while lo < hi:                      # avail rises with s: bisect the fewest spares
        mid = (lo + hi) // 2
        if avail(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo, avail(lo)


def poisson_cdf(k: int, mean: float) -> float:
    """P(X <= k) for X ~ Poisson(mean): the terms summed in log space (no overflow)."""
    if mean <= 0:
        return 1.0
    log_mean = math.log(mean)
    return min(1.0, math.fsum(math.exp(i * log_mean - mean - math.lgamma(i + 1)) for i in range(k + 1)))


def plan_spot(sheet, nodes: int, step_s: float, blocking_s: float, restore_s: float,
              failure_recover_s: float, failure_rate_per_s: float) -> SpotPlan:
    """The spare pool, the notice rule and the recovery times of a spot run (no failures
    and no preemptions when ``sheet.spot_preemptions_per_node_hour`` is 0)."""
    p = sheet.spot_preemptions_per_node_hour / 3600.0
    spares, avail = (0, 1.0) if p == 0 else spare_pool(nodes, p, sheet.spot_reacquire_s,
                                                         sheet.spot_availability, sheet.spot_spare_nodes)
    q = p * nodes
    saves = blocking_s + step_s <= sheet.spot_notice_s
    elastic = sheet.spot_elastic_restart_s + restore_s
    downtime = blocking_s + elastic if saves else elastic
    total = q + failure_rate_per_s
    recover = (q * elastic + failure_rate_per_s * failure_recover_s) / total if total > 0 else failure_recover_s
    why = ""
    if avail < sheet.spot_availability and sheet.spot_availability > 0 and math.isnan(sheet.spot_spare_nodes):
        why = (f"spot is infeasible: with {nodes} nodes preempted {sheet.spot_preemptions_per_node_hour:g} times "
               f"per node-hour and {sheet.spot_reacquire_s / 60:.0f} min to get a node back, even {spares} "
               f"spares keep the job whole only {avail:.0%} of the time")
    return SpotPlan(nodes=nodes, spare_nodes=spares, availability=avail, preemptions_per_s=q,
                    notice_saves=saves, downtime_s=downtime, recover_s=recover, infeasible=why)


def noticed_wall_s(failure_wall_s: float, sp: SpotPlan) -> float:
    """U e^{qD} / A: the failure-only wall time stretched by noticed preemptions' downtimes
    (each restarted by a preemption within it) and by the time the pool is short."""
    x = sp.preemptions_per_s * sp.downtime_s
    if x > 700 or sp.availability <= 0:
        return math.inf
    return failure_wall_s * math.exp(x) / sp.availability


def infeasible_sentence(name: str, nodes: int, rate_per_s: float, recover_s: float, goodput: float) -> str:
    """Why a run cannot make progress, in one sentence."""
    every = 1.0 / rate_per_s if rate_per_s > 0 else math.inf
    return (f"{name} is infeasible: {nodes} nodes see an interruption every {_duration(every)} against "
            f"{_duration(recover_s)} to restart and restore, so under {INFEASIBLE_GOODPUT:.0%} of the time "
            f"trains (goodput {goodput:.2%}); use fewer nodes, more reliable capacity or faster restarts")


def _duration(s: float) -> str:
    if not math.isfinite(s):
        return "never"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"
