"""Kernel time from a roofline with measured efficiencies (Williams et al. 2009, "Roofline").

An op takes max(FLOPs / (peak x eff(shape)), bytes / (HBM bandwidth x eff_mem)) plus a
fixed per-kernel overhead. ``eff(shape)`` is the achieved fraction of the dense peak for a GEMM
of that many FLOPs, a curve kept as data per GPU in ``topologies/catalog/efficiency.yaml`` (each
with its source) in the manner of Calculon (calculon-ai/calculon, ``systems/a100_80g.json``
efficiency tables). No fudge factor lives here: every number comes from the GPU's entry.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field, fields

from simcore.plan.spec import PlanError
from simcore.model import eager_ops as eager
from simcore.model import workload as wl
from simcore.model.workload import Op
from topologies.components import GPU, EfficiencyCurve
from topologies.hardware import load_catalog

#: FLOP ratio of a FlashAttention backward to its forward: 5 matmuls against 2
#: (Dao 2023, FlashAttention-2, Sec. 3.1.2; the backward also recomputes the scores).
FLASH_BACKWARD_FLOP_RATIO = 2.5
#: HBM traffic of an elementwise kernel's backward relative to its forward. LayerNorm and
#: GeLU read x and dy and write dx where the forward read x and wrote y (3 passes against
#: 2); the fused softmax's backward reads y and dy and writes dx, dropout's reads dy and the
#: 1-byte mask and writes dx (11 bytes against the forward's 9); dropout-add passes the
#: residual gradient through. About 1.5x over a layer's elementwise kernels.
ELEMENTWISE_BACKWARD_TRAFFIC = 1.5


@dataclass(frozen=True, slots=True, kw_only=True)
class DeviceModel:
    """Everything the roofline needs about one GPU at one precision, in SI units."""

    name: str
    peak_flops: float
    hbm_bytes_per_s: float
    matmul: EfficiencyCurve
    attention_forward: float
    attention_backward: float
    memory_efficiency: float
    kernel_overhead_s: float
    host_overhead_s: float
    """Host (framework) time to issue one modelled kernel; an eager step cannot run faster."""
    dispatch_s: float | None = None
    """On a device whose issuing thread also runs the kernel (a CPU host), the per-kernel
    host time that adds to the device time (``phase_s``); None where the host issues
    kernels asynchronously (GPUs), so a phase takes the larger of the two."""
    nvlink_efficiency: float
    nic_efficiency: float
    base_latency_s: float
    nvlink_hop_latency_s: float
    net_hop_latency_s: float
    host_memory_bytes_per_s: float
    adam_host_bytes_per_param: float
    comm_compute_interference: float = 1.0
    """Factor by which compute slows while an overlapped NCCL kernel shares the GPU (>= 1)."""
    attention_length: EfficiencyCurve | None = None
    """Multiplier of the attention fractions by one kernel's query tokens (1 at the plateau)."""
    fp8_matmul_ratio: float = 1.0
    """An FP8 GEMM's achieved fraction of the FP8 peak relative to a 16-bit GEMM's of its peak
    at the same size (catalog ``fp8_matmul_ratio``, per GPU; 1 where none is given)."""
    linear_peak_flops: float = 0.0
    """Peak of the transformer blocks' linear layers (``workload.FP8_LINEAR_OPS``) where it
    differs from ``peak_flops``: under an FP8 recipe only they run in FP8 (Transformer
    Engine's ``te.Linear``/``LayerNormLinear``/``LayerNormMLP`` inside ``fp8_autocast``;
    torchao's ``convert_to_float8_training`` swaps ``nn.Linear`` only), while attention,
    softmax, norms, the output layer and all communication stay 16-bit (``peak_flops``).
    MXFP8 and NVFP4 (``training.precision``) run the same linear layers at their own peak
    (TE's ``MXFP8BlockScaling`` / ``NVFP4BlockScaling``: the linear layers' fprop, dgrad, wgrad GEMMs)."""
    linear_format: str = ""
    """The format of the linear layers' GEMMs (fp8, mxfp8, nvfp4); empty: the 16-bit peak."""
    fp8_transpose: bool = True
    """Whether TE's per-tensor FP8 cast writes a transposed copy beside the data: on GPUs whose FP8
    GEMMs take only TN layouts (Hopper, Ada); not on Blackwell (``GPU.non_tn_fp8``)."""
    eager_autocast: bool = False
    """The executor's eager autocast stack (a GPU profile of its runs, 16-bit): ``eager_ops`` count."""
    parallel_kernels: tuple[tuple[str, float, float], ...] = ()
    """(mode, forward, backward) extra host kernels per layer and micro-batch that a torch
    parallel wrapper costs over the plain eager layer (mode: tp, tp_sp, fsdp_zero2,
    fsdp_zero3), collective latency included, per pipeline chunk (mode pipeline_chunk:
    a ``PipelineStage``'s forward/backward over the plain layer) and per model end (modes
    tp[_sp]_embed, tp[_sp]_head, fsdp_zero2/3_root: the embedding, the head, FSDP2's root
    group over the same ends plain, per micro-batch); measured by ``trainplan
    calibrate`` on CPU hosts (``executors.calibrate.parallel_probes.bench_parallel_host``), absent from catalog GPUs."""
    parallel_comm_share: tuple[tuple[str, float, float], ...] = ()
    """(mode, forward, backward) share of a wrapper's ``parallel_kernels`` that a run measures
    as exposed communication (the rest is host compute: DTensor dispatch, FSDP2's hooks)."""
    optimizer_per_tensor_kernels: float = 0.0
    """Host cost of the optimizer per parameter tensor, in host kernels (eager AdamW)."""
    optimizer_dtensor_per_tensor_kernels: float = 0.0
    """The same for a DTensor parameter (TP or FSDP2 shards): every op dispatches through DTensor."""
    optimizer_bytes_per_s: float = 0.0
    """Measured optimizer throughput over parameter bytes (0: the roofline stream model)."""
    broadcast_latency_s: float = 0.0
    """Per-call latency of a 2-rank broadcast (ZeroRedundancyOptimizer's sync: one bucket per rank)."""
    p2p_latency_kernels: float = 0.0
    """Receiver-side cost of one pipeline message between busy ranks, in host kernels:
    measured on CPU hosts by two ranks streaming the probe layer's activations with unwaited
    sends (``executors.calibrate.handover_probes._busy_stream``): gloo hands a message over only once the
    receiver has posted its receive, and the busy sender's gloo thread then waits for a core,
    so a receiver that is ready later than the send still waits this long (an idle ping-pong,
    0.1-1.4 ms and load-dependent, does not see it); absent from catalog GPUs."""
    p2p_send_kernels: float = 0.0
    """Host time of one blocking pipeline send call (gloo ``isend(...).wait()``) on the
    sender's thread, in host kernels; measured by a two-rank relay of the probe layer
    (``executors.calibrate.handover_probes._busy_p2p``); absent from catalog GPUs."""
    p2p_wake_kernels: float = 0.0
    """The relay's cost per message less the send call: the transit to a receiver already
    blocked in its receive, in host kernels; absent from catalog GPUs."""
    p2p_post_kernels: float = 0.0
    """Host time of the call that posts one pipeline receive (gloo ``irecv``, before its
    wait), timed in the same relay, in host kernels; absent from catalog GPUs."""

    dp_sync_wait: float = 0.0
    """The mean rank's wait for the last one at the data-parallel gradient sync, as a
    fraction of the rest of its step: ranks on a shared CPU host run the same work at
    speeds that differ from step to step (measured by the executor's own data-parallel run
    at this rank count, ``executors.calibrate.oversubscription.bench_executor_slowdown``); 0 on
    catalog GPUs."""
    lone_all_reduce_kernels: float = 0.0
    """Time of one latency-bound all-reduce issued right after compute (DDP's gradient
    all-reduce), in host kernels: a lone gloo call pays its threads' wake-up, which the
    back-to-back fits do not see; absent from catalog GPUs."""
    lone_broadcast_kernels: float = 0.0
    """The same for a broadcast (ZeroRedundancyOptimizer's parameter sync)."""
    _hash: int | None = field(default=None, init=False, repr=False, compare=False)

    def __hash__(self) -> int:   # the model's caches key on the device: its ~35 fields hashed once
        if self._hash is None:
            object.__setattr__(self, "_hash", hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare)))
        return self._hash

    def __getstate__(self) -> list:   # the hash of str fields differs between processes: not carried over
        return [None if f.name == "_hash" else getattr(self, f.name) for f in fields(self)]

    @property
    def lone_all_reduce_s(self) -> float:
        """The calibrated lone all-reduce latency (0 on catalog GPUs: the fitted alpha stands)."""
        return self.lone_all_reduce_kernels * self.host_overhead_s

    @property
    def lone_broadcast_s(self) -> float:
        """The calibrated lone broadcast latency (0 on catalog GPUs)."""
        return self.lone_broadcast_kernels * self.host_overhead_s

    @property
    def busy_p2p_latency_s(self) -> float:
        """The calibrated receiver-side cost of one pipeline message (0 on catalog GPUs)."""
        return self.p2p_latency_kernels * self.host_overhead_s

    @property
    def p2p_wake_s(self) -> float:
        """The calibrated transit to a blocked receiver (0 on catalog GPUs: the hop latency)."""
        return self.p2p_wake_kernels * self.host_overhead_s

    @property
    def p2p_post_s(self) -> float:
        """The calibrated call that posts one pipeline receive (0 on catalog GPUs)."""
        return self.p2p_post_kernels * self.host_overhead_s

    @property
    def p2p_send_s(self) -> float:
        """The calibrated sender-side cost of one pipeline send (0 on catalog GPUs: asynchronous)."""
        return self.p2p_send_kernels * self.host_overhead_s

    def parallel_extra_s(self, mode: str) -> tuple[float, float]:
        """(forward, backward) seconds a parallel wrapper adds to one layer's micro-batch."""
        for name, f, b in self.parallel_kernels:
            if name == mode:
                return f * self.host_overhead_s, b * self.host_overhead_s
        return 0.0, 0.0

    def measured(self, *modes: str) -> bool:
        """Whether this (calibrated CPU) host measured what any wrapper of ``modes`` costs; that
        cost then holds its collectives' latency and dispatch, and the model adds their bytes."""
        return bool(self.parallel_kernels) and any(sum(self.parallel_extra_s(m)) > 0 for m in modes)

    def parallel_split_s(self, mode: str) -> tuple[tuple[float, float], tuple[float, float]]:
        """``parallel_extra_s(mode)`` split into ((forward, backward) communication, (forward,
        backward) host compute) by the calibrated share a run measures as exposed communication
        (an end's, ``*_embed`` / ``*_head`` / ``*_root``, is its wrapper's); all communication
        where no share was measured."""
        if not self.parallel_kernels:   # catalog GPUs: no wrapper host costs
            return (0.0, 0.0), (0.0, 0.0)
        f, b = self.parallel_extra_s(mode)
        base = mode.rsplit("_", 1)[0] if mode.endswith(("_embed", "_head", "_root")) else mode
        sf, sb = next(((x, y) for name, x, y in self.parallel_comm_share if name == base), (1.0, 1.0))
        return (f * sf, b * sb), (f * (1 - sf), b * (1 - sb))


