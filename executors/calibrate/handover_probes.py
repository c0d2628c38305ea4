"""The point-to-point probes of the parallel probe (``executors.calibrate.parallel_probes``),
run by each rank: the hand-over between busy ranks as a pipeline runs it (a relay and a
stream, in pairs of ranks side by side), a lone all-reduce and broadcast issued right after
compute, and a ``PipelineStage`` chunk's bookkeeping; the reduction of the ranks' timings to
figures in units of the plain probe layer's per-kernel time (``_busy_rank_kernels``); and
``bench_p2p``, those figures alone on two ranks, for the quick refresh under load.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from executors.calibrate.probes import _layer_step, _median_step, probe_kernels, probe_spec


#: Round trips of the busy-rank point-to-point relay (``_busy_p2p``).
P2P_PROBE_REPS = 60
#: Calls of each lone collective (``_lone_collectives``) and their size: one latency-bound
#: message (the bytes term comes from the back-to-back fits).
LONE_COLLECTIVE_REPS = 20
LONE_COLLECTIVE_BYTES = 4 * 1024
#: Schedule steps and micro-batches of the pipeline-chunk probe (``_pipeline_chunk``).
PIPELINE_PROBE_REPS = 8
PIPELINE_PROBE_MICROBATCHES = 4
#: The pipeline figures of ``parallel_host`` that the point-to-point probe counts in its own
#: per-kernel time on its busy ranks, re-measured by every refresh (``bench_p2p``). Its lone
#: collectives (``lone_*_kernels``) stay in that unit: converted as well, they sent dp2-pp2
#: 59% over in a check (bench/RESULTS.md).
P2P_KEYS = ("p2p_latency_kernels", "p2p_send_kernels", "p2p_wake_kernels", "p2p_post_kernels")


def _busy_p2p(rank: int, step, reps: int, shape: tuple[int, ...]) -> tuple[float, float, float, float]:
    """A two-rank relay as a pipeline runs it, in pairs of ranks (0, 1), (2, 3) ... at once:
    the even rank computes (the probe layer's forward and backward), sends its activation to
    the odd one, which was blocked in its receive, computes and sends back. Returns (wall
    time of the relay on this rank, this rank's compute in it, the time this rank spent in
    its sends, the time it spent posting its receives: the ``irecv`` call before its wait)."""
    buf = torch.zeros(shape)
    peer, role = rank ^ 1, rank % 2   # pairs (0, 1), (2, 3), ...: all pairs at once
    compute = send = post = 0.0

    def receive() -> float:
        t = time.perf_counter()
        work = dist.irecv(buf, src=peer)
        posted = time.perf_counter() - t
        work.wait()
        return posted

    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        if role == 1:
            post += receive()
        c = time.perf_counter()
        step()
        d = time.perf_counter()
        dist.isend(buf, dst=peer).wait()
        compute, send = compute + d - c, send + time.perf_counter() - d
        if role == 0:
            post += receive()
    return time.perf_counter() - t0, compute, send, post


def _busy_stream(rank: int, step, reps: int, shape: tuple[int, ...]) -> tuple[float, float]:
    """Two busy ranks in a stream, as GPipe's forward phase runs them, in pairs as
    ``_busy_p2p``: the even rank computes and posts an asynchronous send it does not wait for
    (gloo's thread must deliver it while both ranks compute), the odd one waits for each
    message, then computes. Returns (wall time, compute) of this rank; the odd rank's period
    less the slower rank's compute is the delivery delay."""
    bufs = [torch.zeros(shape) for _ in range(reps)]
    peer, role = rank ^ 1, rank % 2
    compute, works = 0.0, []
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(reps):
        if role == 1:
            dist.irecv(bufs[i], src=peer).wait()
        c = time.perf_counter()
        step()
        compute += time.perf_counter() - c
        if role == 0:
            works.append(dist.isend(bufs[i], dst=peer))
    wall = time.perf_counter() - t0
    for w in works:
        w.wait()
    return wall, compute


def _handover_probes(rank: int, step, spec) -> dict:
    """The relay and the stream of each pair of ranks, busy with ``step`` (the plain probe layer)
    between messages of one micro-batch's activations."""
    shape = (1, spec.seq_len, spec.hidden)
    return {"p2p": _busy_p2p(rank, step, P2P_PROBE_REPS, shape), "stream": _busy_stream(rank, step, P2P_PROBE_REPS, shape)}


def _lone_collectives(step, reps: int, nbytes: int = LONE_COLLECTIVE_BYTES) -> dict:
    """Median seconds of a lone all-reduce and a lone broadcast of ``nbytes`` (latency-bound),
    each issued right after this rank ran ``step`` (the plain probe layer), as DDP issues its
    gradient all-reduce at the end of a backward and ZeroRedundancyOptimizer its broadcasts
    after the optimizer step. The collectives probe (``executors.calibrate.collective_probes``) times
    calls back to back, which keeps gloo's threads awake; a lone call pays their wake-up
    too (on the 2-core validation host 1.3-2.3 ms for 4 KB against a 1.1 ms fitted alpha)."""
    buf = torch.ones(max(1, nbytes // 4))
    ops = {"all_reduce": lambda: dist.all_reduce(buf), "broadcast": lambda: dist.broadcast(buf, src=0)}
    times: dict = {k: [] for k in ops}
    for i in range(reps + 2):
        for k, op in ops.items():
            step()
            t0 = time.perf_counter()
            op()
            if i >= 2:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _pipeline_chunk(rank: int, world: int, device, spec, reps: int) -> tuple[float, float]:
    """(forward, backward) median seconds of one ``PipelineStage`` chunk of the probe layer
    (torch.distributed.pipelining, a GPipe schedule over all ranks, timed as
    ``executors.record.instrument_stage`` times a run's chunks): the probe layer plus the
    stage's per-chunk bookkeeping (argument flattening, detaching, gradient hand-over)."""
    from torch.distributed import pipelining

    from executors.model import Block

    s, h, m = spec.seq_len, spec.hidden, PIPELINE_PROBE_MICROBATCHES
    stage = pipelining.PipelineStage(Block(spec).to(device), rank, world, device)
    times: dict = {"f": [], "b": []}
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def timed(fn, key):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            times[key].append(time.perf_counter() - t0)
            return out
        return run

    stage.forward_one_chunk, stage.backward_one_chunk = timed(fwd, "f"), timed(bwd, "b")
    sched = pipelining.ScheduleGPipe(stage, m, loss_fn=lambda y, t: y.sum())
    x = torch.randn(m, s, h, device=device)
    for i in range(reps):
        if i == 2:
            times = {"f": [], "b": []}
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=x)
    return statistics.median(times["f"]), statistics.median(times["b"])


def _busy_rank_kernels(rows: list[dict], per_kernel: float) -> tuple[dict, dict]:
    """(raw seconds, kernel-unit figures) of the relay and stream probes (each pair of ranks'
    figures, averaged over the pairs), and of the lone collectives where they ran."""
    pairs = []
    for even, odd in zip(rows[::2], rows[1::2]):
        (wall, c0, s0, p0), (_, c1, s1, p1) = even["p2p"], odd["p2p"]
        per_message = max(0.0, (wall - c0 - c1) / (2 * P2P_PROBE_REPS))
        send = min(per_message, (s0 + s1) / (2 * P2P_PROBE_REPS))
        (_, sc0), (wall1, sc1) = even["stream"], odd["stream"]
        stream_delay = max(0.0, (wall1 - max(sc0, sc1)) / P2P_PROBE_REPS)
        post = min(stream_delay, (p0 + p1) / (2 * P2P_PROBE_REPS))   # the receive wait holds a post
        pairs.append((per_message, send, stream_delay, post))
    per_message, send, stream_delay, post = (statistics.mean(p[j] for p in pairs) for j in range(4))
    raw = {"p2p_per_message_s": per_message, "p2p_send_s": send, "p2p_stream_delay_s": stream_delay,
           "p2p_post_s": post}
    kernels = {"p2p_send_kernels": send / per_kernel, "p2p_latency_kernels": stream_delay / per_kernel,
               "p2p_wake_kernels": (per_message - send) / per_kernel, "p2p_post_kernels": post / per_kernel}
    if "lone" in rows[0]:   # the slower rank's call is the collective's time
        for op in ("all_reduce", "broadcast"):
            raw[f"lone_{op}_s"] = max(r["lone"][op] for r in rows)
            kernels[f"lone_{op}_kernels"] = raw[f"lone_{op}_s"] / per_kernel
    return raw, kernels


def _p2p_probe_rank(rank: int, world: int, device, reps: int) -> dict:
    """The plain probe layer on both ranks at once (the kernel unit), then the relay and the stream."""
    torch.manual_seed(0)
    spec = probe_spec()
    step = _layer_step(spec, device)
    out = {"plain": _median_step(step, reps)}
    out.update(_handover_probes(rank, step, spec))
    out["lone"] = _lone_collectives(step, LONE_COLLECTIVE_REPS)
    dist.barrier()
    return out


def bench_p2p(reps: int = 10) -> dict:
    """The pipeline point-to-point and lone-collective figures alone (two ranks, fork, gloo),
    for the quick refresh under load: ``kernels``, the kernel-unit ``p2p_*_kernels`` and
    ``lone_*_kernels`` of ``bench_parallel_host``, in units of ``per_kernel_s``, the plain
    probe layer's per-kernel time on the ``ranks`` ranks of the same launch."""
    from executors.procs import spawn

    rows = spawn(_p2p_probe_rank, 2, (reps,), timeout_s=120, start_method="fork")
    kf, kb = probe_kernels(probe_spec())
    per_kernel = statistics.mean(sum(r["plain"]) for r in rows) / (kf + kb)
    return {"kernels": _busy_rank_kernels(rows, per_kernel)[1], "per_kernel_s": per_kernel, "ranks": 2}

