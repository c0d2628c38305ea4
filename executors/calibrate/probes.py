"""Single-process probes of the device at hand (``executors.calibrate.build`` fits them into a
profile): GEMM throughput over a grid of shapes and precisions (on a CPU also a transformer
layer's GEMM shapes with their operands out of cache), memory-bound copy bandwidth and the
fixed cost of a tiny kernel (a GPU's own probes: ``executors.calibrate.gpu_probes``), the eager host cost
per modelled kernel of a tiny transformer layer (plain and under ``checkpoint_wrapper``), and
AdamW's cost per parameter tensor and per byte.

Timing follows nanoGPT's bench.py: warm-up discarded, synchronise only at the edges.
"""
from __future__ import annotations

import statistics
import time

import torch


GIB = 1024**3
MATMUL_SIZES = (32, 64, 128, 256, 512, 1024)
#: Largest square GEMM timed at 16-bit on a CPU (bf16 GEMMs run ~30x slower there).
CPU_HALF_MAX_SIZE = 512
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: The probe layer of the host-overhead benchmark: small, so that eager PyTorch's per-op
#: cost dominates its time (a modelling choice, not hardware); its modelled device time is
#: subtracted on serial devices (``_dispatch_s``).
PROBE_LAYER = dict(name="probe", layers=1, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=256,
                   seq_len=32, tied_embeddings=False)


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


def gemm_row(precision: str, m: int, k: int, n: int, seconds: float) -> dict:
    """One timed (m x k) @ (k x n) GEMM: its FLOPs and rate."""
    flops = 2.0 * m * n * k
    return {"precision": precision, "m": m, "k": k, "n": n, "flops": flops, "seconds": seconds,
            "flops_per_s": flops / seconds}


def bench_matmul(device: torch.device, precisions, sizes=MATMUL_SIZES, progress=None) -> list[dict]:
    """Achieved FLOP/s for every shape of ``matmul_shapes``."""
    rows = []
    for precision in precisions:
        dtype = PRECISION_DTYPES[precision]
        for m, k, n in matmul_shapes(precision, device, sizes):
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            rows.append(gemm_row(precision, m, k, n, time_op(lambda: a @ b, device)))
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


def probe_spec(**over):
    from simcore.plan.spec import ModelSpec

    return ModelSpec(**{**PROBE_LAYER, **over})


def probe_kernels(spec, ep: int = 1) -> tuple[int, int]:
    """(forward, backward) kernels ``simcore.model.compute.ops_time_s`` counts for one layer
    (its experts over ``ep`` ranks)."""
    from simcore.model import workload as wl

    ops = wl.layer_forward_ops(spec, b=1, s=spec.seq_len, ep=ep)
    fwd = sum(op.kernels for op in ops)
    bwd = sum(op.backward_kernels for op in ops)
    return fwd, bwd


def _layer_step(spec, device: torch.device, autocast: bool = False):
    """A closure running one forward and backward of the probe layer; returns (fwd_s, bwd_s).
    ``autocast``: the forward under bf16 autocast, as the executor runs a 16-bit plan on a GPU."""
    import contextlib

    from executors.model import Block

    block = Block(spec).to(device)
    x = torch.randn(1, spec.seq_len, spec.hidden, device=device, requires_grad=True)  # (B, T, H)
    ctx = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if autocast else contextlib.nullcontext

    def step() -> tuple[float, float]:
        t0 = time.perf_counter()
        with ctx():
            y = block(x)
        _sync(device)
        t1 = time.perf_counter()
        y.sum().backward()
        _sync(device)
        return t1 - t0, time.perf_counter() - t1
    return step


def _checkpointed_step(spec, device: torch.device, recompute: str):
    """``_layer_step`` of the probe layer wrapped as ``executors.recompute.apply_recompute`` wraps a
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
    time of their own). On a GPU also under bf16 autocast: its casts are kernels the fp32 layer
    does not launch (``simcore.model.eager_ops``)."""
    spec = probe_spec()
    steps = {"plain": _layer_step(spec, device), "full": _checkpointed_step(spec, device, "full"),
             "selective": _checkpointed_step(spec, device, "selective")}
    if device.type == "cuda":
        steps["autocast"] = _layer_step(spec, device, autocast=True)
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
            "checkpointed": {k: {"forward_s": f, "backward_s": b} for k, (f, b) in med.items()
                             if k in ("full", "selective")},
            **({"autocast": dict(zip(("forward_s", "backward_s"), med["autocast"]))} if "autocast" in med else {})}


