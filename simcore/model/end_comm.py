"""The collectives of the model's ends, which the per-layer terms leave out.

- Tensor parallel's embedding and head, per micro-batch (Megatron-Core
  ``VocabParallelEmbedding.forward``: the partial embeddings all-reduced, or under sequence
  parallelism reduce-scattered into the sequence-parallel region, whose backward
  all-gathers; the output layer's ``ColumnParallelLinear``: its input's gradient
  all-reduced in backward, or under SP its input all-gathered forward and the gradient
  reduce-scattered; megatron/core/tensor_parallel/layers.py and mappings.py), and the
  vocab-parallel cross entropy's three all-reduces of one fp32 value per token in forward
  (``LOSS_ALL_REDUCES``).
- FSDP2's root group on each pipeline rank: the embedding on the first, the final norm and
  output on the last (``fully_shard(model)`` after the blocks, torchtitan's
  ``apply_fsdp``), all-gathered and reduce-scattered as often as a block of that stage.
- The tied embedding under pipelining: one all-reduce per step of the shared weight's
  gradient between the first and the last stage (Megatron's embedding group,
  megatron/core/distributed/finalize_model_grads.py ``_allreduce_word_embedding_grads``).

Where a calibrated CPU host measured the ends' wrapper costs (``parallel_host``), those hold
the calls' latency and dispatch, and only the bytes' term is added, as for the layers.
"""
from __future__ import annotations

from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import int8_scatter as i8
from simcore.model import memory as mem
from simcore.plan.rules import int8_scatters
from simcore.plan.spec import Plan, ZeroStage


#: The vocabulary-parallel cross entropy's all-reduces per micro-batch, each of one fp32 value
#: per token: the row maximum, the target's logit and the sum of exponentials (Megatron-Core
#: megatron/core/tensor_parallel/cross_entropy.py ``VocabParallelCrossEntropy``; torch's
#: ``loss_parallel``, tensor/parallel/loss.py ``_log_softmax`` and ``_nll_loss_forward``).
LOSS_ALL_REDUCES = 3
LOSS_VALUE_BYTES = 4


def tp_loss_bytes(plan: Plan) -> int:
    """Bytes of each of the vocabulary-parallel loss's all-reduces (0 without TP)."""
    par, tr = plan.parallel, plan.training
    return tr.micro_batch * (plan.model.seq_len // par.cp) * LOSS_VALUE_BYTES if par.tp > 1 else 0


def tp_end_calls(plan: Plan) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], tuple[tuple[str, ...], tuple[str, ...]]]:
    """((forward kinds, backward kinds) of the embedding, the same of the head), each call
    of ``collectives.tp_act_bytes``; none without TP."""
    if plan.parallel.tp == 1:
        return ((), ()), ((), ())
    if plan.parallel.sequence_parallel:
        return (("reduce_scatter",), ("all_gather",)), (("all_gather",), ("reduce_scatter",))
    return (("all_reduce",), ()), ((), ("all_reduce",))


#: ``tp_ends_s`` and ``tied_s`` answers by what they read (a search prices few distinct
#: ones), each with the cluster and device model it was computed for (kept by identity, as
#: ``collectives.group_net`` keeps its routes); cleared whole at ``_CACHE_MAX``.
_CACHE: dict[tuple, tuple] = {}
_CACHE_MAX = 4096


def _cached(key: tuple, plan: Plan, dev: cmp.DeviceModel, compute):
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is plan.cluster and hit[1] is dev:
        return hit[2]
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.clear()
    value = compute()
    _CACHE[key] = (plan.cluster, dev, value)
    return value


def tp_ends_s(plan: Plan, dev: cmp.DeviceModel) -> tuple[tuple[float, float], tuple[float, float]]:
    """Per micro-batch: ((forward, backward) seconds of the embedding's TP calls, the same of
    the head's)."""
    par = plan.parallel
    if par.tp == 1:
        return (0.0, 0.0), (0.0, 0.0)
    act = coll.tp_act_bytes(plan)
    key = ("tp", id(plan.cluster), id(dev), act, tp_loss_bytes(plan), par.tp, par.sequence_parallel)
    return _cached(key, plan, dev, lambda: _tp_ends_s(plan, dev, act))


def _tp_ends_s(plan: Plan, dev: cmp.DeviceModel, act: float) -> tuple[tuple[float, float], tuple[float, float]]:
    par = plan.parallel
    net = coll.group_net(plan.cluster, dev, par.tp, 1)
    mode = "tp_sp" if par.sequence_parallel else "tp"
    ends = dev.measured(f"{mode}_embed", f"{mode}_head")
    (embed, (head_f, head_b)) = (tuple(sum(_price(k, act, net, ends) for k in kinds) for kinds in side)
                                 for side in tp_end_calls(plan))
    loss = _price("all_reduce", tp_loss_bytes(plan), net, dev.measured(f"{mode}_head"))
    return embed, (head_f + LOSS_ALL_REDUCES * loss, head_b)


_PRICES = {"all_reduce": coll.all_reduce_s, "all_gather": coll.all_gather_s, "reduce_scatter": coll.reduce_scatter_s}


def _price(kind: str, nbytes: float, net: coll.GroupNet, measured: bool) -> float:
    """One TP call at an end: its full price, or on a calibrated host whose wrapper probe
    ``measured`` the end (latency and dispatch in that cost) only its bytes' term."""
    if measured:
        return (2 if kind == "all_reduce" else 1) * coll.ring_bytes_s(nbytes, net)
    return _PRICES[kind](nbytes, net)


