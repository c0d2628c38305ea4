"""Bytes per GPU by term: model states, the stacks' buffers, activations, the allocator's
margin and the CUDA context; whether a Plan fits.

Model states follow Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", SC'20, Sec. 3.1 and 5: mixed-precision Adam keeps 2 + 2 + K
bytes per parameter (16-bit weights, 16-bit gradients, K = 12 bytes of fp32 master
weights, momentum and variance); stage 1 divides the K bytes by N_d, stage 2 also the
gradients, stage 3 everything: (2 + 2 + K) * Psi / N_d. FSDP2 (``fully_shard``, bf16
``param_dtype``) keeps fp32 sharded parameters, gradients and Adam's m, v: the same 16 B
over N_d (buffers: ``comm_buffer_terms``). Megatron's distributed optimizer keeps whole
gradients in the reduce dtype (``collectives.grad_wire_bytes``; fp32 under ``--bf16``:
2 + 4 + 12/d, its docs' dist_optimizer.md). Pure 16-bit (``master_weights: false``): 2 + 2 + 4.
K per optimizer (SGD, 8-bit AdamW, Adafactor): ``simcore.model.optim_states``.

Activations (per recompute policy, per schedule's micro-batches in flight, the loss's
logits) are ``simcore.model.activations``; ``rank_breakdown`` adds everything up per rank,
term by term, and applies the allocator's margin and the CUDA context (``simcore.model.peak``);
``rank_totals`` gives StepCosts every rank's total without a row per rank.
"""
from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

from simcore.model import activations as acts, collectives as coll, ddp_hooks as hooks, dsa, fsdp_pools
from simcore.model import int8_scatter as i8, moe_layers as ml, mtp, onebit, workload as wl, zeropp as zpp
from simcore.model.optim_states import (flat_partitions, largest_tensor_params, optimizer_bytes_per_param,
                                        param_bytes, stored_weight_bytes, weight_bytes_per_param)
from simcore.model.peak import (ROW_FRAMEWORK, ROW_GRADIENTS, ROW_HOST, ROW_KEYS, ROW_TOTAL, framework_terms,
                                gradients_at_activation_peak, rank_kinds, rank_row, reduce_deferred,
                                summary_fields)
from simcore.plan.spec import FsdpRoot, Offload, Plan, Precision, ZeroImpl, ZeroStage

GIB = 1024**3
#: Transformer Engine's ``DelayedScaling.amax_history_len`` default (transformer_engine/common/recipe).
FP8_AMAX_HISTORY = 1024
#: torch DDP's default gradient bucket (``simcore.model.ddp_hooks``).
DDP_BUCKET_BYTES = hooks.DDP_BUCKET_CAP_BYTES
#: DeepSpeed ZeRO defaults, in elements (deepspeed/runtime/zero/config.py: reduce_bucket_size,
#: stage3_prefetch_bucket_size, stage3_max_live_parameters).
DS_REDUCE_BUCKET, DS_PREFETCH_BUCKET, DS_MAX_LIVE = 5e8, 5e7, 1e9
BUCKETS_IN_FLIGHT = 2   # buckets in flight at once: one being reduced while the next fills


@dataclass(frozen=True, slots=True, kw_only=True)
class StageParams:
    """Parameters one GPU of a pipeline rank holds (after TP and EP splits, before ZeRO)."""

    dense: float
    """Parameters replicated over the dp*cp ranks."""
    expert: float
    """MoE expert parameters, replicated over dp*cp/ep ranks."""
    layer_max: float
    """Largest single layer on this rank (for FSDP2's unsharded working set)."""
    ends: float = 0.0
    """The embedding and output parameters among ``dense`` (FSDP2's root group)."""

    @property
    def total(self) -> float:
        return self.dense + self.expert


