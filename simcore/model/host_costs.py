"""The CPU host's measured costs of torch's parallel machinery, as the model charges them.

A calibrated CPU host (``executors.calibrate``) carries, per wrapper the executor applies,
the extra (forward, backward) kernels a layer or a model end costs under it and the share of
them a run measures inside collectives (``DeviceModel.parallel_split_s``). Catalog GPUs
carry none, so nothing here moves their predictions: on a GPU those wrappers' dispatch
overlaps the kernels, and their communication is the model's collectives.
"""
from __future__ import annotations

from simcore.model import compute as cmp
from simcore.model import fsdp_calls
from simcore.model import int8_scatter as i8
from simcore.model import memory as mem
from simcore.plan.rules import int8_scatters
from simcore.plan.spec import Plan, ZeroStage


def layer_wrappers(plan: Plan) -> list[tuple[str, float, bool]]:
    """(probe mode, share of the layers it applies to, whether a recomputed layer runs its
    forward again) of each wrapper the executor puts on one of ``plan``'s transformer layers:
    the ring attention of context parallel; the MoE layer's routing and dispatch beyond its
    modelled kernels, and expert parallel's all-to-all over that (an MoE model's dense layers
    are priced as ``moe_layers.dense_plan``'s, which has none); FSDP2's per-layer groups."""
    par, m = plan.parallel, plan.model
    out = []
    if par.cp > 1:
        out.append(("cp", 1.0, True))
    if m.moe:
        out += [("moe", 1.0, True)] + ([("ep", 1.0, True)] if par.ep > 1 else [])
    if par.zero >= ZeroStage.GRADIENTS and par.dp * par.cp > 1:
        out.append(("fsdp_zero3" if par.zero >= ZeroStage.WEIGHTS else "fsdp_zero2", 1.0, False))
    return out


def layer_wrappers_s(plan: Plan, dev: cmp.DeviceModel, full: float
                     ) -> tuple[tuple[float, float], tuple[float, float], tuple[float, float]]:
    """Per layer and micro-batch: the wrappers' ((forward, backward) blocking comm, (forward,
    backward) host compute, (comm, host) a recomputed forward repeats), ``full`` being the
    share of layers recomputed whole."""
    fc = bc = hf_ = hb_ = rc = rh = 0.0
    if not dev.parallel_kernels:   # catalog GPUs: no wrapper host costs
        return (fc, bc), (hf_, hb_), (rc, rh)
    for mode, share, reruns in layer_wrappers(plan):
        (cf, cb), (hf, hb) = dev.parallel_split_s(mode)
        fc, bc, hf_, hb_ = fc + share * cf, bc + share * cb, hf_ + share * hf, hb_ + share * hb
        if reruns:
            rc, rh = rc + share * cf * full, rh + share * hf * full
    if share := _scatter_share(plan):   # FSDP2's int8 (int4) reduce-scatter's kernels, on the backward's thread
        hb_ += i8.host_s(sum(mem.layer_params_per_gpu(plan)), plan.parallel.shard_ranks, dev, share,
                         plan.training.grad_compression.bits)
    return (fc, bc), (hf_, hb_), (rc, rh)


def _scatter_share(plan: Plan) -> float:
    """FSDP2's int8 reduce-scatters of a block per micro-batch (0 without them): every micro-batch's,
    or one a step under pipelining (``fsdp_calls``)."""
    if not int8_scatters(plan) or plan.parallel.dp * plan.parallel.cp == 1:
        return 0.0
    return fsdp_calls.fsdp_stages_calls(plan, 1)[0][2] / plan.num_microbatches


def add_ends_host(plan: Plan, dev: cmp.DeviceModel, comm: tuple[list[float], list[float]],
                   compute: tuple[list[float], list[float]]) -> None:
    """CPU host: the measured wrapper cost of the model's ends per micro-batch (``parallel_host``
    ``*_embed`` / ``*_head`` / ``*_root``), added to the (forward, backward) blocking comm and
    host compute of the virtual stages that hold them, split as a run measures it
    (``parallel_split_s``). TP splits the embedding and the output projection too (each with
    its own collectives): the embedding's on the first virtual stage, the head's (norm,
    output, loss) on the last. FSDP2 shards each pipeline rank's model as a root group of its
    own (the embedding, final norm and output on the ranks that hold them): one root group's
    cost on each rank's first virtual stage."""
    if not dev.parallel_kernels:   # catalog GPUs: no wrapper host costs
        return
    par = plan.parallel
    parts = []
    if par.tp > 1:
        mode = "tp_sp" if par.sequence_parallel else "tp"
        parts += [(0, f"{mode}_embed"), (-1, f"{mode}_head")]
    if par.zero >= ZeroStage.GRADIENTS and par.dp * par.cp > 1:
        root = "fsdp_zero3_root" if par.zero >= ZeroStage.WEIGHTS else "fsdp_zero2_root"
        parts += [(v, root) for v in range(par.pp)]
    for v, mode in parts:
        for lists, pair in zip((comm, compute), dev.parallel_split_s(mode)):
            lists[0][v] += pair[0]
            lists[1][v] += pair[1]
    if share := _scatter_share(plan):   # the root groups' int8 (int4) reduce-scatters
        for v, sp in enumerate(mem.stage_params(plan)[:par.pp]):
            compute[1][v] += i8.host_s(sp.ends, par.shard_ranks, dev, share, plan.training.grad_compression.bits)


def host_p2p(dev: cmp.DeviceModel, pp: int, nv: int) -> dict[str, tuple[float, ...]]:
    """``StepCosts``' per-virtual-stage send calls and receive waits (none where the device
    has no such costs)."""
    # CPU host: the sender's blocking send call and the receiver's hand-over wait, per message
    send, recv = (dev.p2p_send_s, dev.busy_p2p_latency_s) if pp > 1 else (0.0, 0.0)
    host_p2p = {}
    if send + recv > 0:
        first, last = [float(v > 0) for v in range(nv)], [float(v < nv - 1) for v in range(nv)]
        host_p2p = {"forward_send_s": tuple(send * x for x in last), "forward_recv_wait_s": tuple(recv * x for x in first),
                    "backward_send_s": tuple(send * x for x in first), "backward_recv_wait_s": tuple(recv * x for x in last)}
    return host_p2p
