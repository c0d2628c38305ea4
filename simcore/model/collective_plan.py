"""The collectives each rank issues in one steady-state optimizer step, at torch's granularity.

A Plan is executed by ``executors/parallel.py`` with torch's own parallel APIs; this module
predicts, without torch, every call those APIs make on each rank in one step (after the
first, which infers pipeline shapes and lets DDP rebuild its buckets), named as
``executors/record.py`` records them: kind (``all_reduce``, ``all_gather``,
``reduce_scatter``, ``broadcast``, ``send``, ``recv``) and mesh axis (``dp``, ``tp``, ``pp``).
What each API does, and where torch does it (torch 2.13):

- DDP (``torch/nn/parallel/distributed.py``, ``torch/csrc/distributed/c10d/reducer.cpp``):
  one all-reduce per gradient bucket, after the last micro-batch (``no_sync`` before it,
  and pipelining's ``backward_maybe_with_nosync``). After the first iteration the reducer
  rebuilds its buckets in gradient-ready order with limits ``[first_bucket_bytes,
  bucket_bytes_cap]`` (1 MiB, then 25 MiB: ``dist._DEFAULT_FIRST_BUCKET_BYTES``,
  ``_DEFAULT_BUCKET_CAP_MB``); ``compute_bucket_assignment_by_size`` closes a bucket once its
  bytes reach the limit. Ready order is the reverse of first use in forward. The fp16/bf16
  compression hooks (``default_hooks``) all-reduce a half-precision copy of the bucket.
- ``ZeroRedundancyOptimizer`` (``torch/distributed/optim/zero_redundancy_optimizer.py``,
  ``parameters_as_bucket_view=True``): ``_partition_parameters`` sorts the tensors by size,
  largest first, and gives each to the rank with the fewest elements so far; ``_sync_params``
  then broadcasts each rank's flat bucket of its tensors from that rank after the step (a
  one-element dummy for a rank with none): dp broadcasts, every rank in each.
- FSDP2 ``fully_shard`` (``torch/distributed/fsdp/_fully_shard``): one all-gather and one
  reduce-scatter per FSDP module (each block and the root, which holds the embedding, the
  final norm and the output) with parameters; dim 0 of every parameter is padded to a
  multiple of dp. Without pipelining each micro-batch all-gathers in forward (ZeRO-3:
  reshard after forward, so again in backward) and reduce-scatters after its backward.
  With pipelining (``torch/distributed/pipelining/stage.py``) backwards keep parameters
  unsharded and skip gradient sync; ``perform_reduce_grad`` (the REDUCE_GRAD action)
  reduce-scatters once per step; the multi-stage schedules also UNSHARD and RESHARD stages
  (``_add_unshard_reshard``). ``simcore.model.fsdp_calls`` walks these rules over the rank's actions.
- FSDP2-based ``replicate`` (zero 0/1 with TP or under the zero-bubble and DualPipeV schedules): like a
  single FSDP unit holding every parameter, with an all-reduce instead of a reduce-scatter
  and no all-gather; ZeRO-1 then broadcasts each tensor's local shard (``executors.zero1``).
- DTensor tensor parallel (``torch/distributed/tensor/parallel/style.py``; the plan in
  ``executors.parallel.apply_tp``, Megatron's f/g operators, Shoeybi et al. 2019, and
  sequence parallelism, Korthikanti et al. 2022): per micro-batch and block, without SP
  2 all-reduces in forward (wo, w2 outputs) and 2 in backward (attention and MLP inputs);
  with SP an all-gather and a reduce-scatter in their place, each way. The vocabulary-
  parallel embedding all-reduces its output; the output projection's input gradient is
  all-reduced (SP: all-gathered input, reduce-scattered gradient); its logits stay
  vocabulary-sharded and torch's ``loss_parallel`` (``tensor/parallel/loss.py``
  ``_log_softmax`` and ``_nll_loss_forward``) all-reduces three fp32 values per token in
  forward (the maximum, the sum of exponentials, the target's log-probability) and
  nothing in backward. Under SP the norm weights are Replicate DTensors with Partial gradients:
  one all-reduce each when the gradients are reduced (per FSDP/replicate reduction, else
  else at the optimizer step, where every DTensor op that reads a Partial gradient
  all-reduces it: once for SGD, three times for Adam/AdamW, whose ``_single_tensor_adam``
  reads it in ``exp_avg.lerp_(grad)`` and ``addcmul_(grad, grad)``). Full recomputation
  re-runs a block's forward collectives except the last (w2's output), since
  non-reentrant ``torch.utils.checkpoint`` stops recomputing once the tensors backward
  needs are rebuilt (its early stop); so do the blocks ``layer:N`` or ``{layers: N, method:
  block}`` recompute. torchtitan's per-op SAC re-runs the collectives of
  ``recompute.op_sac_tp_reruns`` (a saved reduce-scatter is not re-communicated).
- MTP modules (``model.mtp_layers``, ``simcore.model.mtp``): each module's block is one more block of the last
  chunk, with its collectives; its output layer and loss issue the head's calls again (the executor builds none).
- ``torch.distributed.pipelining``: one send and one receive per activation and per input
  gradient that crosses ranks, from ``simcore.model.schedules`` lowered as torch lowers it.

Bytes per call: the whole buffer (all-gather output, reduce-scatter input). ``Wire`` says
in which dtypes: the executor's (``EXECUTOR_WIRE``: parameters and gradients fp32, since
autocast keeps fp32 parameters), which the recorded runs are checked against, or the plan's
own (``plan_wire``: 16-bit parameters gathered and broadcast at 2 bytes, FP8 block weights at
1 under ``fp8_param_gather``, gradients reduced at ``collectives.grad_wire_bytes``), what the
stacks the Plan stands for move with the same calls. Activations are in the plan's precision
either way (approximate under autocast, where some backward gradients stay fp32). Context parallel, expert parallel and tied embeddings under
pipelining add the calls of ``simcore.model.layout_calls``; with cp > 1 the data-parallel
wrappers reduce over dp x cp ranks (axis ``dp``, or ``cp`` when dp is 1). Not modelled
(ValueError): an MoE with full or ``layer:N`` recomputation, or with per-op SAC under TP;
DDP's buckets and its hooks' calls are ``simcore.model.ddp_hooks``'.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from simcore.model import ddp_hooks as hooks, dsa
from simcore.model import int8_scatter as i8
from simcore.model import kv_replication as kvr
from simcore.model import recompute as rcp
from simcore.model.collectives import comm_act_bytes
from simcore.model.end_comm import LOSS_ALL_REDUCES, tp_loss_bytes
from simcore.model.fsdp_calls import fsdp_unit_calls, rank_actions
from simcore.model.layout_calls import (expert_calls, fp8_scale_calls, grad_axis, is_expert, moe_capacity, ring_calls,
                                        tied_calls)
from simcore.model.param_layout import (ParamTensor, StagePart, _numel, block_params, embed_params,
                                        fsdp_padded_numel, head_params, local_shape, part_params, stage_parts)
from simcore.model.schedules import Action, Op, add_communication, build_schedule
from simcore.model.wire import EXECUTOR_WIRE, PARAM_ELEMENT_BYTES, Wire, executor_wire, plan_wire  # noqa: F401
from simcore.plan.load import recompute_doc
from simcore.plan.rules import int8_scatters
from simcore.plan.spec import (
    GradCompression, Optimizer, Plan, Recompute, Schedule, ZeroStage,
)
from topologies.placement import rank_grid

#: Reads of a gradient by one optimizer step (torch/optim/sgd.py ``param.add_(grad)``, with
#: momentum ``buf.mul_(momentum).add_(grad)``; adam.py ``exp_avg.lerp_(grad)``,
#: ``exp_avg_sq.mul_().addcmul_(grad, grad)``). The executor runs neither 8-bit AdamW nor
#: Adafactor on DTensor parameters (``executors.support``).
OPTIMIZER_GRAD_READS = {Optimizer.SGD: 1, Optimizer.ADAM: 3, Optimizer.ADAMW: 3}


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One kind of collective call: what, on which mesh axis, how big, issued by which API."""

    kind: str
    axis: str
    bytes: int
    """The whole buffer: all-gather output, reduce-scatter input, the all-reduced tensor."""
    issuer: str
    """``ddp``, ``replicate``, ``zero1``, ``fsdp2``, ``distopt`` (Megatron's instances), ``dtensor``, ``pipelining``,
    ``torchao`` (float8 scales) or ``dsa`` (Megatron-Core's DSA indexer loss, which the executor does not run)."""


