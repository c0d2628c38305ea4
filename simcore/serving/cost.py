"""The time of one serving iteration of a replica, from the training model's parts.

One iteration runs the linear layers over every token it schedules (prefill chunks and one
token per decoding request), attention over each token's context, the output layer over the
rows that emit a token, and two tensor-parallel all-reduces per layer (after the attention
projection and after the MLP, Megatron's layout: Shoeybi et al. 2019, Sec. 3). The engines
run these as a sequence of kernels on one stream (captured in CUDA graphs), so the iteration
is the sum of each kernel's roofline (Williams et al., "Roofline", CACM 2009; summed per
operator as Vidur, Agrawal et al. MLSys 2024, and LLM-Viewer, Yuan et al. 2024, arXiv
2402.16363, do), not one roofline of the whole iteration: a large decode batch's GEMMs are
compute-bound while its attention streams the KV cache, and neither hides the other.

    per layer: sum over its GEMMs of max(FLOPs / matmul rate, weight bytes / bandwidth)
               + max(attention FLOPs / attention rate, KV bytes / bandwidth)
    + the output layer's max(FLOPs / matmul rate, its weight bytes / bandwidth) + TP all-reduces

- compute: each linear GEMM at the catalog's matmul efficiency for its FLOPs (int8/int4
  weight-only layers at the 16-bit peak: the kernels dequantize the weights into 16-bit GEMMs;
  the dequantization's own cost in a compute-bound prefill is not charged)
  (``topologies/catalog/efficiency.yaml`` through ``simcore.model.compute.device_model``; the
  GEMM shapes are ``simcore.model.workload.layer_forward_ops``'), FP8 GEMMs at the FP8 peak
  times the catalog's ``fp8_matmul_ratio``; attention at the catalog's attention fraction of
  the 16-bit peak, causal (a prefill chunk of c tokens after o cached ones: c*o + c(c+1)/2
  query-key pairs; a decode step: its context);
- bytes: each GEMM's weights once per iteration (a GEMM of k x n weights computes 2kn FLOPs a
  token; an MoE layer's expert GEMMs read the experts its tokens reach, each expert drawn top_k/E
  per token), the KV cache each token's attention reads and the KV it writes; at the GPU's
  datasheet HBM bandwidth times the catalog's ``memory_bound.efficiency``. The GEMMs' activation
  reads and writes and the elementwise kernels (norms, activation, residual adds, which the
  engines fuse into the GEMMs' epilogues) are not charged: at a decode batch they are a few
  percent of the weights' bytes, and a prefill's GEMMs are compute-bound;
- all-reduces: ``simcore.model.collectives.all_reduce_s`` (NCCL ring or tree, the faster) on the
  node's NVLink (``group_net``), 16-bit activations.

No fixed host or scheduler overhead per iteration is added: the catalog's ``kernel_overhead_us``
and ``host_overhead_us`` are eager-PyTorch training figures, and no cited source gives a serving
engine's per-iteration overhead (the engines run CUDA graphs). The same holds for the
sampler and for the embedding gather (small). The exception is a CPU host calibrated for trainplan's
serving loop (``trainplan serve PLAN --calibrate``), whose figures the caller passes to
``replica_cost``: there the GEMMs take their times measured at the model's shapes, attention and
the KV bytes the roofline's, and the loop's own measured costs are added (``simcore.serving.host``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simcore.model import workload as wl
from simcore.model.collectives import all_reduce_s, group_net
from simcore.model.compute import DeviceModel, device_model
from simcore.model.params import kv_width, param_counts
from simcore.serving.host import HostCosts
from simcore.serving.spec import DTYPE_BYTES, Dtype, PlanError, ServingPlan

#: Bytes of a 16-bit element (activations on the wire, the embedding and the output layer,
#: which FP8 checkpoints keep in 16 bits: TensorRT-LLM's and vLLM's FP8 schemes quantize the
#: transformer blocks' linear layers only).
HALF = 2.0
#: The linear layers' GEMMs of a layer (the attention core is costed apart).
LINEAR_OPS = wl.FP8_LINEAR_OPS | {"router"}


@dataclass(slots=True, kw_only=True)
class ReplicaCost:
    """The constants of one replica's iteration time and KV capacity (``replica_cost``)."""

    tp: int
    layers: int
    gemms: tuple[tuple[float, int, bool, float, bool], ...]
    """Per layer: (FLOPs per token of one GEMM, GEMMs, runs in FP8, weight bytes of one GEMM on one
    GPU, an expert's GEMM)."""
    logits_flops_per_row: float
    dev: DeviceModel
    fp8_peak: float
    weight_bytes: float
    """Weights one GPU holds."""
    head_bytes: float
    """The output layer's weights on one GPU (read by every iteration)."""
    experts: int
    top_k: int
    kv_bytes_per_token: float
    """KV cache bytes per token on one GPU, all layers."""
    attn_flops_per_pair: float
    """FLOPs of one query-key pair on one GPU, all layers (QK^T and PV)."""
    all_reduce_bytes_per_token: float
    net: object
    kv_blocks: int
    """KV blocks a replica holds."""
    block_size: int
    host: HostCosts | None = None
    """A calibrated CPU host's serving-loop costs beyond the roofline (None elsewhere)."""
    _linear: dict = field(default_factory=dict, repr=False)

    def linear_s(self, tokens: int) -> float:
        """The linear layers' time for ``tokens`` tokens, each GEMM the larger of its compute
        and its weights' read (cached per count)."""
        t = self._linear.get(tokens)
        if t is None:
            t, bw = 0.0, self.dev.hbm_bytes_per_s * self.dev.memory_efficiency
            reached = self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** tokens) if self.experts else 0.0
            for per_token, count, fp8, weights, expert in self.gemms:
                flops = per_token * tokens
                peak = self.fp8_peak * self.dev.fp8_matmul_ratio if fp8 else self.dev.peak_flops
                compute = count * flops / (peak * self.dev.matmul.at(flops))
                t += max(compute, (reached if expert else count) * weights / bw)
            t *= self.layers
            self._linear[tokens] = t
        return t

    def attention_s(self, pairs: float, kv_tokens: float) -> float:
        """Attention over ``pairs`` query-key pairs, all layers, the larger of its FLOPs and the KV of
        ``kv_tokens`` tokens it reads and writes."""
        dev = self.dev
        return max(pairs * self.attn_flops_per_pair / (dev.peak_flops * dev.attention_forward),
                   kv_tokens * self.kv_bytes_per_token / (dev.hbm_bytes_per_s * dev.memory_efficiency))

    def all_reduce_s(self, tokens: int) -> float:
        """Two all-reduces per layer of ``tokens`` hidden vectors."""
        if self.tp == 1 or tokens == 0:
            return 0.0
        return 2 * self.layers * all_reduce_s(tokens * self.all_reduce_bytes_per_token, self.net)