def _entry(gpu: GPU, catalog_root=None) -> dict:
    if gpu.efficiency_json:  # a calibrated profile carries its own entry
        return json.loads(gpu.efficiency_json)
    eff = (load_catalog(catalog_root) if catalog_root else load_catalog()).efficiency
    if gpu.name not in eff:
        raise PlanError(f"GPU '{gpu.name}' has no entry in topologies/catalog/efficiency.yaml "
                        f"(known: {', '.join(sorted(eff))}); add one or calibrate")
    return eff[gpu.name]


def _attention(entry: dict, gpu: GPU, kernel: str) -> dict:
    """The (forward, backward) fractions of ``kernel`` on ``gpu``: the entry's own for
    ``auto``, else its ``attention.kernels`` entry (refused where the catalog has none)."""
    if kernel == "auto":
        return entry["attention"]
    kernels = entry["attention"].get("kernels", {})
    if kernel not in kernels:
        raise PlanError(f"training.attention_kernel={kernel} has no efficiency for {gpu.name} "
                        f"(efficiency.yaml lists {', '.join(sorted(kernels)) or 'none'} besides auto)")
    return kernels[kernel]


@functools.lru_cache(maxsize=64)
def device_model(gpu: GPU, precision: str, catalog_root=None, fp8_recipe: str = "delayed",
                 attention_kernel: str = "auto") -> DeviceModel:
    """The GPU's datasheet figures joined with its efficiency entry (cached per GPU); the
    attention fractions of ``attention_kernel`` where it is not the entry's own (``auto``)."""
    if gpu.name == "uncalibrated-host":
        raise PlanError("cluster.node=localhost has no calibrated profile; run `trainplan calibrate` first")
    peak = gpu.peak(precision)
    if peak is None:
        raise PlanError(f"training.precision={precision} is not supported by {gpu.name} "
                        f"(its catalog entry has no dense_tflops.{precision} peak)")
    linear_peak, linear_format = 0.0, ""
    if precision in wl.LOW_PRECISION_FORMATS:   # low-precision linear layers, the rest in bf16 (linear_peak_flops)
        peak, linear_peak, linear_format = gpu.peak("bf16") or peak, peak, precision
    e = _entry(gpu, catalog_root)
    attention = _attention(e, gpu, attention_kernel)
    coll, off, factor = e["collective"], e.get("offload", {}), eager.host_factor(e, gpu.vendor, precision)
    return DeviceModel(
        name=gpu.name,
        peak_flops=peak,
        hbm_bytes_per_s=gpu.hbm_bytes_per_s,
        matmul=EfficiencyCurve(points=tuple((float(s), float(v)) for s, v in e["matmul"]["points"]),
                               source=e["matmul"].get("source", "")),
        attention_forward=float(attention["forward"]),
        attention_backward=float(attention["backward"]),
        memory_efficiency=float(e["memory_bound"]["efficiency"]),
        kernel_overhead_s=float(e.get("kernel_overhead_us", 0.0)) * 1e-6,
        host_overhead_s=float(e.get("host_overhead_us", 0.0)) * 1e-6 * factor,
        dispatch_s=float(e["dispatch_us"]) * 1e-6 if "dispatch_us" in e else None,
        nvlink_efficiency=float(coll["nvlink_efficiency"]),
        nic_efficiency=float(coll["nic_efficiency"]),
        base_latency_s=float(coll["base_latency_us"]) * 1e-6,
        nvlink_hop_latency_s=float(coll["nvlink_hop_latency_us"]) * 1e-6,
        net_hop_latency_s=float(coll["net_hop_latency_us"]) * 1e-6,
        host_memory_bytes_per_s=float(off.get("host_memory_gbyte_per_s", 0.0)) * 1e9,
        adam_host_bytes_per_param=float(off.get("adam_host_bytes_per_param", 32)),
        comm_compute_interference=float(e.get("comm_compute_interference", 1.0)),
        attention_length=EfficiencyCurve(points=tuple((float(n), float(v)) for n, v in e["attention"]["length_points"]),
                                         source=e["attention"].get("length_source", ""))
        if "length_points" in e["attention"] else None,
        linear_peak_flops=linear_peak,
        linear_format=linear_format,
        fp8_transpose=not (gpu.non_tn_fp8 and fp8_recipe in wl.TE_TENSOR_SCALING),
        fp8_matmul_ratio=_linear_ratio(e, precision, fp8_recipe),
        dp_sync_wait=float(e.get("dp_sync_wait", 0.0)),
        eager_autocast=eager.runs_eager(e, gpu.vendor, precision),
        **_host_terms(e, factor),
    )


