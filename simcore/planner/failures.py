"""Checkpoints and failures: checkpoint size and times, the interval, the expected wall time.

- Checkpoints: the full training state (16-bit weights plus the optimizer's fp32 master
  weights and states: the ZeRO paper's 2 + K bytes per parameter, Rajbhandari et al.
  2020, Sec. 3.1) written by all nodes at once through the storage tier (the aggregate
  write bandwidth, capped by the nodes' client links; local NVMe scales with the nodes).
  ``checkpoints.py`` holds the choices as the stacks write them: synchronous, asynchronous
  (the step blocks for the device-to-host staging copy only), deduplicated or replicated
  writes, a stated compression ratio; the lost work of an asynchronous save.
- Interval: Daly's higher-order optimum (Daly 2006, FGCS 22(3), Eq. 37), which reduces
  to Young's sqrt(2 C M) (Young 1974, CACM 17(9)) for C << M.
- Expected wall time with exponential failures of mean time M, restart R and
  interval tau: T_w = M e^{R/M} (e^{(tau+C)/M} - 1) T_s / tau (Daly 2006, Eq. 13 / Sec. 3);
  without failures T_w = T_s + checkpoints x C exactly.

``Scenario`` is the expected outcome of one way of buying the GPUs under that model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from simcore.model import memory as mem
from simcore.model import workload as wl
from simcore.plan.spec import Plan
from simcore.planner import checkpoints as cks
from topologies.components import Storage


# --------------------------------------------------------------------------- storage

def storage_bytes_per_s(storage: Storage, nodes: int, write: bool) -> float:
    """Aggregate bandwidth when every node reads (or writes) at once: local NVMe scales with
    the nodes; a shared tier gives its aggregate, capped by the nodes' client links."""
    per = storage.write_bytes_per_s if write else storage.read_bytes_per_s
    if storage.kind == "local-nvme":
        return per * nodes
    return min(per, nodes * storage.per_client_bytes_per_s)


def checkpoint_bytes(plan: Plan) -> float:
    """Full training state: 16-bit (or fp32) weights plus K optimizer bytes per parameter."""
    tr = plan.training
    per_param = mem.param_bytes(tr) + mem.optimizer_bytes_per_param(tr, plan.model.hidden)
    return wl.param_counts(plan.model).trained * per_param


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young 1974: tau = sqrt(2 C M)."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly 2006, Eq. 37: sqrt(2CM)[1 + (C/2M)^0.5/3 + (C/2M)/9] - C for C < 2M, else M."""
    c, m = checkpoint_s, mtbf_s
    if math.isinf(m):
        return math.inf
    if c >= 2 * m:
        return m
    x = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(x) / 3 + x / 9) - c


def checkpoints_written(work_s: float, interval_s: float) -> int:
    """Checkpoints of a run with no failures: one per interval, none after the last step."""
    return 0 if math.isinf(interval_s) else max(0, math.ceil(work_s / interval_s) - 1)


def expected_wall_s(work_s: float, interval_s: float, checkpoint_s: float, recover_s: float,
                    mtbf_s: float) -> float:
    """Daly 2006 (Sec. 3): M e^{R/M} (e^{(tau+C)/M} - 1) T_s / tau; one stretch without
    checkpoints when tau >= T_s; no failures: T_s + checkpoints x C exactly. Evaluated in
    log space: inf (not an OverflowError) where the run cannot finish in any float time."""
    if math.isinf(mtbf_s):
        return work_s + checkpoints_written(work_s, interval_s) * checkpoint_s
    m = mtbf_s
    stretch, scale = (work_s, 1.0) if interval_s >= work_s else (interval_s + checkpoint_s, work_s / interval_s)
    log_wall = math.log(m) + recover_s / m + _log_expm1(stretch / m) + math.log(scale)
    return math.exp(log_wall) if log_wall < LOG_FLOAT_MAX else math.inf


#: ln of the largest float: a Daly wall time beyond it is reported as inf.
LOG_FLOAT_MAX = math.log(1.7e308)


