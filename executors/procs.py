"""Rank processes on one host: start them, wire their process group, end them cleanly.

``spawn`` starts ``world`` ranks (fork on a CPU host, spawn with CUDA), each with a gloo or
nccl process group from ``init_distributed``; a rank that raises ends the run with its
message, one that stops making progress ends it after ``timeout_s`` naming the rank
(``executors.watchdog``: heartbeats, signals, ending every rank). gloo's transport
threads are moved to SCHED_IDLE (``idle_gloo_transport``) so that on a small CPU host they do
not take the cores from the ranks while messages flow.
"""
from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait as wait_any
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from executors import watchdog

#: How often the parent polls its ranks, seconds.
POLL_S = 0.2

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(rank: int, world: int, timeout_s: float) -> torch.device:
    """Join the process group (env:// rendezvous); nccl with a GPU per rank, else gloo."""
    local = int(os.environ.get("LOCAL_RANK", rank))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() > local
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    idle_gloo_transport()
    return device


#: The name Linux gives gloo's TCP transport thread (one per process group).
GLOO_TRANSPORT_THREAD = "gloo_tcp_loop"
#: A transport thread names itself once it runs, a moment after it exists: ``idle_gloo_transport``
#: scans the threads again after this pause until a scan finds no new one (at most
#: ``TRANSPORT_SCANS`` scans). A single scan once left one of four at the default policy in a
#: full-suite run on the loaded 2-core host.
TRANSPORT_RESCAN_S = 0.01
TRANSPORT_SCANS = 10


def idle_gloo_transport() -> int:
    """Run this process's gloo transport threads at ``SCHED_IDLE``: on a core no rank needs.

    Each gloo process group has a thread that moves its socket's bytes. While messages flow
    it re-polls ``epoll_wait`` in a tight loop (533k calls in a 30-step pp2-interleaved run
    on the 2-core validation host), so on a host with fewer cores than busy threads it takes
    cores from the ranks' compute, and a rank woken from a blocked receive can wait a
    scheduler tick behind it: a two-rank gloo round trip read a 0.18 ms median, p90 3.9 ms,
    p99 8 ms. At ``SCHED_IDLE`` the same round trip read max 0.45 ms and the local matrix's
    steps 0-40% faster (ZeRO-3 160 -> 108 ms). The threads still run whenever a core is
    free: with no more busy ranks than cores, that is when a rank waits for them; with more
    (four ranks on two cores) they wait until ranks block, and those layouts' communication
    is slower than the two-rank probes read (bench/RESULTS.md). Call it after creating groups
    (``init_distributed``, ``executors.parallel.build_mesh``, the probes' ``new_group``);
    a no-op for nccl and off Linux. Returns how many threads it set."""
    if not (hasattr(os, "SCHED_IDLE") and dist.is_initialized() and dist.get_backend() == "gloo"):
        return 0
    seen: set[int] = set()
    for scan in range(TRANSPORT_SCANS):
        new = [tid for tid in gloo_transport_threads() if tid not in seen]
        if scan and not new:
            break
        for tid in new:
            try:
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                seen.add(tid)
            except OSError:   # the thread ended meanwhile
                continue
        time.sleep(TRANSPORT_RESCAN_S)
    return len(seen)


def gloo_transport_threads() -> list[int]:
    """Thread ids of this process's gloo transport threads (Linux; none elsewhere)."""
    tids = []
    tasks = Path("/proc/self/task")
    for task in tasks.iterdir() if tasks.is_dir() else ():
        try:
            if (task / "comm").read_text().strip() == GLOO_TRANSPORT_THREAD:
                tids.append(int(task.name))
        except OSError:   # the thread ended meanwhile
            continue
    return tids