def _linear_ratio(e: dict, precision: str, fp8_recipe: str) -> float:
    """A low-precision linear GEMM's achieved fraction of its peak relative to a 16-bit GEMM's:
    FP8 by recipe (``fp8_recipes``, else ``fp8_matmul_ratio``), MXFP8 and NVFP4 from
    ``low_precision_matmul_ratio`` (1 where the entry gives none)."""
    if precision == "fp8":
        return float(e.get("fp8_recipes", {}).get(fp8_recipe, e.get("fp8_matmul_ratio", 1.0)))
    return float(e.get("low_precision_matmul_ratio", {}).get(precision, 1.0))


def _host_terms(e: dict, factor: float = 1.0) -> dict:
    """A calibrated profile's host-side terms (``parallel_host``, ``optimizer``; ``factor``: of its
    host cost per kernel, ``eager_ops.host_factor``); catalog GPUs have neither, their defaults stand."""
    ph, opt = e.get("parallel_host") or {}, e.get("optimizer") or {}
    out = {}
    if ph:
        out["parallel_kernels"] = tuple((k, float(v["forward_kernels"]), float(v["backward_kernels"]))
                                        for k, v in sorted(ph.items()) if isinstance(v, dict) and "forward_kernels" in v)
        out["parallel_comm_share"] = tuple((k, float(f), float(b)) for k, (f, b) in sorted((ph.get("comm_share") or {}).items()))
        out["optimizer_per_tensor_kernels"] = float(ph.get("optimizer_per_tensor_kernels", 0.0))
        out["optimizer_dtensor_per_tensor_kernels"] = float(ph.get("optimizer_dtensor_per_tensor_kernels", 0.0))
        out["broadcast_latency_s"] = float(ph.get("broadcast_latency_us", 0.0)) * 1e-6
        out["p2p_latency_kernels"] = float(ph.get("p2p_latency_kernels", 0.0))
        out["p2p_send_kernels"] = float(ph.get("p2p_send_kernels", 0.0))
        out["p2p_wake_kernels"] = float(ph.get("p2p_wake_kernels", 0.0))
        out["p2p_post_kernels"] = float(ph.get("p2p_post_kernels", 0.0))
        out["lone_all_reduce_kernels"] = float(ph.get("lone_all_reduce_kernels", 0.0))
        out["lone_broadcast_kernels"] = float(ph.get("lone_broadcast_kernels", 0.0))
    if opt.get("param_gbyte_per_s"):   # a GPU profile's too: torch AdamW timed on that GPU
        out["optimizer_bytes_per_s"] = float(opt["param_gbyte_per_s"]) * 1e9
    if not ph and opt.get("per_tensor_us") and e.get("host_overhead_us"):   # a GPU's: AdamW's launches per tensor
        out["optimizer_per_tensor_kernels"] = float(opt["per_tensor_us"]) / (float(e["host_overhead_us"]) * factor)
    return out


