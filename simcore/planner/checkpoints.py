"""Checkpoints as the stacks write them: synchronous or asynchronous saves, deduplicated or
replicated writes, a stated compression ratio; what each does to the stall and the lost work.

What the stacks do (each read at the commit named):

- torch DCP ``async_save``: ``AsyncStager.stage`` makes a "training-safe" copy of the state
  dict in CPU memory (``BlockingAsyncStager``: blocking; pinned buffers with
  ``cache_staged_state_dict``), then ``dcp.save`` serializes and writes it in parallel with
  training (pytorch/pytorch torch/distributed/checkpoint/staging.py at c9313cffdfce).
- Megatron-LM ``--async-save``: the write runs in a separate process on an
  ``AsyncCallsQueue`` and is finalized by ``maybe_finalize_async_save``; a new save first
  finalizes the one in flight (NVIDIA/Megatron-LM
  megatron/core/dist_checkpointing/strategies/async_utils.py at cbb9c05c06b5). NeMo saves
  through the same Megatron-core dist-checkpointing and its async queue.
- Deduplicated, sharded writes: DCP's ``dedup_save_plans`` keeps each item that several ranks
  hold in one rank's plan only (torch/distributed/checkpoint/_dedup_save_plans.py at
  646bddd846c0); Megatron's ``FullyParallelSaveStrategyWrapper`` spreads the main replicas'
  shards evenly over the data-parallel ranks, each written once
  (megatron/core/dist_checkpointing/strategies/fully_parallel.py at 20574f7553e6).

The model:

- Bytes: the training state once (deduplicated: both stacks' default, and today's figure),
  or every rank's own state (replicated: each data-parallel replica writes the copy it
  holds, as a per-rank ``torch.save`` does), divided by the compression ratio. The ratio is
  a stated input, default 1 (none): lossless byte-grouping of BF16 weights saves about a
  third (ZipNN, Hershcovitch et al. 2024, arXiv:2411.05239); quantized checkpoints save
  more and lose precision (Check-N-Run, Eisenman et al. NSDI'22). The CPU time of
  (de)compression is not modelled: it is assumed to keep up with the storage.
- Staging: each GPU copies its share (deduplicated: the state over the GPUs, balanced as the
  fully parallel save balances it; replicated: its own state) to host memory over its host
  link (the catalog's PCIe or NVLink-C2C figure), uncompressed.
- Write: the stored bytes through the tier's aggregate bandwidth (every node writes its
  shards at once), never faster than the staging copy (a synchronous save moves the same
  bytes off the GPUs), plus the tier's latency. Restore: the stored bytes read back.
- sync: the step blocks for the write. async: the step blocks for the staging copy; the
  write goes on beside training, modelled as starting with the staging (the staged shards
  stream out; DCP's stage-then-write order makes the durable point later by at most the
  staging copy), durable ``write_s`` after the save began. A save that comes before the
  previous write ended waits for it: ``wait_s = max(0, write_s - staging_s - interval)``.
- Interval: Daly's for the synchronous write (a team that switches on ``--async-save`` keeps
  its ``--save-interval``), raised to the write time when asynchronous so no save waits; a
  given interval is kept and any wait charged. So an asynchronous save never stalls more
  than a synchronous one, per checkpoint or in total.
- Lost work: an asynchronous checkpoint is durable only once its write ends. A failure in
  the ``unprotected_s = write_s - staging_s`` after the step resumes falls back to the
  checkpoint before and loses that interval too: with failures uniform in time, probability
  ~ unprotected / interval times the interval, i.e. the unprotected time per failure in
  expectation; charged as redone work after each failure (Daly's R plus it, ``failures.py``).
"""
from __future__ import annotations

import math
from dataclasses import replace

from simcore.model import memory as mem
from simcore.model import workload as wl
from simcore.plan.spec import Plan, PlanError, ZeroStage

MODES = ("sync", "async")


def check_mode(mode: str | None, tiered: bool = False) -> str:
    """The checkpoint mode: sync or async (``tiered`` is the old name of async)."""
    if mode is None:
        return "async" if tiered else "sync"
    if mode not in MODES:
        raise PlanError(f"unknown checkpoint mode '{mode}' (known: {', '.join(MODES)})")
    if tiered and mode != "async":
        raise PlanError("tiered checkpoints are asynchronous ones: tiered with a synchronous mode contradict")
    return mode