def layer_params_per_gpu(plan: Plan) -> tuple[float, float]:
    """(dense, expert) parameters of one layer on one GPU."""
    m, par = plan.model, plan.parallel
    pc = wl.param_counts(m)
    indexer = dsa.indexer_params(m)
    whole, attention = pc.norms + indexer, pc.attention - indexer   # on every TP rank: the norms, DSA's indexer
    if m.moe:  # the router and the shared experts (TP-split like a dense MLP) are on every EP rank
        router = m.hidden * m.experts
        experts = pc.mlp - router - pc.shared
        return (attention + pc.shared) / par.tp + whole + router, experts / (par.ep * par.etp)
    return (attention + pc.mlp) / par.tp + whole, 0.0


def stage_params(plan: Plan, stages: tuple[int, ...] | None = None) -> tuple[StageParams, ...]:
    """Parameters per GPU on each pipeline rank: its virtual stages' blocks, the embedding on the
    first stage, the output layer (or the tied embedding's copy Megatron keeps when pp > 1) and
    the MTP modules' heads on the last (DualPipeV's V: both on rank 0)."""
    m, par = plan.model, plan.parallel
    pc = wl.param_counts(m)
    dense_l, expert_l = layer_params_per_gpu(plan)
    stages = stages if stages is not None else plan.layers_per_stage
    p = par.pp
    layers = par.by_rank(stages)
    table = m.vocab * m.hidden   # TP splits it; the learned positions and the final norm are whole on every rank
    first = table / par.tp + pc.embedding - table
    last = pc.output - (0 if m.tied_embeddings else table) + (table / par.tp if not m.tied_embeddings or p > 1 else 0) \
        + mtp.head_params_per_gpu(m, par.tp)   # the MTP modules' projections and norms, with the output layer
    dense = ml.rank_dense_layers(m, stages, p, par.v_shape)   # an MoE model's first layers: a dense MLP, no experts
    flat = layer_params_per_gpu(ml.dense_plan(plan))[0] if any(dense) else 0.0
    same: dict = {}   # one value per kind of rank (by layers, dense layers, ends): look-ups by identity

    def value(layers: int, d: int, ends: float) -> StageParams:
        if (sp := same.get((layers, d, ends))) is None:
            big = max(dense_l + expert_l if layers > d or not d else 0.0, flat if d else 0.0)
            sp = same[layers, d, ends] = StageParams(dense=(layers - d) * dense_l + d * flat + ends,
                                                     expert=(layers - d) * expert_l, layer_max=big, ends=ends)
        return sp
    if p == 1:
        return (value(layers[0], dense[0], first + last),)
    head, tail = value(layers[0], dense[0], first + par.v_shape * last), value(layers[-1], dense[-1], (not par.v_shape) * last)
    middle = {k: value(*k, 0.0) for k in set(zip(layers[1:-1], dense[1:-1]))}   # the ranks between hold no ends
    return (head, *map(middle.__getitem__, zip(layers[1:-1], dense[1:-1])), tail)


in_flight_chunks = acts.in_flight_chunks   # model chunks (virtual stages' activations) a rank keeps at its peak


def loss_overlap(plan: Plan, params: tuple[StageParams, ...] | None = None) -> float:
    """Buffers of the last rank not alive while the loss's transients are: without a
    pipeline, no block is gathered or reduce-scattered meanwhile, and FSDP2's root reshards
    after forward and re-gathers in the output layer's backward, after the loss's backward
    freed its transients (torchtitan's FSDPMemTracker traces show it), except the groups the
    stack's wrapping leaves unsharded (``parallel.fsdp_root``, ``fsdp_pools.kept_through_loss``)."""
    par = plan.parallel
    if par.pp > 1 or par.zero < ZeroStage.WEIGHTS or par.dp * par.cp == 1 or acts.executor_activations(plan) \
            or par.zero_impl != ZeroImpl.FSDP2:
        return 0.0
    sp = (params or stage_params(plan))[-1]
    t = comm_buffer_terms(plan, sp)
    kept = fsdp_pools.kept_through_loss(plan, sp.ends, sp.layer_max)
    return max(0.0, t["fsdp_all_gather"] + t["fsdp_reduce_scatter"] + t["fsdp_root"] - kept)