def roofline_s(flops: float, bytes_: float, dev: DeviceModel, efficiency: float, peak: float = 0.0) -> float:
    """max(compute-bound, memory-bound) time of one kernel (no fixed overhead) at ``peak``
    (default: the device's)."""
    return max(flops / ((peak or dev.peak_flops) * efficiency),
               bytes_ / (dev.hbm_bytes_per_s * dev.memory_efficiency))


def attention_length_factor(op: Op, dev: DeviceModel) -> float:
    """The attention kernel's efficiency at ``op.length`` query tokens, relative to its plateau."""
    if dev.attention_length is None or op.length <= 0:
        return 1.0
    return dev.attention_length.at(op.length)


def _efficiency(op: Op, dev: DeviceModel) -> float:
    if op.name == "flash_attention":
        return dev.attention_forward * attention_length_factor(op, dev)
    if not op.matmul:
        return 1.0
    return dev.matmul.at(op.flops * op.count if op.batched else op.flops)


def op_forward_s(op: Op, dev: DeviceModel) -> float:
    """Device time of ``op.count`` forward kernels (fixed per-kernel overhead excluded)."""
    peak, eff = 0.0, _efficiency(op, dev)
    if dev.linear_peak_flops and op.name in wl.FP8_LINEAR_OPS:
        peak, eff = dev.linear_peak_flops, eff * dev.fp8_matmul_ratio
    return op.count * roofline_s(op.flops * op.exec_fraction, op.bytes, dev, eff, peak)