# --------------------------------------------------------------------------- data parallel

def ddp_buckets(ready_bytes: list[int], first_cap: int = hooks.DDP_FIRST_BUCKET_BYTES,
                cap: int = hooks.DDP_BUCKET_CAP_BYTES) -> list[int]:
    """Bytes of each DDP bucket from gradient sizes in ready order (``ddp_hooks.bucket_members``)."""
    return [sum(ready_bytes[i] for i in m) for m in hooks.bucket_members(ready_bytes, first_cap, cap)]


def _ddp_calls(plan: Plan, params: list[ParamTensor], wire: Wire) -> Counter:
    """DDP's calls per bucket, as its communication hook makes them (``ddp_hooks``: one all-reduce;
    the 16-bit hooks' of a half-precision copy; PowerSGD's three in its steady state; the int8
    hook's all-to-all and all-gather)."""
    shapes = [p.shape for p in reversed(params)]
    compression, world = plan.training.grad_compression.value, plan.parallel.dp * plan.parallel.cp
    return Counter(Call(kind=kind, axis=grad_axis(plan), bytes=int(b), issuer="ddp")
                   for members in hooks.bucket_members([_numel(s) * PARAM_ELEMENT_BYTES for s in shapes])
                   for kind, b in hooks.bucket_collectives(compression, [shapes[i] for i in members],
                                                           hooks.POWERSGD_RANK, wire.grad, world))


