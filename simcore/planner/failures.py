"""Checkpoints and failures: checkpoint size and times, the interval, the expected wall time.

- Checkpoints: the full training state (16-bit weights plus the optimizer's fp32 master
  weights and states: the ZeRO paper's 2 + K bytes per parameter, Rajbhandari et al.
  2020, Sec. 3.1) written by all nodes at once through the storage tier (the aggregate
  write bandwidth, capped by the nodes' client links; local NVMe scales with the nodes).
  Tiered checkpointing blocks only for the copy to host memory over PCIe, then drains
  to the file system in the background (as Gemini, Wang et al. SOSP'23, and torch's
  async ``dcp.async_save``); the interval must leave time for the drain.
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
    per_param = mem.weight_bytes_per_param(tr.precision) + mem.optimizer_bytes_per_param(tr.precision, tr.optimizer)
    return wl.param_counts(plan.model).total * per_param


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
    checkpoints when tau >= T_s; no failures: T_s + checkpoints x C exactly."""
    if math.isinf(mtbf_s):
        return work_s + checkpoints_written(work_s, interval_s) * checkpoint_s
    m = mtbf_s
    if interval_s >= work_s:
        return m * math.exp(recover_s / m) * math.expm1(work_s / m)
    return m * math.exp(recover_s / m) * math.expm1((interval_s + checkpoint_s) / m) * work_s / interval_s


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
    rule: str


def plan_checkpoints(plan: Plan, storage: Storage, mtbf_s: float, *, tiered: bool = False,
                     interval_s: float | None = None) -> CheckpointPlan:
    """Checkpoint size, write / restore time through ``storage`` and the interval."""
    nodes = plan.cluster.nodes
    size = checkpoint_bytes(plan)
    wbw = storage_bytes_per_s(storage, nodes, write=True)
    write = size / wbw + storage.latency_s
    restore = size / storage_bytes_per_s(storage, nodes, write=False) + storage.latency_s
    blocking = write
    if tiered:   # each GPU copies its shard to host memory over its PCIe link
        blocking = size / plan.cluster.gpus / plan.cluster.node.gpu.pcie_bytes_per_s
    if interval_s is not None:
        rule = "given"
    elif math.isinf(mtbf_s):
        interval_s, rule = math.inf, "no failures: no checkpoints"
    else:
        interval_s, rule = daly_interval_s(blocking, mtbf_s), "Daly 2006 Eq. 37"
    if tiered and interval_s < write:
        interval_s, rule = write, rule + ", raised to the background write time"
    return CheckpointPlan(size_bytes=size, write_bytes_per_s=wbw, write_s=write, blocking_s=blocking,
                          restore_s=restore, interval_s=interval_s, tiered=tiered, rule=rule)


# --------------------------------------------------------------------------- expected outcome

@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """One way of buying the GPUs: its price, interruption rate and expected outcome."""

    name: str
    usd_per_gpu_hour: float
    mtbf_s: float
    interval_s: float
    wall_s: float
    gpu_hours: float
    usd: float
    expected_interruptions: float
    lost_work_s: float
    checkpoint_total_s: float
    restart_total_s: float
    goodput: float
    """Useful step time over wall time."""
    monte_carlo: dict[str, float] = field(default_factory=dict)


def _scenario(name: str, price: float, work_s: float, recover_s: float, mtbf_s: float,
              ck: CheckpointPlan, gpus: int) -> Scenario:
    """Expected outcome by Daly's model, split into its parts: per segment of a = tau + C,
    (e^{a/M} - 1) e^{R/M} interruptions and (e^{a/M} - 1) M (e^{R/M} - 1) of recovery."""
    wall = expected_wall_s(work_s, ck.interval_s, ck.blocking_s, recover_s, mtbf_s)
    fails = restart_total = 0.0
    if math.isinf(mtbf_s):
        ck_total = checkpoints_written(work_s, ck.interval_s) * ck.blocking_s
    else:
        one = ck.interval_s >= work_s
        segments, period = (1.0, work_s) if one else (work_s / ck.interval_s, ck.interval_s + ck.blocking_s)
        ck_total = 0.0 if one else segments * ck.blocking_s
        retries = math.expm1(period / mtbf_s)
        fails = segments * retries * math.exp(recover_s / mtbf_s)
        restart_total = segments * retries * mtbf_s * math.expm1(recover_s / mtbf_s)
    gpu_hours = gpus * wall / 3600.0
    return Scenario(name=name, usd_per_gpu_hour=price, mtbf_s=mtbf_s, interval_s=ck.interval_s, wall_s=wall,
                    gpu_hours=gpu_hours, usd=gpu_hours * price, expected_interruptions=fails,
                    lost_work_s=max(0.0, wall - work_s - ck_total - restart_total),
                    checkpoint_total_s=ck_total, restart_total_s=restart_total, goodput=work_s / wall)
