"""The cost of a whole training run: time, GPU-hours, dollars, energy, checkpoints, failures.

tokens -> steps (``global_batch * seq_len`` tokens each) -> useful time (steps x the
predicted step time, or the storage's data floor when storage is slower) -> wall time.

- Checkpoints, their interval and the expected wall time with failures (Young, Daly):
  ``simcore.planner.failures``; the prices, energy tariff and failure rates:
  ``simcore.planner.prices``.
- Spot capacity adds preemptions (per node-hour) to the failure rate; on-demand and
  reserved capacity see failures only.
- Energy: per GPU tdp x (idle + (1 - idle) x busy), busy = compute_s / step_time_s of
  the prediction, idle the whole time the run is not stepping; plus the rest of the node
  (system power less its GPUs' TDP), times PUE, times $/kWh. Cloud prices already include
  energy: the energy figures are for an owned cluster.
- A Monte-Carlo of the whole run on SimPy (``simcore.engine.des``) gives p50/p90.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Mapping

from simcore.model import memory as mem
from simcore.plan.spec import Offload, Plan, PlanError
from simcore.planner.failures import CheckpointPlan, Scenario, _scenario, plan_checkpoints, storage_bytes_per_s
from simcore.planner.prices import PriceSheet, resolve_prices
from topologies.components import Storage
from topologies.hardware import load_catalog

#: Share of TDP a GPU draws idle. Assumption: nvidia-smi shows ~60 W of 400 W for an
#: idle A100 SXM and ~70-100 W of 700 W for an idle H100 SXM (NVIDIA DCGM power
#: readings as reported in Patel et al. 2024, "Characterizing Power Management
#: Opportunities for LLMs in the Cloud", ASPLOS'24, Sec. 3); 0.15 rounds them.
GPU_IDLE_POWER_FRACTION = 0.15
#: Bytes per stored token: Megatron's indexed dataset keeps uint16 tokens when the
#: vocabulary fits, int32 otherwise (megatron/core/datasets/indexed_dataset.py, DType.optimal_dtype).
UINT16_VOCAB_LIMIT = 65500
SECONDS_PER_DAY = 86400.0
#: Monte-Carlo effort: interruptions all runs of one scenario may draw together (SimPy
#: handles ~50k per second here), and the fewest runs kept whatever the rate.
MC_INTERRUPTION_BUDGET = 100_000
MC_MIN_RUNS = 20


# --------------------------------------------------------------------------- data, energy

def data_pipeline(plan: Plan, step_time_s: float, storage: Storage) -> dict[str, float | bool]:
    """Token bytes per second the step needs against what the storage tier can read."""
    bytes_per_token = 2 if plan.model.vocab <= UINT16_VOCAB_LIMIT else 4
    step_bytes = plan.training.global_batch * plan.model.seq_len * bytes_per_token
    available = storage_bytes_per_s(storage, plan.cluster.nodes, write=False)
    floor = step_bytes / available
    return {"bytes_per_token": bytes_per_token, "needed_bytes_per_s": step_bytes / step_time_s,
            "available_bytes_per_s": available, "data_floor_step_s": floor,
            "storage_bound": floor > step_time_s}


def nvme_offload_s_per_step(plan: Plan) -> float:
    """If the offloaded states went to the node's NVMe instead of host memory (ZeRO-Infinity,
    Rajbhandari et al. SC'21): read and write them once per step through the local array."""
    if plan.training.offload == Offload.NONE:
        return 0.0
    nvme = load_catalog().storage["local-nvme"]
    per_node = mem.host_bytes_per_node(plan, mem.memory_per_rank(plan))
    return per_node / nvme.read_bytes_per_s + per_node / nvme.write_bytes_per_s


