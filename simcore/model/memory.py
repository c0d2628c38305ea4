"""Bytes per GPU: weights, gradients, optimizer states, activations, buffers, framework.

Model states follow Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", SC'20, Sec. 3.1 and 5: mixed-precision Adam keeps 2 + 2 + K
bytes per parameter (16-bit weights, 16-bit gradients, K = 12 bytes of fp32 master
weights, momentum and variance); stage 1 divides the K bytes by N_d, stage 2 also the
gradients, stage 3 everything: (2 + 2 + K) * Psi / N_d. torch FSDP2 (``fully_shard``
with ``MixedPrecisionPolicy(param_dtype=bf16)``) keeps fp32 sharded parameters (4 B),
fp32 sharded gradients (4 B) and Adam's fp32 m, v (8 B): the same 16 B per parameter
over N_d, plus the unsharded 16-bit parameters of the layer in use and the one it
prefetches and the unsharded gradients of the layer being reduced
(torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py).

Activations follow Korthikanti et al. 2022 (``simcore.model.workload``), times the micro-batches
a pipeline rank keeps in flight: GPipe all m; 1F1B p - r on rank r (Narayanan et al.
2021, Sec. 2.2.1); interleaved 1F1B Megatron's warm-up count 2(p - r - 1) + (v - 1)p + 1
model chunks, i.e. L(1 + (p-1)/(pv)) layers on rank 0 (Korthikanti et al. Sec. 4.2.3).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from simcore.plan.spec import Offload, Optimizer, Plan, Precision, Recompute, Schedule, ZeroStage
from simcore.model import workload as wl

GIB = 1024**3
#: CUDA context, cuBLAS/cuDNN workspaces and NCCL communicator buffers per process.
#: A modelling assumption: PyTorch's CUDA context alone takes 0.3-0.8 GiB on A100/H100
#: (PyTorch docs, "CUDA semantics / memory management": the context is not reported by
#: memory_allocated), NCCL allocates NCCL_BUFFSIZE (4 MiB) per channel and peer.
FRAMEWORK_BYTES = 1.0 * GIB
#: Share of tensor memory the caching allocator loses to fragmentation (assumption; the
#: PyTorch allocator rounds blocks and keeps segments: 3-10% is typical in practice).
ALLOCATOR_FRAGMENTATION = 0.05
#: torch DDP's default gradient bucket (``bucket_cap_mb=25`` in torch/nn/parallel/distributed.py).
DDP_BUCKET_BYTES = 25 * 1024**2
#: Buckets in flight at once (one being reduced while the next fills).
BUCKETS_IN_FLIGHT = 2


def weight_bytes_per_param(precision: Precision) -> int:
    return 4 if precision == Precision.FP32 else 2


def optimizer_bytes_per_param(precision: Precision, optimizer: Optimizer) -> int:
    """K of the ZeRO paper: fp32 master copy (mixed precision only) plus the states."""
    states = 4 if optimizer == Optimizer.SGD else 8      # SGD momentum, or Adam m and v
    return states + (0 if precision == Precision.FP32 else 4)


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters one GPU of a pipeline rank holds (after TP and EP splits, before ZeRO)."""

    dense: float
    """Parameters replicated over the dp*cp ranks."""
    expert: float
    """MoE expert parameters, replicated over dp*cp/ep ranks."""
    layer_max: float
    """Largest single layer on this rank (for FSDP2's unsharded working set)."""

    @property
    def total(self) -> float:
        return self.dense + self.expert


