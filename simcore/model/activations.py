"""Activation bytes per pipeline rank: what one micro-batch leaves per layer (by recompute
policy, ``simcore.model.recompute``), how many micro-batches a schedule keeps in flight, the
loss's logits buffer, and zero-bubble's weight-gradient stash.

Activations per layer follow Korthikanti et al. 2022 (``simcore.model.workload``). The
micro-batches (model chunks) a rank holds at its peak are the most forwards (F) whose backward
(B, or I for zero-bubble) has not run yet on the schedule as ``simcore.model.schedules``
orders it in torch's notation (``counted_peaks``; the closed forms, which the tests hold
equal to it, are what the model uses). GPipe's
all m, 1F1B's p - r on rank r (Narayanan et al. 2021, Sec. 2.2.1), the interleaved
schedule's warm-up count + 1 (torch's ``ScheduleInterleaved1F1B`` ``warmup_ops = (v-1)p +
2(p-1-r)``, Megatron's ``get_forward_backward_func`` the same: L(1 + (p-1)/(pv)) layers on
rank 0, Korthikanti et al. Sec. 4.2.3; with Megatron-Core's micro-batch groups of N, (v-1)N +
2(p-1-r): ``get_pp_rank_microbatches``) and, for zero-bubble, the inputs of the weight
gradients (W) an I has left owed (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", Sec. 3:
W keeps the linears' inputs and output gradients after the input gradient ran).
"""
from __future__ import annotations

import functools
import json

from simcore.model import executor_acts as xa
from simcore.model import linear_attention as la
from simcore.model import moe_layers as ml
from simcore.model import mtp
from simcore.model import recompute as rcp
from simcore.model import schedules as sch
from simcore.model import workload as wl
from simcore.model.params import param_counts
from simcore.plan.spec import Kernels, Loss, Plan, Precision, Recompute, Schedule


