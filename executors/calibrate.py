"""Calibration: microbenchmarks of the machine at hand -> a hardware profile YAML.

The profile has the catalog's shapes so the simulator needs no special case for it:
a ``device`` section in the schema of ``topologies/catalog/gpus.yaml`` (the measured
peak stands in for the datasheet peak), an ``efficiency`` section in the schema of
``efficiency.yaml`` (matmul efficiency curve over GEMM size, memory-bound efficiency,
kernel overhead, collective alpha-beta), and the raw measurements they were fitted from.

What is measured, on the backend a run will use (gloo on CPU, nccl on GPU):
- matmul throughput over a grid of GEMM shapes and precisions (one thread per rank on
  CPU, as the executor runs);
- memory-bound bandwidth (a large tensor copy) and the fixed cost of a tiny kernel;
- all-reduce, all-gather, reduce-scatter, broadcast, all-to-all and send/recv latency
  and bandwidth over message sizes, for group sizes 2 and 4, fitted as t = a + n/b
  (Hockney's alpha-beta model) on the bytes each rank puts on the wire;
- on CPU, matmul throughput per rank when 1, 2, 4 ranks run at once (oversubscription);
- on GPU, host-device copy bandwidth (pinned memory).

Timing follows nanoGPT's bench.py: warm-up discarded, synchronise only at the edges.
"""
from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from simcore.trace import atomic_write_text

GIB = 1024**3
MATMUL_SIZES = (32, 64, 128, 256, 512, 1024)
COLLECTIVE_BYTES = (4 * 1024, 64 * 1024, 1024**2, 8 * 1024**2)
GROUP_SIZES = (2, 4)
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
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


def time_op(fn, device: torch.device, min_time_s: float = 0.05, warmup: int = 2) -> float:
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