def op_backward_s(op: Op, dev: DeviceModel) -> tuple[float, float]:
    """(input-gradient, weight-gradient) device time of ``op``'s backward.

    A GEMM's backward is two GEMMs of the forward's size: dX = dY W^T (input) and
    dW = X^T dY (weight); a batched attention GEMM has no weights, so both go to the
    input side. An elementwise kernel reads its saved input and the incoming gradient
    and writes one gradient: ``ELEMENTWISE_BACKWARD_TRAFFIC`` times the forward's traffic.
    """
    if op.name == "flash_attention":
        t = op.count * roofline_s(op.flops * op.exec_fraction * FLASH_BACKWARD_FLOP_RATIO,
                                  2 * op.bytes, dev, dev.attention_backward * attention_length_factor(op, dev))
        return t, 0.0
    if not op.matmul:
        return op.backward_scale * op.count * roofline_s(0.0, ELEMENTWISE_BACKWARD_TRAFFIC * op.bytes, dev, 1.0), 0.0
    one = op.backward_scale * op_forward_s(op, dev)
    if op.batched:
        return 2 * one, 0.0
    return (0.0 if op.detached else one), one


def phase_s(device_s: float, kernels: int, dev: DeviceModel) -> float:
    """A phase of ``kernels`` kernels: device time plus each kernel's fixed overhead, but
    never less than the host needs to issue them (eager frameworks launch one by one).
    On a serial device (a CPU host: ``dispatch_s`` set) the thread that issues a kernel
    also runs it, so the host time adds to the device time instead."""
    if dev.dispatch_s is not None:
        return device_s + kernels * dev.dispatch_s
    return max(device_s + kernels * dev.kernel_overhead_s, kernels * dev.host_overhead_s)