def _log_expm1(x: float) -> float:
    """ln(e^x - 1) without overflow."""
    return x + math.log(-math.expm1(-x)) if x > 30 else math.log(math.expm1(x))


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointPlan:
    size_bytes: float
    write_bytes_per_s: float
    """Aggregate file-system write bandwidth all writers share."""
    write_s: float
    """Time to write one checkpoint to the storage tier."""
    blocking_s: float
    """Time training stops per checkpoint (= write_s, or the host copy when tiered)."""
    restore_s: float
    interval_s: float
    """Useful work between checkpoints (inf: none)."""
    tiered: bool
    """Asynchronous (``mode == "async"``; the old name of the choice, kept)."""
    rule: str
    mode: str = "sync"
    compression: float = 1.0
    """Stated ratio of logical to stored bytes (1: none)."""
    deduplicated: bool = True
    written_bytes: float = 0.0
    """Bytes through the storage tier per checkpoint: deduplicated or not, over the compression."""
    staging_s: float = 0.0
    """Device-to-host copy of each GPU's share (the whole stall of an asynchronous save)."""
    wait_s: float = 0.0
    """Asynchronous: a save that waits for the previous write (an interval below the write)."""
    unprotected_s: float = 0.0
    """Asynchronous: training time after the step resumes until the checkpoint is durable; a
    failure within it falls back to the checkpoint before (charged as lost work per failure)."""


def plan_checkpoints(plan: Plan, storage: Storage, mtbf_s: float, *, tiered: bool = False,
                     interval_s: float | None = None, mode: str | None = None, compression: float = 1.0,
                     deduplicated: bool = True) -> CheckpointPlan:
    """Checkpoint size, write / restore time through ``storage`` and the interval; ``mode``
    sync or async (``tiered=True`` is async), see ``simcore.planner.checkpoints``."""
    mode = cks.check_mode(mode, tiered)
    ratio = cks.check_compression(compression)
    nodes = plan.cluster.nodes
    size = checkpoint_bytes(plan)
    held = size if deduplicated else cks.replicated_bytes(plan, size)
    wbw = storage_bytes_per_s(storage, nodes, write=True)
    staging, write, restore = cks.times(plan, held, held / ratio, wbw, storage_bytes_per_s(storage, nodes, write=False),
                                        storage.latency_s)
    if interval_s is not None:
        rule = "given"
    elif math.isinf(mtbf_s):
        interval_s, rule = math.inf, "no failures: no checkpoints"
    else:   # async keeps the synchronous save interval, raised so that no save waits for the last write
        interval_s, rule = daly_interval_s(write, mtbf_s), "Daly 2006 Eq. 37"
        if mode == "async" and interval_s < write:
            interval_s, rule = write, rule + ", raised to the background write time"
    ck = CheckpointPlan(size_bytes=size, write_bytes_per_s=wbw, write_s=write, blocking_s=write, restore_s=restore,
                        interval_s=interval_s, tiered=mode == "async", rule=rule, mode=mode, compression=ratio,
                        deduplicated=deduplicated, written_bytes=held / ratio, staging_s=staging)
    return cks.with_interval(ck, interval_s, rule)


# --------------------------------------------------------------------------- expected outcome

@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One way of buying the GPUs: its price, interruption rate and expected outcome. When
    ``infeasible`` holds a sentence the run cannot make progress and every figure is NaN."""

    name: str
    usd_per_gpu_hour: float
    mtbf_s: float
    interval_s: float
    wall_s: float
    gpu_hours: float
    """GPU-hours paid: the job's GPUs and, on spot, its spares."""
    usd: float
    expected_interruptions: float
    lost_work_s: float
    checkpoint_total_s: float
    restart_total_s: float
    goodput: float
    """Useful step time over wall time."""
    monte_carlo: dict[str, float] = field(default_factory=dict)
    infeasible: str = ""
    spare_nodes: int = 0
    availability: float = 1.0
    """Share of the time the job has all its nodes (spot's spare pool)."""
    interval: dict = field(default_factory=dict)
    """The model's interval of wall days and $ from the step time's residuals (runcost)."""

    @property
    def days(self) -> float:
        return self.wall_s / 86400.0


