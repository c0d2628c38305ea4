"""The discrete-event engine: one training step, action by action, on SimPy.

The engine consumes a ``StepCosts`` (seconds per virtual stage per micro-batch, from the
pure math) and the schedule of ``simcore.model.schedules`` (torch.distributed.pipelining's
order) and plays them out in time; it never recomputes FLOPs or bytes. Bubble, exposed
communication and compute are then *measured* on the timeline (``trace.split_step``),
as a profiler would, not taken from closed forms.

What runs (per simulated rank):

- the **compute stream** is the rank's process: it walks the schedule, waits for an
  action's input (the activation of the previous stage, or the gradient of the next),
  then runs recompute / kernels; blocking TP/CP/EP communication (``forward_comm_s``,
  ``backward_comm_s``) follows the kernels on the ``tp`` stream, since the compute
  stream waits on it (Megatron's TP all-reduces are synchronous); on a calibrated CPU
  host a pipeline chunk also waits for its input's hand-over first (the ``wait`` stream:
  idle, so bubble, as the executor measures it) and blocks in its send call last (``pp``);
  where torch posts a later receive in the same call (1F1B's steady phase,
  ``schedules.fused_p2p``) the post follows once the message is on its way (``pp``),
  and that receive's hand-over wait is shorter by it;
- **communication streams** (``pp`` send/recv, ``dp`` gathers, ``dp`` reductions,
  ``copy`` host-device) are FIFO ``simpy.Resource`` queues of capacity 1, like a CUDA
  stream holding NCCL kernels in issue order;
- **p2p sends** are asynchronous (torch's ``isend``): the sender goes on computing;
- **DDP / FSDP2 gradient reduction** (Li et al. 2020, PyTorch Distributed, Sec. 3.2):
  the per-step reduction of a stage is issued in ``grad_buckets`` equal buckets while
  that stage's last backward runs (gradient accumulation reduces only once per step;
  FSDP2 without pipelining, ``grad_reduce_per_microbatch``, reduce-scatters in every
  backward instead), and overlaps the rest of the schedule; where ``grad_sync_holds_send`` (DDP under
  torch.distributed.pipelining, on a calibrated profile) that backward sends its input
  gradient only once the reduction is done;
- **FSDP2 parameter all-gather** (``forward_gather_s``, ``backward_gather_s``: ZeRO-2
  gathers in the forward only, ZeRO-3 in both): the gather of the next unit of
  work (action, or layer at layer granularity) is issued when the current one starts,
  torch FSDP2's one-ahead prefetch; the work waits for its own gather;
- then the optimizer step, with optimizer-offload copies over PCIe (gradients down
  before, parameters up after) and the ZeRO-1 parameter all-gather.

Links: every transfer is a *fluid flow* over named links, each active flow given its
max-min fair share of every link it crosses (``simcore.engine.links``).

Compute shares the GPU with communication kernels: while a data-parallel collective
(DDP/ZeRO gradient reduction, FSDP2 or ZeRO-1 parameter all-gather) runs on a rank, that
rank's compute kernels progress at ``1/k`` of their speed, k = the GPU's
``comm_compute_interference`` (catalog ``efficiency.yaml``, carried in
``StepCosts.time_detail_s``), so hiding T seconds of such communication costs T (1 - 1/k)
of compute: the same physics as the analytic path (``analytic._interference_loss``).
Pipeline sends and the blocking TP/CP/EP collectives do not slow compute, as there.

Speed: a chunk of compute on a rank with no data-parallel collective in flight is one
timeout (no collective can start during it: only the rank's own process issues them);
streams are plain FIFO queues started synchronously (no SimPy event per operation);
gradient buckets issued while the previous bucket of the stage's reduction is still on
the wire join that flow (back-to-back flows on one FIFO stream over the same links are one
flow of their summed work, so this is exact in time); and a stage's last backward is cut
into at most ``MAX_BUCKET_CHUNKS`` chunks to issue its buckets.

Symmetry: ``mode="representative"`` simulates one data-parallel replica (one rank per
pipeline stage), assuming every replica does the same; ``mode="full"`` simulates every
(pipeline stage, data-parallel replica) pair, with data-parallel collectives as barriers
across the replicas, to check the reduction and to place stragglers. TP and CP ranks of
a group run in lockstep (every TP/CP collective is blocking), so each group is one
simulated process, labelled with the global rank of its first member.
"""
from __future__ import annotations

import math
from collections import defaultdict

from simcore.engine.step import _Step
from simcore.model.costs import StepCosts
from simcore.results import GIB, Span, StepResult, rate_fields, split_step
from topologies.placement import rank_grid

GRANULARITIES = ("microbatch", "layer")
MODES = ("representative", "full")


