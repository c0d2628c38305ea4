"""The profile document from a calibration's raw measurements (``build_profile``), one
function per section: the device in the catalog's schema (``_device``), the efficiency
figures every device has (``_efficiency``), the host's framework cost (``_host_efficiency``),
the torch-parallel host costs (``_parallel_host``), the oversubscription tables; and the fits
and conversions they are made of (the matmul efficiency curve, the per-rank-count tables).
``executors.calibrate.profile`` runs the probes and writes the document.
"""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import statistics

import torch

from executors.calibrate.collective_probes import fit_alpha_beta, split_ring_latency
from executors.calibrate.handover_probes import P2P_KEYS
from executors.calibrate.oversubscription import _per_rank
from executors.calibrate.parallel_probes import PARALLEL_PROBE_METHOD
from executors.calibrate.probes import GIB, PROBE_LAYER, _dispatch_s, probe_kernels, probe_spec, recompute_kernels
from executors.calibrate.wrapper_probes import wrapper_kernels

#: Host bytes per parameter the offload model charges a CPU Adam step (``efficiency.yaml``'s
#: ``adam_host_bytes_per_param``: fp32 parameter, gradient and two moments read, three written,
#: the 16-bit copy written; DeepSpeed csrc/adam/cpu_adam.cpp).
OFFLOAD_ADAM_BYTES = 32


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


def build_profile(matmul, memory, collectives, oversub, device: torch.device, *,
                  host: dict | None = None, optimizer: dict | None = None, parallel: dict | None = None,
                  grouped: dict | None = None, gpu: dict | None = None, seconds: float = 0.0) -> dict:
    """The profile document from the raw measurements (``grouped``: the parallel probe on more
    ranks, whose figures are kept under ``name@ranks``, ``at_ranks``; ``gpu``: the GPU probes'
    device facts, host copies and attention rows, ``executors.calibrate.gpu_probes``)."""
    hostname = socket.gethostname()
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    source = f"measured by trainplan calibrate on {hostname}, {date}"
    peaks = {p: max(r["flops_per_s"] for r in matmul if r["precision"] == p)
             for p in {r["precision"] for r in matmul}}
    fits = fit_alpha_beta(collectives, memory["copy_bytes_per_s"])
    hop, ar = split_ring_latency(fits)
    ring = ar[max(ar)]
    cpu = device.type == "cpu"
    backend = "gloo" if cpu or torch.cuda.device_count() < 2 else "nccl"   # as calibrate's collective probe ran
    main_precision = "bf16" if "bf16" in peaks and not cpu else "fp32"
    peak, copy_bytes_per_s = peaks[main_precision], memory["copy_bytes_per_s"]
    cores = os.cpu_count() or 1
    efficiency = _efficiency(matmul, memory, fits, hop, ar, main_precision, peak, source)
    if gpu:
        gpu_efficiency(efficiency, gpu, matmul, peaks, source)
        efficiency["memory"] = {"executor_activations": True, "allocator_peak": True, "source": GPU_MEMORY_SOURCE}
        if backend == "gloo":
            efficiency["collective"]["source"] += ("; one GPU: gloo over the host's CPU (NCCL refuses two ranks on "
                                                   "one device), so no NCCL figure: a single-GPU plan issues none")
    if host:
        _host_efficiency(efficiency, host, oversub, cpu, peak, copy_bytes_per_s, source)
    if optimizer:
        efficiency["optimizer"] = {"per_tensor_us": optimizer["per_tensor_s"] * 1e6,
                                   "param_gbyte_per_s": optimizer["param_bytes_per_s"] / 1e9,
                                   "source": f"{source}; torch.optim.AdamW step over 3 parameter sets"}
    if parallel:
        efficiency["parallel_host"] = _parallel_host(parallel, grouped, host, oversub, fits, peak, copy_bytes_per_s,
                                                     efficiency, source)
    if cpu:
        efficiency["memory"] = {
            "framework_bytes": 0.0, "allocator_fragmentation": 0.0, "comm_buffers": False,
            "executor_activations": True,
            "source": "CPU host: no CUDA context or caching allocator; the executor counts the tensors "
                      "a rank owns (executors/measure.py), which DDP's bucket buffers are not, and the "
                      "tensors its torch model saves for backward (simcore.model.workload.executor_activation_bytes)"}
        _rank_tables(efficiency, oversub)
    return {
        "measured_on": {"host": hostname, "date": date, "torch": str(torch.__version__), "device": str(device),
                        "backend": backend, "cpu_cores": cores,
                        "calibration_s": round(seconds, 1), **({"gpu": gpu["facts"]} if gpu else {})},
        "device": _device(device, peaks, memory, ring, (gpu or {}).get("host_copies"), hostname, source),
        "node": {"cpu_cores": cores, "host_memory_gib": round(_host_memory_gib(), 3)},
        "efficiency": efficiency,
        "oversubscription": _oversubscription(oversub, source),
        "collectives": fits,
        "raw": {"matmul": matmul, "memory": memory, "collectives": collectives,
                **({k: gpu[k] for k in ("host_copies", "attention", "cpu_optimizer") if k in gpu} if gpu else {}),
                "host_overhead": host, "optimizer": optimizer, "parallel_host": parallel,
                "executor_one_rank": oversub.get("one_rank_step") or {}},
    }