def recompute_kernels(host: dict, peak: float, copy_bytes_per_s: float, efficiency: dict) -> dict:
    """Host cost of activation checkpointing beyond the recomputed ops, per layer and
    micro-batch, in units of the probe layer's per-kernel time: the checkpointed layer's
    forward less the plain one, and its backward less the plain backward and less the
    recomputation the simulator charges (``serial_layer_s``)."""
    from simcore.plan.spec import Recompute

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


#: Elements per tensor of the optimizer probe's large set: on a CPU 8 x 1 MiB of fp32; on a GPU
#: 8 x 128 MiB, far beyond the L2 (50 MB on an H100). With 8 x 1 MiB the H100 profile read
#: 760 GB/s of parameters from L2 and predicted a 0.94B-parameter AdamW step at 9 ms that ran
#: in 30 ms (validation/gpu_runs.csv).
OPTIMIZER_BIG_NUMEL = 256 * 1024
OPTIMIZER_BIG_NUMEL_GPU = 32 * 1024**2


def bench_optimizer(device: torch.device, reps: int = 15) -> dict:
    """AdamW step time over two parameter sets, fitted as t = tensors * a + bytes / bw."""
    from executors.parallel import ADAM_BETAS, WEIGHT_DECAY

    rows = []
    big = OPTIMIZER_BIG_NUMEL_GPU if device.type == "cuda" else OPTIMIZER_BIG_NUMEL
    for tensors, numel in ((8, 1024), (8, big), (64, 1024)):
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


def _median_step(step, reps: int, warmup: int = 3) -> tuple[float, float]:
    from executors.watchdog import heartbeat

    times = []
    for _ in range(reps + warmup):
        times.append(step())
        heartbeat()   # progress, outside the timed step: on a busy host a probe runs for minutes
    times = times[warmup:]
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


def _probe_dispatch_s(per_kernel_s: float, peak: float, copy_bytes_per_s: float, efficiency: dict) -> float:
    """Per-kernel host time of a serial (CPU) device: the probe layer's measured per-kernel
    time less its device time per kernel under the profile's own curve."""
    spec = probe_spec()
    f, b = serial_layer_s(spec, peak, copy_bytes_per_s, efficiency["matmul"]["points"],
                          float(efficiency["attention"]["forward"]))
    return max(0.0, per_kernel_s - (f + b) / sum(probe_kernels(spec)))


def _dispatch_s(efficiency: dict, peak: float, copy_bytes_per_s: float) -> float:
    """``_probe_dispatch_s`` of the profile's own per-kernel time (``host_overhead_us``)."""
    return _probe_dispatch_s(efficiency["host_overhead_us"] * 1e-6, peak, copy_bytes_per_s, efficiency)


def serial_layer_s(spec, peak_flops: float, hbm_bytes_per_s: float, matmul_points, attention: float,
                   dispatch_s: float = 0.0, recompute=None) -> tuple[float, float]:
    """(forward, backward) time of one layer of ``spec`` (micro-batch 1, full sequence) on a
    serial device given by its calibrated peak, bandwidth, matmul curve and per-kernel
    dispatch time; with ``recompute`` the forward of the ops that recomputation re-runs
    instead. With ``dispatch_s=0`` it is the device time alone, which ``executors.calibrate.profile``
    subtracts from a measured eager layer to get the dispatch time of a CPU host."""
    from simcore.model import workload as wl
    from simcore.model.compute import DeviceModel, ops_time_s
    from topologies.components import EfficiencyCurve

    dev = DeviceModel(
        name="calibration", peak_flops=peak_flops, hbm_bytes_per_s=hbm_bytes_per_s,
        matmul=EfficiencyCurve(points=tuple((float(a), float(b)) for a, b in matmul_points)),
        attention_forward=attention, attention_backward=attention, memory_efficiency=1.0,
        kernel_overhead_s=0.0, host_overhead_s=0.0, dispatch_s=dispatch_s, nvlink_efficiency=1.0,
        nic_efficiency=1.0, base_latency_s=0.0, nvlink_hop_latency_s=0.0, net_hop_latency_s=0.0,
        host_memory_bytes_per_s=0.0, adam_host_bytes_per_param=0.0)
    ops = wl.layer_forward_ops(spec, b=1, s=spec.seq_len)
    if recompute is not None:
        return ops_time_s(wl.recompute_ops(ops, recompute), dev)[0], 0.0
    f, bi, bw = ops_time_s(ops, dev)
    return f, bi + bw