def _factors(costs: StepCosts, stragglers: dict[int, float] | None, full: bool) -> dict:
    """Slow-down of each simulated unit: the slowest of the global ranks it stands for
    (a TP group waits for its slowest member; in representative mode a pipeline stage
    is as slow as its slowest replica, which the data-parallel reduction waits for)."""
    par = costs.plan.parallel
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    out: dict = {}
    for rank, factor in (stragglers or {}).items():
        if not 0 <= rank < grid.world:
            raise ValueError(f"stragglers rank {rank} is outside the plan's ranks 0..{grid.world - 1}")
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"stragglers[{rank}]={factor} must be a positive slow-down factor")
        c = grid.coords(rank)
        unit = (c["pp"], c["dp"] if full else 0)
        out[unit] = max(out.get(unit, 1.0), factor)
    return out


def stage_stragglers(costs_or_plan, stages: dict[int, float]) -> dict[int, float]:
    """Expand ``{pipeline stage: factor}`` into ``{global rank: factor}`` for ``simulate_des``."""
    par = getattr(costs_or_plan, "plan", costs_or_plan).parallel
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    return {r: f for s, f in stages.items() for r in range(grid.world) if grid.coords(r)["pp"] == s}


def default_interference(costs: StepCosts) -> float:
    """The GPU's ``comm_compute_interference`` (catalog efficiency.yaml or a calibrated
    profile) as ``step_costs`` carried it; 1.0 (none) for hand-built costs without it."""
    return float(costs.time_detail_s.get("comm_compute_interference", 1.0))


def simulate_des(costs: StepCosts, *, granularity: str = "microbatch", mode: str = "representative",
                 stragglers: dict[int, float] | None = None, seed: int = 0,
                 comm_compute_interference: float | None = None, jitter: float = 0.0) -> StepResult:
    """Play one training step on the event engine and measure it from its timeline.

    ``stragglers`` maps global ranks to a compute slow-down factor (``stage_stragglers``
    builds it for whole pipeline stages). ``comm_compute_interference`` (k >= 1): compute
    runs at 1/k speed while a data-parallel collective runs on its GPU; None takes the
    catalog figure from ``costs`` (``default_interference``).
    ``jitter`` is the log-normal sigma of per-chunk compute noise drawn from
    ``numpy.random.default_rng(seed)`` (0: deterministic).
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} must be one of: {', '.join(GRANULARITIES)}")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of: {', '.join(MODES)}")
    slowdown = default_interference(costs) if comm_compute_interference is None else comm_compute_interference
    if not slowdown >= 1.0:
        raise ValueError(f"comm_compute_interference={slowdown} must be at least 1.0")
    if jitter < 0:
        raise ValueError(f"jitter={jitter} must be non-negative")
    step = _Step(costs, granularity, mode, _factors(costs, stragglers, mode == "full"), slowdown, jitter, seed)
    spans = step.run()
    return _result(costs, spans, max(step.end.values()), step, mode)


def _result(costs: StepCosts, spans: list[Span], step_s: float, step: _Step, mode: str) -> StepResult:
    plan = costs.plan
    ranks = sorted(step.label.values())
    own: dict[int, list[Span]] = defaultdict(list)
    for s in spans:
        own[s.rank].append(s)
    splits = {r: split_step(own[r], r, 0.0, step_s) for r in ranks}   # sort + sweep: once per rank
    critical = max(ranks, key=lambda r: (splits[r]["compute_s"] + splits[r]["exposed_comm_s"]
                                         + splits[r]["offload_s"], -r))
    split = splits[critical]
    by_kind: dict[str, float] = defaultdict(float)
    for s in spans:
        if s.rank == critical:
            name = {"tp": "tp_comm", "pp": "pp_comm", "dp": "dp_comm", "wait": "pp_wait"}.get(s.stream, s.kind)
            by_kind[name] += s.duration_s
    by_kind["bubble"] = split["bubble_s"]
    peak = plan.cluster.node.gpu.peak(plan.training.precision.value)
    notes = list(costs.notes)
    if not peak:
        notes.append(f"no {plan.training.precision.value} peak for {plan.cluster.node.gpu.name}: mfu/hfu are 0")
    # as the analytic path: the most loaded pipeline rank, and host memory for offload
    memory = max(costs.memory_per_rank_bytes, default=sum(costs.memory_bytes.values()))
    host_ok = costs.time_detail_s.get("host_memory_per_node_bytes", 0.0) <= plan.cluster.node.host_memory_bytes
    return StepResult(
        source="des", plan_name=plan.name, step_time_s=step_s,
        **rate_fields(plan, step_s, costs.model_flops_per_step, costs.hardware_flops_per_step),
        compute_s=split["compute_s"], exposed_comm_s=split["exposed_comm_s"], bubble_s=split["bubble_s"],
        offload_s=split["offload_s"], memory_per_gpu_gib=memory / GIB,
        fits=memory <= plan.cluster.node.gpu.hbm_bytes and host_ok, memory_bytes=dict(costs.memory_bytes),
        time_s=dict(by_kind), memory_per_rank_gib=tuple(b / GIB for b in costs.memory_per_rank_bytes),
        spans=tuple(spans), notes=tuple(notes),
        extra={"critical_rank": critical, "simulated_ranks": len(ranks), "des_events": step.env.scheduled,
               "full_mode": float(mode == "full")},
    )