@functools.lru_cache(maxsize=1024)
def schedule_peaks(kind: Schedule, pp: int, m: int, vpp: int, group: int = 0
                   ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Per rank: (most chunks in flight, most weight gradients owed), by closed forms that
    ``counted_peaks`` on the schedule confirms (tests/model/test_memory_terms.py); ``group``:
    ``parallel.microbatch_group``."""
    flights = tuple(_closed_form(kind, pp, m, vpp, r, group) for r in range(pp))
    if kind not in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V):
        return flights, (0,) * pp
    return flights, tuple(min(m, r + 1) for r in range(pp))   # ZB-H1, DualPipeV: rank r runs W r + 1 late


def counted_peaks(kind: Schedule, pp: int, m: int, vpp: int, group: int = 0) -> tuple[tuple[int, ...], ...]:
    """``schedule_peaks`` counted on ``schedules.build_schedule``'s actions."""
    try:
        states = counted_states(kind, pp, m, vpp, group)
    except ValueError:   # a shape torch's schedule refuses: the closed forms
        return schedule_peaks(kind, pp, m, vpp, group)
    return tuple(max(s[0] for s in st) for st in states), tuple(max(s[1] for s in st) for st in states)


def counted_states(kind: Schedule, pp: int, m: int, vpp: int, group: int = 0) -> list[set[tuple[int, int]]]:
    """Per rank, every (chunks in flight, weight gradients owed) its actions pass through: an F
    adds a chunk, a B or I frees one (an I owes its W), a W pays."""
    actions, out = sch.build_schedule(kind, pp, m, vpp, group), []
    for r in range(pp):
        live = w = 0
        seen = {(0, 0)}
        for a in actions[r]:
            if a is None:
                continue
            if a.op == sch.Op.F:
                live += 1
            elif a.op in (sch.Op.B, sch.Op.I):
                live -= 1
                w += a.op == sch.Op.I
            elif a.op == sch.Op.W:
                w -= 1
            seen.add((live, w))
        out.append(seen)
    return out


def _closed_form(kind: Schedule, p: int, m: int, v: int, rank: int, group: int = 0) -> int:
    if kind == Schedule.GPIPE:
        return m * v
    if kind == Schedule.DUALPIPE_V:   # 2p + 1 on every rank: the DualPipe README's PP + 1 (PP = 2p stages)
        return min(m * v, 2 * p + 1)
    if kind == Schedule.ZERO_BUBBLE and v > 1:   # every chunk's warm-up forward before its first I
        return min(m * v, v * p - rank)
    if v > 1:   # a chunk runs ``group`` micro-batches in a row (p by default: m is a multiple of p)
        return min(m * v, 2 * (p - rank - 1) + (v - 1) * (group or p) + 1)
    return min(m, p - rank)


def in_flight_chunks(plan: Plan, rank: int) -> int:
    """Model chunks (virtual stages' activations) rank ``rank`` keeps at its peak."""
    par = plan.parallel
    if par.pp == 1:
        return 1
    return schedule_peaks(par.schedule, par.pp, plan.num_microbatches, par.vpp, par.microbatch_group)[0][rank]


def memory_entry(plan: Plan) -> dict:
    """A calibrated profile's ``efficiency.memory`` entry, or the catalog entry's of its GPU (a
    compiled runtime's own reserve and fragmentation: XLA on TPU); {} where neither has one (the
    CUDA defaults of ``simcore.model.peak``)."""
    gpu = plan.cluster.node.gpu
    if gpu.efficiency_json:
        return json.loads(gpu.efficiency_json).get("memory") or {}
    from topologies.hardware import load_catalog

    return (load_catalog().efficiency.get(gpu.name) or {}).get("memory") or {}


def executor_activations(plan: Plan) -> bool:
    """A calibrated profile whose memory is counted on the executor's own model (its host's runs
    are the executor's: a CPU host, or a GPU with ``allocator_peak``, whose measured peak is
    torch's allocator's and holds the loss's transient gradients too)."""
    return bool(memory_entry(plan).get("executor_activations"))


def loss_bytes(plan: Plan) -> tuple[float, float]:
    """The loss's logits buffers per GPU at the backward's start: (kept, transient).

    ``eager``: PyTorch's ``F.cross_entropy(logits.float(), labels)`` (torchtitan's
    components/loss.py uncompiled, Hugging Face): the fp32 log-softmax it saves (4 B per
    logit) and, transient, the gradient that arrives for it and the one it returns (4 B
    each). ``fused``: a compiled or fused loss (Megatron's vocab-parallel cross entropy works
    in place): the 16-bit logits it saves and their gradient (2 B each). ``chunked``:
    torchtune's ``CEWithChunkedOutputLoss`` (8 chunks): the 16-bit logits of every chunk are
    kept and one chunk at a time is upcast and differentiated (12 B per logit of one chunk).
    The logits are vocabulary-parallel over TP (Megatron; torchtitan's loss_parallel). The
    eager loss under TP is torch's ``loss_parallel``, whose backward of the cross entropy and
    log-softmax together (torch/distributed/tensor/parallel/loss.py,
    ``_nll_loss_and_log_softmax_backward``: ``(zeros_like(x) + exp(x)) * grad_output``) holds
    three fp32 copies of the local logits beside the saved log-softmax (12 B transient)."""
    m, par, tr = plan.model, plan.parallel, plan.training
    logits = tr.micro_batch * (m.seq_len // par.cp) * m.vocab / par.tp
    if tr.loss == Loss.FUSED:
        return 2 * logits, 2 * logits
    if tr.loss == Loss.CHUNKED:
        return 2 * logits, 12 * logits / CHUNKED_LOSS_CHUNKS
    return 4 * logits, (LOSS_PARALLEL_TRANSIENT if par.tp > 1 else EAGER_TRANSIENT) * logits


#: Bytes per logit of the eager loss's backward beyond its saved fp32 log-softmax: whole
#: logits, the two gradients of ``nll_loss_backward`` and ``_log_softmax_backward_data``;
#: torch's ``loss_parallel``, ``zeros_like``, ``exp`` and their sum (fp32 each).
EAGER_TRANSIENT, LOSS_PARALLEL_TRANSIENT = 8, 12
#: torchtune's ``CEWithChunkedOutputLoss(num_output_chunks=8)`` (torchtune/modules/loss/ce_chunked_output_loss.py).
CHUNKED_LOSS_CHUNKS = 8


#: ``_layer_terms``' answers by the fields it reads (``_terms_key``); cleared whole at ``_TERMS_MAX``.
_TERMS: dict[tuple, tuple] = {}
_TERMS_MAX = 4096


def _terms_key(plan: Plan) -> tuple:
    """What ``_layer_terms`` (with ``loss_bytes``, ``_wgrad_stash_per_layer`` and
    ``executor_activations``) reads of a plan: the model, the training section, the calibrated
    profile's entry, and of the layout tp, cp, sequence parallel and the schedule."""
    par = plan.parallel
    return (plan.model, plan.training, plan.cluster.node.gpu.efficiency_json, par.tp, par.cp,
            par.sequence_parallel, par.schedule)


def _layer_terms(plan: Plan) -> tuple[rcp.LayerActivations, float, float, float, float]:
    """(one layer's activations, embedding, last stage (final norm and loss kept), the loss's
    transients, W stash per layer), kept per ``_terms_key``."""
    key = _terms_key(plan)
    terms = _TERMS.get(key)
    if terms is None:
        if len(_TERMS) >= _TERMS_MAX:
            _TERMS.clear()
        terms = _TERMS[key] = _layer_terms_of(plan)
    return terms


_layer_terms.cache_clear = _TERMS.clear   # as functools' caches answer (tests clear them all)


def _layer_terms_of(plan: Plan) -> tuple[rcp.LayerActivations, float, float, float, float]:
    """``_layer_terms`` computed."""
    m, par, tr = plan.model, plan.parallel, plan.training
    b, s = tr.micro_batch, m.seq_len // par.cp
    sp = par.tp if par.sequence_parallel else 1
    if executor_activations(plan):   # the executor's own tensors: fp32, or torch autocast on a GPU
        kw = dict(b=b, s=s, tp=par.tp, sequence_parallel=par.sequence_parallel,
                  autocast=tr.precision != Precision.FP32)
        kept_rc = tr.recompute if tr.recompute in (Recompute.SELECTIVE, Recompute.NONE) else Recompute.NONE
        act = rcp.LayerActivations(
            whole=xa.layer_bytes(m, recompute=Recompute.NONE, **kw),
            kept=xa.layer_bytes(m, recompute=kept_rc, **kw),
            boundary=xa.layer_bytes(m, recompute=Recompute.FULL, **kw))
        # a GPU's peak is its allocator's (max_memory_allocated): the loss's gradients count there
        transient = loss_bytes(plan)[1] if memory_entry(plan).get("allocator_peak") else 0.0
        return (act, xa.embedding_bytes(m, b=b, s=s), xa.logits_bytes(m, **kw), transient, 0.0)
    kw = dict(b=b, s=s, tp=par.tp, sequence_parallel=par.sequence_parallel)
    gemm_input = wl.saved_gemm_input_bytes(tr.precision.value, tr.fp8_recipe.value)
    whole = la.activation_bytes_per_layer(m, recompute=Recompute.NONE, flash=tr.flash_attention,
                                          gemm_input=gemm_input, unpad=tr.attention_unpad, **kw)
    kept = whole
    if tr.recompute == Recompute.SELECTIVE:
        kept = la.activation_bytes_per_layer(m, recompute=Recompute.SELECTIVE, flash=tr.flash_attention,
                                             gemm_input=gemm_input, unpad=tr.attention_unpad, **kw)
    elif tr.recompute == Recompute.OP:
        kept = min(whole, rcp.op_sac_kept_bytes(m, flash=tr.flash_attention, ep=par.ep,
                                                 compiled=tr.kernels == Kernels.FUSED, **kw))
    elif tr.recompute == Recompute.DOTS:
        kept = min(whole, rcp.dots_kept_bytes(m, **kw))
    act = rcp.LayerActivations(whole=whole, kept=kept, boundary=wl.ACT_BYTES * b * s * m.hidden / sp)
    last = 4 * s * b * m.hidden / sp                          # final norm's input and output
    if tr.autocast:
        act, last = _autocast_terms(plan, act, last)
    wide = 2 if tr.precision == Precision.FP32 else 1   # fp32 training saves 4-byte tensors, not 2
    if wide > 1:
        act = rcp.LayerActivations(whole=wide * act.whole, kept=wide * act.kept, boundary=wide * act.boundary)
    if tr.kernels == Kernels.EAGER:   # per-op SAC and dots save matmul outputs only: their kept sets the same
        extra = wl.eager_activation_bytes(m, act_bytes=wide * wl.ACT_BYTES, **kw)
        act = rcp.LayerActivations(whole=act.whole + extra, kept=act.kept + (
            0.0 if tr.recompute in rcp.SAVES_MATMULS else extra), boundary=act.boundary)
    kept, transient = loss_bytes(plan)   # and the MTP modules' norms, projections and logits on the last stage
    last, kept = last + mtp.kept_bytes(m, b=b, s=s, sp=sp), (1 + m.mtp_layers) * kept
    return (act, wide * wl.embedding_activation_bytes(m, **kw), wide * last + kept, transient,
            wide * _wgrad_stash_per_layer(plan))


def _autocast_terms(plan: Plan, act: rcp.LayerActivations, last: float) -> tuple[rcp.LayerActivations, float]:
    """What torch.autocast over fp32 parameters keeps beyond the 16-bit count (``training.autocast``):
    the residual stream stays fp32 (an fp32 embedding plus 16-bit branch outputs promote to fp32),
    so the two norms' inputs and a checkpointed layer's input take 4 bytes; softmax is on autocast's
    fp32 list, so an unfused attention keeps fp32 probabilities; the final norm runs in fp32 and the
    head's weight is cast. Each linear casts the fp32 norm output it reads apart and saves its copy
    (q, k and v; the MLP's input linears: the autocast stacks' modules, as ``executor_acts`` counts
    them), where the 16-bit count keeps one input for QKV and one for the MLP. Every weight's 16-bit
    copy is cached from its first cast to the forward's end (autocast's cache keys on the fp32 leaf
    whatever the grad mode, so a checkpointed forward fills it too: aten/src/ATen/autocast_mode.cpp
    ``cached_cast``) and saved by its matmul: the layer's share, whatever the recompute."""
    m, par, tr = plan.model, plan.parallel, plan.training
    b, s = tr.micro_batch, m.seq_len // par.cp
    sp = par.tp if par.sequence_parallel else 1
    pc = param_counts(m)
    copies = wl.ACT_BYTES * (pc.attention + pc.mlp) / par.tp
    readers = 3 + (2 if m.gated_mlp else 1) - 2           # norm-output copies beyond the 16-bit count's two
    norms = (2 * (4 - wl.ACT_BYTES) / sp + readers * wl.ACT_BYTES) * b * s * m.hidden
    probs = 0.0 if tr.flash_attention else (4 - wl.ACT_BYTES) * m.heads * s * s * b / par.tp
    # per-op SAC and dots keep matmul outputs only: the fp32 norm inputs and the input casts are re-run
    kept = copies if tr.recompute in rcp.SAVES_MATMULS else \
        norms + copies + (0.0 if tr.recompute == Recompute.SELECTIVE else probs)
    act = rcp.LayerActivations(whole=act.whole + norms + probs + copies, kept=act.kept + kept,
                               boundary=2 * act.boundary + copies)
    return act, 2 * last + wl.ACT_BYTES * m.vocab * m.hidden / par.tp


def _wgrad_stash_per_layer(plan: Plan) -> float:
    """Zero-bubble: what a layer keeps for a W its I left owed: the inputs of its linears
    (QKV and MLP-in take the whole hidden input, the projection and MLP-out their TP shard)
    and the gradients of their outputs."""
    if plan.parallel.schedule not in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V):
        return 0.0
    m, par, tr = plan.model, plan.parallel, plan.training
    h, t, sb = m.hidden, par.tp, tr.micro_batch * (m.seq_len // par.cp)
    moe = m.top_k if m.moe else 1
    f_act, f_in = m.ffn_hidden * moe, m.ffn_hidden * (wl.mlp_matrices(m) - 1) * moe
    inputs = h + h / t + h + f_act / t
    grads = (h + 2 * wl.kv_width(m)) / t + h + f_in / t + h
    return wl.ACT_BYTES * sb * (inputs + grads)


def layer_activations(plan: Plan) -> rcp.LayerActivations:
    """One layer's activation bytes for one micro-batch (``_layer_terms``)."""
    return _layer_terms(plan)[0]


def activation_terms(plan: Plan, overlap: float = 0.0) -> tuple:
    """What ``rank_activation_bytes`` needs of a plan, computed once per plan. ``overlap``:
    bytes of the last rank's buffers that are free while the loss's transients live (FSDP2's
    gathered and scattered layers, ``memory.loss_overlap``). Last: an MoE model's dense layer's
    activations (``moe_layers.dense_plan``), None where it has no dense layers; and whether the
    chunks in flight and the weight gradients owed peak apart (DualPipeV: ``peak_apart``)."""
    m = plan.model
    flat = _layer_terms(ml.dense_plan(plan))[0] if m.dense_count else None
    return (_layer_terms(plan), plan.training, overlap, flat, plan.parallel.v_shape)


def rank_activation_bytes(plan: Plan, rank: int, stages: tuple[int, ...], terms) -> dict[str, float]:
    """Rank ``rank``'s activation bytes at its peak, by part: ``layers`` (in-flight chunks'
    stashes and the recomputed layer's working set), ``embedding``, ``loss`` and
    ``loss_transient`` (last rank: what outlasts the buffers it overlaps) and ``wgrad_stash``
    (zero-bubble)."""
    return shape_activation_bytes(plan.parallel.vpp, rank_shapes(plan, stages)[rank], terms)


def rank_shapes(plan: Plan, stages: tuple[int, ...]) -> tuple[tuple[int, int, float, bool, bool, float], ...]:
    """Per pipeline rank, what its activation bytes depend on: (chunks in flight, weight
    gradients owed, layers per model chunk, first rank, last rank, an MoE model's dense layers
    per model chunk). Megatron-Core's combined 1F1B (``parallel.moe_a2a_overlap``) runs one more
    forward ahead, so that each step's forward and backward are independent (schedules.py
    ``get_pp_rank_microbatches`` @d98e8a64: ``num_warmup_microbatches + 1``; without a pipeline
    the next micro-batch's forward beside this one's backward): one more chunk in flight. Kept per
    (model, layout, micro-batches, stages): a search asks again for each recompute it prices (read only)."""
    return _rank_shapes(plan.model, plan.parallel, plan.num_microbatches, tuple(stages))


@functools.lru_cache(maxsize=4096)
def _rank_shapes(model, par, m: int, stages: tuple[int, ...]) -> tuple[tuple[int, int, float, bool, bool, float], ...]:
    p, ahead = par.pp, int(par.moe_a2a_overlap)
    dense = ml.rank_dense_layers(model, stages, p, par.v_shape)
    if p == 1:
        return ((min(1 + ahead, m), 0, sum(stages) / par.vpp, True, True, dense[0] / par.vpp),)
    flights, owes = schedule_peaks(par.schedule, p, m, par.vpp, par.microbatch_group)
    flights = tuple(min(f + ahead, m * par.vpp) for f in flights) if ahead else flights
    layers = par.by_rank(stages)
    per_chunk = {n: n / par.vpp for n in set(layers) | set(dense)}
    last = (True,) + (False,) * (p - 1) if par.v_shape else (False,) * (p - 1) + (True,)   # DualPipeV: rank 0
    return tuple(zip(flights, owes, map(per_chunk.__getitem__, layers), (True,) + (False,) * (p - 1),
                     last, map(per_chunk.__getitem__, dense)))


#: The parts of a rank's activation bytes, in ``shape_activation_parts``' order.
ACTIVATION_PARTS = ("layers", "embedding", "loss", "loss_transient", "wgrad_stash")


def shape_activation_bytes(vpp: int, shape: tuple[int, int, float, bool, bool, float], terms,
                           per_chunk: dict | None = None) -> dict[str, float]:
    """``rank_activation_bytes`` of a rank of shape ``shape`` (``rank_shapes``); ``per_chunk``
    keeps a chunk's (stash, working set) by its layers across the ranks of one plan."""
    return dict(zip(ACTIVATION_PARTS, shape_activation_parts(vpp, shape, terms, per_chunk)))


def shape_activation_parts(vpp: int, shape: tuple[int, int, float, bool, bool, float], terms,
                           per_chunk: dict | None = None) -> tuple[float, float, float, float, float]:
    """``shape_activation_bytes``' values in ``ACTIVATION_PARTS`` order (no dict per rank)."""
    (act, emb, last, transient, wstash), tr, overlap, flat, apart = terms
    chunks, owed, n, first, final, dense = shape
    stash_work = _chunk_parts(tr, (n, dense), ml.mixed_activations(act, flat, n, dense), per_chunk)
    if apart and owed:
        chunks, owed = peak_apart(chunks, owed, stash_work[0], n * wstash)
    loss, spike = (last, max(0.0, transient - overlap)) if final else (0.0, 0.0)
    # the loss's tensors are freed by its backward, before any layer's backward rebuilds its
    # working set: the two are never live together, so the larger one counts
    layers = chunks * stash_work[0] + max(0.0, stash_work[1] - loss - spike)
    return layers, chunks / vpp * emb if first else 0.0, loss, spike, owed * n * wstash


def peak_apart(chunks: int, owed: int, chunk: float, weight: float) -> tuple[int, int]:
    """DualPipeV's (chunks in flight, weight gradients owed) at a rank's peak, a chunk's stash
    ``chunk`` bytes and an owed W's ``weight``: the two counts peak apart on its schedule. Each rank
    holds 2p + 1 chunks with no W owed and, but the last, 2p - 1 beside the one its I1W1F1 warm-up
    owes; in the cool-down rank r owes k of its last r + 1 W beside p - k chunks (``counted_states``;
    tests/model/test_memory_terms.py holds these points to its states)."""
    p = (chunks - 1) // 2
    points = ((chunks, 0), (chunks - 2 if owed < p else p - 1, 1), (max(0, p - owed), owed))
    return max(points, key=lambda x: x[0] * chunk + x[1] * weight)


def _chunk_parts(tr, size: tuple[float, float], act: rcp.LayerActivations, per_chunk: dict | None
                 ) -> tuple[float, float, float]:
    """A model chunk of ``size`` (layers, dense layers): (the stash one micro-batch leaves on the
    GPU, the working set recomputation adds, the stash offloaded to host memory), kept in ``per_chunk``."""
    parts = per_chunk.get(size) if per_chunk is not None else None
    n = size[0]
    if parts is None:
        gpu, host = rcp.offload_split(tr, n, rcp.chunk_stash_bytes(tr, n, act))
        parts = (gpu, rcp.working_bytes(tr, n, act), host)
        if per_chunk is not None:
            per_chunk[size] = parts
    return parts


def rank_offloaded_bytes(plan: Plan, rank: int, stages: tuple[int, ...], terms) -> float:
    """Host bytes per GPU of pipeline rank ``rank``'s offloaded activations (``training.activation_offload``)."""
    return shape_offloaded_bytes(rank_shapes(plan, stages)[rank], terms)


def shape_offloaded_bytes(shape: tuple[int, int, float, bool, bool, float], terms,
                          per_chunk: dict | None = None) -> float:
    """Host bytes per GPU of ``training.activation_offload`` on a rank of shape ``shape``: the
    offloaded layers' stash of every chunk it holds (one without a pipeline)."""
    (act, *_), tr, _, flat, _ = terms
    if not tr.activation_offload:
        return 0.0
    size = (shape[2], shape[5])   # (layers, dense layers) per chunk
    return shape[0] * _chunk_parts(tr, size, ml.mixed_activations(act, flat, *size), per_chunk)[2]
