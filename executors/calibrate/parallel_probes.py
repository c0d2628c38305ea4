"""The host cost of torch's parallel machinery on a CPU host, measured on two ranks at once
(fork, gloo) in units of the plain probe layer's per-kernel time of the same launch, so that
load from other processes falls on plain and wrapped alike: DTensor TP (with and without
SP), FSDP2 (ZeRO-2/3), the model's ends under each, a ``PipelineStage`` chunk's bookkeeping,
AdamW over plain and DTensor parameters, the point-to-point hand-over between busy ranks as
a pipeline runs it, and a lone all-reduce and broadcast issued right after compute, as DDP
and ZeroRedundancyOptimizer issue theirs. TP, the ring attention and the hand-over are measured on four ranks
too (two pairs side by side, ``GROUPED_PROBE_RANKS``), where the ranks outnumber a small
host's cores.

The probes' pieces are in ``executors.calibrate.wrapper_probes`` (the wrapped models and their
fits) and ``executors.calibrate.handover_probes`` (the point-to-point hand-over, the lone
collectives, the pipeline chunk); this module runs them together on each rank
(``_parallel_probe_rank``) and reduces the ranks' results (``bench_parallel_host``).
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from executors.calibrate.handover_probes import (LONE_COLLECTIVE_REPS, PIPELINE_PROBE_REPS, _busy_rank_kernels,
                                                 _handover_probes, _lone_collectives, _pipeline_chunk)
from executors.calibrate.probes import _layer_step, _median_step, _optimizer_per_tensor_s, probe_kernels, probe_spec
from executors.calibrate.wrapper_probes import (COMM_SHARE_REPS, PROBE_GROUP, WRAPPER_BASE, WRAPPER_FIT_LAYERS,
                                                WRAPPER_MODES, _recorded_comm, _wrapped_model_steps, comm_shares,
                                                parallel_host_kernels)
from executors.procs import idle_gloo_transport


#: Layer steps per probe variant of the parallel probe (median kept; a modelling choice).
PARALLEL_PROBE_REPS = 20
#: Interleaved rounds of the parallel probe's layer variants (median of the per-round ratios;
#: with 5 the TP figure moved 95-174 kernels between calibrations on the shared 2-core host).
PARALLEL_PROBE_ROUNDS = 9
#: Ranks and wrappers of the grouped probe (``bench_parallel_host(world=GROUPED_PROBE_RANKS)``):
#: two TP pairs side by side, as the local matrix's tp2-pp2 puts four ranks on the cores. On
#: the 2-core validation host a TP all-reduce read 2.2-2.6 ms in that run and 2.3 ms in this
#: probe, where the two-rank figures scaled by the one-rank slowdown tables gave 1.45 ms
#: (bench/RESULTS.md). The ring attention of context parallel likewise: cp2-dp2 runs two rings
#: side by side, and the two-rank figure scaled by the slowdown tables gave its layers 1.3x
#: the two-rank cost where the run took 2x. FSDP2 is left out to keep the calibration short
#: (4 s a wrapper).
GROUPED_PROBE_RANKS = 4
GROUPED_PROBE_MODES = ("tp", "tp_sp", "cp")
#: Version of the parallel probe's method, kept with the pooled host costs: calibrations
#: that measured the wrappers another way are not pooled with this one. 3: gloo's transport
#: threads at SCHED_IDLE (``executors.procs.idle_gloo_transport``), which made the wrapped
#: layers cheaper than the method-2 calibrations read them.
PARALLEL_PROBE_METHOD = 3


def _parallel_probe_rank(rank: int, world: int, device, reps: int, rounds: int = PARALLEL_PROBE_ROUNDS,
                         modes: tuple[str, ...] = WRAPPER_MODES) -> dict:
    """All ranks at once, in groups of two (pairs (0, 1), (2, 3) ... side by side where
    ``world`` is more than 2): the plain probe layer (the kernel unit) and the probe model at
    two depths plain and under the wrappers of ``modes`` (DTensor TP with and without SP,
    ``executors.parallel``'s plan; FSDP2, reshard after forward or not), with the model's
    ends for TP's split (``_wrapped_model_steps``), in ``rounds`` interleaved rounds (each
    the median of its steps), so that load from other processes, which comes and goes by the
    second, falls on plain and wrapped alike; AdamW over plain and DTensor (FSDP2-sharded)
    parameters where FSDP2 is timed; then the busy-rank point-to-point relay and stream of
    each pair, and on two ranks a pipeline stage's chunk and the lone collectives."""
    from torch.distributed.device_mesh import init_device_mesh

    from executors.model import Block

    torch.manual_seed(0)
    spec = probe_spec()
    if world == PROBE_GROUP:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("x",))
    else:
        mesh = init_device_mesh(device.type, (world // PROBE_GROUP, PROBE_GROUP), mesh_dim_names=("pairs", "x"))["x"]
    idle_gloo_transport()
    steps = {"plain": _layer_step(spec, device)}
    wrapped, dtensor_params = _wrapped_model_steps(spec, mesh, device, modes)
    steps.update(wrapped)
    per_round = max(2, reps // rounds)

    def timed(step, r: int) -> tuple[float, float]:
        if world > PROBE_GROUP:   # groups side by side start each variant together, as a run's ranks run
            dist.barrier()        # theirs (one group's own collectives keep its ranks together)
        return _median_step(step, per_round, warmup=3 if r == 0 else 1)

    out: dict = {"rounds": [{k: timed(st, r) for k, st in steps.items()} for r in range(rounds)]}
    for k in steps:
        out[k] = tuple(statistics.median(rd[k][i] for rd in out["rounds"]) for i in range(2))
    deep = WRAPPER_FIT_LAYERS[-1]
    names = ["model", *(WRAPPER_BASE[m] for m in modes if m in WRAPPER_BASE), *modes]
    out["recorded"] = _recorded_comm(rank, mesh, steps, [f"{n}{deep}" for n in dict.fromkeys(names)], COMM_SHARE_REPS)
    if dtensor_params:
        out["opt_dtensor"] = _optimizer_per_tensor_s(dtensor_params, reps)
        out["opt_plain"] = _optimizer_per_tensor_s(list(Block(spec).to(device).parameters()), reps)
    out.update(_handover_probes(rank, steps["plain"], spec))
    if world == PROBE_GROUP:
        out["pipeline_chunk"] = _pipeline_chunk(rank, world, device, spec, PIPELINE_PROBE_REPS)
        out["lone"] = _lone_collectives(steps["plain"], LONE_COLLECTIVE_REPS)
    dist.barrier()
    return out


def bench_parallel_host(world: int = PROBE_GROUP, reps: int = PARALLEL_PROBE_REPS, rounds: int = PARALLEL_PROBE_ROUNDS,
                        modes: tuple[str, ...] = WRAPPER_MODES) -> dict:
    """The torch-parallel host cost on ``world`` ranks (fork, gloo; groups of two side by side
    where ``world`` is more than 2, so that their ranks share the cores), in units of the plain
    probe layer's per-kernel cost measured in the same launch (so that load from other
    processes cancels): extra kernels per layer forward and backward for the wrappers of
    ``modes``, DTensor TP, TP+SP and FSDP2 ZeRO-2/3 (their collectives' latency and dispatch
    included) and for the model's ends under each (TP's embedding and head, FSDP2's root group), from the probe
    model wrapped as the executor wraps it at two depths (``parallel_host_kernels``; the
    median over interleaved rounds); AdamW's cost per parameter tensor, plain and DTensor;
    the point-to-point figures between busy ranks; on two ranks a pipeline stage's chunk and
    the lone collectives. Ranks' medians are averaged."""
    from executors.procs import spawn

    if world < PROBE_GROUP or world % PROBE_GROUP:
        raise ValueError(f"world={world}: the parallel probe runs groups of {PROBE_GROUP} ranks")
    rows = spawn(_parallel_probe_rank, world, (reps, rounds, modes), timeout_s=240, start_method="fork")
    kf, kb = probe_kernels(probe_spec())
    keys = [k for k in rows[0] if k not in ("rounds", "p2p", "stream", "lone", "recorded")]
    avg = {k: tuple(statistics.mean(r[k][i] for r in rows) for i in range(2)) if isinstance(rows[0][k], tuple)
           else statistics.mean(r[k] for r in rows) for k in keys}
    per_kernel = sum(avg["plain"]) / (kf + kb)
    out = {"ranks": world, "per_kernel_s": per_kernel, "raw": {k: list(v) if isinstance(v, tuple) else v
                                                                for k, v in avg.items()}}
    out.update(parallel_host_kernels(rows, kf, kb, modes))
    out["comm_share"] = comm_shares(rows, modes)
    if "opt_plain" in avg:
        out["optimizer_per_tensor_kernels"] = avg["opt_plain"] / per_kernel
        out["optimizer_dtensor_per_tensor_kernels"] = avg["opt_dtensor"] / per_kernel
    raw, kernels = _busy_rank_kernels(rows, per_kernel)
    out["raw"].update(raw)
    out.update(kernels)
    if "pipeline_chunk" in avg:   # a stage's chunk over the plain layer, both ranks averaged
        out["pipeline_chunk"] = {"forward_kernels": max(0.0, (avg["pipeline_chunk"][0] - avg["plain"][0]) / per_kernel),
                                 "backward_kernels": max(0.0, (avg["pipeline_chunk"][1] - avg["plain"][1]) / per_kernel)}
    return out

