"""Probes only a GPU has (``executors.calibrate.profile`` runs them where CUDA is present):
GEMMs up to the sizes that fill the chip, per precision (fp32, tf32, bf16, fp16, and fp8
through ``torch._scaled_mm`` where the GPU has FP8 tensor cores), the fused attention kernel
torch's SDPA picks (FlashAttention) forward and backward over sequence lengths, streaming
bandwidth over a tensor far larger than the L2 cache, and host-device copies from pinned and
from pageable host memory, both directions.

Every figure is a rate measured here; ``executors.calibrate.build`` turns them into the
profile's efficiency fractions, and ``bench/gpu_profile_compare.py`` sets them beside the
catalog's figures for the same GPU.
"""
from __future__ import annotations

import os
import sys
import time

import torch
import torch.nn.functional as F

from executors.calibrate.probes import GIB, gemm_row, time_op
from executors.float8 import FP8_MIN_CAPABILITY
from executors.procs import torch_threads
from simcore.model.compute import FLASH_BACKWARD_FLOP_RATIO
from simcore.model.attention_window import CAUSAL_FLASH_FRACTION

#: Square GEMM sizes on a GPU: from launch-bound (256) to the sizes whose time no longer grows
#: faster than their FLOPs (8192-16384 on an H100: about 1 and 9 TFLOP per GEMM).
GPU_MATMUL_SIZES = (256, 512, 1024, 2048, 4096, 8192, 16384)
#: Bytes of the streaming-copy probe: far beyond any GPU's L2 (50 MB on an H100), so that the
#: copy reads and writes HBM.
GPU_COPY_BYTES = 2 * GIB
#: Bytes of one host-device copy.
H2D_BYTES = 512 * 1024**2
#: The attention probe's inputs: batch x sequence = 16k tokens, 16 heads of 128, causal, as
#: the FlashAttention-3 benchmark inputs of pytorch/benchmark (commit ff65cb675209) that the
#: catalog's H100 length curve was read from.
ATTENTION_TOKENS, ATTENTION_HEADS, ATTENTION_HEAD_DIM = 16384, 16, 128
ATTENTION_SEQS = (512, 1024, 2048, 4096, 8192)