def _device(device: torch.device, peaks: dict, memory: dict, ring: dict, copies: dict | None, hostname: str,
            source: str) -> dict:
    """The ``device`` section, in the schema of ``topologies/catalog/gpus.yaml``: the measured
    peaks, memory and copy bandwidth, the all-reduce ring's bus bandwidth as the intra-node link,
    the pinned host-to-device copy rate as the PCIe link (a GPU)."""
    cpu = device.type == "cpu"
    h2d = (copies or {}).get("h2d_pinned")
    if not cpu:
        props = torch.cuda.get_device_properties(device)
        name, hbm_gib = props.name.lower().replace(" ", "-"), props.total_memory / GIB
    else:
        name, hbm_gib = f"cpu-{platform.machine()}", _host_memory_gib()
    return {
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
    }


def _efficiency(matmul: list[dict], memory: dict, fits: dict, hop: float, ar: dict, precision: str, peak: float,
                source: str) -> dict:
    """The ``efficiency`` figures every device has, in the schema of ``efficiency.yaml``: the
    matmul curve, attention (the matmul efficiency), memory-bound, the kernel overhead and the
    collectives' latencies (``hop``, ``ar``: ``split_ring_latency``)."""
    ring = ar[max(ar)]
    return {
        "matmul": {"points": matmul_curve(matmul, precision, peak),
                   "source": f"{source}; GEMM grid of {len(matmul)} shapes"},
        "attention": {"forward": _attention_efficiency(matmul, precision, peak),
                      "backward": _attention_efficiency(matmul, precision, peak),
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


def _host_efficiency(efficiency: dict, host: dict, oversub: dict, cpu: bool, peak: float, copy_bytes_per_s: float,
                     source: str) -> None:
    """Add the host (framework) cost per kernel to ``efficiency``, and on a CPU the per-kernel
    dispatch time."""
    efficiency["host_overhead_us"] = _host_overhead_s(host, oversub) * 1e6
    efficiency["host_overhead_source"] = (
        f"{source}; eager forward+backward of a tiny transformer layer (hidden {PROBE_LAYER['hidden']}, "
        f"seq {PROBE_LAYER['seq_len']}) over the {host['forward_kernels'] + host['backward_kernels']} "
        "kernels simcore.model.workload counts for it")
    if host.get("autocast"):   # a GPU: the probe layer's host time under bf16 autocast over its fp32 time
        ac, plain = host["autocast"], host["forward_s"] + host["backward_s"]
        efficiency["autocast_host_factor"] = (ac["forward_s"] + ac["backward_s"]) / plain
    if cpu:
        efficiency["dispatch_us"] = _dispatch_s(efficiency, peak, copy_bytes_per_s) * 1e6
        efficiency["dispatch_source"] = (
            f"{source}; the same probe layer's per-kernel time less its modelled device time (the "
            "cold-cache matmul curve and copy bandwidth): on a CPU the issuing thread runs each kernel, "
            "so simcore.model.compute.phase_s adds this to the device time")


#: Why a GPU profile counts the executor's own saved tensors (its CUDA context and allocator
#: margin stay the model's defaults, ``simcore.model.peak``).
GPU_MEMORY_SOURCE = ("the runs on this GPU are the executor's: its activations are its torch model's saved "
                     "tensors under autocast (simcore.model.executor_acts), not a Megatron stack's; its peak is "
                     "torch's allocator's (max_memory_allocated), which holds the loss's transient gradients")
#: Reference sequence length of a GPU profile's attention fractions: the catalog's length
#: curves are relative to 2048 query tokens and hold at 1 from there.
ATTENTION_REF_SEQ = 2048
#: Smallest GEMM (FLOPs) whose FP8/BF16 efficiency ratio enters ``fp8_matmul_ratio``: the
#: sizes a large model's linear layers run at.
FP8_RATIO_MIN_FLOPS = 1e10


def gpu_efficiency(efficiency: dict, gpu: dict, matmul: list[dict], peaks: dict, source: str) -> None:
    """A GPU's own figures in ``efficiency``: FlashAttention's fractions of the bf16 peak at
    ``ATTENTION_REF_SEQ`` tokens with the length curve below it (forward), the FP8 GEMM's
    efficiency relative to bf16's at the same FLOPs, and the host side of optimizer offload
    (torch's AdamW on this host's cores, as FSDP2's CPUOffloadPolicy runs it)."""
    rows = sorted(gpu.get("attention") or [], key=lambda r: r["seq"])
    if rows and "bf16" in peaks:
        ref = max((r for r in rows if r["seq"] <= ATTENTION_REF_SEQ), key=lambda r: r["seq"], default=rows[0])
        efficiency["attention"] = {
            "forward": round(ref["forward_flops_per_s"] / peaks["bf16"], 4),
            "backward": round(ref["backward_flops_per_s"] / peaks["bf16"], 4),
            "length_points": [[r["seq"], round(r["forward_flops_per_s"] / ref["forward_flops_per_s"], 4)]
                              for r in rows if r["seq"] <= ref["seq"]],
            "source": f"{source}; torch SDPA FlashAttention kernel, causal bf16, {rows[0]['heads']} heads of "
                      f"{rows[0]['head_dim']}, batch x seq = {rows[0]['batch'] * rows[0]['seq']} tokens, at "
                      f"{ref['seq']} tokens over the measured bf16 GEMM peak (FLOPs as simcore.model.workload "
                      "counts them); length_points: forward rate at shorter sequences over it"}
    if "fp8" in peaks and "bf16" in peaks:
        bf16 = {r["flops"]: r["flops_per_s"] / peaks["bf16"] for r in matmul if r["precision"] == "bf16"}
        ratios = [r["flops_per_s"] / peaks["fp8"] / bf16[r["flops"]] for r in matmul
                  if r["precision"] == "fp8" and r["flops"] in bf16 and r["flops"] >= FP8_RATIO_MIN_FLOPS]
        if ratios:
            efficiency["fp8_matmul_ratio"] = round(statistics.median(ratios), 4)
            efficiency["fp8_matmul_ratio_source"] = (
                f"{source}; torch._scaled_mm (e4m3, per-tensor scales, bf16 out) over the bf16 GEMM at equal "
                f"FLOPs, each as a fraction of its own measured peak, median over GEMMs of >= "
                f"{FP8_RATIO_MIN_FLOPS:.0e} FLOPs: the GEMM alone, without a recipe's casts and amax")
    cpu_adam = gpu.get("cpu_optimizer")
    if cpu_adam:
        efficiency["offload"] = {
            "host_memory_gbyte_per_s": OFFLOAD_ADAM_BYTES / 4 * cpu_adam["param_bytes_per_s"] / 1e9,
            "adam_host_bytes_per_param": OFFLOAD_ADAM_BYTES,
            "source": f"{source}; torch.optim.AdamW on this host's {os.cpu_count()} cores (FSDP2's CPUOffloadPolicy "
                      f"steps it there), its fp32 parameter rate times {OFFLOAD_ADAM_BYTES // 4}: the bandwidth "
                      f"that charges {OFFLOAD_ADAM_BYTES} B per parameter at the measured step time"}


def _parallel_host(parallel: dict, grouped: dict | None, host: dict | None, oversub: dict, fits: dict, peak: float,
                   copy_bytes_per_s: float, efficiency: dict, source: str) -> dict:
    """The ``parallel_host`` section: the torch-parallel host costs of ``bench_parallel_host``
    (and of its grouped run, ``at_ranks``) in the simulator's per-kernel unit, the broadcast
    latency, the point-to-point and lone-collective figures, and checkpointing's recompute costs."""
    bc = (fits.get("broadcast") or {}).get(2, {})
    # the wrapper costs were counted in the probe's own per-kernel time on ``ranks`` ranks;
    # the simulator charges them in its per-kernel time for that many ranks (the one-rank
    # figure times the executor-derived slowdown): convert, so the measured seconds return
    layer = oversub.get("layer") or {}
    one = host["per_kernel_s"] * layer[1] * sum(probe_kernels(probe_spec())) if host and 1 in layer else 1.0
    more = at_ranks(grouped, layer) if grouped else {}
    shares = {**parallel.get("comm_share", {}),
              **({f"{m}@{grouped['ranks']}": v for m, v in grouped.get("comm_share", {}).items()} if more else {})}
    return {
        "probe_method": PARALLEL_PROBE_METHOD,
        "probe_ranks": parallel["ranks"],
        **wrapper_kernels(parallel, layer),
        **more,
        "broadcast_latency_us": bc.get("alpha_s", 0.0) * 1e6,
        "p2p_latency_kernels": parallel.get("p2p_latency_kernels", 0.0),
        "p2p_send_kernels": parallel.get("p2p_send_kernels", 0.0),
        "p2p_wake_kernels": parallel.get("p2p_wake_kernels", 0.0),
        "p2p_post_kernels": parallel.get("p2p_post_kernels", 0.0),
        **{k: parallel[k] for k in ("lone_all_reduce_kernels", "lone_broadcast_kernels") if k in parallel},
        **({"comm_share": shares} if shares else {}),
        **({k: {n: x * one for n, x in v.items()} for k, v in recompute_kernels(
            host, peak, copy_bytes_per_s, efficiency).items()} if host else {}),
        "recompute_unit_factor": one,
        "source": f"{source}; probe layer on {parallel['ranks']} ranks at once, plain vs DTensor TP "
                  "(executors.parallel's plan, with and without SP) vs FSDP2, in units of the plain "
                  "layer's per-kernel time, median of interleaved rounds: the probe model wrapped as the "
                  "executor wraps it, over the same model plain, at 2 and 6 layers, the slope per layer and "
                  "the intercept for the ends (*_root: FSDP2's root group; TP's *_embed / *_head: split "
                  "in the ratio of the embedding's and head's costs timed alone), per micro-batch; "
                  "AdamW per plain / DTensor "
                  "tensor; broadcast: its 2-rank alpha; p2p: a two-rank relay of the probe layer, its cost per message less the send call (wake), the sender's blocking send call, "
                  "the irecv call that posts a receive (post); "
                  "latency: two busy ranks streaming unwaited sends, the receiver's period less the "
                  "slower rank's compute (delivery by gloo's thread while both ranks compute); lone_*: a "
                  "4 KB all-reduce / broadcast issued right after both ranks ran the probe layer "
                  "(the slower rank's median), as DDP and ZeroRedundancyOptimizer issue theirs; recompute_full/"
                  "selective: the probe layer under checkpoint_wrapper in one process, beyond the "
                  "recomputed ops, interleaved with the plain layer; *_unit_factor: each probe's "
                  "per-kernel time over the simulator's for the same rank count, applied to its "
                  "figures; comm_share: per wrapper, [forward, backward] share of its extra time that "
                  "the executor's recorder counts as exposed communication (the 6-layer probe model, "
                  "recorded steps apart from the timed ones), the rest host compute; name@n: the same "
                  "figure from the probe on n ranks at once (groups of probe_ranks side by side), which "
                  "topologies.profile.scale_for_ranks uses for runs nearer n ranks"}


def _oversubscription(oversub: dict, source: str) -> dict:
    """The ``oversubscription`` section: the per-rank GEMM and probe-layer rates and the
    executor's slowdown with n ranks."""
    return {"matmul_flops_per_s_per_rank": _per_rank(oversub.get("matmul", {})),
            "layer_steps_per_s_per_rank": _per_rank(oversub.get("layer", {})),
            "executor_slowdown": _per_rank(oversub.get("slowdown", {})),
            "source": f"{source}; one-rank GEMM and probe-layer rates (one thread, gloo "
                      "process group) over the executor's slowdown with n ranks: "
                      "forward + optimizer time per rank of a data-parallel run of the "
                      "validation tiny model on n ranks over one rank, median of "
                      "interleaved rounds"}


def at_ranks(grouped: dict, layer: dict) -> dict:
    """The grouped parallel probe's wrapper costs (in the simulator's unit for its rank count,
    ``wrapper_kernels``) and pipeline point-to-point figures (in the probe's unit until
    ``p2p_in_sim_unit``), each under ``name@ranks``; none where the oversubscription probe
    measured no slowdown for that rank count to convert them by."""
    n = grouped["ranks"]
    if n not in layer:
        return {}
    out = {f"{k}@{n}": v for k, v in wrapper_kernels(grouped, layer).items()}
    out.update({f"{k}@{n}": grouped[k] for k in P2P_KEYS if k in grouped})
    return out


def _rank_tables(efficiency: dict, oversub: dict) -> None:
    """The per-rank-count tables ``topologies.profile.scale_for_ranks`` reads (string keys):
    the layer rate per rank (``host_oversubscription``) and the wait for the last rank at
    DDP's sync (``dp_sync_wait_fraction``), where the oversubscription probe measured them."""
    for key, name in (("layer", "host_oversubscription"), ("dp_sync_wait", "dp_sync_wait_fraction")):
        if oversub.get(key):
            efficiency[name] = {str(k): v for k, v in _per_rank(oversub[key]).items()}


def _host_overhead_s(host: dict, oversub: dict) -> float:
    """Per-kernel host cost. On a CPU host, from the one-rank oversubscription probe (the
    same layer), so that ``topologies.profile.scale_for_ranks``, which multiplies it by
    layer[1] / layer[n], gives exactly the per-rank cost measured with n ranks running;
    elsewhere the main-process probe."""
    one = (oversub.get("layer") or {}).get(1)
    if not one:
        return host["per_kernel_s"]
    return 1.0 / (one * (host["forward_kernels"] + host["backward_kernels"]))


def _attention_efficiency(rows, precision, peak) -> float:
    """Attention on a device without a fused kernel runs as batched GEMMs of size s x s x d."""
    mid = [r for r in rows if r["precision"] == precision and r["m"] == 256]
    return round(statistics.median(r["flops_per_s"] for r in mid) / peak, 4) if mid else 0.5


def _host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return 0.0