def check_compression(ratio) -> float:
    """A stated compression ratio: logical over stored bytes, finite, at least 1."""
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        r = math.nan
    if not (math.isfinite(r) and r >= 1.0):
        raise PlanError(f"checkpoint compression ratio {ratio} must be a finite number of 1 or more "
                        "(logical bytes over stored bytes; 1: none)")
    return r


def replicated_bytes(plan: Plan, state_bytes: float) -> float:
    """Every rank's own training state summed: the weights once per data-parallel replica
    unless ZeRO-3 shards them, the optimizer's states once per replica unless ZeRO-1 or above
    shards them (the ZeRO paper's partitions; experts counted as dense); never below the
    state once (``state_bytes``)."""
    tr, par = plan.training, plan.parallel
    params = wl.param_counts(plan.model).trained
    replicas = par.dp * par.cp
    weights = mem.param_bytes(tr) * params * (1 if par.zero >= ZeroStage.WEIGHTS else replicas)
    opt = mem.optimizer_bytes_per_param(tr, plan.model.hidden) * params * (
        1 if par.zero >= ZeroStage.OPTIMIZER_STATES else replicas)
    return max(weights + opt, state_bytes)


def times(plan: Plan, held_bytes: float, stored_bytes: float, write_bytes_per_s: float,
          read_bytes_per_s: float, latency_s: float) -> tuple[float, float, float]:
    """(staging, write, restore) seconds of one checkpoint (see the module)."""
    cl = plan.cluster
    staging = held_bytes / cl.gpus / cl.node.gpu.host_bytes_per_s
    write = max(stored_bytes / write_bytes_per_s, staging) + latency_s
    return staging, write, stored_bytes / read_bytes_per_s + latency_s


def with_interval(ck, interval_s: float, rule: str):
    """``ck`` (a ``failures.CheckpointPlan``) at another interval: an asynchronous save's wait
    for the previous write follows it."""
    if ck.mode != "async":
        return replace(ck, interval_s=interval_s, rule=rule)
    wait = max(0.0, ck.write_s - ck.staging_s - interval_s) if math.isfinite(interval_s) else 0.0
    return replace(ck, interval_s=interval_s, rule=rule, wait_s=wait, blocking_s=ck.staging_s + wait,
                   unprotected_s=ck.write_s - ck.staging_s)


# --------------------------------------------------------------------------- the printout

def stall_line(rc) -> str:
    """The checkpoint stall of the on-demand run: per checkpoint, in total, in days and $."""
    ck, od = rc.checkpoint, rc.on_demand
    how = (f"{ck.mode}, {'deduplicated' if ck.deduplicated else 'replicated'} writes of "
           f"{ck.written_bytes / 1e9:,.0f} GB" + (f", compressed {ck.compression:g}x" if ck.compression != 1 else ""))
    if od.infeasible or not math.isfinite(ck.interval_s) or not od.checkpoint_total_s:
        return f"checkpoint stall ({how}): none (no checkpoint written)"
    count = od.checkpoint_total_s / ck.blocking_s if ck.blocking_s > 0 else 0.0
    usd = od.checkpoint_total_s / 3600.0 * rc.gpus * od.usd_per_gpu_hour
    per = (f"staging to host {ck.staging_s:.1f} s" + (f" + waiting for the previous write {ck.wait_s:.1f} s"
                                                      if ck.wait_s > 0 else "")) if ck.mode == "async" \
        else "the whole write"
    line = (f"checkpoint stall ({how}): {ck.blocking_s:.1f} s per checkpoint ({per}) x {count:,.0f} = "
            f"{od.checkpoint_total_s / 3600:.1f} h, {od.checkpoint_total_s / 86400:.2f} days, ${usd:,.0f} on demand")
    if ck.mode == "async":
        line += (f"; each failure loses {ck.unprotected_s:.0f} s more work (a checkpoint is durable only when "
                 "its write ends)")
    return line