def _fsdp_units(plan: Plan, part: StagePart) -> list[list[ParamTensor]]:
    """One FSDP module per block, then the root with what is left (embed, norm, output);
    an expert-parallel rank's experts are left out (``executors.moe``)."""
    spec = plan.model
    root = (embed_params(spec) if part.embed else []) + (head_params(spec, not part.embed) if part.head else [])
    units = [_dp_params(plan, block_params(spec, i)) for i in part.layers] + [root]
    return [u for u in units if u]  # a root with no parameters has no FSDP param group


def _dp_params(plan: Plan, params: list[ParamTensor]) -> list[ParamTensor]:
    """The parameters the data-parallel wrapper reduces (not an expert-parallel rank's experts)."""
    return [p for p in params if not is_expert(p)] if plan.parallel.ep > 1 else params


def _fsdp_calls(plan: Plan, part: StagePart, actions: list[Action], tp_rank: int, wire: Wire) -> Counter:
    par, out, nd, axis = plan.parallel, Counter(), plan.parallel.shard_ranks, grad_axis(plan)
    for unit in _fsdp_units(plan, part):
        numels = [(fsdp_padded_numel(local_shape(p, par.tp, tp_rank), nd), wire.of(p)) for p in unit]
        gathers, scatters = fsdp_unit_calls(actions, part.stage, par.zero == ZeroStage.WEIGHTS, par.pp > 1)
        out[Call(kind="all_gather", axis=axis, bytes=sum(n * e for n, e in numels), issuer="fsdp2")] += gathers
        total, bits = sum(n for n, _ in numels), plan.training.grad_compression.bits   # FSDP2's int8 (int4)
        out[Call(kind="all_to_all", axis=axis, bytes=i8.call_bytes(total, nd, bits), issuer="fsdp2") if int8_scatters(plan)
            else Call(kind="reduce_scatter", axis=axis, bytes=total * wire.grad, issuer="fsdp2")] += scatters
        if par.dp_replicate > 1:   # HSDP: foreach_reduce all-reduces the shard over the replicas
            out[Call(kind="all_reduce", axis="dp_replicate", bytes=sum(n for n, _ in numels) // nd * wire.grad,
                     issuer="fsdp2")] += scatters
    return +out


