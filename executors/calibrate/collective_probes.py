"""Collective latency and bandwidth on the backend a run will use (gloo on CPU, nccl on GPU):
all-reduce, all-gather, reduce-scatter, broadcast, all-to-all and send/recv over message
sizes, for group sizes 2 and 4 in one launch (the world and a sub-group), fitted as
t = a + n/b (Hockney's alpha-beta model) on the bytes each rank puts on the wire; send/recv
is a ping-pong, half a round trip (the p2p latency).
"""
from __future__ import annotations

import math
import os
import time

import torch
import torch.distributed as dist

from executors.procs import idle_gloo_transport
from executors.watchdog import heartbeat
from executors.calibrate.probes import _sync


COLLECTIVE_BYTES = (4 * 1024, 64 * 1024, 1024**2, 4 * 1024**2)
GROUP_SIZES = (2, 4)
#: Fraction of a collective's buffer each rank sends, per algorithm, for the ring algorithms
#: gloo and NCCL use (Thakur et al. 2005; NCCL's bus-bandwidth convention in nccl-tests PERFORMANCE.md).
WIRE_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
# torch 2.13 renamed the flat-tensor collectives; keep working on older releases too.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _collective_fn(op: str, nbytes: int, rank: int, world: int, device, group=None):
    numel = max(world, nbytes // 4 // world * world)
    x = torch.ones(numel, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    if op == "all_gather":
        out = torch.empty(numel * world, device=device)
        return lambda: _ALL_GATHER(out, x, group=group)
    if op == "reduce_scatter":
        out = torch.empty(numel // world, device=device)
        return lambda: _REDUCE_SCATTER(out, x, group=group)
    if op == "all_to_all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(x, group_src=0, group=group)
    if op == "send_recv":  # ping-pong in pairs (0,1), (2,3): the time is half a round trip
        peer = rank ^ 1
        if rank % 2 == 0:
            return lambda: (dist.send(x, group_dst=peer, group=group), dist.recv(x, group_src=peer, group=group))
        return lambda: (dist.recv(x, group_src=peer, group=group), dist.send(x, group_dst=peer, group=group))
    raise ValueError(op)


def _time_collective(fn, device, group, halve: bool, min_time_s: float = 0.015, max_reps: int = 12) -> float:
    """Seconds per call; every rank runs the same number of calls (agreed from a probe call)."""
    fn()  # warm-up
    dist.barrier(group=group)
    start = time.perf_counter()
    fn()
    _sync(device)
    probe = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)
    reps = int(min(max_reps, max(2, min_time_s / max(float(probe), 1e-9))))
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / reps])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)  # the slowest rank sets the collective's time
    heartbeat()   # progress for the spawning watchdog, outside the timed calls
    return float(elapsed) / (2.0 if halve else 1.0)


def _collective_rank(rank: int, world: int, device, sizes: tuple[int, ...], nbytes_list: tuple[int, ...]) -> list[dict]:
    """Every op and size on groups of each size in ``sizes`` (ranks 0..n-1; the others wait)."""
    rows = []
    for n in sizes:
        group = None if n == world else dist.new_group(list(range(n)))
        idle_gloo_transport()
        if rank < n:
            for op in WIRE_FACTOR:
                for nbytes in nbytes_list:
                    fn = _collective_fn(op, nbytes, rank, n, device, group)
                    rows.append({"op": op, "ranks": n, "bytes": nbytes,
                                 "seconds": _time_collective(fn, device, group, halve=op == "send_recv")})
        dist.barrier()
    return rows


def bench_collectives(backend: str, group_sizes=GROUP_SIZES, nbytes_list=COLLECTIVE_BYTES) -> list[dict]:
    """One launch of max(group_sizes) ranks (fork on a CPU host); rank 0's rows. gloo on a host
    with a GPU (one GPU: NCCL refuses two ranks on a device) runs CPU ranks, started fresh with
    the GPU hidden from them (CUDA cannot be used in a forked child of a process that holds it)."""
    from executors.procs import spawn

    gpu_host = torch.cuda.is_available()
    method = "fork" if backend == "gloo" and not gpu_host else "spawn"
    world = max(group_sizes)
    hide = backend == "gloo" and gpu_host
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hide:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        out = spawn(_collective_rank, world, (tuple(sorted(group_sizes)), tuple(nbytes_list)), timeout_s=120,
                    start_method=method)
    finally:
        if hide:
            os.environ.pop("CUDA_VISIBLE_DEVICES")
            if saved is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
    return out[0]


def fit_alpha_beta(rows: list[dict], max_bytes_per_s: float = math.inf) -> dict:
    """Least-squares t = alpha + wire_bytes / beta per (op, ranks), alpha >= 0, weighted by
    1/t^2 (relative residuals): the sizes span three decades, and an unweighted fit would
    let the largest message's noise set the latency. Where the messages are all
    latency-bound the slope is lost in the noise and 1/slope runs away (a quick calibration
    once read 1,000,000 GB/s): beta is capped at ``max_bytes_per_s`` (the host's measured
    copy bandwidth: a collective moves each byte through memory at least once), and a
    capped fit says so (``capped_at_copy_bandwidth``)."""
    fits: dict = {}
    for key in sorted({(r["op"], r["ranks"]) for r in rows}):
        op, n = key
        pts = [(WIRE_FACTOR[op](n) * r["bytes"], r["seconds"]) for r in rows if (r["op"], r["ranks"]) == key]
        w = [1.0 / max(y, 1e-12) ** 2 for _, y in pts]
        sw = sum(w)
        mx = sum(wi * x for wi, (x, _) in zip(w, pts)) / sw
        my = sum(wi * y for wi, (_, y) in zip(w, pts)) / sw
        sxx = sum(wi * (x - mx) ** 2 for wi, (x, _) in zip(w, pts))
        slope = sum(wi * (x - mx) * (y - my) for wi, (x, y) in zip(w, pts)) / sxx if sxx else 0.0
        capped = slope * max_bytes_per_s < 1.0
        slope = max(slope, 1.0 / max_bytes_per_s, 1e-15)
        fit = {"alpha_s": max(0.0, my - slope * mx), "bus_bytes_per_s": 1.0 / slope}
        if capped:
            fit["capped_at_copy_bandwidth"] = True
        fits.setdefault(op, {})[n] = fit
    return fits


def split_ring_latency(fits: dict) -> tuple[float, dict]:
    """The p2p (hop) latency from the ping-pong fit of the smallest group, and each
    all-reduce fit's base latency: its alpha less the 2(n-1) hops of
    ``simcore.model.collectives.ring_all_reduce_s``'s latency term (never below zero)."""
    sr = fits.get("send_recv", {})
    hop = sr[min(sr)]["alpha_s"] if sr else 0.0
    ar = fits.get("all_reduce", {})
    for n, f in ar.items():
        f["base_latency_s"] = max(0.0, f["alpha_s"] - 2 * (n - 1) * hop)
    return hop, ar