def _daly_parts(work_s: float, recover_s: float, mtbf_s: float, ck: CheckpointPlan) -> dict[str, float]:
    """Daly's expected outcome split into its parts: per segment of a = tau + C,
    (e^{a/M} - 1) e^{R/M} interruptions and (e^{a/M} - 1) M (e^{R/M} - 1) of recovery."""
    redo = ck.unprotected_s   # asynchronous: a failure before the write ends redoes the interval before
    wall = expected_wall_s(work_s, ck.interval_s, ck.blocking_s, recover_s + redo, mtbf_s)
    if math.isinf(mtbf_s):
        return {"wall": wall, "fails": 0.0, "restart": 0.0,
                "ck": checkpoints_written(work_s, ck.interval_s) * ck.blocking_s}
    if not math.isfinite(wall):
        return {"wall": math.inf, "fails": math.inf, "restart": math.inf, "ck": math.nan}
    one = ck.interval_s >= work_s
    segments, period = (1.0, work_s) if one else (work_s / ck.interval_s, ck.interval_s + ck.blocking_s)
    retries = math.expm1(period / mtbf_s)
    back = recover_s + redo   # the restart's share of the time back stays restart; the redo is lost work
    recovery = segments * retries * mtbf_s * math.expm1(back / mtbf_s)
    return {"wall": wall, "fails": segments * retries * math.exp(back / mtbf_s),
            "restart": recovery * recover_s / back if back > 0 else 0.0,
            "ck": 0.0 if one else segments * ck.blocking_s}


def _scenario(name: str, price: float, work_s: float, recover_s: float, mtbf_s: float,
              ck: CheckpointPlan, gpus: int, *, spot=None, gpus_per_node: int = 1, nodes: int = 1) -> Scenario:
    """Expected outcome by Daly's model; on spot (``spot``: a ``spot.SpotPlan``) noticed
    preemptions stretch it by their downtimes and the spare pool's waits (``spot.py``)."""
    from simcore.planner.spot import INFEASIBLE_GOODPUT, infeasible_sentence, noticed_wall_s

    parts = _daly_parts(work_s, recover_s, mtbf_s, ck)
    lost = parts["wall"] - work_s - parts["ck"] - parts["restart"]
    wall, why, spares, avail = parts["wall"], "", 0, 1.0
    rate = 0.0 if math.isinf(mtbf_s) else 1.0 / mtbf_s
    if spot is not None:
        spares, avail, why = spot.spare_nodes, spot.availability, spot.infeasible
        if spot.notice_saves:
            wall = noticed_wall_s(wall, spot)
            parts["fails"] += spot.preemptions_per_s * wall * avail
            parts["restart"] += max(0.0, wall * avail - parts["wall"])
            rate += spot.preemptions_per_s
        else:
            wall = wall / avail if avail > 0 else math.inf
    goodput = work_s / wall if math.isfinite(wall) else 0.0
    if not why and goodput < INFEASIBLE_GOODPUT:
        why = infeasible_sentence(name.replace("_", "-"), nodes, rate, recover_s if spot is None else
                                  (spot.downtime_s if spot.notice_saves else spot.recover_s), goodput)
    paid = gpus + spares * gpus_per_node
    if why:
        nan = math.nan
        return Scenario(name=name, usd_per_gpu_hour=price, mtbf_s=mtbf_s, interval_s=ck.interval_s, wall_s=nan,
                        gpu_hours=nan, usd=nan, expected_interruptions=nan, lost_work_s=nan,
                        checkpoint_total_s=nan, restart_total_s=nan, goodput=goodput, infeasible=why,
                        spare_nodes=spares, availability=avail)
    gpu_hours = paid * wall / 3600.0
    return Scenario(name=name, usd_per_gpu_hour=price, mtbf_s=mtbf_s, interval_s=ck.interval_s, wall_s=wall,
                    gpu_hours=gpu_hours, usd=gpu_hours * price, expected_interruptions=parts["fails"],
                    lost_work_s=max(0.0, lost),
                    checkpoint_total_s=parts["ck"], restart_total_s=parts["restart"], goodput=goodput,
                    spare_nodes=spares, availability=avail)