def layer_params_per_gpu(plan: Plan) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one GPU."""
    m, par = plan.model, plan.parallel
    pc = wl.param_counts(m)
    if m.moe:  # the router and the shared experts (TP-split like a dense MLP) are on every EP rank
        router = m.hidden * m.experts
        experts = pc.mlp - router - pc.shared
        return (pc.attention + pc.shared) / par.tp + pc.norms + router, experts / (par.ep * par.tp)
    return (pc.attention + pc.mlp) / par.tp + pc.norms, 0.0


def stage_params(plan: Plan, stages: tuple[int, ...] | None = None) -> tuple[StageParams, ...]:
    """Parameters per GPU on each pipeline rank: its virtual stages' layers, the
    embedding on the first stage, the output layer (or the tied embedding's copy that
    Megatron keeps when pp > 1) on the last."""
    m, par = plan.model, plan.parallel
    pc = wl.param_counts(m)
    dense_l, expert_l = layer_params_per_gpu(plan)
    stages = stages if stages is not None else plan.layers_per_stage
    out = []
    for r in range(par.pp):
        layers = sum(stages[r::par.pp])
        dense = layers * dense_l
        if r == 0:
            dense += pc.embedding / par.tp
        if r == par.pp - 1:
            dense += pc.output / par.tp
            if m.tied_embeddings and par.pp > 1:
                dense += m.vocab * m.hidden / par.tp
        out.append(StageParams(dense=dense, expert=layers * expert_l, layer_max=dense_l + expert_l))
    return tuple(out)


def in_flight_chunks(plan: Plan, rank: int) -> int:
    """Model chunks (virtual stages' activations) rank ``rank`` keeps at its peak."""
    return _in_flight_table(plan)(rank)


def _in_flight_table(plan: Plan):
    """``in_flight_chunks(plan, rank)`` as a function of the rank alone (the plan read once:
    ``memory_per_rank`` calls it for every rank of every layout the search scores)."""
    p, v, m = plan.parallel.pp, plan.parallel.vpp, plan.num_microbatches
    if plan.parallel.schedule == Schedule.GPIPE:
        return lambda rank: m * v
    if v > 1:
        return lambda rank: min(m * v, 2 * (p - rank - 1) + (v - 1) * p + 1)
    return lambda rank: min(m, p - rank)


def _executor_activation_terms(plan: Plan) -> tuple[float, float, float, float]:
    """The same four terms for the executor's torch model (``simcore.model.workload.executor_*``)."""
    m, par, tr = plan.model, plan.parallel, plan.training
    e = 4 if tr.precision == Precision.FP32 else 2
    kw = dict(b=tr.micro_batch, s=m.seq_len // par.cp, tp=par.tp, sequence_parallel=par.sequence_parallel)
    per_layer = wl.executor_activation_bytes_per_layer(m, recompute=tr.recompute, elem_bytes=e, **kw)
    working = 0.0
    if tr.recompute == Recompute.FULL:
        working = wl.executor_activation_bytes_per_layer(m, recompute=Recompute.NONE, elem_bytes=e, **kw)
    return (per_layer, working, wl.executor_embedding_activation_bytes(m, b=kw["b"], s=kw["s"]),
            wl.executor_logits_activation_bytes(m, elem_bytes=e, **kw))


def executor_activations(plan: Plan) -> bool:
    """A calibrated profile whose memory is counted on the executor's own model (CPU hosts)."""
    ej = plan.cluster.node.gpu.efficiency_json
    return bool(ej and (json.loads(ej).get("memory") or {}).get("executor_activations"))


def _activation_terms(plan: Plan) -> tuple[float, float, float, float]:
    """(per layer, full-recompute working layer, embedding, logits) activation bytes."""
    if executor_activations(plan):
        return _executor_activation_terms(plan)
    m, par, tr = plan.model, plan.parallel, plan.training
    kw = dict(b=tr.micro_batch, s=m.seq_len // par.cp, tp=par.tp, sequence_parallel=par.sequence_parallel)
    per_layer = wl.activation_bytes_per_layer(m, recompute=tr.recompute, flash=tr.flash_attention, **kw)
    working = 0.0
    if tr.recompute == Recompute.FULL:  # one layer rebuilt in full during its backward
        working = wl.activation_bytes_per_layer(m, recompute=Recompute.NONE, flash=tr.flash_attention, **kw)
    return per_layer, working, wl.embedding_activation_bytes(m, **kw), wl.logits_activation_bytes(m, **kw)


def activation_bytes(plan: Plan, rank: int, stages: tuple[int, ...] | None = None, terms=None) -> float:
    """Activation bytes of pipeline rank ``rank`` at its peak."""
    stages = stages if stages is not None else plan.layers_per_stage
    return _rank_activation_bytes(in_flight_chunks(plan, rank), stages, rank, plan.parallel.pp, plan.parallel.vpp,
                                  terms if terms is not None else _activation_terms(plan))


def _rank_activation_bytes(chunks: int, stages: tuple[int, ...], rank: int, pp: int, vpp: int, terms) -> float:
    """``chunks`` in-flight chunks of rank ``rank``'s layers (``stages`` per virtual stage)
    at ``terms`` = (per layer, full-recompute working layer, embedding, logits) bytes."""
    per_layer, working, emb, logits = terms
    total = chunks * sum(stages[rank::pp]) * pp / len(stages) * per_layer + working
    if rank == 0:
        total += chunks / vpp * emb
    if rank == pp - 1:
        total += logits
    return total


def comm_buffer_bytes(plan: Plan, sp: StageParams) -> float:
    """Communication buffers: DDP/ZeRO buckets, FSDP2's unsharded layers, PP send/recv
    buffers, the sequence-parallel all-gather output, ring attention's K/V in flight."""
    m, par, tr = plan.model, plan.parallel, plan.training
    wb = weight_bytes_per_param(tr.precision)
    b, s = tr.micro_batch, m.seq_len // par.cp
    total = 0.0
    if par.dp * par.cp > 1:
        if par.zero == ZeroStage.WEIGHTS:   # current + prefetched layer, and one layer's grads
            total += (2 * wb + wb) * sp.layer_max
        else:
            total += BUCKETS_IN_FLIGHT * DDP_BUCKET_BYTES
    if par.pp > 1:  # send and receive, forward and backward
        total += 4 * wl.ACT_BYTES * b * s * m.hidden / (par.tp if par.sequence_parallel else 1)
    if par.sequence_parallel:
        total += wl.ACT_BYTES * b * s * m.hidden
    if par.cp > 1:   # ring attention: the K/V chunk in flight and the one received (context_parallel.py)
        total += 2 * 2 * wl.ACT_BYTES * b * s * wl.kv_width(m) / par.tp
    return total


def sharded_gradients(plan: Plan) -> bool:
    """Whether a rank holds only its shard of the gradients through the step. FSDP2
    (``parallel.zero`` 2 or 3) reduce-scatters each block's gradients right after its
    backward, every micro-batch, when it runs alone; under torch.distributed.pipelining a
    stage skips gradient sync until its last backward (``PipelineStage`` with
    ``set_requires_gradient_sync(False)``, then ``perform_reduce_grad``), so it accumulates
    whole unsharded gradients and reduce-scatters once per step, as DDP keeps whole
    gradients for ZeRO 0-1 (``simcore.model.fsdp_calls.fsdp_phase_calls`` counts the
    calls). A ZeRO-2 that shards gradients pays a reduce-scatter per micro-batch for it."""
    return plan.parallel.zero >= ZeroStage.GRADIENTS and plan.parallel.pp == 1


def model_state_bytes(plan: Plan, sp: StageParams) -> dict[str, float]:
    """Weights, gradients and optimizer states on one GPU, and the host bytes of offload."""
    par, tr = plan.parallel, plan.training
    wb = weight_bytes_per_param(tr.precision)
    k = optimizer_bytes_per_param(tr.precision, tr.optimizer)
    nd = par.dp * par.cp
    nd_e = max(1, nd // par.ep)
    shard = sp.dense / nd + sp.expert / nd_e           # parameters this GPU owns
    z = par.zero
    weights = wb * (shard if z >= ZeroStage.WEIGHTS else sp.total)
    if z == ZeroStage.GRADIENTS and tr.precision == Precision.FP32:
        # ZeRO-2 in fp32: the optimizer steps a sharded fp32 copy (FSDP2's sharded parameters,
        # DeepSpeed's fp32 partition) while the full parameters stay gathered from forward to
        # backward (FSDP2 reshard_after_forward=False); in mixed precision that copy is the
        # master weights, already in K
        weights += wb * shard
    grads = wb * (shard if sharded_gradients(plan) else sp.total)
    opt = k * (shard if z >= ZeroStage.OPTIMIZER_STATES else sp.total)
    host = 0.0
    if tr.offload != Offload.NONE:
        host += opt
        opt = 0.0
    if tr.offload == Offload.OPTIMIZER_PARAMS:
        host += weights + grads
        weights = grads = 0.0
    return {"weights": weights, "gradients": grads, "optimizer_states": opt, "host": host}


def framework_terms(plan: Plan) -> tuple[float, float, bool]:
    """(framework bytes, allocator fragmentation, count comm buffers): a calibrated
    profile's ``memory`` entry where it has one (a CPU host: no CUDA context, no caching
    allocator, and the executor counts the tensors a rank owns), else the CUDA figures above."""
    ej = plan.cluster.node.gpu.efficiency_json
    entry = (json.loads(ej).get("memory") or {}) if ej else {}
    return (float(entry.get("framework_bytes", FRAMEWORK_BYTES)),
            float(entry.get("allocator_fragmentation", ALLOCATOR_FRAGMENTATION)),
            bool(entry.get("comm_buffers", True)))


def memory_per_rank(plan: Plan, stages: tuple[int, ...] | None = None,
                    params: tuple[StageParams, ...] | None = None) -> list[dict[str, float]]:
    """Bytes per GPU by kind (trace.MEMORY_KINDS) on each pipeline rank, plus ``host``
    (offloaded bytes per GPU) and ``total`` (GPU bytes)."""
    stages = stages if stages is not None else plan.layers_per_stage
    params = params if params is not None else stage_params(plan, stages)
    terms = _activation_terms(plan)
    framework, fragmentation, count_buffers = framework_terms(plan)
    out = []
    states_of: dict[StageParams, tuple] = {}
    chunks_of = _in_flight_table(plan)
    pp, vpp = plan.parallel.pp, plan.parallel.vpp
    for r, sp in enumerate(params):
        if sp not in states_of:   # most ranks hold the same parameters
            states_of[sp] = (model_state_bytes(plan, sp), comm_buffer_bytes(plan, sp))
        states, buffers = states_of[sp]
        mem = {k: states[k] for k in ("weights", "gradients", "optimizer_states")}
        mem["activations"] = _rank_activation_bytes(chunks_of(r), stages, r, pp, vpp, terms)
        mem["comm_buffers"] = buffers if count_buffers else 0.0
        tensors = sum(mem.values())
        mem["framework"] = framework + fragmentation * tensors
        mem["total"] = tensors + mem["framework"]
        mem["host"] = states["host"]
        out.append(mem)
    return out


def host_bytes_per_node(plan: Plan, per_rank: list[dict[str, float]]) -> float:
    """Host memory that offload needs on one node (the most loaded rank's figure per GPU)."""
    return max(m["host"] for m in per_rank) * plan.cluster.gpus_per_node


def fits(plan: Plan, per_rank: list[dict[str, float]]) -> bool:
    """Every rank within its GPU's HBM, and offloaded states within the node's host memory."""
    hbm = plan.cluster.node.gpu.hbm_bytes
    host_ok = host_bytes_per_node(plan, per_rank) <= plan.cluster.node.host_memory_bytes
    return max(m["total"] for m in per_rank) <= hbm and host_ok
