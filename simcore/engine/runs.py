"""A whole training run on SimPy: work, checkpoints, failures, restarts, preemptions.

One process trains: it works ``interval_s`` of useful steps, then writes a checkpoint
(``checkpoint_s`` blocking), and repeats until ``work_s`` of useful work is done. A
second process draws the time to the next interruption from an exponential law with
``failure_rate_per_s`` (failures and, for spot capacity, preemptions: independent
Poisson processes, so their rates add) and interrupts the first. An interruption loses
the work since the last completed checkpoint (a checkpoint cut short is lost too), then
costs ``restart_s`` (detect, reschedule, relaunch) plus ``restore_s`` (read the
checkpoint back) before training resumes. This is the model of Daly, "A higher order
estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006,
Sec. 2, played out event by event rather than in expectation; interruptions during a
restart start the restart over, as in Daly's model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import simpy


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSample:
    """One simulated training run."""

    wall_s: float
    """Wall time from start to the last useful step."""
    interruptions: int
    lost_work_s: float
    """Useful work redone after interruptions (and checkpoints cut short)."""
    checkpoints: int
    checkpoint_s: float
    """Time spent writing checkpoints that completed."""
    restart_s: float
    """Time spent restarting and restoring."""


class _Log:
    __slots__ = ("done_s", "interruptions", "lost_s", "checkpoints", "checkpoint_s", "restart_s")

    def __init__(self) -> None:
        self.done_s = 0.0
        self.interruptions = 0
        self.lost_s = 0.0
        self.checkpoints = 0
        self.checkpoint_s = 0.0
        self.restart_s = 0.0


def _train(env: simpy.Environment, log: _Log, work_s: float, interval_s: float,
           checkpoint_s: float, recover_s: float, finished: simpy.Event):
    """The training job. Between interruptions it runs segments of ``interval_s`` work,
    each closed by a ``checkpoint_s`` write (none after the last); one timeout covers
    the whole uninterrupted stretch, and an interruption is resolved against the
    segment boundaries, so events scale with interruptions, not with checkpoints.
    After an interruption it recovers for ``recover_s``; an interruption during the
    recovery starts the recovery over."""
    period = interval_s + checkpoint_s
    recovering = False
    while recovering or log.done_s < work_s:
        start = env.now
        if recovering:
            try:
                yield env.timeout(recover_s)
                log.restart_s += recover_s
                recovering = False
            except simpy.Interrupt:
                log.restart_s += env.now - start
                log.interruptions += 1
            continue
        left = work_s - log.done_s
        full = max(0, math.ceil(left / interval_s) - 1)    # checkpoints still to write
        try:
            yield env.timeout(left + full * checkpoint_s)
            log.checkpoints += full
            log.checkpoint_s += full * checkpoint_s
            log.done_s = work_s
        except simpy.Interrupt:
            elapsed = env.now - start
            saved = min(full, int(elapsed // period))     # checkpoints completed before the failure
            log.checkpoints += saved
            log.checkpoint_s += saved * checkpoint_s
            log.done_s += saved * interval_s
            log.lost_s += min(elapsed - saved * period, interval_s)
            log.interruptions += 1
            recovering = True
    finished.succeed()


def _interrupter(env: simpy.Environment, job: simpy.Process, rate_per_s: float, rng: np.random.Generator):
    """Failures (and preemptions) as a Poisson process: exponential gaps."""
    while job.is_alive:
        yield env.timeout(rng.exponential(1.0 / rate_per_s))
        if job.is_alive:
            job.interrupt("failure")


def simulate_training_run(*, work_s: float, interval_s: float, checkpoint_s: float, restore_s: float,
                          restart_s: float, failure_rate_per_s: float,
                          rng: np.random.Generator) -> RunSample:
    """One run of ``work_s`` seconds of useful steps with checkpoints every ``interval_s``."""
    if work_s <= 0 or interval_s <= 0:
        raise ValueError(f"work_s={work_s} and interval_s={interval_s} must be positive")
    env = simpy.Environment()
    log = _Log()
    finished = env.event()
    job = env.process(_train(env, log, work_s, interval_s, checkpoint_s, restart_s + restore_s, finished))
    if failure_rate_per_s > 0:
        env.process(_interrupter(env, job, failure_rate_per_s, rng))
    env.run(until=finished)
    return RunSample(wall_s=env.now, interruptions=log.interruptions, lost_work_s=log.lost_s,
                     checkpoints=log.checkpoints, checkpoint_s=log.checkpoint_s, restart_s=log.restart_s)


def monte_carlo_runs(n: int, seed: int, **kwargs) -> list[RunSample]:
    """``n`` independent runs; run i draws from ``default_rng([seed, i])`` (reproducible)."""
    return [simulate_training_run(rng=np.random.default_rng([seed, i]), **kwargs) for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else math.nan