def activation_bytes(plan: Plan, rank: int, stages: tuple[int, ...] | None = None, terms=None) -> float:
    """Activation bytes of pipeline rank ``rank`` at its peak (the loss's buffers included)."""
    stages = stages if stages is not None else plan.layers_per_stage
    terms = terms if terms is not None else acts.activation_terms(plan, loss_overlap(plan))
    parts = acts.rank_activation_bytes(plan, rank, stages, terms)
    return sum(parts.values())


def comm_buffer_terms(plan: Plan, sp: StageParams) -> dict[str, float]:
    """Communication and working buffers by part.

    Data parallel: DDP's gradient buckets (``bucket_cap_mb=25``, two in flight); FSDP2
    (``parallel.zero`` 2, 3): the reduce-scatter input of one layer (its unsharded gradient
    in the parameter dtype and its fp32 copy, ``MixedPrecisionPolicy(reduce_dtype=float32)``
    as torchtitan sets it; int8's working buffers, ``int8_scatter``) and, for ZeRO-3, the all-gather outputs of the layer in use and the
    one prefetched (``_fsdp_param_group.py``: one-ahead prefetch, ``reshard_after_forward``)
    plus the root group (embedding, final norm, output) gathered around the loss with the
    output's unsharded gradient. PP send/receive buffers, the sequence-parallel all-gather
    output, ring attention's K/V chunk in flight and the one received (context_parallel.py).
    FP8 (Transformer Engine): each linear's cached FP8 weight (the parameter itself under
    ``fp8_param_gather``) and, unless FP8 GEMMs take any layout (Blackwell, ``GPU.non_tn_fp8``), its
    transpose (1 B each, ``is_first_microbatch``), the delayed-scaling amax history (fp32, three
    tensors a linear, ``amax_history_len=1024``); under ZeRO-3 none cached: the layer is gathered
    16-bit and cast per GEMM, or gathered in FP8 under ``fp8_param_gather`` (torchao's
    ``enable_fsdp_float8_all_gather``: one byte an element of the gathered layer). MXFP8 and NVFP4
    cache their weights' rowwise and columnwise quantized copies with the block scales
    (``workload.quantized_bytes``: 1 + 1/32 and 0.5 + 1/16 bytes an element each) and keep
    no amax history (TE's ``MXFP8BlockScaling`` / ``NVFP4BlockScaling`` scale per block)."""
    m, par, tr = plan.model, plan.parallel, plan.training
    wb = param_bytes(tr)
    fp8 = tr.precision == Precision.FP8
    b, s = tr.micro_batch, m.seq_len // par.cp
    out = {"dp_buckets": 0.0, "fsdp_all_gather": 0.0, "fsdp_reduce_scatter": 0.0, "fsdp_root": 0.0,
           "pp_p2p": 0.0, "sp_gather": 0.0, "cp_ring": 0.0, "fp8_weights": 0.0, "zeropp": 0.0, "hook_errors": 0.0}
    if par.dp * par.cp > 1 and par.zero_impl == ZeroImpl.DEEPSPEED:
        # DeepSpeed's defaults (deepspeed/runtime/zero/config.py): the gradient reduction bucket
        # (reduce_bucket_size, 5e8 elements) and, for stage 3, the live gathered parameters:
        # the submodule in use and the prefetch bucket (stage3_prefetch_bucket_size, 5e7),
        # bounded by stage3_max_live_parameters (1e9)
        out["dp_buckets"] = wb * min(DS_REDUCE_BUCKET, sp.total)
        if par.zero == ZeroStage.WEIGHTS:
            out["fsdp_all_gather"] = wb * min(DS_MAX_LIVE, sp.layer_max + DS_PREFETCH_BUCKET)
            out["zeropp"] = zpp.secondary_bytes(sp.total, wb, par.zero_hpz_partition_size, par.zero_quantized_weights) \
                + zpp.buffer_bytes(sp.layer_max, par.zero_quantized_weights, par.zero_quantized_gradients)
    elif par.dp * par.cp > 1:
        if par.zero >= ZeroStage.GRADIENTS:
            out["fsdp_reduce_scatter"] = (wb + 4 + (tr.grad_compression.bits > 0) * i8.SCATTER_BUFFER_BYTES) * sp.layer_max
            if par.zero == ZeroStage.WEIGHTS:
                out["fsdp_all_gather"] = 2 * (1 if fp8 and tr.fp8_param_gather else wb) * sp.layer_max
                # the root's gathered parameters and, from the loss on, the output's unsharded
                # gradient; none under ``output_kept`` (fsdp_pools: its groups reshard sooner)
                if par.fsdp_root != FsdpRoot.OUTPUT_KEPT:
                    out["fsdp_root"] = wb * (sp.ends + fsdp_pools.output_group(plan, sp.ends))
        else:
            out["dp_buckets"] = BUCKETS_IN_FLIGHT * DDP_BUCKET_BYTES
            # a DDP hook's error feedback, kept from step to step in fp32: PowerSGD's error per bucket
            # (torch's PowerSGDState.error_dict, use_error_feedback's default), int8_ef's worker error
            # over the bucket and server error over its 1/W chunk (``ddp_hooks.ef_error_bytes``)
            share = {"powersgd": 1.0, "int8_ef": 1.0 + 1.0 / (par.dp * par.cp)}.get(tr.grad_compression.value, 0.0)
            out["hook_errors"] = 4.0 * share * sp.dense if par.zero == ZeroStage.NONE else 0.0
    if par.pp > 1:  # send and receive, forward and backward
        out["pp_p2p"] = 4 * wl.ACT_BYTES * b * s * m.hidden / (par.tp if par.sequence_parallel else 1)
    if par.sequence_parallel:
        out["sp_gather"] = wl.ACT_BYTES * b * s * m.hidden
    if par.cp > 1:
        out["cp_ring"] = 2 * 2 * wl.ACT_BYTES * b * s * wl.kv_width(m) / par.tp
    if fp8:
        linears = 4 * (sp.total - sp.ends) / max(sp.layer_max, 1.0)   # four linears per layer
        copies = 1 if plan.cluster.node.gpu.non_tn_fp8 and tr.fp8_recipe.value in wl.TE_TENSOR_SCALING else 2
        cached = 0.0 if par.zero == ZeroStage.WEIGHTS else (copies - tr.fp8_param_gather) * (sp.total - sp.ends)
        out["fp8_weights"] = cached + linears * 3 * FP8_AMAX_HISTORY * 4
    elif tr.precision.value in wl.LOW_PRECISION_FORMATS:   # mxfp8, nvfp4: two block-scaled copies
        out["fp8_weights"] = 2 * wl.quantized_bytes(tr.precision.value) * (sp.total - sp.ends)
    # DeepSpeed's 1-bit optimizers: their worker and server errors, 1-bit LAMB's momentum clone (simcore.model.onebit)
    out.update(onebit.memory_terms(tr.optimizer, sp.total, par.dp * par.cp))
    return out