def _entry(rank, fn, world, port, outdir, timeout_s, beats, parent, args):
    watchdog.start_rank(rank, beats, parent)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    path = Path(outdir) / f"rank{rank}.pkl"
    try:
        device = init_distributed(rank, world, timeout_s * watchdog.COLLECTIVE_TIMEOUT_FACTOR)
        if device.type == "cuda":   # a GPU rank's host threads are CPU offload's Adam: its share of the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        watchdog.heartbeat()
        result = ("ok", fn(rank, world, device, *args))
    except BaseException as exc:  # reported to the parent, which names the rank
        if not isinstance(exc, ValueError):
            traceback.print_exc()  # the whole story on stderr; the parent raises one sentence
        result = ("error", type(exc).__name__, str(exc).strip().split("\n")[0], isinstance(exc, ValueError),
                  time.time())
        path.write_bytes(pickle.dumps(result))
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    path.write_bytes(pickle.dumps(result))


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` inside the block, what they were restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _frozen_heap():
    """Fork with this process's objects in the garbage collector's permanent generation.

    A forked rank shares its parent's heap copy-on-write. Unfrozen, every full collection
    in the rank walks all the objects it inherited (torch, pandas, the simulator's state)
    and copies the pages it touches: 260-300 ms on the 2-core validation host, one stall
    every few steps of a rank that makes much garbage (the runtime pipeline schedules).
    That is the launcher's cost, not the plan's, and torchrun's ranks do not pay it. The
    Python docs' recipe for fork without exec: ``gc.freeze()`` right before the fork."""
    fresh = gc.get_freeze_count() == 0
    gc.freeze()
    try:
        yield
    finally:
        if fresh:   # the parent's own objects are collectable again; the ranks keep theirs frozen
            gc.unfreeze()


def spawn(fn, world: int, args: tuple = (), *, timeout_s: float = 300.0, start_method: str = "spawn") -> list:
    """Run ``fn(rank, world, device, *args)`` on ``world`` fresh processes; return the
    results by rank. ValueError from a rank is re-raised as is; another failure, or a live
    rank with no progress (``executors.watchdog.heartbeat``) for ``timeout_s``, ends every
    rank and raises RuntimeError naming the rank. SIGINT or SIGTERM ends every rank, removes
    the ranks' temporary folder and raises ``watchdog.RunInterrupted``.
    ``start_method="fork"`` (CPU only) skips re-importing torch in every rank, which the
    tests use to stay fast on two cores."""
    beats = watchdog.new_heartbeats(mp.get_context(start_method), world)
    with watchdog.ParentSignals() as signals, tempfile.TemporaryDirectory(prefix="trainplan-ranks-") as outdir:
        ctx = None
        try:
            with _frozen_heap() if start_method == "fork" else contextlib.nullcontext():
                ctx = mp.start_processes(_entry, nprocs=world, join=False, start_method=start_method,
                                         args=(fn, world, free_port(), outdir, timeout_s, beats, os.getpid(), args))
            failed = _wait(ctx.processes, beats, timeout_s)
            if failed is not None:
                watchdog.end_ranks(ctx.processes)   # the others at once: their errors are its echo
                _raise_rank_error(outdir, world, failed, ctx.processes[failed].exitcode)
        finally:
            signals.armed = False   # ending the ranks must not be cut short by a second signal
            if ctx is not None:
                watchdog.end_ranks(ctx.processes)
                for name in ctx.error_files:   # torch's per-rank traceback files in $TMPDIR: ours are in outdir
                    Path(name).unlink(missing_ok=True)
        return [pickle.loads((Path(outdir) / f"rank{r}.pkl").read_bytes())[1] for r in range(world)]


def _wait(processes, beats, timeout_s: float) -> int | None:
    """Wait for every rank to exit; the first rank that exits non-zero, None when all
    succeed. Raises the watchdog's RuntimeError when a live rank stops making progress."""
    pending = {p.sentinel: r for r, p in enumerate(processes)}
    while pending:
        for sentinel in wait_any(list(pending), timeout=POLL_S):
            rank = pending.pop(sentinel)
            processes[rank].join()
            if processes[rank].exitcode != 0:
                return rank
        watchdog.check_progress(processes, beats, timeout_s)
    return None


def _raise_rank_error(outdir: str, world: int, rank: int, exitcode: int):
    """Re-raise the first failure in time: the others are usually its echo (a peer reset)."""
    errors = []
    for r in range(world):
        path = Path(outdir) / f"rank{r}.pkl"
        if path.exists():
            status = pickle.loads(path.read_bytes())
            if status[0] == "error":
                errors.append((status[4], r, status))
    if errors:
        _, r, status = min(errors)
        if status[3]:
            raise ValueError(status[2]) from None
        raise RuntimeError(f"rank {r} failed: {status[1]}: {status[2]}") from None
    how = f"signal {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exit code {exitcode}"
    raise RuntimeError(f"rank {rank} failed: it ended with {how}") from None


# --------------------------------------------------------------------------- data