def iteration_s(rc: ReplicaCost, tokens: int, pairs: float, kv_read_tokens: float, rows: int,
                chunks: int = 0, decodes: int = 0, idle_s: float = 0.0) -> float:
    """Seconds of one iteration over ``tokens`` scheduled tokens whose attention covers ``pairs``
    query-key pairs and reads ``kv_read_tokens`` cached tokens, ``rows`` of them emitting a token;
    ``chunks`` prefill chunks and ``decodes`` decoding requests among them, ``idle_s`` seconds after
    the replica's last iteration ended (the serving-calibrated host's terms)."""
    if tokens <= 0:
        return 0.0
    dev = rc.dev
    if rc.host is not None:       # a CPU host calibrated for the serving loop (simcore.serving.host)
        h = rc.host
        attention = pairs * rc.attn_flops_per_pair / (dev.peak_flops * dev.attention_forward)
        kv = (kv_read_tokens + tokens) * rc.kv_bytes_per_token / (dev.hbm_bytes_per_s * dev.memory_efficiency)
        return (h.gemm_s(rc.layers, tokens, rows) + attention + kv
                + h.seconds(tokens - decodes, chunks, decodes, kv_read_tokens) + h.wake_s(idle_s))
    bw = dev.hbm_bytes_per_s * dev.memory_efficiency
    logits = rows * rc.logits_flops_per_row
    head = max(logits / (dev.peak_flops * dev.matmul.at(logits)) if rows else 0.0, rc.head_bytes / bw)
    return rc.linear_s(tokens) + rc.attention_s(pairs, kv_read_tokens + tokens) + head + rc.all_reduce_s(tokens)


def prefill_s(rc: ReplicaCost, prompt: int, offset: int = 0) -> float:
    """A prefill chunk of ``prompt`` tokens after ``offset`` cached ones, alone in its iteration."""
    pairs = prompt * offset + prompt * (prompt + 1) / 2
    return iteration_s(rc, prompt, pairs, offset, 1, chunks=1)


def decode_s(rc: ReplicaCost, seqs: int, context: int) -> float:
    """A decode step of ``seqs`` requests of ``context`` tokens each."""
    return iteration_s(rc, seqs, seqs * context, seqs * context, seqs, decodes=seqs)


#: An MoE layer's expert GEMMs (``workload.mlp_ops``): their weights are read per expert reached.
EXPERT_OPS = ("expert_in", "expert_out")


def _gemms(plan: ServingPlan) -> tuple[tuple[float, int, bool, float, bool], ...]:
    """The linear GEMMs of one layer per token (``layer_forward_ops`` at one token) and the
    weight bytes of each on one GPU: a GEMM of k x n weights computes 2kn FLOPs a token (an
    expert's, 2kn per token copy routed to it: top_k x capacity_factor / E a token at one token);
    the router's weights stay 16-bit."""
    m, fp8 = plan.model, plan.precision.activations == Dtype.FP8
    w, half = weight_bytes_per_param(plan), act_bytes(plan)
    ops = wl.layer_forward_ops(m, b=1, s=1, tp=plan.tp, flash=True)
    out = []
    for op in ops:
        if op.name not in LINEAR_OPS:
            continue
        expert = op.name in EXPERT_OPS
        params = op.flops / 2 / (m.top_k * m.capacity_factor / op.count if expert else 1.0)
        out.append((op.flops, op.count, fp8 and op.name in wl.FP8_LINEAR_OPS,
                    params * (half if op.name == "router" else w), expert))
    return tuple(out)