def gpu_matmul_shapes(sizes=GPU_MATMUL_SIZES) -> list[tuple[int, int, int]]:
    """Square GEMMs and transformer-shaped ones (tokens x h x 2h), every dimension a
    multiple of 16 (FP8's rule)."""
    return [(s, s, s) for s in sizes] + [(s, s // 2, 2 * s) for s in sizes[1:]]


def bench_gpu_matmul(device: torch.device, sizes=GPU_MATMUL_SIZES, progress=None) -> list[dict]:
    """Achieved FLOP/s of every shape of ``gpu_matmul_shapes`` in bf16, fp16, tf32, fp32 (no
    TF32) and, where the GPU has FP8 tensor cores, fp8 (e4m3 operands, per-tensor scales, bf16
    output: ``torch._scaled_mm``, the GEMM torchao's float8 training calls). A precision stops
    at ``PRECISION_BUDGET_S`` (its largest shapes are left out and the log says so)."""
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}
    rows, tf32 = [], torch.backends.cuda.matmul.allow_tf32
    try:
        for precision, dtype in dtypes.items():
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"

            def make(m, k, n, dtype=dtype):
                a = torch.randn(m, k, device=device, dtype=dtype)
                b = torch.randn(k, n, device=device, dtype=dtype)
                return lambda: a @ b
            rows += _timed_shapes(precision, make, device, sizes)
            if progress:
                progress.update(1)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    rows += bench_fp8_matmul(device, sizes)
    return rows


#: Seconds one precision's GEMM grid may take before its larger shapes are left out.
PRECISION_BUDGET_S = 30.0


def _timed_shapes(precision: str, make, device: torch.device, sizes) -> list[dict]:
    """``gemm_row`` of each shape, smallest first, within ``PRECISION_BUDGET_S``; the time
    taken on stderr."""
    rows, start = [], time.perf_counter()
    for m, k, n in sorted(gpu_matmul_shapes(sizes), key=lambda s: s[0] * s[1] * s[2]):
        if time.perf_counter() - start > PRECISION_BUDGET_S:
            print(f"calibrate: {precision} GEMMs from {m}x{k}x{n} on left out ({PRECISION_BUDGET_S:.0f} s budget)",
                  file=sys.stderr, flush=True)
            break
        rows.append(gemm_row(precision, m, k, n, time_op(make(m, k, n), device)))
    print(f"calibrate: {precision} GEMMs {time.perf_counter() - start:.1f} s, best "
          f"{max(r['flops_per_s'] for r in rows) / 1e12:.0f} TFLOP/s", file=sys.stderr, flush=True)
    return rows


def has_fp8(device: torch.device) -> bool:
    return (device.type == "cuda" and hasattr(torch, "float8_e4m3fn")
            and torch.cuda.get_device_capability(device) >= FP8_MIN_CAPABILITY)


def bench_fp8_matmul(device: torch.device, sizes=GPU_MATMUL_SIZES) -> list[dict]:
    """FP8 rows of ``bench_gpu_matmul`` (none on a GPU without FP8 tensor cores)."""
    if not has_fp8(device):
        return []
    one = torch.ones((), device=device)

    def make(m, k, n):
        a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()   # column-major, as cuBLASLt wants
        return lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return _timed_shapes("fp8", make, device, sizes)


def bench_attention(device: torch.device, seqs=ATTENTION_SEQS) -> list[dict]:
    """SDPA's FlashAttention kernel, causal, bf16: forward and backward seconds and the FLOP/s
    they execute as ``simcore.model.workload`` counts them (forward 4 b h s^2 d times the causal
    fraction; backward ``FLASH_BACKWARD_FLOP_RATIO`` times that)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    for s in seqs:
        b = max(1, ATTENTION_TOKENS // s)
        q, k, v = (torch.randn(b, ATTENTION_HEADS, s, ATTENTION_HEAD_DIM, device=device, dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            grad = torch.randn_like(out)
            fwd = time_op(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device)
            both = time_op(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                                       (q, k, v), grad), device)
        flops = 4.0 * b * ATTENTION_HEADS * s * s * ATTENTION_HEAD_DIM * CAUSAL_FLASH_FRACTION
        bwd = max(both - fwd, 1e-9)
        rows.append({"seq": s, "batch": b, "heads": ATTENTION_HEADS, "head_dim": ATTENTION_HEAD_DIM,
                     "forward_s": fwd, "backward_s": bwd, "forward_flops_per_s": flops / fwd,
                     "backward_flops_per_s": FLASH_BACKWARD_FLOP_RATIO * flops / bwd})
    return rows


def bench_gpu_memory(device: torch.device) -> dict:
    """Streaming copy bandwidth over ``GPU_COPY_BYTES`` (read + write) and the fixed cost of a
    tiny kernel (launch throughput: only the edges synchronise)."""
    n = GPU_COPY_BYTES // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    copy_s = time_op(lambda: dst.copy_(src), device, min_time_s=0.2)
    tiny = torch.ones(1, device=device)
    tiny_s = time_op(lambda: tiny.add_(1.0), device, min_time_s=0.05)
    return {"copy_bytes_per_s": 2 * n * 4 / copy_s, "kernel_overhead_s": tiny_s, "copy_bytes": 2 * n * 4}


def bench_host_copies(device: torch.device) -> dict:
    """Host-device copy bandwidth, bytes/s: host to device and back, from pinned and from
    pageable host memory (``H2D_BYTES`` per copy)."""
    dev = torch.empty(H2D_BYTES, dtype=torch.uint8, device=device)
    out = {}
    for kind, pinned in (("pinned", True), ("pageable", False)):
        host = torch.empty(H2D_BYTES, dtype=torch.uint8, pin_memory=pinned)
        out[f"h2d_{kind}"] = H2D_BYTES / time_op(lambda: dev.copy_(host, non_blocking=pinned), device, min_time_s=0.2)
        out[f"d2h_{kind}"] = H2D_BYTES / time_op(lambda: host.copy_(dev, non_blocking=pinned), device, min_time_s=0.2)
    return out


def bench_cpu_optimizer() -> dict:
    """``bench_optimizer`` on the host's CPU with all its cores (the step FSDP2's
    CPUOffloadPolicy runs there), for the host side of optimizer offload."""
    from executors.calibrate.probes import bench_optimizer

    with torch_threads(os.cpu_count() or 1):
        return bench_optimizer(torch.device("cpu"))


def device_facts(device: torch.device) -> dict:
    """What the driver reports: name, memory, SMs, compute capability, versions."""
    props = torch.cuda.get_device_properties(device)
    free, total = torch.cuda.mem_get_info(device)
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
    except Exception:   # NVML's Python binding is optional: the driver goes unrecorded
        driver = ""
    return {"name": props.name, "total_memory_bytes": props.total_memory, "free_memory_bytes": free,
            "mem_get_info_total_bytes": total, "multiprocessors": props.multi_processor_count,
            "capability": list(torch.cuda.get_device_capability(device)), "torch": str(torch.__version__),
            "cuda": str(torch.version.cuda), "cudnn": torch.backends.cudnn.version(),
            "nccl": ".".join(str(x) for x in torch.cuda.nccl.version()), "driver": str(driver)}