def _ops_device_s(ops: list[Op], dev: DeviceModel) -> tuple[float, float, float, int, int]:
    """(forward, backward-input, backward-weight) device seconds and (forward, backward) kernels."""
    fwd = bi = bw = 0.0
    kf = kb = 0
    for op in ops:
        fwd += op_forward_s(op, dev)
        i, w = op_backward_s(op, dev)
        bi += i
        bw += w
        kf += op.kernels
        kb += op.backward_kernels
    return fwd, bi, bw, kf, kb


def ops_time_s(ops: list[Op], dev: DeviceModel) -> tuple[float, float, float]:
    """(forward, backward-input, backward-weight) seconds of a list of ops."""
    fwd, bi, bw, kf, kb = _ops_device_s(ops, dev)
    fwd_s = phase_s(fwd, kf, dev)
    bwd_s = phase_s(bi + bw, kb, dev)
    scale = bwd_s / (bi + bw) if bi + bw > 0 else 0.0
    return fwd_s, bi * scale, bw * scale


def ops_host_slack_s(ops: list[Op], dev: DeviceModel) -> tuple[float, float]:
    """(forward, backward) time the GPU idles in a host-bound phase of ``ops``, waiting for the
    host to issue the next kernel: device work the host does not wait for (a NCCL kernel on the
    stream) runs in it free of charge. 0 on a serial device (a CPU host: ``dispatch_s``)."""
    if dev.dispatch_s is not None:
        return 0.0, 0.0
    fwd, bi, bw, kf, kb = _ops_device_s(ops, dev)
    return (max(0.0, kf * (dev.host_overhead_s - dev.kernel_overhead_s) - fwd),
            max(0.0, kb * (dev.host_overhead_s - dev.kernel_overhead_s) - bi - bw))


def stream_s(bytes_: float, dev: DeviceModel) -> float:
    """A memory-bound pass over ``bytes_`` (e.g. the optimizer step)."""
    return bytes_ / (dev.hbm_bytes_per_s * dev.memory_efficiency) + dev.kernel_overhead_s