def weight_bytes_per_param(plan: ServingPlan) -> float:
    """Bytes a quantized linear layer's weight takes per parameter: its format, and for int4 an
    fp16 scale and a packed int4 zero point per group of input channels (``PrecisionSpec``)."""
    pr = plan.precision
    w = DTYPE_BYTES[pr.weights]
    return w + (HALF + DTYPE_BYTES[Dtype.INT4]) / pr.group_size if pr.weights == Dtype.INT4 else w


def weight_bytes(plan: ServingPlan) -> float:
    """The weight bytes one GPU holds: the blocks in the weights' format, the embedding and the
    output layer in 16 bits."""
    pc, tp = param_counts(plan.model), plan.tp
    ends = (pc.embedding + pc.output) * act_bytes(plan) / tp
    return ends + (pc.total - pc.embedding - pc.output) * weight_bytes_per_param(plan) / tp


def act_bytes(plan: ServingPlan) -> float:
    """Bytes of an activation, an embedding or output-layer weight: 16 bits, or fp32 where the plan
    serves in fp32 (a CPU host)."""
    return DTYPE_BYTES[Dtype.FP32] if plan.precision.activations == Dtype.FP32 else HALF


def activation_bytes(plan: ServingPlan) -> float:
    """The activation workspace of the largest iteration on one GPU: vLLM sizes its KV cache after a
    profiling forward of ``max_num_batched_tokens`` (``gpu_worker.determine_available_memory``);
    here its largest tensors: the MLP's intermediate, the QKV output and the fp32 logits."""
    m, s, tp = plan.model, plan.scheduler, plan.tp
    width = 2 * m.ffn_hidden / tp + m.hidden + (m.heads + 2 * m.kv_heads) * m.head_dim / tp
    return s.max_num_batched_tokens * width * act_bytes(plan) + s.max_num_seqs * m.vocab / tp * 4


def kv_bytes_per_token(plan: ServingPlan) -> float:
    """K and V of one token on one GPU, all layers (a KV head is replicated where tp > kv_heads)."""
    m = plan.model
    per_rank = kv_width(m) / max(1, min(plan.tp, m.kv_heads)) if not m.mla else m.kv_lora_rank + m.qk_rope_head_dim
    factor = 2 if not m.mla else 1
    return m.layers * factor * per_rank * DTYPE_BYTES[plan.precision.kv_cache]


def replica_cost(plan: ServingPlan, host: HostCosts | None = None) -> ReplicaCost:
    """The replica's constants: device, GEMM shapes, bytes, KV capacity, TP group; ``host``: a
    calibrated CPU host's serving-loop costs (``simcore.serving.host``)."""
    gpu = plan.cluster.node.gpu
    dev = device_model(gpu, "fp32" if plan.precision.activations == Dtype.FP32 else "bf16")
    fp8_peak = gpu.peak("fp8") or 0.0
    if plan.precision.activations == Dtype.FP8 and not fp8_peak:
        raise PlanError(f"precision.activations=fp8 is not supported by {gpu.name} (no fp8 peak in its catalog entry)")
    m = plan.model
    held = weight_bytes(plan)
    pc = param_counts(m)
    kv_token = kv_bytes_per_token(plan)
    kv = plan.kv_cache
    if kv.free_memory_fraction is None:
        free = gpu.hbm_bytes * kv.gpu_memory_utilization - held - activation_bytes(plan)
    else:
        free = kv.free_memory_fraction * (gpu.hbm_bytes - held - activation_bytes(plan))
    if free <= 0:
        raise PlanError(f"parallel.tp={plan.tp}: the weights ({held / 2**30:.1f} GiB per GPU) and activations leave no "
                        f"KV cache within the kv_cache section's share of {gpu.name}'s {gpu.hbm_bytes / 2**30:.0f} GiB")
    blocks = int(free // (kv_token * plan.kv_cache.block_size))
    return ReplicaCost(
        tp=plan.tp, layers=m.layers, gemms=_gemms(plan), logits_flops_per_row=2.0 * m.hidden * m.vocab / plan.tp,
        dev=dev, fp8_peak=fp8_peak, weight_bytes=held,
        head_bytes=(pc.embedding if m.tied_embeddings else pc.output) * act_bytes(plan) / plan.tp,
        experts=m.experts, top_k=m.top_k, kv_bytes_per_token=kv_token,
        attn_flops_per_pair=4.0 * m.layers * (m.heads // plan.tp) * m.head_dim,
        all_reduce_bytes_per_token=m.hidden * act_bytes(plan),
        net=group_net(plan.cluster, dev, plan.tp, 1), kv_blocks=blocks, block_size=plan.kv_cache.block_size,
        host=host)
