"""The cost of a whole training run: time, GPU-hours, dollars, energy, checkpoints, failures.

tokens -> steps (``global_batch * seq_len`` tokens each) -> useful time (steps x the
predicted step time, or the storage's data floor when storage is slower) -> wall time.

- Checkpoints, their interval and the expected wall time with failures (Young, Daly):
  ``simcore.planner.failures``; the prices, energy tariff and failure rates:
  ``simcore.planner.prices``.
- Spot capacity is run as operators run it (``simcore.planner.spot``): spares, elastic
  restarts, a checkpoint on the provider's notice; on-demand and reserved see failures only.
  A run that cannot make progress is ``infeasible`` (one sentence), never a divergent figure.
- Energy: per GPU tdp x (idle + (1 - idle) x busy), busy = compute_s / step_time_s of
  the prediction, idle the whole time the run is not stepping; plus the rest of the node
  (system power less its GPUs' TDP), times PUE, times $/kWh. Cloud prices already include
  energy: the energy figures are for an owned cluster.
- A Monte-Carlo of the whole run (``simcore.planner.montecarlo``: numpy draws per failure
  event, the model ``simcore.engine.runs`` plays on SimPy) gives the spread of days and $.
- Intervals: every day and $ figure carries the interval of the step time from the
  validation residuals (``simcore.planner.uncertainty``), carried through the same model.
- DeepSpeed's 1-bit optimizers (1-bit Adam, 1-bit LAMB, 0/1 Adam): the steps before their steady
  state at the step DeepSpeed runs then, with a note (``simcore.planner.onebit_phases``).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from types import SimpleNamespace
from typing import Mapping

from simcore.model import kv_replication as kvr
from simcore.model import memory as mem

from simcore.model import peak as pk
from simcore.plan.spec import Offload, Plan, PlanError
from simcore.planner.failures import CheckpointPlan, Scenario, _scenario, plan_checkpoints, storage_bytes_per_s
from simcore.planner.onebit_phases import warmup_phases
from simcore.planner.prices import PriceSheet, resolve_prices
from simcore.planner.spot import plan_spot
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
    per_node = pk.host_bytes_per_node(plan, mem.memory_per_rank(kvr.as_run(plan)))   # NxD's K/V copies held
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
        """A JSON document: NaN and inf (infeasible, unlimited) become null, never NaN."""
        out = asdict(self)
        out["days"] = self.days
        out["gpu_hours"] = self.gpu_hours
        out["notes"] = list(self.notes)
        from simcore.planner.formatting import json_safe

        return json_safe(out)


def _monte_carlo(s: Scenario, work_s: float, ck: CheckpointPlan, recover_s: float, gpus_paid: float,
                 runs: int, seed: int, spot=None) -> dict[str, float]:
    """Percentiles of days and $ over Monte-Carlo runs of the whole training
    (``simcore.planner.montecarlo``), or {} when infeasible or over the event budget."""
    from simcore.planner import montecarlo as mc
    from simcore.planner.uncertainty import DEFAULT_LEVEL

    if s.infeasible:
        return {}
    runs = mc.runs_for_budget(runs, s.expected_interruptions)
    if runs == 0:
        return {"skipped": f"over {mc.EVENT_BUDGET:,} interruptions to draw: the analytic figures only"}
    interval = ck.interval_s if math.isfinite(ck.interval_s) else work_s
    noticed = spot is not None and spot.notice_saves
    rate = 0.0 if math.isinf(s.mtbf_s) else 1.0 / s.mtbf_s
    r = mc.daly_runs(runs, seed, work_s=work_s, interval_s=interval, checkpoint_s=ck.blocking_s,
                     recover_s=recover_s + ck.unprotected_s if spot is None or noticed else spot.recover_s,
                     rate_per_s=rate)
    if spot is not None:
        r = mc.with_downtimes(r, seed, rate_per_s=spot.preemptions_per_s if noticed else 0.0,
                              downtime_s=spot.downtime_s, availability=spot.availability)
    return mc.summary(r, gpus_paid * s.usd_per_gpu_hour / 3600.0, seed, DEFAULT_LEVEL)


def _with_monte_carlo(scen: dict[str, Scenario], work_s: float, cks: dict[str, CheckpointPlan],
                      recover_s: float, gpus: int, runs: int, seed: int, spot, gpus_per_node: int
                      ) -> dict[str, Scenario]:
    """On-demand and spot runs; reserved capacity fails like on-demand, so it reuses those
    runs at its own price."""
    od = _monte_carlo(scen["on_demand"], work_s, cks["on_demand"], recover_s, gpus, runs, seed)
    sp = scen["spot"]
    spot_mc = _monte_carlo(sp, work_s, cks["spot"], recover_s, gpus + sp.spare_nodes * gpus_per_node, runs,
                           seed, spot)
    ratio = scen["reserved"].usd_per_gpu_hour / scen["on_demand"].usd_per_gpu_hour
    res = {k: v * ratio if k.startswith("usd") else v for k, v in od.items()}
    return {"on_demand": replace(scen["on_demand"], monte_carlo=od),
            "reserved": replace(scen["reserved"], monte_carlo=res),
            "spot": replace(sp, monte_carlo=spot_mc)}


def _storage(plan: Plan, storage: Storage | str | None) -> Storage:
    if storage is None:
        return plan.cluster.storage
    if isinstance(storage, Storage):
        return storage
    tiers = load_catalog().storage
    if storage not in tiers:
        raise PlanError(f"unknown storage '{storage}' (known: {', '.join(sorted(tiers))})")
    return tiers[storage]


def _whole_steps(ck: CheckpointPlan, step_s: float) -> CheckpointPlan:
    """A checkpoint is taken between steps (Megatron's --save-interval counts iterations): the
    interval rounded up to a whole number of steps."""
    if not math.isfinite(ck.interval_s) or ck.interval_s <= 0:
        return ck
    from simcore.planner.checkpoints import with_interval

    steps = math.ceil(ck.interval_s / step_s - 1e-9)
    return with_interval(ck, steps * step_s, ck.rule if steps * step_s == ck.interval_s
                         else ck.rule + ", rounded up to whole steps")


def _scenarios(plan: Plan, sheet: PriceSheet, st: Storage, step_s: float, work: float, failures: bool,
               ckw: dict):
    """The three ways of buying the GPUs for ``work`` useful seconds: (scenarios, checkpoint
    plans, the spot plan, the failure recovery); ``ckw``: the checkpoint choices."""
    cl = plan.cluster
    fail_rate = sheet.failures_per_gpu_hour * cl.gpus / 3600.0 if failures else 0.0
    mtbf = 1.0 / fail_rate if fail_rate > 0 else math.inf
    ck = _whole_steps(plan_checkpoints(plan, st, mtbf, **ckw), step_s)
    recover = sheet.restart_s + ck.restore_s
    spot_sheet = sheet if failures else replace(sheet, spot_preemptions_per_node_hour=0.0)
    # a save on the provider's notice must be durable: its whole write, asynchronous or not
    spot = plan_spot(spot_sheet, cl.nodes, step_s, max(ck.blocking_s, ck.write_s), ck.restore_s,
                     recover + ck.unprotected_s, fail_rate)
    # Noticed preemptions lose no work: the interval follows the failures alone; else both.
    spot_rate = fail_rate + (0.0 if spot.notice_saves else spot.preemptions_per_s)
    spot_mtbf = 1.0 / spot_rate if spot_rate > 0 else math.inf
    ck_spot = _whole_steps(plan_checkpoints(plan, st, spot_mtbf, **ckw), step_s)
    common = {"gpus_per_node": cl.node.gpus_per_node, "nodes": cl.nodes}
    scen = {"on_demand": _scenario("on_demand", sheet.on_demand_usd, work, recover, mtbf, ck, cl.gpus, **common),
            "reserved": _scenario("reserved", sheet.reserved_usd, work, recover, mtbf, ck, cl.gpus, **common),
            "spot": _scenario("spot", sheet.spot_usd, work, recover, spot_mtbf, ck_spot, cl.gpus, spot=spot,
                              **common)}
    return scen, {"on_demand": ck, "spot": ck_spot}, spot, recover


def _with_intervals(plan: Plan, scen: dict[str, Scenario], step_s: float, steps: int, again) -> dict[str, Scenario]:
    """Each scenario's days and $ at the ends of the step time's interval (validation
    residuals, ``simcore.planner.uncertainty``), the same model run at both ends."""
    from simcore.planner.uncertainty import DEFAULT_LEVEL, interval_fields

    iv = interval_fields(plan, SimpleNamespace(step_time_s=step_s))
    if iv["interval_s"] is None:
        note = {"level": DEFAULT_LEVEL, "source": iv["interval_source"]}
        return {k: replace(s, interval=note) for k, s in scen.items()}
    lo_s, hi_s = iv["interval_s"]
    lo, hi = again(max(lo_s, 0.0) * steps), again(hi_s * steps)
    def ends(k: str, attr: str) -> list[float]:
        """The figure over the step-time interval: its ends and the value itself (spot's whole
        spare nodes can make it move unevenly between them); NaN at an end means infeasible there."""
        values = [getattr(lo[k], attr), getattr(scen[k], attr), getattr(hi[k], attr)]
        if any(math.isnan(v) for v in values):
            return [values[0], values[2]]
        return [min(values), max(values)]
    return {k: replace(s, interval={"days": ends(k, "days"), "usd": ends(k, "usd"),
                                    "step_time_s": [lo_s, hi_s], "level": iv["interval_level"],
                                    "source": f"step time {iv['interval_source']}",
                                    "extrapolated": iv.get("extrapolated")})
            for k, s in scen.items()}


def run_cost(plan: Plan, prediction, tokens: float, *, prices: Mapping[str, float] | None = None,
             storage: Storage | str | None = None, failures: bool = True, monte_carlo: int = 200,
             seed: int = 0, tiered_checkpoints: bool = False,
             checkpoint_interval_s: float | None = None, checkpoint: str | None = None,
             checkpoint_compression: float = 1.0, checkpoint_dedup: bool = True) -> RunCost:
    """Time, GPU-hours, $ (on-demand / reserved / spot), energy, checkpoints and failures of a
    run of ``tokens`` tokens with ``prediction``'s step time (any object with
    ``step_time_s`` and ``compute_s``). ``failures=False``: no failures, no preemptions.
    ``checkpoint``: sync or async (``tiered_checkpoints`` is async), written deduplicated or
    not, compressed by a stated ratio (``simcore.planner.checkpoints``)."""
    from simcore.plan.bounds import check_tokens

    from simcore.planner.checkpoints import check_compression, check_mode

    check_tokens(tokens)
    ckw = {"mode": check_mode(checkpoint, tiered_checkpoints), "interval_s": checkpoint_interval_s,
           "compression": check_compression(checkpoint_compression), "deduplicated": bool(checkpoint_dedup)}
    st = _storage(plan, storage)
    sheet = resolve_prices(plan, prices)
    cl = plan.cluster
    tokens_per_step = plan.training.global_batch * plan.model.seq_len
    steps = math.ceil(tokens / tokens_per_step)
    data = data_pipeline(plan, prediction.step_time_s, st)
    step_s = max(prediction.step_time_s, data["data_floor_step_s"])
    # DeepSpeed's 1-bit optimizers: the steps before their steady state, as DeepSpeed runs them (onebit_phases)
    phases, warm_note = warmup_phases(plan, prediction, steps)
    work = steps * step_s + sum(n * (max(t, data["data_floor_step_s"]) - step_s) for n, t in phases)
    step_s = work / steps

    def again(work_s: float):
        return _scenarios(plan, sheet, st, work_s / steps, work_s, failures, ckw)[0]
    scen, cks, spot, recover = _scenarios(plan, sheet, st, step_s, work, failures, ckw)
    scen = _with_intervals(plan, scen, step_s, steps, again)
    if monte_carlo > 0:
        scen = _with_monte_carlo(scen, work, cks, recover, cl.gpus, monte_carlo, seed, spot, cl.node.gpus_per_node)
    od = scen["on_demand"]
    busy = min(1.0, prediction.compute_s / prediction.step_time_s)
    kwh = energy_kwh(plan, busy * prediction.step_time_s / step_s, work, od.wall_s, sheet.pue)
    notes = _notes(plan, data, st, cks["on_demand"], failures, spot)
    notes += (warm_note,) if warm_note else ()
    return RunCost(plan_name=plan.name, gpus=cl.gpus, nodes=cl.nodes, tokens=float(tokens),
                   tokens_per_step=tokens_per_step, steps=steps, step_time_s=prediction.step_time_s,
                   effective_step_time_s=step_s, useful_s=work, checkpoint=cks["on_demand"], data=data,
                   nvme_offload_s_per_step=nvme_offload_s_per_step(plan), prices=sheet,
                   on_demand=od, reserved=scen["reserved"], spot=scen["spot"], energy_kwh=kwh,
                   energy_usd=kwh * sheet.usd_per_kwh, notes=notes)


def _notes(plan: Plan, data: dict, st: Storage, ck: CheckpointPlan, failures: bool, spot) -> tuple[str, ...]:
    notes = [f"storage {st.name} ({st.kind}): {st.source}",
             f"checkpoint {ck.size_bytes / 1e9:.0f} GB written in {ck.write_s:.0f} s at "
             f"{ck.write_bytes_per_s / 1e9:.1f} GB/s aggregate; " + (f"interval {ck.interval_s:.0f} s"
             if math.isfinite(ck.interval_s) else "none written") + f" ({ck.rule})",
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
        notes.append("async: a failure within the background write falls back to the checkpoint before; "
                     "charged as lost work (simcore/planner/checkpoints.py)")
    if not failures:
        notes.append("failures and preemptions off: an ideal run")
    elif spot.preemptions_per_s > 0:
        notes.append(f"spot: {spot.spare_nodes} spare node(s) held, the job whole {spot.availability:.2%} of the time; "
                     + ("a checkpoint fits in the provider's notice, so a preemption loses no work"
                        if spot.notice_saves else "no checkpoint fits in the provider's notice: a preemption "
                        "loses the work since the last checkpoint") + " (simcore/planner/spot.py)")
    return tuple(notes)


def _span(lo: float, hi: float, fmt: str) -> str:
    hi_txt = "infeasible" if not math.isfinite(hi) else format(hi, fmt)
    return f"{format(lo, fmt)}-{hi_txt}"


def scenario_line(s: Scenario) -> str:
    """One scenario for the terminal: $ and days with their intervals, or why it is infeasible."""
    if s.infeasible:
        return f"  {s.name:>9}: infeasible ({s.infeasible})"
    iv, mc = s.interval, s.monte_carlo
    model = (f" (step-time {iv['level']:.0%} interval {_span(*iv['days'], '.1f')} days, "
             f"${_span(*iv['usd'], ',.0f')})") if "days" in iv else ""
    spread = (f"; failures {mc['level']:.0%} of {mc['runs']} runs {mc['days_lo']:.1f}-{mc['days_hi']:.1f} days, "
              f"${mc['usd_lo']:,.0f}-${mc['usd_hi']:,.0f}") if "runs" in mc else \
        (f"; Monte-Carlo skipped: {mc['skipped']}" if "skipped" in mc else "")
    spares = f", {s.spare_nodes} spare node{'s' if s.spare_nodes > 1 else ''}" if s.spare_nodes else ""
    return (f"  {s.name:>9}: ${s.usd:,.0f} at ${s.usd_per_gpu_hour:.2f}/GPU-hour, {s.days:.1f} days{model}, "
            f"{s.expected_interruptions:,.1f} interruptions, goodput {s.goodput:.1%}{spares}{spread}")


def summary_lines(rc: RunCost) -> list[str]:
    """The run cost as a few lines for the terminal (the CLI prints these without --json)."""
    ck, od = rc.checkpoint, rc.on_demand
    days = "infeasible" if od.infeasible else f"{rc.days:,.1f} days (goodput {od.goodput:.1%}); " \
        f"{rc.gpu_hours:,.0f} GPU-hours"
    from simcore.planner.formatting import si

    lines = [f"{rc.plan_name}: {si(rc.tokens, '')} tokens = {rc.steps:,} steps of {rc.effective_step_time_s:.3f} s "
             f"on {rc.gpus} GPUs ({rc.nodes} nodes)", f"time to train: {days}"]
    lines += [scenario_line(s) for s in (rc.on_demand, rc.reserved, rc.spot)]
    iv = od.interval
    lines.append(f"intervals: {iv.get('level', 0.9):.0%}, {iv.get('source', '')}")
    every = f"every {ck.interval_s / 60:.1f} min" if math.isfinite(ck.interval_s) else "none written"
    lines.append(f"checkpoints: {ck.size_bytes / 1e9:,.0f} GB each, write {ck.write_s:.1f} s, blocking "
                 f"{ck.blocking_s:.1f} s, restore {ck.restore_s:.1f} s, {every} ({ck.rule})")
    from simcore.planner.checkpoints import stall_line

    lines.append(stall_line(rc))
    if od.infeasible:
        lines.append("energy and failure breakdown: none (the on-demand run is infeasible)")
    else:
        mtbf = "none" if math.isinf(od.mtbf_s) else f"MTBF {od.mtbf_s / 3600:.1f} h"
        lines += [f"energy: {rc.energy_kwh:,.0f} kWh, ${rc.energy_usd:,.0f} (PUE {rc.prices.pue}, "
                  f"${rc.prices.usd_per_kwh}/kWh)",
                  f"failures: {mtbf}; lost work {od.lost_work_s / 3600:.1f} h, restarts "
                  f"{od.restart_total_s / 3600:.1f} h, checkpoint writes {od.checkpoint_total_s / 3600:.1f} h"]
    lines.append(f"data: needs {rc.data['needed_bytes_per_s'] / 1e6:.2f} MB/s of "
                 f"{rc.data['available_bytes_per_s'] / 1e9:.1f} GB/s available"
                 + (" (STORAGE-BOUND)" if rc.data["storage_bound"] else ""))
    if rc.nvme_offload_s_per_step:
        lines.append(f"offload to NVMe instead of host memory would add {rc.nvme_offload_s_per_step:.2f} s per step")
    return lines + [f"note: {n}" for n in rc.notes]
