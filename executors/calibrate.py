"""Calibration: microbenchmarks of the machine at hand -> a hardware profile YAML.

The profile has the catalog's shapes so the simulator needs no special case for it:
a ``device`` section in the schema of ``topologies/catalog/gpus.yaml`` (the measured
peak stands in for the datasheet peak), an ``efficiency`` section in the schema of
``efficiency.yaml`` (matmul efficiency curve over GEMM size, memory-bound efficiency,
kernel and host overhead, collective alpha-beta), and the raw measurements they were
fitted from.

What is measured, on the backend a run will use (gloo on CPU, nccl on GPU):
- matmul throughput over a grid of GEMM shapes and precisions (one thread per rank on
  CPU, as the executor runs); on CPU the efficiency curve comes from a transformer layer's
  GEMM shapes (forward, dX, dW) timed with their operands out of cache, as inside a step;
- memory-bound bandwidth (a large tensor copy) and the fixed cost of a tiny kernel;
- the host (framework) cost of eager PyTorch per modelled kernel: one tiny transformer
  layer (``executors.model.Block``) forward and backward divided by the kernels
  ``simcore.workload`` counts for it; on a CPU, where the issuing thread runs each kernel,
  the layer's modelled device time is subtracted to give the per-kernel dispatch time that
  ``simcore.compute.phase_s`` adds to the device time (on a GPU the figure is the floor of
  a phase); and the same layer under full and selective ``checkpoint_wrapper``, whose
  host cost beyond the recomputed ops is kept per layer;
- the optimizer step (``torch.optim.AdamW`` as the executor builds it) over two model
  sizes: a cost per parameter tensor and a bandwidth;
- all-reduce, all-gather, reduce-scatter, broadcast, all-to-all and send/recv latency
  and bandwidth over message sizes, for group sizes 2 and 4 (one launch: the world and
  a sub-group), fitted as t = a + n/b (Hockney's alpha-beta model) on the bytes each
  rank puts on the wire; send/recv is a ping-pong, half a round trip (the p2p latency);
- on CPU, throughput per rank when 1, 2, 4 ranks run at once (oversubscription): the
  one-rank GEMM and overhead-bound tiny-layer rates, in processes set up as the executor's
  ranks, scaled by the slowdown of the executor's own step with n ranks (a data-parallel
  run of the validation tiny model), since a lone GEMM or layer slows less than a real
  step when ranks share cores;
- on GPU, host-device copy bandwidth (pinned memory).

On a CPU host the compute figures are finally anchored to the executor's own one-rank step
(``anchor_to_executor``): the isolated probes predict a real step 10-40% off on a small
shared host, and the one-rank run is measured in the same calibration anyway.

Timing follows nanoGPT's bench.py: warm-up discarded, synchronise only at the edges.
``refit_profile`` refits the profile from a measured run (``trainplan calibrate
--from-run``): the compute and communication figures are scaled by the ratio of measured
to predicted phase times, so the next prediction on this machine starts from what was seen.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import multiprocessing
import os
import platform
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from simcore.trace import atomic_write_text

GIB = 1024**3
MATMUL_SIZES = (32, 64, 128, 256, 512, 1024)
#: Largest square GEMM timed at 16-bit on a CPU (bf16 GEMMs run ~30x slower there).
CPU_HALF_MAX_SIZE = 512
COLLECTIVE_BYTES = (4 * 1024, 64 * 1024, 1024**2, 4 * 1024**2)
GROUP_SIZES = (2, 4)
OVERSUB_RANKS = (1, 2, 4)
#: Seconds every oversubscription worker runs each probe for, all ranks at once.
OVERSUB_WINDOW_S = 0.25
#: Interleaved rounds of the oversubscription probe (median kept).
OVERSUB_CYCLES = 3
#: Window and rounds of the quick re-measurement before each validation run
#: (``refresh_host_speed``). Measured on the 2-core validation host: with one 0.1 s round
#: the 2-rank slowdown read anywhere from 0.7x to 2.1x in back-to-back probes (and the
#: predictions inherited that scatter); 0.25 s x 3 interleaved rounds, median kept, keep it
#: within about 10% (a noise choice, not hardware).
REFRESH_WINDOW_S = 0.25
REFRESH_CYCLES = 3
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The probe layer of the host-overhead benchmark: small, so that eager PyTorch's per-op
#: cost dominates its time (a modelling choice, not hardware); its modelled device time is
#: subtracted on serial devices (``_dispatch_s``).
PROBE_LAYER = dict(name="probe", layers=1, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=256,
                   seq_len=32, tied_embeddings=False)
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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_op(fn, device: torch.device, min_time_s: float = 0.03, warmup: int = 2) -> float:
    """Seconds per call of ``fn``: warm-up discarded, repeated until ``min_time_s`` elapsed."""
    for _ in range(warmup):
        fn()
    _sync(device)
    reps, start = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        if reps >= 3 and (time.perf_counter() - start) >= min_time_s:
            break
    _sync(device)
    return (time.perf_counter() - start) / reps


def matmul_shapes(precision: str, device: torch.device, sizes=MATMUL_SIZES) -> list[tuple[int, int, int]]:
    """Square and transformer-shaped (tokens x h x 4h) GEMMs; 16-bit on a CPU stops early."""
    if device.type == "cpu" and precision != "fp32":
        sizes = tuple(s for s in sizes if s <= CPU_HALF_MAX_SIZE)
    return [(s, s, s) for s in sizes] + [(s, s // 2 or 1, 2 * s) for s in sizes[1:]]


def bench_matmul(device: torch.device, precisions, sizes=MATMUL_SIZES, progress=None) -> list[dict]:
    """Achieved FLOP/s for every shape of ``matmul_shapes``."""
    rows = []
    for precision in precisions:
        dtype = PRECISION_DTYPES[precision]
        for m, k, n in matmul_shapes(precision, device, sizes):
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            t = time_op(lambda: a @ b, device)
            rows.append({"precision": precision, "m": m, "k": k, "n": n, "flops": 2.0 * m * n * k,
                         "seconds": t, "flops_per_s": 2.0 * m * n * k / t})
        if progress:
            progress.update(1)
    return rows


#: Tokens per micro-batch (rows) and hidden sizes of the layer-shaped GEMMs timed with cold
#: caches on a CPU host (``bench_layer_gemms``): the shapes eager training runs, T x h times
#: h x 4h, in the forward's ``F.linear`` form and the backward's dX and dW forms.
LAYER_GEMM_TOKENS = (32, 128, 512)
LAYER_GEMM_HIDDEN = (64, 128, 256, 512, 1024)
#: Bytes of the rotating operand pool of ``bench_layer_gemms``: larger than the last-level
#: cache (32 MiB on the validation host; ``lscpu``), so every GEMM starts with its operands
#: out of cache, as inside a training step where the other layers' tensors evicted them.
COLD_POOL_BYTES = 64 * 1024**2


def _cold_rate(make, shapes_bytes: int, pool: torch.Tensor, min_time_s: float) -> float:
    """Seconds per call of GEMMs whose operands are views at rotating offsets of ``pool``."""
    per = shapes_bytes // 4
    calls = [make(pool[i * per:(i + 1) * per]) for i in range(max(1, pool.numel() // per))]
    for fn in calls[:2]:
        fn()
    reps, start = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - start < min_time_s:
        for fn in calls:
            fn()
        reps += len(calls)
    return (time.perf_counter() - start) / reps


def bench_layer_gemms(tokens=LAYER_GEMM_TOKENS, hidden=LAYER_GEMM_HIDDEN, min_time_s: float = 0.02) -> list[dict]:
    """fp32 GEMMs of a transformer layer's shapes on one CPU thread, operands out of cache:
    x (T, h) against W (4h, h) as ``F.linear`` (forward), dY (T, 4h) @ W (dX) and
    dY^T @ x (dW). Isolated GEMMs on hot operands run 1.5-2.5x faster than the same
    GEMMs inside an eager training step on this class of host (the step's other tensors
    evict them from cache), which the simulator's FLOP-indexed curve cannot know."""
    import torch.nn.functional as F

    pool = torch.randn(COLD_POOL_BYTES // 4)
    rows = []
    for t in tokens:
        for h in hidden:
            n = 4 * h
            nbytes = 4 * (t * h + n * h + t * n)

            def split(buf, t=t, h=h, n=n):
                return buf[:t * h].view(t, h), buf[t * h:t * h + n * h].view(n, h), buf[t * h + n * h:].view(t, n)
            forms = {
                "fwd": lambda buf: (lambda x, w, _: (lambda: F.linear(x, w)))(*split(buf)),
                "dx": lambda buf: (lambda _, w, dy: (lambda: dy @ w))(*split(buf)),
                "dw": lambda buf: (lambda x, _, dy: (lambda: dy.t() @ x))(*split(buf)),
            }
            for form, make in forms.items():
                sec = _cold_rate(make, nbytes, pool, min_time_s)
                flops = 2.0 * t * h * n
                rows.append({"precision": "fp32", "m": t, "k": h, "n": n, "form": f"layer-{form}", "cold": True,
                             "flops": flops, "seconds": sec, "flops_per_s": flops / sec})
    return rows


def bench_memory(device: torch.device) -> dict:
    """Streaming bandwidth (copy: read + write) and the fixed cost of a tiny kernel."""
    n = 32 * 1024**2 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    copy_s = time_op(lambda: dst.copy_(src), device, min_time_s=0.05)
    tiny = torch.ones(1, device=device)
    tiny_s = time_op(lambda: tiny.add_(1.0), device, min_time_s=0.02)
    return {"copy_bytes_per_s": 2 * n * 4 / copy_s, "kernel_overhead_s": tiny_s}


def bench_host_device(device: torch.device) -> float | None:
    """Pinned host-to-device copy bandwidth, bytes/s (None on a CPU host)."""
    if device.type != "cuda":
        return None
    host = torch.empty(256 * 1024**2, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device=device)
    return host.numel() / time_op(lambda: dev.copy_(host, non_blocking=True), device, min_time_s=0.2)


# --------------------------------------------------------------------------- host overhead, optimizer

def probe_spec(**over):
    from simcore.spec import ModelSpec

    return ModelSpec(**{**PROBE_LAYER, **over})


def probe_kernels(spec) -> tuple[int, int]:
    """(forward, backward) kernels ``simcore.compute.ops_time_s`` counts for one layer."""
    from simcore import workload as wl

    ops = wl.layer_forward_ops(spec, b=1, s=spec.seq_len)
    fwd = sum(op.kernels for op in ops)
    bwd = sum(op.kernels * (2 if op.matmul and not op.batched and op.name != "flash_attention" else 1)
              for op in ops)
    return fwd, bwd


def _layer_step(spec, device: torch.device):
    """A closure running one forward and backward of the probe layer; returns (fwd_s, bwd_s)."""
    from executors.model import Block

    block = Block(spec).to(device)
    x = torch.randn(1, spec.seq_len, spec.hidden, device=device, requires_grad=True)  # (B, T, H)

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        y = block(x)
        _sync(device)
        t1 = time.perf_counter()
        y.sum().backward()
        _sync(device)
        return t1 - t0, time.perf_counter() - t1
    return step


def _checkpointed_step(spec, device: torch.device, recompute: str):
    """``_layer_step`` of the probe layer wrapped as ``executors.parallel.apply_ac`` wraps a
    block: the whole block (full) or its attention core (selective)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    from executors.model import Block

    block = Block(spec).to(device)
    if recompute == "full":
        block = checkpoint_wrapper(block, preserve_rng_state=False)
    else:
        block.attention.core = checkpoint_wrapper(block.attention.core, preserve_rng_state=False)
    x = torch.randn(1, spec.seq_len, spec.hidden, device=device, requires_grad=True)  # (B, T, H)
    return _wrapped_layer_step(block, x)


def bench_host_overhead(device: torch.device, reps: int = 40, warmup: int = 8) -> dict:
    """Eager host cost per modelled kernel: the probe layer's median forward and backward
    over the kernels the workload model counts for them; and, interleaved with it, the same
    layer under full and selective activation checkpointing (torch's non-reentrant
    ``checkpoint_wrapper``, whose saved-tensor hooks and recomputation bookkeeping cost host
    time of their own)."""
    spec = probe_spec()
    steps = {"plain": _layer_step(spec, device), "full": _checkpointed_step(spec, device, "full"),
             "selective": _checkpointed_step(spec, device, "selective")}
    times = {k: [] for k in steps}
    for i in range(reps + warmup):
        for k, step in steps.items():
            t = step()
            if i >= warmup:
                times[k].append(t)
    med = {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for k, v in times.items()}
    fwd_s, bwd_s = med["plain"]
    kf, kb = probe_kernels(spec)
    return {"forward_s": fwd_s, "backward_s": bwd_s, "forward_kernels": kf, "backward_kernels": kb,
            "per_kernel_s": (fwd_s + bwd_s) / (kf + kb),
            "checkpointed": {k: {"forward_s": f, "backward_s": b} for k, (f, b) in med.items() if k != "plain"}}


def recompute_kernels(host: dict, peak: float, copy_bytes_per_s: float, efficiency: dict) -> dict:
    """Host cost of activation checkpointing beyond the recomputed ops, per layer and
    micro-batch, in units of the probe layer's per-kernel time: the checkpointed layer's
    forward less the plain one, and its backward less the plain backward and less the
    recomputation the simulator charges (``simcore.compute.serial_layer_s``)."""
    from simcore.compute import serial_layer_s
    from simcore.spec import Recompute

    spec, per_kernel = probe_spec(), host["per_kernel_s"]
    points, attn = efficiency["matmul"]["points"], float(efficiency["attention"]["forward"])
    dispatch = _probe_dispatch_s(per_kernel, peak, copy_bytes_per_s, efficiency)
    out = {}
    for mode, meas in (host.get("checkpointed") or {}).items():
        rec = serial_layer_s(spec, peak, copy_bytes_per_s, points, attn, dispatch, Recompute(mode))[0]
        out[f"recompute_{mode}"] = {
            "forward_kernels": max(0.0, meas["forward_s"] - host["forward_s"]) / per_kernel,
            "backward_kernels": max(0.0, meas["backward_s"] - host["backward_s"] - rec) / per_kernel}
    return out


def bench_optimizer(device: torch.device, reps: int = 15) -> dict:
    """AdamW step time over two parameter sets, fitted as t = tensors * a + bytes / bw."""
    from executors.parallel import ADAM_BETAS, WEIGHT_DECAY

    rows = []
    for tensors, numel in ((8, 1024), (8, 256 * 1024), (64, 1024)):
        params = [torch.nn.Parameter(torch.randn(numel, device=device)) for _ in range(tensors)]
        for p in params:
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY)
        t = time_op(opt.step, device, min_time_s=0.02, warmup=2) if reps else 0.0
        rows.append({"tensors": tensors, "bytes": tensors * numel * 4.0, "seconds": t})
    small, big, many = rows
    per_tensor = max(0.0, (many["seconds"] - small["seconds"]) / (many["tensors"] - small["tensors"]))
    per_byte = max(1e-15, (big["seconds"] - small["seconds"]) / (big["bytes"] - small["bytes"]))
    return {"rows": rows, "per_tensor_s": per_tensor, "param_bytes_per_s": 1.0 / per_byte}


# --------------------------------------------------------------------------- torch-parallel host cost

#: Layer steps per probe variant of the parallel probe (median kept; a modelling choice).
PARALLEL_PROBE_REPS = 20
#: Interleaved rounds of the parallel probe's layer variants (median of the per-round ratios;
#: with 5 the TP figure moved 95-174 kernels between calibrations on the shared 2-core host).
PARALLEL_PROBE_ROUNDS = 9
#: Round trips of the busy-rank point-to-point relay (``_busy_p2p``).
P2P_PROBE_REPS = 60
#: Schedule steps and micro-batches of the pipeline-chunk probe (``_pipeline_chunk``).
PIPELINE_PROBE_REPS = 8
PIPELINE_PROBE_MICROBATCHES = 4


def _median_step(step, reps: int, warmup: int = 3) -> tuple[float, float]:
    times = [step() for _ in range(reps + warmup)][warmup:]
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def _wrapped_layer_step(block, x):
    """(fwd_s, bwd_s) closure of a wrapped probe block (DTensor TP or FSDP2) on input ``x``."""
    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        y = block(x)
        t1 = time.perf_counter()
        y.sum().backward()
        return t1 - t0, time.perf_counter() - t1
    return step


def _optimizer_per_tensor_s(params, reps: int) -> float:
    from executors.parallel import ADAM_BETAS, WEIGHT_DECAY

    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(params, lr=1e-3, betas=ADAM_BETAS, weight_decay=WEIGHT_DECAY)
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) / len(params)


def _busy_p2p(rank: int, step, reps: int, shape: tuple[int, ...]) -> tuple[float, float, float]:
    """A two-rank relay as a pipeline runs it: rank 0 computes (the probe layer's forward and
    backward), sends its activation to rank 1, which was blocked in its receive, computes and
    sends back. Returns (wall time of the relay on this rank, this rank's compute in it, the
    time this rank spent in its sends)."""
    buf = torch.zeros(shape)
    peer = 1 - rank
    compute = send = 0.0
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        if rank == 1:
            dist.irecv(buf, src=peer).wait()
        c = time.perf_counter()
        step()
        d = time.perf_counter()
        dist.isend(buf, dst=peer).wait()
        compute, send = compute + d - c, send + time.perf_counter() - d
        if rank == 0:
            dist.irecv(buf, src=peer).wait()
    return time.perf_counter() - t0, compute, send


def _busy_stream(rank: int, step, reps: int, shape: tuple[int, ...]) -> tuple[float, float]:
    """Two busy ranks in a stream, as GPipe's forward phase runs them: rank 0 computes and
    posts an asynchronous send it does not wait for (gloo's thread must deliver it while both
    ranks compute), rank 1 waits for each message, then computes. Returns (wall time, compute)
    of this rank; rank 1's period less the slower rank's compute is the delivery delay."""
    bufs = [torch.zeros(shape) for _ in range(reps)]
    peer = 1 - rank
    compute, works = 0.0, []
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(reps):
        if rank == 1:
            dist.irecv(bufs[i], src=peer).wait()
        c = time.perf_counter()
        step()
        compute += time.perf_counter() - c
        if rank == 0:
            works.append(dist.isend(bufs[i], dst=peer))
    wall = time.perf_counter() - t0
    for w in works:
        w.wait()
    return wall, compute


def _pipeline_chunk(rank: int, world: int, device, spec, reps: int) -> tuple[float, float]:
    """(forward, backward) median seconds of one ``PipelineStage`` chunk of the probe layer
    (torch.distributed.pipelining, a GPipe schedule over all ranks, timed as
    ``executors.measure.instrument_stage`` times a run's chunks): the probe layer plus the
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


def _ends_steps(spec, mesh, device) -> dict:
    """Step closures of the probe model's ends (``executors.model.Transformer`` with no
    layers), plain and wrapped as ``executors.parallel`` wraps a whole model: the embedding
    alone and the head alone (final norm, output projection and loss) under DTensor TP, with
    and without SP (each end holds its own TP collectives), and both ends together as FSDP2's
    root group (``fully_shard`` of the model, one gather and reduce-scatter for all of them).
    Keys: embed, head, tp_embed, tp_head, tp_sp_embed, tp_sp_head, ends, fsdp_zero2_root,
    fsdp_zero3_root."""
    from torch.distributed.fsdp import fully_shard

    from executors.model import Transformer, loss_fn
    from executors.parallel import apply_tp

    s, h, world = spec.seq_len, spec.hidden, mesh.size()
    ends = probe_spec(layers=0)
    tokens = torch.randint(0, spec.vocab, (1, s), device=device)
    labels = torch.randint(0, spec.vocab, (1, s), device=device)

    def model(part: str, wrap=None):
        m = Transformer(ends).to(device)
        if part == "embed":
            m.norm = m.output = None
        elif part == "head":
            m.embed = None
        if wrap:
            wrap(m)
        return m

    def step(m, x, head: bool):
        def run() -> tuple[float, float]:
            t0 = time.perf_counter()
            y = m(x)
            loss = loss_fn(y, labels) if head else y.sum()
            t1 = time.perf_counter()
            loss.backward()
            return t1 - t0, time.perf_counter() - t1
        return run

    def hidden(sharded: bool):
        return torch.randn(1, s // world if sharded else s, h, device=device, requires_grad=True)

    out = {"embed": step(model("embed"), tokens, False), "head": step(model("head"), hidden(False), True),
           "ends": step(model("ends"), tokens, True)}
    for name, sp in (("tp", False), ("tp_sp", True)):
        out[f"{name}_embed"] = step(model("embed", lambda m: apply_tp(m, mesh, sp)), tokens, False)
        out[f"{name}_head"] = step(model("head", lambda m: apply_tp(m, mesh, sp)), hidden(sp), True)
    for name, reshard in (("fsdp_zero2_root", False), ("fsdp_zero3_root", True)):
        out[name] = step(model("ends", lambda m: fully_shard(m, mesh=mesh, reshard_after_forward=reshard)),
                         tokens, True)
    return out


#: Wrapped end of the probe model -> its plain counterpart (``_ends_steps``).
ENDS_BASE = {"tp_embed": "embed", "tp_head": "head", "tp_sp_embed": "embed", "tp_sp_head": "head",
             "fsdp_zero2_root": "ends", "fsdp_zero3_root": "ends"}


def _parallel_probe_rank(rank: int, world: int, device, reps: int, rounds: int = PARALLEL_PROBE_ROUNDS) -> dict:
    """Both ranks at once: the probe layer plain, under DTensor TP (with and without SP,
    ``executors.parallel``'s plan) and under FSDP2 (reshard after forward or not), and
    AdamW over plain and DTensor (FSDP2-sharded) parameters. The layer variants run in
    ``rounds`` interleaved rounds (each the median of its steps), so that load from other
    processes, which comes and goes by the second, falls on plain and wrapped alike; last,
    the busy-rank point-to-point relay (``_busy_p2p``) between ranks 0 and 1."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from executors.model import Block
    from executors.parallel import _block_tp_plan

    torch.manual_seed(0)
    spec = probe_spec()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("x",))
    s, h = spec.seq_len, spec.hidden
    steps = {"plain": _layer_step(spec, device)}
    for name, sp in (("tp", False), ("tp_sp", True)):
        block = Block(spec).to(device)
        parallelize_module(block, mesh, _block_tp_plan(block, sp))
        x = torch.randn(1, s // world if sp else s, h, device=device, requires_grad=True)  # (B, T[/t], H)
        steps[name] = _wrapped_layer_step(block, x)
    dtensor_params = []
    for name, reshard in (("fsdp_zero2", False), ("fsdp_zero3", True)):
        block = Block(spec).to(device)
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        x = torch.randn(1, s, h, device=device, requires_grad=True)
        steps[name] = _wrapped_layer_step(block, x)
        if reshard:
            dtensor_params = list(block.parameters())
    steps.update(_ends_steps(spec, mesh, device))
    per_round = max(2, reps // rounds)
    out: dict = {"rounds": [{k: _median_step(st, per_round, warmup=3 if r == 0 else 1) for k, st in steps.items()}
                            for r in range(rounds)]}
    for k in steps:
        out[k] = tuple(statistics.median(rd[k][i] for rd in out["rounds"]) for i in range(2))
    out["opt_dtensor"] = _optimizer_per_tensor_s(dtensor_params, reps)
    out["opt_plain"] = _optimizer_per_tensor_s(list(Block(spec).to(device).parameters()), reps)
    if rank < 2:
        out["p2p"] = _busy_p2p(rank, steps["plain"], P2P_PROBE_REPS, (1, s, h))
        out["stream"] = _busy_stream(rank, steps["plain"], P2P_PROBE_REPS, (1, s, h))
    if world == 2:
        out["pipeline_chunk"] = _pipeline_chunk(rank, world, device, spec, PIPELINE_PROBE_REPS)
    dist.barrier()
    return out


def _round_kernels(rows: list[dict], name: str, kf: int, kb: int, base: str = "plain") -> tuple[float, float]:
    """Median over the interleaved rounds of (forward, backward) extra kernels of ``name``
    over ``base`` (its unwrapped counterpart), each round in units of its own plain layer's
    per-kernel time (ranks averaged)."""
    fwd, bwd = [], []
    for i in range(len(rows[0]["rounds"])):
        rds = [r["rounds"][i] for r in rows]
        plain = [statistics.mean(rd["plain"][j] for rd in rds) for j in range(2)]
        ref = [statistics.mean(rd[base][j] for rd in rds) for j in range(2)]
        var = [statistics.mean(rd[name][j] for rd in rds) for j in range(2)]
        per_kernel = sum(plain) / (kf + kb)
        fwd.append((var[0] - ref[0]) / per_kernel)
        bwd.append((var[1] - ref[1]) / per_kernel)
    return max(0.0, statistics.median(fwd)), max(0.0, statistics.median(bwd))


def _p2p_kernels(rows: list[dict], per_kernel: float) -> tuple[dict, dict]:
    """(raw seconds, kernel-unit figures) of the relay and stream probes of ranks 0 and 1."""
    (wall, c0, s0), (_, c1, s1) = rows[0]["p2p"], rows[1]["p2p"]
    per_message = max(0.0, (wall - c0 - c1) / (2 * P2P_PROBE_REPS))
    send = min(per_message, (s0 + s1) / (2 * P2P_PROBE_REPS))
    (_, sc0), (wall1, sc1) = rows[0]["stream"], rows[1]["stream"]
    stream_delay = max(0.0, (wall1 - max(sc0, sc1)) / P2P_PROBE_REPS)
    raw = {"p2p_per_message_s": per_message, "p2p_send_s": send, "p2p_stream_delay_s": stream_delay}
    return raw, {"p2p_send_kernels": send / per_kernel, "p2p_latency_kernels": stream_delay / per_kernel,
                 "p2p_wake_kernels": (per_message - send) / per_kernel}


def _p2p_probe_rank(rank: int, world: int, device, reps: int) -> dict:
    """The plain probe layer on both ranks at once (the kernel unit), then the relay and the stream."""
    torch.manual_seed(0)
    spec = probe_spec()
    step = _layer_step(spec, device)
    out = {"plain": _median_step(step, reps)}
    out["p2p"] = _busy_p2p(rank, step, P2P_PROBE_REPS, (1, spec.seq_len, spec.hidden))
    out["stream"] = _busy_stream(rank, step, P2P_PROBE_REPS, (1, spec.seq_len, spec.hidden))
    dist.barrier()
    return out


def bench_p2p(reps: int = 10) -> dict:
    """The pipeline point-to-point figures alone (two ranks, fork, gloo): the kernel-unit
    ``p2p_*_kernels`` of ``bench_parallel_host``, for the quick refresh under load."""
    from executors.launch import spawn

    rows = spawn(_p2p_probe_rank, 2, (reps,), timeout_s=120, start_method="fork")
    kf, kb = probe_kernels(probe_spec())
    per_kernel = statistics.mean(sum(r["plain"]) for r in rows) / (kf + kb)
    return _p2p_kernels(rows, per_kernel)[1]


def bench_parallel_host(world: int = 2, reps: int = PARALLEL_PROBE_REPS, rounds: int = PARALLEL_PROBE_ROUNDS) -> dict:
    """The torch-parallel host cost on ``world`` ranks (fork, gloo), in units of the plain
    probe layer's per-kernel cost measured in the same launch (so that load from other
    processes cancels): extra kernels per layer forward and backward for DTensor TP, TP+SP,
    FSDP2 ZeRO-2/3 (their collectives' latency and dispatch included; the median over
    interleaved rounds), the same for the model's ends (``_ends_steps``: TP's embedding and
    head, FSDP2's root group, each over its plain counterpart; on the 4-layer validation
    model they add 12-22% to the layers' wrapper cost), AdamW's cost per parameter tensor, plain and DTensor, and the
    point-to-point latency between busy ranks (the relay's wall time less both ranks'
    compute, per message). Ranks' medians are averaged."""
    from executors.launch import spawn

    rows = spawn(_parallel_probe_rank, world, (reps, rounds), timeout_s=240, start_method="fork")
    kf, kb = probe_kernels(probe_spec())
    keys = [k for k in rows[0] if k not in ("rounds", "p2p", "stream")]
    avg = {k: tuple(statistics.mean(r[k][i] for r in rows) for i in range(2)) if isinstance(rows[0][k], tuple)
           else statistics.mean(r[k] for r in rows) for k in keys}
    per_kernel = sum(avg["plain"]) / (kf + kb)
    out = {"ranks": world, "per_kernel_s": per_kernel, "raw": {k: list(v) if isinstance(v, tuple) else v
                                                                for k, v in avg.items()}}
    for name, base in (*((n, "plain") for n in ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3")), *ENDS_BASE.items()):
        f, b = _round_kernels(rows, name, kf, kb, base)
        out[name] = {"forward_kernels": f, "backward_kernels": b}
    out["optimizer_per_tensor_kernels"] = avg["opt_plain"] / per_kernel
    out["optimizer_dtensor_per_tensor_kernels"] = avg["opt_dtensor"] / per_kernel
    raw, kernels = _p2p_kernels(rows, per_kernel)
    out["raw"].update(raw)
    out.update(kernels)
    if "pipeline_chunk" in avg:   # a stage's chunk over the plain layer, both ranks averaged
        out["pipeline_chunk"] = {"forward_kernels": max(0.0, (avg["pipeline_chunk"][0] - avg["plain"][0]) / per_kernel),
                                 "backward_kernels": max(0.0, (avg["pipeline_chunk"][1] - avg["plain"][1]) / per_kernel)}
    return out


# --------------------------------------------------------------------------- collectives

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
    return float(elapsed) / (2.0 if halve else 1.0)


def _collective_rank(rank: int, world: int, device, sizes: tuple[int, ...], nbytes_list: tuple[int, ...]) -> list[dict]:
    """Every op and size on groups of each size in ``sizes`` (ranks 0..n-1; the others wait)."""
    rows = []
    for n in sizes:
        group = None if n == world else dist.new_group(list(range(n)))
        if rank < n:
            for op in WIRE_FACTOR:
                for nbytes in nbytes_list:
                    fn = _collective_fn(op, nbytes, rank, n, device, group)
                    rows.append({"op": op, "ranks": n, "bytes": nbytes,
                                 "seconds": _time_collective(fn, device, group, halve=op == "send_recv")})
        dist.barrier()
    return rows


def bench_collectives(backend: str, group_sizes=GROUP_SIZES, nbytes_list=COLLECTIVE_BYTES) -> list[dict]:
    """One launch of max(group_sizes) ranks (fork on CPU); rank 0's rows."""
    from executors.launch import spawn

    method = "fork" if backend == "gloo" else "spawn"
    world = max(group_sizes)
    out = spawn(_collective_rank, world, (tuple(sorted(group_sizes)), tuple(nbytes_list)), timeout_s=120,
                start_method=method)
    return out[0]


# --------------------------------------------------------------------------- oversubscription

#: The workload of the executor slowdown probe: the local validation matrix's tiny model
#: (validation/local.yaml's base; a modelling choice: the workload whose slowdown the
#: predictions must carry).
STEP_PROBE_MODEL = dict(name="step-probe", layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=256,
                        seq_len=32, tied_embeddings=False)


def _window_rate(fn, work: float, window_s: float, group) -> float:
    """Work per second of ``fn`` repeated for ``window_s``, started on a gloo barrier of ``group``."""
    dist.barrier(group=group)
    reps, start = 0, time.perf_counter()
    while reps < 2 or time.perf_counter() - start < window_s:
        fn()
        reps += 1
    return reps * work / (time.perf_counter() - start)


def _oversub_rank(rank: int, world: int, device, ranks: tuple[int, ...], size: int, window_s: float,
                  cycles: int) -> list[dict]:
    """One rank of the oversubscription probe, in a process set up exactly as the executor
    sets up its ranks (``executors.launch.spawn``: one intra-op thread, a gloo process group
    with its background threads): for each rank count n in ``ranks`` (interleaved over
    ``cycles`` rounds) ranks 0..n-1 run the GEMM and the probe layer, each over a window they
    start together on a barrier, while the others wait blocked in a barrier (no CPU). Rows
    of (cycle, n, rates) of this rank."""
    torch.manual_seed(rank)
    a, b = torch.randn(size, size), torch.randn(size, size)
    layer = _layer_step(probe_spec(), device)
    for fn in (lambda: a @ b, layer):   # warm-up
        fn()
    groups = {n: None if n == world else dist.new_group(list(range(n))) for n in ranks}
    rows = []
    for cycle in range(cycles):
        for n in ranks:
            if rank < n:
                g = groups[n]
                rows.append({"cycle": cycle, "n": n,
                             "matmul": _window_rate(lambda: a @ b, 2.0 * size**3, window_s, g),
                             "layer": _window_rate(layer, 1.0, window_s, g)})
            dist.barrier()
    return rows


#: Steps (after warm-up) of each executor run of the slowdown probe, and its interleaved
#: rounds (median kept). A noise choice: on the 2-core validation host one round's 2-rank
#: forward slowdown read anywhere from 1.05x to 1.73x.
SLOWDOWN_STEPS, SLOWDOWN_WARMUP, SLOWDOWN_ROUNDS = 8, 2, 5
#: Executor phases whose time the slowdown probe compares: those with no collective in them
#: (DDP's gradient all-reduce runs inside ``backward``), so the comm model is not counted twice.
SLOWDOWN_PHASES = ("forward", "optimizer")


def _probe_plan(ranks: int, profile=None):
    """A data-parallel plan of ``STEP_PROBE_MODEL`` on ``ranks`` ranks of this host (with the
    profile at ``profile``, default this host's cached one), four micro-batches of one
    sample per rank per step."""
    from simcore.spec import plan_from_dict

    model = {k: v for k, v in STEP_PROBE_MODEL.items() if k not in ("kv_heads", "ffn_hidden")}
    cluster = {"node": "localhost", "gpus_per_node": max(OVERSUB_RANKS), **({"profile": str(profile)} if profile else {})}
    return plan_from_dict({"name": f"slowdown-probe-dp{ranks}", "model": model, "cluster": cluster,
                           "parallel": {"dp": ranks},
                           "training": {"global_batch": 4 * ranks, "micro_batch": 1, "precision": "fp32"}},
                          Path("."))


def bench_executor_slowdown(ranks=OVERSUB_RANKS, cycles: int = OVERSUB_CYCLES) -> tuple[dict, dict]:
    """Per-rank slowdown of a real training step when ``n`` ranks share this host: the
    executor itself (``executors.launch.run``, fork, gloo: its threads, DDP, autograd and
    AdamW as a validation run has them) on ``_probe_plan(n)``, the time of
    ``SLOWDOWN_PHASES`` per rank with n ranks over that with one, median over ``cycles``
    interleaved rounds. Returns ({n: slowdown} (1.0 for one rank), the one-rank run's
    compute phases: forward and backward, median over the rounds, which
    ``anchor_to_executor`` uses)."""
    from executors.launch import run

    ratios: dict = {n: [] for n in ranks}
    one: dict = {"forward": [], "backward": []}
    for _ in range(cycles):
        t = {}
        for n in ranks:
            m = run(_probe_plan(n), steps=SLOWDOWN_STEPS, warmup=SLOWDOWN_WARMUP, start_method="fork")
            t[n] = sum(m.time_s.get(k, 0.0) for k in SLOWDOWN_PHASES)
            if n == 1:
                for k in one:
                    one[k].append(m.time_s.get(k, 0.0))
        for n in ranks:
            ratios[n].append(t[n] / t[min(ranks)])
    slowdown = {n: max(1.0, statistics.median(v)) for n, v in ratios.items()}
    return slowdown, ({k: statistics.median(v) for k, v in one.items()} if one["forward"] else {})


def anchor_to_executor(profile: dict, profile_path) -> dict:
    """Scale a CPU profile's compute figures (per-kernel kernel and dispatch times up, the
    peak and memory bandwidth down, all by one ratio) so that the executor's own one-rank step of the
    slowdown probe (``_probe_plan(1)``: same model class, same launch, measured in the same
    calibration) is predicted as measured. The probe layer and the GEMM grid run in
    isolation; a training step's forward and backward run among the optimizer's and the
    other layers' tensors, which on a small shared host cost 10-40% more than the isolated
    probes predict. The ratio and the step it came from are kept under
    ``efficiency.executor_anchor``. ``profile_path`` must hold ``profile`` (the plan is
    resolved from it)."""
    from simcore.simulate import simulate

    one = (profile.get("raw") or {}).get("executor_one_rank") or {}
    if not one.get("forward"):
        return profile
    pred = simulate(_probe_plan(1, profile_path), engine="analytic").time_s
    r = (one["forward"] + one["backward"]) / (pred["forward"] + pred["backward"])
    _scale_compute(profile, r, host_unit=False)
    profile["efficiency"]["executor_anchor"] = {
        "ratio": r, "measured_s": dict(one),
        "source": f"forward + backward of the executor's one-rank {_probe_plan(1).name} step ({SLOWDOWN_STEPS - SLOWDOWN_WARMUP} "
                  f"steps, median of the calibration's rounds) over the profile's prediction before this scaling"}
    atomic_write_text(profile_path, yaml.safe_dump(profile, sort_keys=False))
    return profile


def _scale_compute(profile: dict, r: float, *, host_unit: bool = True) -> None:
    """Compute time x r: per-kernel host, kernel and dispatch times times r, peaks and
    memory bandwidth over r. ``host_unit=False`` leaves ``host_overhead_us`` alone: on a
    serial device it is only the unit of the separately measured parallel-wrapper,
    checkpointing, optimizer and pipeline host costs, which the plain layer's compute
    does not move."""
    eff = profile["efficiency"]
    for key in ("host_overhead_us", "kernel_overhead_us", "dispatch_us"):
        if key == "host_overhead_us" and not host_unit:
            continue
        if eff.get(key):
            eff[key] *= r
    dev = profile["device"]
    dev["dense_tflops"] = {p: (v / r if v else v) for p, v in dev["dense_tflops"].items()}
    dev["hbm_tbyte_per_s"] /= r


def derive_oversubscription(measured: dict) -> dict:
    """Per-rank tables ``topologies.hardware.scale_for_ranks`` applies: with n ranks, the
    one-rank GEMM rate and layer rate over the executor's measured slowdown with n ranks
    (``bench_executor_slowdown``). What slows a run's ranks when they share cores (DDP and
    gloo threads, the autograd engine, caches and memory bandwidth) is not what slows a lone
    GEMM or layer: on the 2-core validation host those probes read 1.0-1.35x with 2 ranks
    while the executor's steps slowed ~1.3x, which left every multi-rank prediction too
    fast. Without a slowdown figure the measured tables stand."""
    slow = measured.get("slowdown") or {}
    if 1 not in slow:
        return {"matmul": dict(measured["matmul"]), "layer": dict(measured["layer"])}
    return {kind: {n: measured[kind][1] / slow[n] for n in slow} for kind in ("matmul", "layer")}


def bench_oversubscription(ranks=OVERSUB_RANKS, size: int = 256, window_s: float = OVERSUB_WINDOW_S,
                           cycles: int = OVERSUB_CYCLES) -> dict:
    """Per-rank GEMM FLOP/s and probe-layer steps/s when ``n`` ranks run at once (CPU hosts),
    in one fork launch of max(ranks) ranks configured as the executor's ranks
    (``_oversub_rank``; the rank counts interleaved over ``cycles`` rounds, median kept, so
    that load from other processes that comes and goes biases every count alike), and the
    executor's slowdown with n ranks (``bench_executor_slowdown``). Returns the derived
    tables (``derive_oversubscription``) under "matmul" and "layer", the slowdown under
    "slowdown" and the measured GEMM and layer rates under "raw"."""
    from executors.launch import spawn

    ranks = tuple(sorted(ranks))
    per_rank = spawn(_oversub_rank, max(ranks), (ranks, size, window_s, cycles), timeout_s=180, start_method="fork")
    samples: dict = {kind: {n: [] for n in ranks} for kind in ("matmul", "layer")}
    for cycle in range(cycles):
        for n in ranks:
            rows = [r for rank_rows in per_rank for r in rank_rows if r["cycle"] == cycle and r["n"] == n]
            for kind in samples:
                samples[kind][n].append(statistics.mean(r[kind] for r in rows))
    measured = {kind: {n: statistics.median(v) for n, v in by_n.items()} for kind, by_n in samples.items()}
    measured["slowdown"], one_rank = bench_executor_slowdown(ranks, SLOWDOWN_ROUNDS if cycles > 1 else 1)
    return {**derive_oversubscription(measured), "slowdown": measured["slowdown"], "one_rank_step": one_rank,
            "raw": {"matmul": measured["matmul"], "layer": measured["layer"]}}


# --------------------------------------------------------------------------- fitting

def fit_alpha_beta(rows: list[dict]) -> dict:
    """Least-squares t = alpha + wire_bytes / beta per (op, ranks), alpha >= 0, weighted by
    1/t^2 (relative residuals): the sizes span three decades, and an unweighted fit would
    let the largest message's noise set the latency."""
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
        slope = max(slope, 1e-15)
        alpha = max(0.0, my - slope * mx)
        fits.setdefault(op, {})[n] = {"alpha_s": alpha, "bus_bytes_per_s": 1.0 / slope}
    return fits


def split_ring_latency(fits: dict) -> tuple[float, dict]:
    """The p2p (hop) latency from the ping-pong fit of the smallest group, and each
    all-reduce fit's base latency: its alpha less the 2(n-1) hops of
    ``simcore.collectives.ring_all_reduce_s``'s latency term (never below zero)."""
    sr = fits.get("send_recv", {})
    hop = sr[min(sr)]["alpha_s"] if sr else 0.0
    ar = fits.get("all_reduce", {})
    for n, f in ar.items():
        f["base_latency_s"] = max(0.0, f["alpha_s"] - 2 * (n - 1) * hop)
    return hop, ar


def matmul_curve(rows: list[dict], precision: str, peak: float) -> list[list[float]]:
    """Efficiency points (GEMM FLOPs, fraction of the measured peak), median per size.
    Where cold-cache layer-shaped GEMMs were timed (CPU hosts), the curve is theirs alone:
    the hot square grid only sets the peak."""
    cold = any(r.get("cold") and r["precision"] == precision for r in rows)
    by_flops: dict[float, list[float]] = {}
    for r in rows:
        if r["precision"] == precision and bool(r.get("cold")) == cold:
            by_flops.setdefault(r["flops"], []).append(r["flops_per_s"] / peak)
    return [[f, round(min(1.0, statistics.median(v)), 4)] for f, v in sorted(by_flops.items())]


def _per_rank(table: dict) -> dict:
    return {int(k): float(v) for k, v in sorted(table.items())}


def build_profile(matmul, memory, collectives, oversub, h2d, device: torch.device, *,
                  host: dict | None = None, optimizer: dict | None = None, parallel: dict | None = None,
                  seconds: float = 0.0) -> dict:
    """The profile document from the raw measurements."""
    hostname = socket.gethostname()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = f"measured by trainplan calibrate on {hostname}, {date}"
    peaks = {p: max(r["flops_per_s"] for r in matmul if r["precision"] == p)
             for p in {r["precision"] for r in matmul}}
    fits = fit_alpha_beta(collectives)
    hop, ar = split_ring_latency(fits)
    ring = ar[max(ar)]
    cpu = device.type == "cpu"
    if not cpu:
        props = torch.cuda.get_device_properties(device)
        name, hbm_gib = props.name.lower().replace(" ", "-"), props.total_memory / GIB
    else:
        name, hbm_gib = f"cpu-{platform.machine()}", _host_memory_gib()
    main_precision = "bf16" if "bf16" in peaks and not cpu else "fp32"
    cores = os.cpu_count() or 1
    efficiency = {
        "matmul": {"points": matmul_curve(matmul, main_precision, peaks[main_precision]),
                   "source": f"{source}; GEMM grid of {len(matmul)} shapes"},
        "attention": {"forward": _attention_efficiency(matmul, main_precision, peaks[main_precision]),
                      "backward": _attention_efficiency(matmul, main_precision, peaks[main_precision]),
                      "source": f"{source}; no fused attention kernel on this device: its matmul efficiency"},
        "memory_bound": {"efficiency": 1.0, "source": f"{source}; the measured copy bandwidth is the peak"},
        "kernel_overhead_us": memory["kernel_overhead_s"] * 1e6,
        "kernel_overhead_source": f"{source}; one-element add",
        "collective": {
            "nvlink_efficiency": 1.0, "nic_efficiency": 1.0,
            "base_latency_us": ring["base_latency_s"] * 1e6, "nvlink_hop_latency_us": hop * 1e6,
            "net_hop_latency_us": 0.0,
            "source": f"{source}; alpha-beta fit of all_reduce on {max(ar)} ranks; hop latency: half a "
                      f"send/recv round trip on {min(fits['send_recv'])} ranks",
        },
    }
    if host:
        efficiency["host_overhead_us"] = _host_overhead_s(host, oversub) * 1e6
        efficiency["host_overhead_source"] = (
            f"{source}; eager forward+backward of a tiny transformer layer (hidden {PROBE_LAYER['hidden']}, "
            f"seq {PROBE_LAYER['seq_len']}) over the {host['forward_kernels'] + host['backward_kernels']} "
            "kernels simcore.workload counts for it")
        if cpu:
            efficiency["dispatch_us"] = _dispatch_s(efficiency, peaks[main_precision], memory["copy_bytes_per_s"]) * 1e6
            efficiency["dispatch_source"] = (
                f"{source}; the same probe layer's per-kernel time less its modelled device time (the "
                "cold-cache matmul curve and copy bandwidth): on a CPU the issuing thread runs each kernel, "
                "so simcore.compute.phase_s adds this to the device time")
    if optimizer:
        efficiency["optimizer"] = {"per_tensor_us": optimizer["per_tensor_s"] * 1e6,
                                   "param_gbyte_per_s": optimizer["param_bytes_per_s"] / 1e9,
                                   "source": f"{source}; torch.optim.AdamW step over 3 parameter sets"}
    if parallel:
        bc = (fits.get("broadcast") or {}).get(2, {})
        # the wrapper costs were counted in the probe's own per-kernel time on ``ranks`` ranks;
        # the simulator charges them in its per-kernel time for that many ranks (the one-rank
        # figure times the executor-derived slowdown): convert, so the measured seconds return
        layer = oversub.get("layer") or {}
        one = host["per_kernel_s"] * layer[1] * sum(probe_kernels(probe_spec())) if host and 1 in layer else 1.0
        efficiency["parallel_host"] = {
            **wrapper_kernels(parallel, layer),
            "broadcast_latency_us": bc.get("alpha_s", 0.0) * 1e6,
            "p2p_latency_kernels": parallel.get("p2p_latency_kernels", 0.0),
            "p2p_send_kernels": parallel.get("p2p_send_kernels", 0.0),
            "p2p_wake_kernels": parallel.get("p2p_wake_kernels", 0.0),
            **({k: {n: x * one for n, x in v.items()} for k, v in recompute_kernels(
                host, peaks[main_precision], memory["copy_bytes_per_s"], efficiency).items()} if host else {}),
            "recompute_unit_factor": one,
            "source": f"{source}; probe layer on {parallel['ranks']} ranks at once, plain vs DTensor TP "
                      "(executors.parallel's plan, with and without SP) vs FSDP2, in units of the plain "
                      "layer's per-kernel time, median of interleaved rounds; *_embed / *_head / *_root: "
                      "the model's ends (no layers) under TP, and under FSDP2 as the root group, over "
                      "the same ends plain, per micro-batch; AdamW per plain / DTensor "
                      "tensor; broadcast: its 2-rank alpha; p2p: a two-rank relay of the probe layer, its cost per message less the send call (wake), the sender's blocking send call; "
                      "latency: two busy ranks streaming unwaited sends, the receiver's period less the "
                      "slower rank's compute (delivery by gloo's thread while both ranks compute); recompute_full/"
                      "selective: the probe layer under checkpoint_wrapper in one process, beyond the "
                      "recomputed ops, interleaved with the plain layer; *_unit_factor: each probe's "
                      "per-kernel time over the simulator's for the same rank count, applied to its "
                      "figures"}
    if cpu:
        efficiency["memory"] = {
            "framework_bytes": 0.0, "allocator_fragmentation": 0.0, "comm_buffers": False,
            "executor_activations": True,
            "source": "CPU host: no CUDA context or caching allocator; the executor counts the tensors "
                      "a rank owns (executors/measure.py), which DDP's bucket buffers are not, and the "
                      "tensors its torch model saves for backward (simcore.workload.executor_activation_bytes)"}
        if oversub.get("layer"):
            efficiency["host_oversubscription"] = {str(k): v for k, v in _per_rank(oversub["layer"]).items()}
    return {
        "measured_on": {"host": hostname, "date": date, "torch": str(torch.__version__), "device": str(device),
                        "backend": "gloo" if cpu else "nccl", "cpu_cores": cores,
                        "calibration_s": round(seconds, 1)},
        "device": {
            "name": name, "description": f"{name} on {hostname} (calibrated)", "vendor": device.type,
            "dense_tflops": {p: (peaks[p] / 1e12 if p in peaks else None) for p in ("fp32", "tf32", "bf16", "fp16", "fp8")},
            "hbm_gib": round(hbm_gib, 3),
            "hbm_tbyte_per_s": memory["copy_bytes_per_s"] / 1e12,
            "intra_link": "shared-memory" if cpu else "pcie",
            "intra_link_gbyte_per_s_bidir": 2 * ring["bus_bytes_per_s"] / 1e9,
            "pcie_gen": 0,
            "pcie_gbyte_per_s_bidir": 2 * (h2d or memory["copy_bytes_per_s"]) / 1e9,
            "tdp_w": 0.0,
            "source": source,
        },
        "node": {"cpu_cores": cores, "host_memory_gib": round(_host_memory_gib(), 3)},
        "efficiency": efficiency,
        "oversubscription": {"matmul_flops_per_s_per_rank": _per_rank(oversub.get("matmul", {})),
                             "layer_steps_per_s_per_rank": _per_rank(oversub.get("layer", {})),
                             "executor_slowdown": _per_rank(oversub.get("slowdown", {})),
                             "source": f"{source}; one-rank GEMM and probe-layer rates (one thread, gloo "
                                       "process group) over the executor's slowdown with n ranks: "
                                       "forward + optimizer time per rank of a data-parallel run of the "
                                       "validation tiny model on n ranks over one rank, median of "
                                       "interleaved rounds"},
        "collectives": fits,
        "raw": {"matmul": matmul, "memory": memory, "collectives": collectives, "h2d_bytes_per_s": h2d,
                "host_overhead": host, "optimizer": optimizer, "parallel_host": parallel,
                "executor_one_rank": oversub.get("one_rank_step") or {}},
    }


def _host_overhead_s(host: dict, oversub: dict) -> float:
    """Per-kernel host cost. On a CPU host, from the one-rank oversubscription probe (the
    same layer), so that ``topologies.hardware.scale_for_ranks``, which multiplies it by
    layer[1] / layer[n], gives exactly the per-rank cost measured with n ranks running;
    elsewhere the main-process probe."""
    one = (oversub.get("layer") or {}).get(1)
    if not one:
        return host["per_kernel_s"]
    return 1.0 / (one * (host["forward_kernels"] + host["backward_kernels"]))


def wrapper_kernels(parallel: dict, layer: dict) -> dict:
    """The torch-wrapper host costs of ``bench_parallel_host`` (TP, TP+SP, FSDP2, pipeline
    chunk, AdamW per tensor) converted from the probe's own per-kernel time on its ranks to
    the simulator's for that rank count (the one-rank figure over the executor-derived
    slowdown, 1 / (layer[n] x kernels)), so the seconds the probe measured come back;
    the factor is kept as ``parallel_unit_factor``."""
    kernels = sum(probe_kernels(probe_spec()))
    n = parallel["ranks"]
    unit = parallel["per_kernel_s"] * layer[n] * kernels if n in layer else 1.0
    out = {k: {name: v * unit for name, v in parallel[k].items()}
           for k in ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3", "pipeline_chunk", *ENDS_BASE) if k in parallel}
    out["optimizer_per_tensor_kernels"] = parallel["optimizer_per_tensor_kernels"] * unit
    out["optimizer_dtensor_per_tensor_kernels"] = parallel["optimizer_dtensor_per_tensor_kernels"] * unit
    out["parallel_unit_factor"] = unit
    return out


def _probe_dispatch_s(per_kernel_s: float, peak: float, copy_bytes_per_s: float, efficiency: dict) -> float:
    """Per-kernel host time of a serial (CPU) device: the probe layer's measured per-kernel
    time less its device time per kernel under the profile's own curve."""
    from simcore.compute import serial_layer_s

    spec = probe_spec()
    f, b = serial_layer_s(spec, peak, copy_bytes_per_s, efficiency["matmul"]["points"],
                          float(efficiency["attention"]["forward"]))
    return max(0.0, per_kernel_s - (f + b) / sum(probe_kernels(spec)))


def _dispatch_s(efficiency: dict, peak: float, copy_bytes_per_s: float) -> float:
    """``_probe_dispatch_s`` of the profile's own per-kernel time (``host_overhead_us``)."""
    return _probe_dispatch_s(efficiency["host_overhead_us"] * 1e-6, peak, copy_bytes_per_s, efficiency)


def _attention_efficiency(rows, precision, peak) -> float:
    """Attention on a device without a fused kernel runs as batched GEMMs of size s x s x d."""
    mid = [r for r in rows if r["precision"] == precision and r["m"] == 256]
    return round(statistics.median(r["flops_per_s"] for r in mid) / peak, 4) if mid else 0.5


def _host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return 0.0


def calibrate(out: str | os.PathLike, *, quick: bool = False, progress: bool = True) -> dict:
    """Measure this host and write its profile to ``out`` atomically; return the profile."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    precisions = ["bf16", "fp16"] if device.type == "cuda" else ["fp32", "bf16"]
    sizes = MATMUL_SIZES[:4] if quick else MATMUL_SIZES
    with tqdm(total=len(precisions) + 7, desc="calibrate", disable=not progress, unit="bench") as bar:
        matmul = bench_matmul(device, precisions, sizes, bar)
        if device.type == "cpu":
            matmul += bench_layer_gemms(hidden=LAYER_GEMM_HIDDEN[:3] if quick else LAYER_GEMM_HIDDEN)
        memory = bench_memory(device)
        bar.update(1)
        h2d = bench_host_device(device)
        bar.update(1)
        host = bench_host_overhead(device, reps=10 if quick else 40)
        bar.update(1)
        optimizer = bench_optimizer(device)
        bar.update(1)
        oversub = {}
        if device.type == "cpu":
            oversub = bench_oversubscription((1, 2), window_s=0.1, cycles=1) if quick else bench_oversubscription()
        bar.update(1)
        backend = "nccl" if device.type == "cuda" and torch.cuda.device_count() >= 2 else "gloo"
        if backend == "nccl":
            groups = tuple(n for n in GROUP_SIZES if n <= torch.cuda.device_count())
        else:
            groups = (2,) if quick else GROUP_SIZES
        collectives = bench_collectives(backend, groups, COLLECTIVE_BYTES[:3] if quick else COLLECTIVE_BYTES)
        bar.update(1)
        parallel = bench_parallel_host(reps=4 if quick else PARALLEL_PROBE_REPS) if backend == "gloo" else None
        bar.update(1)
    profile = build_profile(matmul, memory, collectives, oversub, h2d, device, host=host, optimizer=optimizer,
                            parallel=parallel, seconds=time.perf_counter() - t0)
    atomic_write_text(out, yaml.safe_dump(profile, sort_keys=False))
    return anchor_to_executor(profile, out)


# --------------------------------------------------------------------------- refresh under load

def refresh_host_speed(profile_path, *, window_s: float = REFRESH_WINDOW_S, cycles: int = REFRESH_CYCLES) -> dict:
    """Re-measure the load-sensitive host figures of a CPU profile now (~25 s): the
    oversubscription probes (1, 2, 4 ranks, the executor's slowdown included), hence the
    per-kernel host overhead and the per-rank GEMM rates, the pipeline point-to-point
    figures (``bench_p2p``), and the anchor to the executor's one-rank step. (Re-measuring
    the torch wrappers' host cost here too, with a shorter ``bench_parallel_host``, was
    tried: it added as much noise per run as it removed bias; bench/RESULTS.md.) On a machine shared with other work the speed a rank gets changes
    from minute to minute, so a prediction compared with a run should use figures taken
    just before it. The other figures (in units of the host kernel, or fits) are kept."""
    profile = yaml.safe_load(Path(profile_path).read_text())
    if (profile.get("measured_on") or {}).get("device") != "cpu":
        return profile   # a GPU's speed does not depend on other processes' CPU load
    oversub = bench_oversubscription(window_s=window_s, cycles=cycles)
    eff = profile["efficiency"]
    anchor = eff.pop("executor_anchor", None)
    if anchor:   # back to the probes' own figures; re-anchored below on this refresh's run
        _scale_compute(profile, 1.0 / anchor["ratio"], host_unit=False)
    host = (profile.get("raw") or {}).get("host_overhead")
    if host:
        eff["host_overhead_us"] = _host_overhead_s(host, oversub) * 1e6
    eff["host_oversubscription"] = {str(k): v for k, v in _per_rank(oversub["layer"]).items()}
    if eff.get("parallel_host"):   # the pipeline hand-over between busy ranks moves with the load
        eff["parallel_host"].update(bench_p2p())
    old_one = (profile["oversubscription"].get("matmul_flops_per_s_per_rank") or {}).get(1)
    if old_one and oversub["matmul"].get(1):   # the one-rank GEMM rate moves the measured peak with it
        r = oversub["matmul"][1] / float(old_one)
        profile["device"]["dense_tflops"] = {p: (v * r if v else v) for p, v in profile["device"]["dense_tflops"].items()}
    if "dispatch_us" in eff:
        eff["dispatch_us"] = _dispatch_s(eff, profile["device"]["dense_tflops"]["fp32"] * 1e12,
                                         profile["device"]["hbm_tbyte_per_s"] * 1e12) * 1e6
    profile["oversubscription"]["matmul_flops_per_s_per_rank"] = _per_rank(oversub["matmul"])
    profile["oversubscription"]["layer_steps_per_s_per_rank"] = _per_rank(oversub["layer"])
    profile["oversubscription"]["executor_slowdown"] = _per_rank(oversub.get("slowdown", {}))
    profile.setdefault("raw", {})["executor_one_rank"] = oversub.get("one_rank_step") or {}
    profile["measured_on"]["refreshed"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    atomic_write_text(profile_path, yaml.safe_dump(profile, sort_keys=False))
    return anchor_to_executor(profile, profile_path)


# --------------------------------------------------------------------------- refit from a run

#: Measured phase (``StepResult.time_s`` key) -> the profile figure it refits.
#: Compute phases refit the host overhead and the peak together (both scale the
#: compute time of an overhead- or FLOP-bound phase); pp_comm the p2p hop latency;
#: dp_comm the all-reduce latency and bandwidth.
REFIT_PHASES = {"compute": ("forward", "backward", "recompute"), "pp": ("pp_comm",), "dp": ("dp_comm",)}
#: Ratios outside [1/REFIT_CLAMP, REFIT_CLAMP] are clamped: one noisy run must not move a
#: figure by more than this factor (a robustness choice, not hardware).
REFIT_CLAMP = 4.0


def _load_measured(path) -> dict:
    doc = json.loads(Path(path).read_text())
    return doc.get("measured", doc)   # a `trainplan validate --json` document or a `run --json` one


def _phase_ratio(pred: dict, meas: dict, keys: tuple[str, ...]) -> float | None:
    p = sum(float(pred.get(k, 0.0)) for k in keys)
    m = sum(float(meas.get(k, 0.0)) for k in keys)
    if p <= 0 or m <= 0:
        return None
    return min(REFIT_CLAMP, max(1.0 / REFIT_CLAMP, m / p))


def refit_profile(profile_path, measured_json_path, plan) -> dict:
    """Refit the profile's efficiency and bandwidth figures from a measured run of ``plan``
    (``trainplan run --json`` / ``validate --json`` output): each figure is scaled by the
    ratio of measured to predicted time of the phase it drives. Writes the profile back
    (atomically, the old figures kept under ``refits``) and returns it."""
    from simcore.simulate import simulate

    profile = yaml.safe_load(Path(profile_path).read_text())
    measured = _load_measured(measured_json_path)
    meas_t = measured.get("time_s") or (measured.get("breakdown") or {}).get("time_s") or {}
    if not meas_t:
        raise ValueError(f"{measured_json_path} has no 'time_s' phase breakdown (use `trainplan run --json`)")
    pred_t = simulate(plan, engine="des").time_s
    eff = profile["efficiency"]
    before = {"host_overhead_us": eff.get("host_overhead_us"), "kernel_overhead_us": eff.get("kernel_overhead_us"),
              "dispatch_us": eff.get("dispatch_us"),
              "dense_tflops": dict(profile["device"]["dense_tflops"]), "collective": dict(eff["collective"])}
    ratios = {k: _phase_ratio(pred_t, meas_t, keys) for k, keys in REFIT_PHASES.items()}
    if ratios["compute"]:
        _scale_compute(profile, ratios["compute"])
    if ratios["pp"]:
        eff["collective"]["nvlink_hop_latency_us"] *= ratios["pp"]
    if ratios["dp"]:
        _scale_all_reduce(profile, ratios["dp"])
    profile.setdefault("refits", []).append({
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "plan": plan.name, "measured": str(measured_json_path),
        "ratios": {k: v for k, v in ratios.items() if v}, "before": before})
    atomic_write_text(profile_path, yaml.safe_dump(profile, sort_keys=False))
    return profile


def _scale_all_reduce(profile: dict, ratio: float) -> None:
    """All-reduce time x ratio: latencies times it, bandwidths over it."""
    eff = profile["efficiency"]
    eff["collective"]["base_latency_us"] *= ratio
    for fit in (profile.get("collectives") or {}).get("all_reduce", {}).values():
        fit["alpha_s"] *= ratio
        if "base_latency_s" in fit:
            fit["base_latency_s"] *= ratio
        fit["bus_bytes_per_s"] /= ratio
    dev = profile["device"]
    dev["intra_link_gbyte_per_s_bidir"] /= ratio