def grad_reductions(plan: Plan) -> int:
    """Gradient reductions per step by an FSDP-based wrapper: ``fully_shard`` once per
    micro-batch without pipelining (its default, which the executor keeps: ZeRO-2/3 reduce
    what they shard), ``replicate`` once (the executor turns its gradient sync off before
    the last micro-batch, as DDP's ``no_sync``); under pipelining at REDUCE_GRAD."""
    return 1 if plan.parallel.pp > 1 or _replicate(plan) else plan.num_microbatches


def _fsdp_based(plan: Plan) -> bool:
    par = plan.parallel
    return par.dp * par.cp > 1 and (par.zero >= ZeroStage.GRADIENTS or _replicate(plan))


def _dp_calls(plan: Plan, part: StagePart, actions: list[Action], tp_rank: int, wire: Wire) -> Counter:
    par = plan.parallel
    params = _dp_params(plan, part_params(plan.model, part))
    nd, axis = par.dp * par.cp, grad_axis(plan)
    if nd == 1:
        return Counter()
    if par.zero >= ZeroStage.GRADIENTS:
        return _fsdp_calls(plan, part, actions, tp_rank, wire)
    if par.dp_replicate > 1:   # Megatron's distributed-optimizer instances (ZeRO-1 by instance)
        n = sum(_numel(local_shape(p, par.tp, tp_rank)) for p in params)
        shard = math.ceil(n / par.shard_ranks)
        return Counter({Call(kind="reduce_scatter", axis=axis, bytes=shard * par.shard_ranks * wire.grad, issuer="distopt"): 1,
                        Call(kind="all_reduce", axis="dp_replicate", bytes=shard * wire.grad, issuer="distopt"): 1,
                        Call(kind="all_gather", axis=axis, bytes=shard * par.shard_ranks * wire.param, issuer="distopt"): 1})
    if _replicate(plan):  # replicate: one param group, all-reduced per reduction
        nbytes = sum(_numel(local_shape(p, par.tp, tp_rank)) for p in params) * wire.grad
        out = Counter({Call(kind="all_reduce", axis=axis, bytes=nbytes, issuer="replicate"): grad_reductions(plan)})
        if par.zero == ZeroStage.OPTIMIZER_STATES and nd // par.ep > 1:   # executors.zero1: a broadcast a tensor
            held = part_params(plan.model, part)
            out.update(Call(kind="broadcast", axis="dp" if par.ep > 1 else axis, issuer="zero1",
                            bytes=_numel(local_shape(p, par.tp, tp_rank)) * wire.of(p))
                       for p in held if p in params or _held_expert(plan, p, held))
        return out
    out = _ddp_calls(plan, params, wire)
    zero_ranks = nd // par.ep      # under ep, ZeRO-1 shards over the ranks holding the same experts
    if par.zero == ZeroStage.OPTIMIZER_STATES and zero_ranks > 1:
        held = [p for p in part_params(plan.model, part) if p not in params]
        tensors = params + held[:len(held) // par.ep]
        buckets = zero1_buckets([_numel(p.shape) for p in tensors], zero_ranks, [wire.of(p) for p in tensors])
        out.update(Call(kind="broadcast", axis="dp" if par.ep > 1 else axis, bytes=max(wire.param, n),
                        issuer="zero1") for n in buckets)
    return out


def _replicate(plan: Plan) -> bool:
    """ZeRO 0/1 by FSDP2's ``replicate``, not DDP (``executors.support.uses_replicate``):
    with TP, and under the zero-bubble and DualPipeV schedules (their split backward skips DDP's hooks)."""
    par = plan.parallel
    split = par.schedule in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V)
    return par.zero < ZeroStage.GRADIENTS and (par.tp > 1 or (split and par.pp > 1))