def comm_buffer_bytes(plan: Plan, sp: StageParams) -> float:
    """The sum of ``comm_buffer_terms``."""
    return sum(comm_buffer_terms(plan, sp).values())


def sharded_gradients(plan: Plan) -> bool:
    """Whether a rank holds only its gradient shard through the step: FSDP2 (zero 2-3) alone reduce-scatters
    each block's after its backward, every micro-batch; under torch.distributed.pipelining a stage keeps whole
    gradients to its last backward (``perform_reduce_grad``), as DDP does for ZeRO 0-1 (``peak.reduce_deferred``)."""
    return plan.parallel.zero >= ZeroStage.GRADIENTS and plan.parallel.pp == 1


def model_state_bytes(plan: Plan, sp: StageParams) -> dict[str, float]:
    """Weights, gradients and optimizer states on one GPU, and the host bytes of offload."""
    par, tr = plan.parallel, plan.training
    wb, gb = param_bytes(tr), coll.grad_wire_bytes(plan)
    k = optimizer_bytes_per_param(tr, plan.model.hidden, flat_partitions(plan))
    nd = par.shard_ranks                                # dp x cp, or one replica's (``dp_replicate``)
    nd_e = max(1, nd * par.tp // (par.ep * par.etp))    # expert data parallel (folded: over TP ranks too)
    shard = sp.dense / nd + sp.expert / nd_e           # parameters this GPU owns
    z = par.zero
    if z >= ZeroStage.GRADIENTS and par.zero_impl == ZeroImpl.FSDP2:
        # FSDP2: the sharded parameters are what the optimizer steps, fp32 under a mixed-
        # precision policy (so they are the master copy), and its sharded gradients are fp32
        # (reduce_dtype); ZeRO-2 (reshard_after_forward=False) also keeps every 16-bit
        # parameter gathered from forward to backward. Under pipelining the gradients stay
        # unsharded until the one reduce-scatter, accumulated in the reduce dtype
        # (_fsdp_param.py ``to_accumulated_grad_if_needed``: ``unsharded_accumulated_grad``).
        master = 4 if tr.master_weights and tr.precision != Precision.FP32 else 0
        weights = (master or wb) * shard + (wb * sp.total if z == ZeroStage.GRADIENTS else 0.0)
        grads = (master or wb) * shard if sharded_gradients(plan) else gb * sp.total
        opt = (k - master) * shard
    else:   # DDP, Megatron's distributed optimizer, DeepSpeed: the ZeRO paper's partitions
        weights = wb * shard if z >= ZeroStage.WEIGHTS else stored_weight_bytes(plan, sp.total, sp.ends)
        # the distributed optimizer's main_grads in the reduce dtype; DDP's autocast: 4 + 4 + 8 = 2 + 2 + 12
        grads = wb * shard if sharded_gradients(plan) else (gb if z == ZeroStage.OPTIMIZER_STATES else wb) * sp.total
        opt = k * (shard if z >= ZeroStage.OPTIMIZER_STATES else sp.total)
    if tr.optimizer_in_backward:   # stepped and freed one tensor at a time: the largest is all that lives
        grads *= largest_tensor_params(plan.model, par.tp) / sp.total
    host = 0.0
    if tr.offload != Offload.NONE:
        host += opt
        opt = 0.0
    if tr.offload == Offload.OPTIMIZER_PARAMS:
        host += weights + grads
        weights = grads = 0.0
    end, resharded = backward_end_buffers(plan, sp) if grads else (0.0, 0.0)
    return {"weights": weights, "gradients": grads, "optimizer_states": opt, "host": host,
            "backward_end": end, "resharded_at_end": resharded}


def backward_end_buffers(plan: Plan, sp: StageParams) -> tuple[float, float]:
    """Bytes beside the whole sharded gradients at the backward's end under FSDP2, the larger of
    the first block's post-backward (its unsharded gradient and the reduce dtype's copy that
    ``foreach_reduce`` reduce-scatters, its parameters and, ZeRO-3, the root's gathered: FSDP2
    keeps the root unsharded after forward) and the root group's, which runs last (its
    parameters gathered and its gradients in both dtypes). torch's FSDPMemTracker puts the
    peak there under TP, or where the gradients outweigh the activations (an MoE's experts).
    Zero where gradients are not sharded per block (DDP, ZeRO 0-1, DeepSpeed, pipelining).
    Second: the gathered parameters ZeRO-2 has resharded by then (every block's but the first's)."""
    par, tr = plan.parallel, plan.training
    if not (sharded_gradients(plan) and par.zero_impl == ZeroImpl.FSDP2 and par.dp * par.cp > 1):
        return 0.0, 0.0
    wb, zero3 = weight_bytes_per_param(tr.precision), par.zero == ZeroStage.WEIGHTS
    gathered = wb * (sp.ends + sp.layer_max) if zero3 else 0.0   # the root's and the first block's
    reduce = wb + coll.grad_wire_bytes(plan)
    zero2 = wb * max(0.0, sp.total - sp.ends - sp.layer_max) if par.zero == ZeroStage.GRADIENTS else 0.0
    return max(gathered + reduce * sp.layer_max, (wb * sp.ends if zero3 else 0.0) + reduce * sp.ends), zero2


def rank_kind(plan: Plan, sp: StageParams, kinds: dict, count_buffers: bool) -> tuple:
    """(model states, buffer terms, their sum; none counted without ``count_buffers``) of a rank
    holding ``sp``, kept in ``kinds`` (``peak.rank_kinds``: most ranks hold the same parameters)."""
    if (kind := kinds.get(sp)) is None:
        buffers = comm_buffer_terms(plan, sp)
        buffers = buffers if count_buffers else dict.fromkeys(buffers, 0.0)
        states = {**model_state_bytes(plan, sp), "deferred": buffers["fsdp_reduce_scatter"] * reduce_deferred(plan)}
        kind = kinds[sp] = (states, buffers, sum(buffers.values()))
    return kind


def _row_maker(plan: Plan, params: tuple[StageParams, ...]):
    """What ``rank_rows`` reads once per plan, as a function of a rank's (StageParams, shape)
    (``activations.rank_shapes``) to its (row, (model states, buffer terms, their sum),
    activation parts); and whether the gradients are live at the activations' peak."""
    terms = acts.activation_terms(plan, loss_overlap(plan, params))
    context, margin, count_buffers = framework_terms(plan)
    grads_live = gradients_at_activation_peak(plan)
    vpp, tr, kinds = plan.parallel.vpp, plan.training, rank_kinds(plan, count_buffers)
    per_chunk: dict = {}

    def row_of(sp: StageParams, shape: tuple) -> tuple:
        kind = rank_kind(plan, sp, kinds, count_buffers)
        act = acts.shape_activation_parts(vpp, shape, terms, per_chunk)
        states = kind[0]
        if tr.activation_offload:   # the offloaded activations wait in host memory
            states = {**states, "host": states["host"] + acts.shape_offloaded_bytes(shape, terms, per_chunk)}
        return rank_row(states, sum(act), kind[2], context, margin, grads_live), kind, act
    return row_of, grads_live


def rank_rows(plan: Plan, stages: tuple[int, ...] | None = None, params: tuple[StageParams, ...] | None = None,
              parts: list | None = None) -> list[tuple[float, ...]]:
    """Per pipeline rank, its row (``ROW_KEYS``). The model states and buffers are computed once
    per kind of rank (``stage_params`` gives equal ranks one value), the activations per rank
    (their micro-batches in flight differ). ``parts``, where given, receives per rank (model
    states, buffer terms, ``activations.ACTIVATION_PARTS`` values) for the breakdown by term."""
    stages = stages if stages is not None else plan.layers_per_stage
    params = params if params is not None else stage_params(plan, stages)
    row_of, _ = _row_maker(plan, params)
    rows = []
    for sp, shape in zip(params, acts.rank_shapes(plan, stages)):
        row, kind, act = row_of(sp, shape)
        rows.append(row)
        if parts is not None:
            parts.append((kind[0], kind[1], act))
    return rows


def rank_totals(plan: Plan, stages: tuple[int, ...] | None = None, params: tuple[StageParams, ...] | None = None,
                ) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """(every rank's total, the fullest rank's row, the most host bytes per GPU): ``rank_rows``'
    figures without a row per rank. Consecutive ranks of one kind (the same parameters, layers
    per chunk, ends and weight gradients owed) differ only in their chunks in flight, and while the
    gradients are live their total is affine in that count: it is computed at a kind's first
    and last rank and interpolated between them (the same figures to rounding); the fullest
    rank's row is computed whole."""
    stages = stages if stages is not None else plan.layers_per_stage
    params = params if params is not None else stage_params(plan, stages)
    row_of, grads_live = _row_maker(plan, params)
    shapes = acts.rank_shapes(plan, stages)
    totals, host, start = [0.0] * len(shapes), 0.0, 0
    done: dict[int, tuple[float, ...]] = {}   # the rows computed whole, by rank
    kinds = zip(map(id, params), map(operator.itemgetter(slice(1, None)), shapes))   # all but the chunks in flight
    affine = grads_live and not reduce_deferred(plan)   # a deferred reduction's peak is a max
    for end in itertools.accumulate(len(list(run)) for _, run in itertools.groupby(kinds)):   # runs of one kind
        members, start = range(start, end), end
        ends = (members[0], members[-1]) if affine and len(members) > 2 else members   # else every rank
        for r in ends:
            row = done[r] = row_of(params[r], shapes[r])[0]
            totals[r], host = row[ROW_TOTAL], max(host, row[ROW_HOST])
        if len(members) > len(ends):
            (a, ca), (b, cb) = (ends[0], shapes[ends[0]][0]), (ends[-1], shapes[ends[-1]][0])
            slope, base = (totals[b] - totals[a]) / (cb - ca) if cb != ca else 0.0, totals[a]
            totals[a + 1:b] = [base + (shape[0] - ca) * slope for shape in shapes[a + 1:b]]
    worst = totals.index(max(totals))
    row = done.get(worst) or row_of(params[worst], shapes[worst])[0]
    totals[worst] = row[ROW_TOTAL]
    return tuple(totals), row, host


def rank_breakdown(plan: Plan, stages: tuple[int, ...] | None = None,
                   params: tuple[StageParams, ...] | None = None,
                   terms_too: bool = True, parts: list | None = None,
                   ) -> list[tuple[dict[str, float], dict[str, float] | None]]:
    """Per pipeline rank: (bytes by kind, trace.MEMORY_KINDS plus ``total`` and ``host``;
    bytes by term, each term one line of ``trainplan memory``, or None without
    ``terms_too``: the layout search needs only the kinds). The kinds sum the terms."""
    parts = parts if parts is not None else []   # the caller's list receives ``rank_rows``' parts too
    rows = rank_rows(plan, stages, params, parts)
    context, margin, _ = framework_terms(plan)
    grads_live = gradients_at_activation_peak(plan)
    out = []
    for row, (states, buffers, act) in zip(rows, parts):
        mem = dict(zip(ROW_KEYS, row))
        detail = None
        if terms_too:
            end, deferred = 0.0, states.get("deferred", 0.0)
            if deferred:   # as ``peak.rank_row`` chose: the activations, or the reduction after them
                act, buffers = (act, {**buffers, "fsdp_reduce_scatter": 0.0}) if mem["activations"] \
                    else ((0.0,) * len(act), buffers)
            if not grads_live and row[ROW_GRADIENTS] > 0:   # the backward's end: no activations
                act, buffers = (0.0,) * len(act), dict.fromkeys(buffers, 0.0)
                end = states["backward_end"]
            buffers = {**buffers, "fsdp_backward_end": end}
            tensors = sum(row[:ROW_FRAMEWORK])
            detail = {**{k: mem[k] for k in ("weights", "gradients", "optimizer_states")},
                      **{f"activations_{k}": v for k, v in zip(acts.ACTIVATION_PARTS, act)}, **buffers,
                      "allocator_margin": margin * tensors, "cuda_context": context}
        out.append((mem, detail))
    return out


def memory_per_rank(plan: Plan, stages: tuple[int, ...] | None = None,
                    params: tuple[StageParams, ...] | None = None) -> list[dict[str, float]]:
    """Bytes per GPU by kind (trace.MEMORY_KINDS) on each pipeline rank, plus ``host``
    (offloaded bytes per GPU) and ``total`` (GPU bytes)."""
    return [dict(zip(ROW_KEYS, row)) for row in rank_rows(plan, stages, params)]


def memory_fields(plan: Plan, per_rank: list[dict[str, float]] | None = None) -> dict:
    """``StepCosts``' memory fields of ``plan`` (the fullest rank by kind, every rank's total)."""
    if per_rank is None:
        return summary_fields(*rank_totals(plan)[:2])
    totals = [r["total"] for r in per_rank]
    return summary_fields(totals, tuple(per_rank[totals.index(max(totals))][k] for k in ROW_KEYS))