def energy_kwh(plan: Plan, busy: float, stepping_s: float, wall_s: float, pue: float) -> float:
    """GPUs at idle + (1 - idle) x busy of TDP while stepping, idle otherwise; the rest of
    each node at its non-GPU share of system power; times PUE."""
    node, cl = plan.cluster.node, plan.cluster
    tdp = node.gpu.tdp_w
    idle = GPU_IDLE_POWER_FRACTION
    gpu_j = cl.gpus * tdp * (stepping_s * (idle + (1 - idle) * busy) + (wall_s - stepping_s) * idle)
    rest_w = max(0.0, node.system_power_w - node.gpus_per_node * tdp)
    return (gpu_j + cl.nodes * rest_w * wall_s) * pue / 3.6e6


# --------------------------------------------------------------------------- the run

@dataclass(frozen=True, slots=True, kw_only=True)
class RunCost:
    plan_name: str
    gpus: int
    nodes: int
    tokens: float
    tokens_per_step: int
    steps: int
    step_time_s: float
    """Predicted step time."""
    effective_step_time_s: float
    """Step time the run sees: the prediction, or the storage's data floor when slower."""
    useful_s: float
    checkpoint: CheckpointPlan
    data: dict[str, float | bool]
    nvme_offload_s_per_step: float
    prices: PriceSheet
    on_demand: Scenario
    reserved: Scenario
    spot: Scenario
    energy_kwh: float
    energy_usd: float
    notes: tuple[str, ...] = ()

    @property
    def days(self) -> float:
        return self.on_demand.wall_s / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.on_demand.gpu_hours

    def to_json(self) -> dict:
        out = asdict(self)
        out["days"] = self.days
        out["gpu_hours"] = self.gpu_hours
        out["notes"] = list(self.notes)
        return out


def _monte_carlo(s: Scenario, work_s: float, ck: CheckpointPlan, recover_s: float, gpus: int,
                 runs: int, seed: int) -> dict[str, float]:
    """p50/p90 of days and $ over SimPy runs of the whole training (simcore.engine.des).
    Runs are capped so that all of them together see about MC_INTERRUPTION_BUDGET
    interruptions (at least MC_MIN_RUNS runs); ``runs`` in the answer says how many ran."""
    from simcore.engine.runs import monte_carlo_runs, percentile

    runs = min(runs, max(MC_MIN_RUNS, int(MC_INTERRUPTION_BUDGET / max(1.0, s.expected_interruptions))))
    interval = ck.interval_s if math.isfinite(ck.interval_s) else work_s
    rate = 0.0 if math.isinf(s.mtbf_s) else 1.0 / s.mtbf_s
    samples = monte_carlo_runs(runs, seed, work_s=work_s, interval_s=interval, checkpoint_s=ck.blocking_s,
                               restore_s=recover_s, restart_s=0.0, failure_rate_per_s=rate)
    days = [r.wall_s / SECONDS_PER_DAY for r in samples]
    usd = [r.wall_s / 3600.0 * gpus * s.usd_per_gpu_hour for r in samples]
    return {"runs": runs, "seed": seed, "days_p50": percentile(days, 50), "days_p90": percentile(days, 90),
            "usd_p50": percentile(usd, 50), "usd_p90": percentile(usd, 90),
            "interruptions_mean": sum(r.interruptions for r in samples) / runs,
            "lost_work_s_mean": sum(r.lost_work_s for r in samples) / runs}


def _with_monte_carlo(scen: dict[str, Scenario], work_s: float, cks: dict[str, CheckpointPlan],
                      recover_s: float, gpus: int, runs: int, seed: int) -> dict[str, Scenario]:
    """On-demand and spot runs; reserved capacity fails like on-demand, so it reuses those
    runs at its own price."""
    od = _monte_carlo(scen["on_demand"], work_s, cks["on_demand"], recover_s, gpus, runs, seed)
    spot = _monte_carlo(scen["spot"], work_s, cks["spot"], recover_s, gpus, runs, seed)
    ratio = scen["reserved"].usd_per_gpu_hour / scen["on_demand"].usd_per_gpu_hour
    res = {**od, "usd_p50": od["usd_p50"] * ratio, "usd_p90": od["usd_p90"] * ratio}
    return {"on_demand": replace(scen["on_demand"], monte_carlo=od),
            "reserved": replace(scen["reserved"], monte_carlo=res),
            "spot": replace(scen["spot"], monte_carlo=spot)}