def _held_expert(plan: Plan, p: ParamTensor, held: list[ParamTensor]) -> bool:
    """Whether an expert-parallel rank holds expert tensor ``p`` (its layer's first E/ep experts
    stand in for any rank's: they have the same shapes)."""
    if not is_expert(p):
        return False
    expert = int(p.name.split(".experts.")[1].split(".")[0])
    return expert < plan.model.experts // plan.parallel.ep


def zero1_buckets(numels: list[int], dp: int, element_bytes: list[int] | None = None) -> list[int]:
    """Elements of each rank's bucket under ``ZeroRedundancyOptimizer``'s greedy partition (by
    elements, largest first), or its bytes with ``element_bytes`` per tensor."""
    sizes, held = [0] * dp, [0] * dp
    weights = element_bytes or [1] * len(numels)
    for n, e in sorted(zip(numels, weights), key=lambda t: -t[0]):
        r = sizes.index(min(sizes))
        sizes[r] += n
        held[r] += n * e
    return held


# --------------------------------------------------------------------------- tensor parallel

def _tp_calls(plan: Plan, part: StagePart, tp_rank: int, wire: Wire) -> Counter:
    """DTensor collectives of one chunk in one step (see the module docstring)."""
    par, m, tr = plan.parallel, plan.model, plan.training
    if par.tp == 1:
        return Counter()
    n_mb, blocks = plan.num_microbatches, len(part.layers)
    redo = rcp.full_layers(tr, blocks)   # blocks recomputed whole re-run their forward's collectives
    op = Counter({k: n * blocks for k, n in rcp.tp_reruns(tr.recompute, par.sequence_parallel).items()})
    seq, heads = m.seq_len // par.cp, part.head * (1 + m.mtp_layers)   # the output layer again per MTP module
    act = tr.micro_batch * seq * m.hidden * comm_act_bytes(tr.precision)

    def call(kind: str, nbytes: int) -> Call:
        return Call(kind=kind, axis="tp", bytes=nbytes, issuer="dtensor")

    out: Counter = Counter()
    moe = sum(not m.is_dense_layer(i) for i in part.layers) if m.moe else 0   # an MoE block's MLP half: its
    # experts' own collectives (an MoE model's first, dense, blocks have a dense MLP's)
    if moe:
        # each expert's w2 output all-reduced forward, its w1 and w3 inputs' gradients backward
        # (ColwiseParallel per matrix: no shared input); rows: the capacity buffer of ep ranks
        rows = par.ep * moe_capacity(plan) * m.hidden * comm_act_bytes(tr.precision)
        out[call("all_reduce", rows)] += n_mb * moe * (m.experts // par.ep) * (2 + m.gated_mlp)
    if par.sequence_parallel:
        # per block: forward gathers (attention, MLP inputs) and scatters (wo, w2 outputs),
        # the transposes in backward; recomputation gathers both inputs and scatters wo's; an
        # MoE gathers its input forward and its output's gradient backward, and scatters none
        out[call("all_gather", act)] += n_mb * (4 * blocks + 2 * redo + op["all_gather"] + part.embed + heads)
        out[call("reduce_scatter", act)] += n_mb * (4 * blocks + redo - 2 * moe + heads)
        out[call("all_reduce", act)] += n_mb * part.embed
        reductions = grad_reductions(plan) if _fsdp_based(plan) else OPTIMIZER_GRAD_READS[tr.optimizer]
        for p in part_params(m, part):
            out[call("all_reduce", _numel(p.shape) * wire.grad)] += reductions * p.norm
    else:
        out[call("all_reduce", act)] += n_mb * (4 * blocks + redo + op["all_reduce"] - 2 * moe + part.embed
                                                + heads)
    if part.head:
        out[call("all_reduce", tp_loss_bytes(plan))] += LOSS_ALL_REDUCES * n_mb * heads   # fp32 in the executor too
    if m.sparse_attention is not None:   # DSA's indexer loss, forward and backward (Megatron-Core's dsa.py)
        out[Call(kind="all_reduce", axis="tp", bytes=int(dsa.loss_all_reduce_bytes(m, tr.micro_batch, seq)),
                 issuer="dsa")] += n_mb * (2 * blocks + redo)
    return +out


# --------------------------------------------------------------------------- pipeline

def _pp_calls(plan: Plan, pp_rank: int, tp_rank: int) -> Counter:
    par, m, tr = plan.parallel, plan.model, plan.training
    if par.pp == 1:
        return Counter()
    schedule = build_schedule(par.schedule, par.pp, plan.num_microbatches, par.vpp, par.microbatch_group)
    lowered = add_communication(schedule, par.pp, par.vpp)[pp_rank]
    # under SP a stage's output is a sequence shard, and the stage sends its local tensor
    seq = math.ceil(m.seq_len // par.cp / par.tp) if par.sequence_parallel else m.seq_len // par.cp
    act = tr.micro_batch * seq * m.hidden * comm_act_bytes(tr.precision)
    kinds = {Op.SEND_F: "send", Op.SEND_B: "send", Op.RECV_F: "recv", Op.RECV_B: "recv"}
    return Counter(Call(kind=kinds[a.op], axis="pp", bytes=act, issuer="pipelining")
                   for a in lowered if a.op in kinds)


# --------------------------------------------------------------------------- per rank

def _check_modelled(plan: Plan) -> None:
    from simcore.plan.choices import ONEBIT_OPTIMIZERS   # DeepSpeed's 1-bit Adam, 1-bit LAMB, 0/1 Adam

    m, tr = plan.model, plan.training
    par = plan.parallel
    rules = [(not m.moe or tr.recompute not in (Recompute.FULL, Recompute.LAYER),
              f"model.experts={m.experts} with training.recompute={recompute_doc(tr)}: the recomputed MoE's "
              "collectives are not modelled at torch's granularity"),
             (not m.moe or par.tp == 1 or tr.recompute not in rcp.SAVES_MATMULS,
              f"model.experts={m.experts} with training.recompute={tr.recompute.value} and parallel.tp={par.tp}: "
              "which experts' all-reduces the per-layer policy re-runs is not modelled at torch's granularity"),
             (par.etp == par.tp, f"parallel.expert_tp={par.expert_tp}: the folded expert grid's collectives are "
              "not modelled at torch's granularity (the executor does not run it)"),
             (par.moe_dispatcher.value == "alltoall", "parallel.moe_dispatcher=deepep: DeepEP's dispatch is not "
              "modelled at torch's granularity (the executor does not run it)"),
             (not (par.zero_quantized_weights or par.zero_quantized_gradients or par.zero_hpz_partition_size > 1),
              "ZeRO++ (parallel.zero_quantized_weights / zero_hpz_partition_size / zero_quantized_gradients): "
              "DeepSpeed's quantized and hierarchical calls are priced (simcore/model/zeropp.py), not listed at "
              "torch's granularity (the executor does not run DeepSpeed)"),
             (tr.optimizer not in ONEBIT_OPTIMIZERS, f"training.optimizer={tr.optimizer.value}: DeepSpeed's "
              "compressed all-reduce is priced (simcore/model/onebit.py), not listed at torch's granularity (the "
              "executor does not run DeepSpeed)"),
             (not par.sequence_parallel or tr.optimizer in OPTIMIZER_GRAD_READS,
              f"training.optimizer={tr.optimizer.value} with sequence parallelism: how often its step reads a "
              "DTensor gradient is not modelled (the executor does not run it)")]
    for ok, message in rules:
        if not ok:
            raise ValueError(message)


def expected_calls(plan: Plan, rank: int, wire: Wire | None = None) -> Counter:
    """Counter of ``Call`` -> calls that global ``rank`` issues in one steady-state step, bytes by ``wire`` (the
    executor's by default); replicated K/V heads: NxD's model and its kv group's all-reduces (``kv_replication``)."""
    wire = wire or executor_wire(plan)
    plan, replicated = kvr.as_run(plan), plan
    _check_modelled(plan)
    par = plan.parallel
    coords = rank_grid(par.pp, par.dp, par.cp, par.tp).coords(rank)
    actions = rank_actions(plan, coords["pp"])
    out = _pp_calls(plan, coords["pp"], coords["tp"])
    act = comm_act_bytes(plan.training.precision)
    for part in stage_parts(plan, coords["pp"]):
        out.update(_tp_calls(plan, part, coords["tp"], wire))
        out.update(_dp_calls(plan, part, actions, coords["tp"], wire))
        for kind, axis, nbytes, issuer, n in (ring_calls(plan, part, act)
                                              + expert_calls(plan, part, act, coords["tp"], wire.grad)
                                              + tied_calls(plan, part, coords["tp"], wire.grad)
                                              + fp8_scale_calls(plan, part)
                                              + kvr.sync_calls(replicated, len(part.layers))):
            out[Call(kind=kind, axis=axis, bytes=nbytes, issuer=issuer)] += n
    return +out


def by_kind_axis(calls: Counter) -> Counter:
    """Collapse a Counter of ``Call`` to (kind, axis) -> count, as the executor records."""
    out: Counter = Counter()
    for c, n in calls.items():
        out[(c.kind, c.axis)] += n
    return out


def expected_collectives(plan: Plan) -> dict[int, Counter]:
    """(kind, axis) -> calls per step, for every global rank of the plan (ranks with the same
    pipeline and tensor-parallel coordinates share one Counter)."""
    par = plan.parallel
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    firsts = {grid.rank(pp=i, tp=t): (i, t) for i in range(par.pp) for t in range(par.tp)}
    counts = {key: by_kind_axis(expected_calls(plan, r)) for r, key in firsts.items()}
    return {r: counts[(c["pp"], c["tp"])] for r in range(par.gpus) for c in [grid.coords(r)]}


def format_collectives(plan: Plan, wire: Wire | None = None) -> str:
    """A table per pipeline stage (its first rank): axis, kind, calls per step, bytes per
    call (range when they differ) and bytes per step, bytes by ``wire``."""
    par = plan.parallel
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    lines = []
    for pp_rank in range(par.pp):
        rank = grid.rank(pp=pp_rank)
        calls = expected_calls(plan, rank, wire)
        rows: dict[tuple[str, str], list] = {}
        for c, n in calls.items():
            rows.setdefault((c.axis, c.kind), []).append((c.bytes, n))
        lines.append(f"rank {rank} (pipeline stage {pp_rank}), {plan.num_microbatches} micro-batches per step")
        w = max([5] + [len(a) + 1 for a, _ in rows])   # dp_replicate, dp_shard under hybrid sharding
        lines.append(f"  {'axis':<{w}}{'kind':<15}{'calls/step':>11}  {'bytes/call':>29}  {'bytes/step':>19}")
        for (axis, kind), items in sorted(rows.items()):
            sizes = sorted({b for b, _ in items})
            per_call = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
            count, total = sum(n for _, n in items), sum(b * n for b, n in items)
            lines.append(f"  {axis:<{w}}{kind:<15}{count:>11,}  {per_call:>29}  {total:>19,}")
        if not rows:
            lines.append("  (no collectives)")
    return "\n".join(lines) + "\n"