def bench_matmul(device: torch.device, precisions, sizes=MATMUL_SIZES, progress=None) -> list[dict]:
    """Achieved FLOP/s for square and transformer-shaped (tokens x h x 4h) GEMMs."""
    rows = []
    shapes = [(s, s, s) for s in sizes] + [(s, s // 2 or 1, 2 * s) for s in sizes[1:]]
    for precision in precisions:
        dtype = PRECISION_DTYPES[precision]
        for m, k, n in shapes:
            a = torch.randn(m, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            t = time_op(lambda: a @ b, device)
            rows.append({"precision": precision, "m": m, "k": k, "n": n, "flops": 2.0 * m * n * k,
                         "seconds": t, "flops_per_s": 2.0 * m * n * k / t})
            if progress:
                progress.update(1)
    return rows


def bench_memory(device: torch.device) -> dict:
    """Streaming bandwidth (copy: read + write) and the fixed cost of a tiny kernel."""
    n = 64 * 1024**2 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    copy_s = time_op(lambda: dst.copy_(src), device, min_time_s=0.1)
    tiny = torch.ones(1, device=device)
    tiny_s = time_op(lambda: tiny.add_(1.0), device, min_time_s=0.05)
    return {"copy_bytes_per_s": 2 * n * 4 / copy_s, "kernel_overhead_s": tiny_s}


def bench_host_device(device: torch.device) -> float | None:
    """Pinned host-to-device copy bandwidth, bytes/s (None on a CPU host)."""
    if device.type != "cuda":
        return None
    host = torch.empty(256 * 1024**2, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device=device)
    return host.numel() / time_op(lambda: dev.copy_(host, non_blocking=True), device, min_time_s=0.2)


def _collective_fns(op: str, nbytes: int, rank: int, world: int, device):
    numel = max(world, nbytes // 4 // world * world)
    x = torch.ones(numel, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x)
    if op == "all_gather":
        out = torch.empty(numel * world, device=device)
        return lambda: _ALL_GATHER(out, x)
    if op == "reduce_scatter":
        out = torch.empty(numel // world, device=device)
        return lambda: _REDUCE_SCATTER(out, x)
    if op == "all_to_all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    if op == "broadcast":
        return lambda: dist.broadcast(x, src=0)
    if op == "send_recv":  # pairs (0,1), (2,3): one direction at a time, as a pipeline does
        peer = rank ^ 1
        if peer >= world:
            return lambda: None
        return (lambda: dist.send(x, peer)) if rank % 2 == 0 else (lambda: dist.recv(x, peer))
    raise ValueError(op)


def _collective_worker(rank: int, world: int, port: int, backend: str, out_path: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=_dt.timedelta(seconds=120))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rows = []
    try:
        for op in WIRE_FACTOR:
            for nbytes in COLLECTIVE_BYTES:
                rows.append({"op": op, "ranks": world, "bytes": nbytes,
                             "seconds": _time_collective(_collective_fns(op, nbytes, rank, world, device), device)})
        if rank == 0:
            atomic_write_text(out_path, yaml.safe_dump(rows))
    finally:
        dist.destroy_process_group()


def _time_collective(fn, device, min_time_s: float = 0.02, max_reps: int = 20) -> float:
    """Seconds per call; every rank runs the same number of calls (agreed from a probe call)."""
    fn()  # warm-up
    dist.barrier()
    start = time.perf_counter()
    fn()
    _sync(device)
    probe = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(probe, op=dist.ReduceOp.MAX)
    reps = int(min(max_reps, max(2, min_time_s / max(float(probe), 1e-9))))
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / reps])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the collective's time
    return float(elapsed)


def _matmul_worker(rank: int, size: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    a, b = torch.randn(size, size), torch.randn(size, size)
    t = time_op(lambda: a @ b, torch.device("cpu"), min_time_s=0.2)
    Path(out_dir, f"{rank}.txt").write_text(str(2.0 * size**3 / t))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_collectives(backend: str, group_sizes=GROUP_SIZES) -> list[dict]:
    rows = []
    for world in group_sizes:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.yaml")
            mp.start_processes(_collective_worker, args=(world, free_port(), backend, out), nprocs=world,
                               join=True, start_method="spawn")
            rows += yaml.safe_load(Path(out).read_text())
    return rows


def bench_oversubscription(ranks=(1, 2, 4), size: int = 512) -> dict[int, float]:
    """Matmul FLOP/s per rank when ``n`` single-threaded ranks run at once (CPU hosts)."""
    out = {}
    for n in ranks:
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(_matmul_worker, args=(size, tmp), nprocs=n, join=True, start_method="spawn")
            rates = [float(Path(tmp, f"{r}.txt").read_text()) for r in range(n)]
        out[n] = statistics.mean(rates)
    return out


# --------------------------------------------------------------------------- fitting

def fit_alpha_beta(rows: list[dict]) -> dict:
    """Least-squares t = alpha + wire_bytes / beta per (op, ranks); alpha >= 0."""
    fits: dict = {}
    for key in sorted({(r["op"], r["ranks"]) for r in rows}):
        op, n = key
        pts = [(WIRE_FACTOR[op](n) * r["bytes"], r["seconds"]) for r in rows if (r["op"], r["ranks"]) == key]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
        slope = max(slope, 1e-15)
        alpha = max(0.0, my - slope * mx)
        fits.setdefault(op, {})[n] = {"alpha_s": alpha, "bus_bytes_per_s": 1.0 / slope}
    return fits


def matmul_curve(rows: list[dict], precision: str, peak: float) -> list[list[float]]:
    """Efficiency points (GEMM FLOPs, fraction of the measured peak), median per size."""
    by_flops: dict[float, list[float]] = {}
    for r in rows:
        if r["precision"] == precision:
            by_flops.setdefault(r["flops"], []).append(r["flops_per_s"] / peak)
    return [[f, round(min(1.0, statistics.median(v)), 4)] for f, v in sorted(by_flops.items())]


def build_profile(matmul, memory, collectives, oversub, h2d, device: torch.device) -> dict:
    """The profile document from the raw measurements."""
    host = socket.gethostname()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = f"measured by trainplan calibrate on {host}, {date}"
    peaks = {p: max(r["flops_per_s"] for r in matmul if r["precision"] == p)
             for p in {r["precision"] for r in matmul}}
    fits = fit_alpha_beta(collectives)
    ring = fits["all_reduce"][max(fits["all_reduce"])]
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, hbm_gib = props.name.lower().replace(" ", "-"), props.total_memory / GIB
    else:
        name, hbm_gib = f"cpu-{platform.machine()}", _host_memory_gib()
    main_precision = "bf16" if "bf16" in peaks else "fp32"
    cores = os.cpu_count() or 1
    return {
        "measured_on": {"host": host, "date": date, "torch": str(torch.__version__), "device": str(device),
                        "backend": "nccl" if device.type == "cuda" else "gloo", "cpu_cores": cores},
        "device": {
            "name": name, "description": f"{name} on {host} (calibrated)", "vendor": device.type,
            "dense_tflops": {p: (peaks[p] / 1e12 if p in peaks else None) for p in ("fp32", "tf32", "bf16", "fp16", "fp8")},
            "hbm_gib": round(hbm_gib, 3),
            "hbm_tbyte_per_s": memory["copy_bytes_per_s"] / 1e12,
            "intra_link": "shared-memory" if device.type == "cpu" else "pcie",
            "intra_link_gbyte_per_s_bidir": 2 * ring["bus_bytes_per_s"] / 1e9,
            "pcie_gen": 0,
            "pcie_gbyte_per_s_bidir": 2 * (h2d or memory["copy_bytes_per_s"]) / 1e9,
            "tdp_w": 0.0,
            "source": source,
        },
        "node": {"cpu_cores": cores, "host_memory_gib": round(_host_memory_gib(), 3)},
        "efficiency": {
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
                "base_latency_us": ring["alpha_s"] * 1e6, "nvlink_hop_latency_us": 0.0, "net_hop_latency_us": 0.0,
                "source": f"{source}; alpha-beta fit of all_reduce on {max(fits['all_reduce'])} ranks",
            },
        },
        "oversubscription": {"matmul_flops_per_s_per_rank": {int(k): v for k, v in oversub.items()},
                             "source": source},
        "collectives": fits,
        "raw": {"matmul": matmul, "memory": memory, "collectives": collectives, "h2d_bytes_per_s": h2d},
    }


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

    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    precisions = ["bf16", "fp16"] if device.type == "cuda" else ["fp32", "bf16"]
    sizes = MATMUL_SIZES[:5] if quick else MATMUL_SIZES
    steps = len(precisions) * (2 * len(sizes) - 1) + 4
    with tqdm(total=steps, desc="calibrate", disable=not progress, unit="bench") as bar:
        matmul = bench_matmul(device, precisions, sizes, bar)
        memory = bench_memory(device)
        bar.update(1)
        h2d = bench_host_device(device)
        bar.update(1)
        backend = "nccl" if device.type == "cuda" and torch.cuda.device_count() >= 2 else "gloo"
        groups = (2,) if quick else GROUP_SIZES
        collectives = bench_collectives(backend, groups)
        bar.update(1)
        oversub = bench_oversubscription((1, 2) if quick else (1, 2, 4)) if device.type == "cpu" else {1: math.nan}
        bar.update(1)
    profile = build_profile(matmul, memory, collectives, oversub, h2d, device)
    atomic_write_text(out, yaml.safe_dump(profile, sort_keys=False))
    return profile