def _storage(plan: Plan, storage: Storage | str | None) -> Storage:
    if storage is None:
        return plan.cluster.storage
    if isinstance(storage, Storage):
        return storage
    tiers = load_catalog().storage
    if storage not in tiers:
        raise PlanError(f"unknown storage '{storage}' (known: {', '.join(sorted(tiers))})")
    return tiers[storage]


def run_cost(plan: Plan, prediction, tokens: float, *, prices: Mapping[str, float] | None = None,
             storage: Storage | str | None = None, failures: bool = True, monte_carlo: int = 200,
             seed: int = 0, tiered_checkpoints: bool = False,
             checkpoint_interval_s: float | None = None) -> RunCost:
    """Time, GPU-hours, $ (on-demand / reserved / spot), energy, checkpoints and failures of a
    run of ``tokens`` tokens with ``prediction``'s step time (any object with
    ``step_time_s`` and ``compute_s``). ``failures=False``: no failures, no preemptions."""
    if not tokens > 0:
        raise PlanError(f"tokens={tokens} must be positive")
    st = _storage(plan, storage)
    sheet = resolve_prices(plan, prices)
    cl = plan.cluster
    tokens_per_step = plan.training.global_batch * plan.model.seq_len
    steps = math.ceil(tokens / tokens_per_step)
    data = data_pipeline(plan, prediction.step_time_s, st)
    step_s = max(prediction.step_time_s, data["data_floor_step_s"])
    work = steps * step_s
    fail_rate = sheet.failures_per_gpu_hour * cl.gpus / 3600.0 if failures else 0.0
    spot_rate = fail_rate + (sheet.spot_preemptions_per_node_hour * cl.nodes / 3600.0 if failures else 0.0)
    mtbf = 1.0 / fail_rate if fail_rate > 0 else math.inf
    spot_mtbf = 1.0 / spot_rate if spot_rate > 0 else math.inf
    ck = plan_checkpoints(plan, st, mtbf, tiered=tiered_checkpoints, interval_s=checkpoint_interval_s)
    ck_spot = plan_checkpoints(plan, st, spot_mtbf, tiered=tiered_checkpoints, interval_s=checkpoint_interval_s)
    recover = sheet.restart_s + ck.restore_s
    scen = {name: _scenario(name, price, work, recover, m, c, cl.gpus)
            for name, price, m, c in (("on_demand", sheet.on_demand_usd, mtbf, ck),
                                      ("reserved", sheet.reserved_usd, mtbf, ck),
                                      ("spot", sheet.spot_usd, spot_mtbf, ck_spot))}
    if monte_carlo > 0:
        cks = {"on_demand": ck, "spot": ck_spot}
        scen = _with_monte_carlo(scen, work, cks, recover, cl.gpus, monte_carlo, seed)
    od = scen["on_demand"]
    busy = min(1.0, prediction.compute_s / prediction.step_time_s)
    kwh = energy_kwh(plan, busy * prediction.step_time_s / step_s, work, od.wall_s, sheet.pue)
    notes = _notes(plan, data, st, ck, failures)
    return RunCost(plan_name=plan.name, gpus=cl.gpus, nodes=cl.nodes, tokens=float(tokens),
                   tokens_per_step=tokens_per_step, steps=steps, step_time_s=prediction.step_time_s,
                   effective_step_time_s=step_s, useful_s=work, checkpoint=ck, data=data,
                   nvme_offload_s_per_step=nvme_offload_s_per_step(plan), prices=sheet,
                   on_demand=od, reserved=scen["reserved"], spot=scen["spot"], energy_kwh=kwh,
                   energy_usd=kwh * sheet.usd_per_kwh, notes=notes)


