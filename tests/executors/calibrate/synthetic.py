"""Synthetic inputs shared by the calibration tests: noiseless alpha-beta collective timings,
a CPU profile built from synthetic measurements, and a tiny two-stage plan document."""
import torch

from executors.calibrate import build
from executors.calibrate import collective_probes as cprobes

ALPHA, BETA = 2e-4, 1e9
SIZES = (4096, 65536, 1 << 20)


def alpha_beta_rows(op, n, alpha=ALPHA, beta=BETA):
    return [{"op": op, "ranks": n, "bytes": b, "seconds": alpha + cprobes.WIRE_FACTOR[op](n) * b / beta} for b in SIZES]


def synthetic_profile():
    matmul = [{"precision": "fp32", "m": s, "k": s, "n": s, "flops": 2.0 * s**3, "seconds": 1.0,
               "flops_per_s": 1e13 * min(1.0, s / 256)} for s in (64, 256, 1024)]
    memory = {"copy_bytes_per_s": 1e12, "kernel_overhead_s": 5e-6}
    coll = [r for op in cprobes.WIRE_FACTOR for n in (2, 4) for r in alpha_beta_rows(op, n)]
    oversub = {"matmul": {1: 1e10, 2: 1e10}, "layer": {1: 500.0, 2: 500.0}}
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28}
    opt = {"per_tensor_s": 2e-5, "param_bytes_per_s": 1e9}
    return build.build_profile(matmul, memory, coll, oversub, torch.device("cpu"), host=host, optimizer=opt)


DOC = {"name": "t", "model": {"name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32,
                              "tied_embeddings": False},
       "cluster": {"node": "localhost", "gpus_per_node": 2}, "parallel": {"pp": 2, "dp": 1},
       "training": {"global_batch": 4, "micro_batch": 1, "precision": "fp32"}}