def fsdp_root_bytes(plan: Plan, sp: mem.StageParams) -> tuple[float, float]:
    """(all-gather, reduce-scatter) bytes of one pipeline rank's FSDP2 root group, whose
    parameters are ``sp.ends``: 16-bit (fp32 in an fp32 plan) parameters gathered, gradients
    reduced as the blocks' (``collectives.grad_wire_bytes``)."""
    return mem.param_bytes(plan.training) * sp.ends, coll.grad_wire_bytes(plan) * sp.ends


def fsdp_root_s(plan: Plan, dev: cmp.DeviceModel, sp: mem.StageParams) -> tuple[float, float]:
    """(all-gather, reduce-scatter) seconds of one call each of a rank's root group (0 where
    FSDP2 does not shard or the rank holds no ends)."""
    par = plan.parallel
    nd = par.dp * par.cp
    if par.zero < ZeroStage.GRADIENTS or nd == 1 or sp.ends <= 0:
        return 0.0, 0.0
    ag, rs = fsdp_root_bytes(plan, sp)
    net = coll.group_net(plan.cluster, dev, par.shard_ranks, par.tp)
    mode = "fsdp_zero3" if par.zero >= ZeroStage.WEIGHTS else "fsdp_zero2"
    hsdp = coll.replica_all_reduce_s(plan, dev, rs)   # the replicas' all-reduce of the shard
    measured = dev.measured(f"{mode}_root")   # latency in the measured root cost
    if int8_scatters(plan):   # FSDP2's int8 reduce-scatter, then (HSDP) the replicas' all-reduce in fp32
        return (coll.ring_bytes_s if measured else coll.all_gather_s)(ag, net), i8.call_s(
            sp.ends, net, dev, measured, plan.training.grad_compression.bits) + hsdp
    if measured:
        return coll.ring_bytes_s(ag, net), coll.ring_bytes_s(rs, net) + hsdp
    return coll.all_gather_s(ag, net), coll.reduce_scatter_s(rs, net) + hsdp


def tied_bytes(plan: Plan) -> float:
    """Bytes of the embedding group's all-reduce (0 without it): the shared weight's local
    gradient, sharded under FSDP2. DualPipeV's V keeps both copies on rank 0: no group."""
    m, par = plan.model, plan.parallel
    if not (m.tied_embeddings and par.pp > 1) or par.v_shape:
        return 0.0
    shard = par.shard_ranks if par.zero >= ZeroStage.GRADIENTS else 1
    return coll.grad_wire_bytes(plan) * m.vocab * m.hidden / par.tp / shard


def tied_s(plan: Plan, dev: cmp.DeviceModel) -> float:
    """Seconds of the embedding group's all-reduce per step, on the first and the last stage:
    two ranks (pp - 1) * tp * cp * dp apart; on a CPU host a lone call plus its bytes."""
    nbytes = tied_bytes(plan)
    if nbytes <= 0:
        return 0.0
    par = plan.parallel
    stride = (par.pp - 1) * par.tp * par.cp * par.dp
    return _cached(("tied", id(plan.cluster), id(dev), nbytes, stride), plan, dev, lambda: _tied_s(plan, dev, nbytes,
                                                                                                  stride))


def _tied_s(plan: Plan, dev: cmp.DeviceModel, nbytes: float, stride: int) -> float:
    net = coll.group_net(plan.cluster, dev, 2, stride)
    if dev.lone_all_reduce_s > 0:
        return dev.lone_all_reduce_s + nbytes / net.bus_bytes_per_s
    return coll.all_reduce_s(nbytes, net)


def add_step_ends(plan: Plan, costs: list[tuple], fsdp: tuple[tuple[int, int, int], ...], grad: list[float],
                  gathers: tuple[tuple[float, ...], tuple[float, ...]], gathers_params: bool
                  ) -> tuple[list[float], tuple[tuple[float, ...], tuple[float, ...]]]:
    """``step_costs``' per-step gradient reduction and per-micro-batch (forward, backward)
    FSDP2 gathers per virtual stage, with each pipeline rank's root group on its first
    virtual stage and the tied embedding's all-reduce on the first and the last virtual
    stage, as ``dp_costs`` priced them for each rank (``costs``: ``dp_costs.rank_costs``);
    ``fsdp``: a block's (forward gathers, backward gathers, reduce-scatters) per step on each
    virtual stage; the gathers only where the stack gathers parameters, ``gathers_params``."""
    ends = [(r, costs[r][0]) for r in sorted({0, len(costs) - 1})]   # the ranks holding the ends
    if not any(d["root_rs"] or d["tied"] for _, d in ends):   # (a search's hot path)
        return grad, gathers
    grad, fwd, bwd = list(grad), list(gathers[0]), list(gathers[1])
    mbs = plan.num_microbatches
    for r, d in ends:
        f_ag, b_ag, scatters = fsdp[r]
        grad[r] += d["root_rs"] * scatters
        if gathers_params:
            fwd[r] += d["root_ag"] * f_ag / mbs
            bwd[r] += d["root_ag"] * b_ag / mbs
    grad[0] += ends[0][1]["tied"]
    grad[-1] += ends[-1][1]["tied"]
    return grad, (tuple(fwd), tuple(bwd))


_cached.cache_clear = _CACHE.clear   # as functools' caches answer (tests clear them all)