def _notes(plan: Plan, data: dict, st: Storage, ck: CheckpointPlan, failures: bool) -> tuple[str, ...]:
    notes = [f"storage {st.name} ({st.kind}): {st.source}",
             f"checkpoint {ck.size_bytes / 1e9:.0f} GB written in {ck.write_s:.0f} s at "
             f"{ck.write_bytes_per_s / 1e9:.1f} GB/s aggregate; interval {ck.interval_s:.0f} s ({ck.rule})",
             f"GPU idle power {GPU_IDLE_POWER_FRACTION:.0%} of TDP (assumption, see runcost.py); "
             "node power beyond the GPUs from the node's system_power_w",
             "cloud GPU-hour prices include energy; energy figures are for an owned cluster"]
    if data["storage_bound"]:
        notes.append(f"storage, not GPUs, bounds the step: reading a step's tokens takes "
                     f"{data['data_floor_step_s']:.2f} s")
    if st.kind == "local-nvme":
        notes.append("checkpoints on node-local NVMe do not survive the loss of a node; "
                     "a shared file system is assumed for the restore")
    if ck.tiered:
        notes.append("tiered: a failure within the background write falls back to the previous "
                     "checkpoint (not modelled)")
    if not failures:
        notes.append("failures and preemptions off: an ideal run")
    return tuple(notes)


def summary_lines(rc: RunCost) -> list[str]:
    """The run cost as a few lines for the terminal (the CLI prints these without --json)."""
    ck, od = rc.checkpoint, rc.on_demand
    lines = [f"{rc.plan_name}: {rc.tokens:.3g} tokens = {rc.steps:,} steps of {rc.effective_step_time_s:.3f} s "
             f"on {rc.gpus} GPUs ({rc.nodes} nodes)",
             f"time to train: {rc.days:.1f} days (goodput {od.goodput:.1%}); {rc.gpu_hours:,.0f} GPU-hours"]
    for s in (rc.on_demand, rc.reserved, rc.spot):
        mc = s.monte_carlo
        spread = f", p50 {mc['days_p50']:.1f} / p90 {mc['days_p90']:.1f} days, ${mc['usd_p50']:,.0f} / " \
                 f"${mc['usd_p90']:,.0f} ({mc['runs']} runs)" if mc else ""
        lines.append(f"  {s.name:>9}: ${s.usd:,.0f} at ${s.usd_per_gpu_hour:.2f}/GPU-hour, "
                     f"{s.wall_s / SECONDS_PER_DAY:.1f} days, {s.expected_interruptions:.1f} interruptions{spread}")
    lines += [f"energy: {rc.energy_kwh:,.0f} kWh, ${rc.energy_usd:,.0f} (PUE {rc.prices.pue}, "
              f"${rc.prices.usd_per_kwh}/kWh)",
              f"checkpoints: {ck.size_bytes / 1e9:,.0f} GB each, write {ck.write_s:.1f} s, blocking "
              f"{ck.blocking_s:.1f} s, restore {ck.restore_s:.1f} s, every {ck.interval_s / 60:.1f} min ({ck.rule})",
              f"failures: MTBF {od.mtbf_s / 3600:.1f} h; lost work {od.lost_work_s / 3600:.1f} h, restarts "
              f"{od.restart_total_s / 3600:.1f} h, checkpoint writes {od.checkpoint_total_s / 3600:.1f} h",
              f"data: needs {rc.data['needed_bytes_per_s'] / 1e6:.2f} MB/s of {rc.data['available_bytes_per_s'] / 1e9:.1f}"
              f" GB/s available" + (" (STORAGE-BOUND)" if rc.data["storage_bound"] else "")]
    if rc.nvme_offload_s_per_step:
        lines.append(f"offload to NVMe instead of host memory would add {rc.nvme_offload_s_per_step:.2f} s per step")
    return lines + [f"note: {n}" for n in rc.notes]
