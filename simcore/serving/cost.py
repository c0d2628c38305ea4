"""The time of one serving iteration of a replica, from the training model's parts.

One iteration runs the linear layers over every token it schedules (prefill chunks and one
token per decoding request), attention over each token's context, the output layer over the
rows that emit a token, and two tensor-parallel all-reduces per layer (after the attention
projection and after the MLP, Megatron's layout: Shoeybi et al. 2019, Sec. 3). Its time is

    max(compute, HBM bytes / achievable bandwidth) + TP all-reduces

- compute: each linear GEMM at the catalog's matmul efficiency for its FLOPs (int8/int4
  weight-only layers at the 16-bit peak: the kernels dequantize the weights into 16-bit GEMMs;
  the dequantization's own cost in a compute-bound prefill is not charged)
  (``topologies/catalog/efficiency.yaml`` through ``simcore.model.compute.device_model``; the
  GEMM shapes are ``simcore.model.workload.layer_forward_ops``'), FP8 GEMMs at the FP8 peak
  times the catalog's ``fp8_matmul_ratio``; attention at the catalog's attention fraction of
  the 16-bit peak, causal (a prefill chunk of c tokens after o cached ones: c*o + c(c+1)/2
  query-key pairs; a decode step: its context);
- bytes: the weights once per iteration (an MoE layer: the experts its tokens reach, each
  expert drawn top_k/E per token), the KV cache each token's attention reads, and the KV it
  writes; at the GPU's datasheet HBM bandwidth times the catalog's ``memory_bound.efficiency``;
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
    gemms: tuple[tuple[float, int, bool], ...]
    """Per layer: (FLOPs per token of one GEMM, GEMMs, runs in FP8)."""
    logits_flops_per_row: float
    dev: DeviceModel
    fp8_peak: float
    weight_bytes: float
    """Weights one GPU holds."""
    dense_read_bytes: float
    """Weights an iteration reads whatever its tokens (all but the experts and the embedding)."""
    expert_bytes: float
    """One GPU's share of one expert's weights, all MoE layers (0 for a dense model)."""
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
        """The linear layers' compute time for ``tokens`` tokens (cached per count)."""
        t = self._linear.get(tokens)
        if t is None:
            t = 0.0
            for per_token, count, fp8 in self.gemms:
                flops = per_token * tokens
                eff = self.dev.matmul.at(flops)
                peak = self.fp8_peak * self.dev.fp8_matmul_ratio if fp8 else self.dev.peak_flops
                t += count * flops / (peak * eff)
            t *= self.layers
            self._linear[tokens] = t
        return t

    def all_reduce_s(self, tokens: int) -> float:
        """Two all-reduces per layer of ``tokens`` hidden vectors."""
        if self.tp == 1 or tokens == 0:
            return 0.0
        return 2 * self.layers * all_reduce_s(tokens * self.all_reduce_bytes_per_token, self.net)

    def weight_read_bytes(self, tokens: int) -> float:
        if not self.experts:
            return self.dense_read_bytes
        reached = self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** tokens)
        return self.dense_read_bytes + reached * self.expert_bytes


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
    logits = rows * rc.logits_flops_per_row
    compute = (rc.linear_s(tokens) + logits / (dev.peak_flops * dev.matmul.at(logits))
               + pairs * rc.attn_flops_per_pair / (dev.peak_flops * dev.attention_forward))
    bytes_ = rc.weight_read_bytes(tokens) + (kv_read_tokens + tokens) * rc.kv_bytes_per_token
    memory = bytes_ / (dev.hbm_bytes_per_s * dev.memory_efficiency)
    return max(compute, memory) + rc.all_reduce_s(tokens)


def prefill_s(rc: ReplicaCost, prompt: int, offset: int = 0) -> float:
    """A prefill chunk of ``prompt`` tokens after ``offset`` cached ones, alone in its iteration."""
    pairs = prompt * offset + prompt * (prompt + 1) / 2
    return iteration_s(rc, prompt, pairs, offset, 1, chunks=1)


def decode_s(rc: ReplicaCost, seqs: int, context: int) -> float:
    """A decode step of ``seqs`` requests of ``context`` tokens each."""
    return iteration_s(rc, seqs, seqs * context, seqs * context, seqs, decodes=seqs)


def _gemms(plan: ServingPlan) -> tuple[tuple[float, int, bool], ...]:
    """The linear GEMMs of one layer per token (``layer_forward_ops`` at one token)."""
    fp8 = plan.precision.activations == Dtype.FP8
    ops = wl.layer_forward_ops(plan.model, b=1, s=1, tp=plan.tp, flash=True)
    return tuple((op.flops, op.count, fp8 and op.name in wl.FP8_LINEAR_OPS) for op in ops if op.name in LINEAR_OPS)


def weight_bytes_per_param(plan: ServingPlan) -> float:
    """Bytes a quantized linear layer's weight takes per parameter: its format, and for int4 an
    fp16 scale and a packed int4 zero point per group of input channels (``PrecisionSpec``)."""
    pr = plan.precision
    w = DTYPE_BYTES[pr.weights]
    return w + (HALF + DTYPE_BYTES[Dtype.INT4]) / pr.group_size if pr.weights == Dtype.INT4 else w


def weight_bytes(plan: ServingPlan) -> tuple[float, float, float]:
    """(held, read every iteration, one expert's) weight bytes on one GPU."""
    m, tp = plan.model, plan.tp
    pc = param_counts(m)
    w = weight_bytes_per_param(plan)
    ends = (pc.embedding + pc.output) * act_bytes(plan) / tp
    blocks = (pc.total - pc.embedding - pc.output) * w / tp
    head = (pc.embedding if m.tied_embeddings else pc.output) * act_bytes(plan) / tp
    if not m.moe:
        return ends + blocks, blocks + head, 0.0
    moe_layers = m.layers - m.dense_count
    one_expert = moe_layers * 3 * m.hidden * m.ffn_hidden * w / tp if m.gated_mlp else \
        moe_layers * 2 * m.hidden * m.ffn_hidden * w / tp
    return ends + blocks, blocks + head - m.experts * one_expert, one_expert


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
    held, read, expert = weight_bytes(plan)
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
        dev=dev, fp8_peak=fp8_peak, weight_bytes=held, dense_read_bytes=read, expert_bytes=expert,
        experts=m.experts, top_k=m.top_k, kv_bytes_per_token=kv_token,
        attn_flops_per_pair=4.0 * m.layers * (m.heads // plan.tp) * m.head_dim,
        all_reduce_bytes_per_token=m.hidden * act_bytes(plan),
        net=group_net(plan.cluster, dev, plan.tp, 1), kv_blocks=blocks, block_size=plan.kv_cache.block_size,
        host=host)
