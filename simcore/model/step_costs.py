"""Plan -> StepCosts: the per-stage costs of one training step, and the memory report.

``step_costs`` reduces a Plan to ``StepCosts`` (simcore/model/costs.py) from the pure models
(workload, compute, collectives, memory); the engines (``simcore.engine.analytic``, the closed
forms, and ``simcore.engine.des``, the SimPy engine) turn them into a ``StepResult``.

On a calibrated CPU host (profile keys catalog GPUs lack, so their predictions do not
move) a pipeline also pays, per micro-batch and virtual stage, torch.distributed.pipelining's
per-chunk bookkeeping (``parallel_host.pipeline_chunk``), the sender's blocking gloo send
call (pipeline comm) and the receiver's hand-over wait (idle, so bubble, as the executor
measures it; ``p2p_send_kernels``, ``p2p_latency_kernels``: gloo moves a message only once
the receiver posts its receive, and the busy sender's gloo thread then waits for a core);
the transit to a receiver already blocked is the relay's remainder (``p2p_wake_kernels``).
Where torch posts a receive in the same call as a send (Schedule1F1B's steady phase,
``schedules.fused_p2p``), the post (``p2p_post_kernels``) is the sender's comm after the
message left, and the wait of the receive it posts is that much shorter.
TP's and FSDP2's wrapper costs are split between blocking comm and host compute by the
share a run's recorder sees inside collectives (``parallel_host.comm_share``). All are
measured by ``executors.calibrate.profile``. On any calibrated profile, where trainplan's executor
is what runs, DDP under torch.distributed.pipelining sends a stage's last input gradient
only after the stage's gradient reduction (``StepCosts.grad_sync_holds_send``): the drain
waits for every later stage's reduction tail in turn.
"""
from __future__ import annotations

import functools
import operator

from simcore.model import act_offload as ao
from simcore.model import activations as acts
from simcore.model import dp_costs as dpm
from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import end_comm as ec
from simcore.model import fsdp_pools
from simcore.model import host_costs as hc
from simcore.model import kv_replication as kvr
from simcore.model import layer_comm as lcm
from simcore.model import layer_times as lt
from simcore.model import memory as mem
from simcore.model import moe_dispatch as md
from simcore.model import moe_layers as ml
from simcore.model.moe_dispatch import dispatch_ranks  # noqa: F401  (re-exported: the DeepEP tests read it here)
from simcore.model import overlap as ov
from simcore.model import peak as pk
from simcore.model import recompute as rcp
from simcore.model import workload as wl
from simcore.model.costs import StepCosts
from simcore.plan.spec import Fp8Recipe, Kernels, Plan, PlanError, Recompute, ZeroStage, evolve
from simcore.results import GIB

#: ``workload.model_flops_per_step`` kept per (model, global batch): a search asks for few.
_model_flops_per_step = functools.lru_cache(maxsize=1024)(wl.model_flops_per_step)


def plan_device(plan: Plan) -> cmp.DeviceModel:
    """The device model of ``plan``'s GPU at its precision, FP8 recipe and attention kernel."""
    tr = plan.training
    return cmp.device_model(plan.cluster.node.gpu, tr.precision.value, fp8_recipe=tr.fp8_recipe.value,
                            attention_kernel=tr.attention_kernel.value)


def _check_device(plan: Plan) -> None:
    if plan.cluster.node.gpu.name == "uncalibrated-host":
        raise PlanError("cluster.node=localhost has no calibrated profile; run `trainplan calibrate` first")


#: A stage's FSDP2 reduce-scatters per block, of its ``dp_costs.fsdp_calls`` entry.
_SCATTERS = operator.itemgetter(2)

def _p2p_s(plan: Plan, dev: cmp.DeviceModel) -> float:
    """One micro-batch's activations to the next stage; with tp > 1 each TP rank sends
    1/t of it (Megatron's scatter/gather optimisation, Narayanan et al. Sec. 4.1). The
    latency is the ring hop's, or on a calibrated CPU host the relay's transit to a blocked
    receiver (the send call and the hand-over wait are blocking costs, in step_costs)."""
    m, par, tr, cl = plan.model, plan.parallel, plan.training, plan.cluster
    if par.pp == 1:
        return 0.0
    bytes_ = coll.comm_act_bytes(tr.precision) * tr.micro_batch * (m.seq_len // par.cp) * m.hidden / par.tp
    stride = par.tp * par.cp * par.dp
    net = coll.group_net(cl, dev, 2, stride)
    hop = net.hop_s
    if dev.p2p_send_s > 0:   # CPU host: the transit to a blocked receiver (calibrate's relay)
        hop = dev.p2p_wake_s
    return coll.send_recv_s(bytes_, net.bus_bytes_per_s, hop)


def _per_step_costs(plan: Plan, dev: cmp.DeviceModel, columns: tuple[tuple[float, ...], ...],
                    work: tuple[list[float], ...], host_p2p: dict[str, tuple[float, ...]], ddp: bool,
                    fsdp: list[tuple[int, int, int]], flat_rs: list[float]
                    ) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per virtual stage: (gradient reduction, parameter sync, optimizer, offload) per step,
    from its rank's ``dp_costs.rank_costs`` ``columns``, its per-micro-batch ``work``
    (forward, backward-input, backward-weight, recompute, forward comm, backward comm) and its
    FSDP2 calls per step (``fsdp``: forward gathers, backward gathers, reduce-scatters per
    block; empty where no stage reduce-scatters per block); ``flat_rs``: what the stage's dense
    layers' reduce-scatters take more than an MoE layer's (an MoE model's dense layers)."""
    stages = plan.layers_per_stage
    grad, layer_rs, sync, opt, off = columns
    if fsdp:   # FSDP2's reduce-scatters: per micro-batch, or once pipelined
        grad = [g + f[2] * (n * rs + x) for g, rs, f, n, x in zip(grad, layer_rs, fsdp, stages, flat_rs)]
    if ddp and dev.dp_sync_wait > 0:
        # CPU host: DDP's all-reduce waits for the last rank; its lateness is measured as
        # a fraction of the rest of the step (the rank's work between syncs)
        mbs = plan.num_microbatches
        p2p_host = [sum(x) for x in zip(*host_p2p.values())] or [0.0] * len(stages)
        grad = [g + dev.dp_sync_wait * (mbs * (sum(w) + h) + o)
                for g, w, h, o in zip(grad, zip(*work), p2p_host, opt)]
    return grad, sync, opt, off


def _layer_share(plan: Plan, layers_of) -> float:
    """The share of the model's layers that ``layers_of(training, layers of a chunk)`` picks."""
    per_size = {n: layers_of(plan.training, n) for n in set(plan.layers_per_stage)}
    return sum(map(per_size.__getitem__, plan.layers_per_stage)) / sum(plan.layers_per_stage)


def _rerun_tp_share(plan: Plan) -> float:
    """The share of a layer's forward TP bytes that per-op SAC or dots re-run (``rcp.tp_reruns``)."""
    par = plan.parallel
    reruns = rcp.tp_reruns(plan.training.recompute, par.sequence_parallel)
    if not reruns or par.tp == 1:
        return 0.0
    size = coll.tp_call_bytes(plan)
    forward = 2 * (size["all_gather"] + size["reduce_scatter"]) if par.sequence_parallel else 2 * size["all_reduce"]
    return sum(n * size[kind] for kind, n in reruns.items()) / forward


def _layer_blocking(plan: Plan, dev: cmp.DeviceModel, core: float, slack: tuple[float, float, float],
                    compute: tuple[float, float] = (0.0, 0.0)) -> tuple[dict, float, float, float, float, float]:
    """Per layer and micro-batch: ``layer_comm.layer_comm``'s figures, the (forward, backward) blocking
    communication, the (forward, backward) host compute of the wrappers (CPU host), and the
    host compute a full recomputation repeats; ``core`` is the attention core's forward time,
    ``slack`` the (forward, backward, recompute) time the layer's GPU waits for its host,
    ``compute`` the layer's (forward, backward) time, behind which ``parallel.moe_a2a_overlap``
    hides the expert all-to-alls (``moe_dispatch.a2a_exposed``).

    TP's and CP's NCCL kernels go on the stream without stopping the host (torch's NCCL
    ``Work.wait`` makes the compute stream wait, not the host), so in a host-bound phase
    they run while the GPU would wait for the next kernel: what is exposed is what exceeds
    that wait. EP's all-to-alls are not: Megatron-Core's dispatcher copies the tokens per
    expert to the host and synchronises on every layer (megatron/core/transformer/moe/
    token_dispatcher.py ``_maybe_dtoh_and_synchronize`` @d98e8a64)."""
    lc = lcm.layer_comm(plan, dev)
    if plan.parallel.moe_a2a_overlap:
        ef, eb = md.a2a_exposed(plan, (lc["ep_f"], lc["ep_b"]), compute, dev.comm_compute_interference)
        lc = {**lc, "ep_f": ef, "ep_b": eb}
    # Ring attention (Megatron-Core through Transformer Engine's P2P context parallel,
    # transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py,
    # flash_attn_p2p_communicate: K/V forward, K/V and dK/dV backward, twice the bytes over
    # twice the core time): each exchange overlaps the attention of the chunk at hand; what
    # the core cannot hide is exposed, and the part it hides slows the core as any overlapped
    # NCCL kernel does (the GPU's comm_compute_interference, as for data-parallel traffic)
    lost = ov.lost_share(dev.comm_compute_interference)
    ring = ov.overlapped_s(lc["cp"], core, 0.0, lost)
    tp_f, tp_b = ov.tp_exposed(plan, dev, lc, lost)
    # the share of layers recomputed whole, which re-run their forward collectives too; of
    # those whose attention is recomputed, which exchange K/V again; and per-op SAC's TP share
    full, attention = (_layer_share(plan, fn) for fn in (rcp.full_layers, rcp.recomputed_layers))
    rec_comm = (tp_f + lc["ep_f"]) * full + (ring + lc["cp_f"]) * attention + tp_f * _rerun_tp_share(plan)
    host_f, host_b = lc["host_f"], lc["host_b"]   # CPU host: wrappers' dispatch, compute per layer
    rec_host = host_f if full else 0.0            # the recomputed forward dispatches through DTensor again
    sf, sb, sr = slack
    rec_async = rec_comm - lc["ep_f"] * full
    fc = max(0.0, tp_f + ring + lc["cp_f"] - sf) + lc["ep_f"]
    bc = max(0.0, tp_b + 2 * ring + lc["cp_b"] + rec_async - sb - sr * attention) + lc["ep_b"] + lc["ep_f"] * full
    (cf, cb), (hf, hb), (rc, rh) = hc.layer_wrappers_s(plan, dev, full)   # CPU host: torch's wrappers
    return lc, fc + cf, bc + cb + rc, host_f + hf, host_b + hb, rec_host + rh


def _layer_work(plan: Plan, dev: cmp.DeviceModel) -> tuple[tuple[float, ...], tuple[float, ...], dict]:
    """One layer of ``plan``'s model and one micro-batch: its (forward, backward-input,
    backward-weight, recompute) times, its (forward comm, backward comm, forward host, backward
    host) ``_layer_blocking`` figures and ``layer_comm``'s."""
    m, par, tr = plan.model, plan.parallel, plan.training
    shape = (m, tr.micro_batch, m.seq_len // par.cp, par.tp, par.cp, par.ep, par.sequence_parallel,
             tr.flash_attention, tr.recompute, dev, par.cp_comm.value, tr.fp8_recipe != Fp8Recipe.DELAYED,
             par.expert_tp, tr.kernels == Kernels.EAGER, tr.autocast, tr.attention_unpad)
    f, bi, bw, rc, core = lt.layer_times(*shape)
    lc, fc, bc, host_f, host_b, rec_host = _layer_blocking(plan, dev, core, lt.layer_slack(*shape), (f, bi + bw))
    return (f, bi, bw, rc + rec_host), (fc, bc, host_f, host_b), lc


def _stage_work(plan: Plan, dev: cmp.DeviceModel, stages: tuple[int, ...], dense: tuple[int, ...],
                kinds: tuple[tuple, tuple], logits: tuple[float, float, float]) -> tuple[list[float], ...]:
    """Per virtual stage and micro-batch: (forward, backward-input, backward-weight, recompute,
    forward comm, backward comm), from the (MoE or only, dense) layer ``kinds``, each one layer's
    ((forward, backward-input, backward-weight, recompute) times, (forward comm, backward comm,
    forward host, backward host) blocking), the stages' ``dense`` layers (an MoE model's first)
    and the (forward, backward-input, backward-weight) ``logits`` on the last virtual stage;
    each figure once per distinct (layers, dense layers), repeated over the stages."""
    par, tr = plan.parallel, plan.training

    def of(n: int, d: int) -> tuple[float, ...]:
        (t, c), (td, cd) = kinds
        return tuple((n - d) * x + d * y for x, y in zip((t[0] + c[2], t[1] + c[3], t[2], c[0], c[1]),
                                                          (td[0] + cd[2], td[1] + cd[3], td[2], cd[0], cd[1])))
    by_layers = {k: of(*k) for k in set(zip(stages, dense))}
    fwd, bin_, bwt, fcomm, bcomm = map(list, zip(*map(by_layers.__getitem__, zip(stages, dense))))
    hc.add_ends_host(plan, dev, (fcomm, bcomm), (fwd, bin_))
    (ef, eb), (hf, hb) = ec.tp_ends_s(plan, dev)   # TP's embedding and head collectives
    fcomm[0] += ef   # (one list element when there is one virtual stage)
    bcomm[0] += eb
    fcomm[-1] += hf * (1 + plan.model.mtp_layers)   # the output layer again per MTP module (``mtp``)
    bcomm[-1] += hb * (1 + plan.model.mtp_layers)
    if par.pp > 1 and dev.parallel_kernels:   # CPU host: torch.distributed.pipelining's per-chunk bookkeeping
        cf, cb = dev.parallel_extra_s("pipeline_chunk")
        fwd, bin_ = [x + cf for x in fwd], [x + cb for x in bin_]
    fwd[-1] += logits[0]                                # the logits sit on the last virtual stage
    bin_[-1] += logits[1]
    bwt[-1] += logits[2]
    rc, rcd, extra = kinds[0][0][3], kinds[1][0][3], 0.0
    if tr.recompute != Recompute.NONE and dev.parallel_kernels:   # CPU host: checkpoint_wrapper's bookkeeping per layer
        af, extra = dev.parallel_extra_s(f"recompute_{tr.recompute.value}")
        fwd = [x + n * af for x, n in zip(fwd, stages)]
    # the recomputed layers of a chunk, at the mean of its MoE and dense layers' recompute
    recomputed = {(n, d): rcp.recomputed_layers(tr, n) * (extra + ((n - d) * rc + d * rcd) / max(n, 1))
                  for n, d in set(zip(stages, dense))}
    return fwd, bin_, bwt, list(map(recomputed.__getitem__, zip(stages, dense))), fcomm, bcomm


def _work(plan: Plan, dev: cmp.DeviceModel, kept: dict | None) -> tuple:
    """What ``step_costs`` reads of neither the ZeRO stage nor the memory (one layer's times, blocking and
    ``layer_comm``, the stages' work, p2p send, FLOPs, activation offload's waits), held in ``kept`` (a search's
    batch, read only) by all of the plan but the ZeRO stage, which only a CPU host's wrapper costs read."""
    m, par, tr, stages = plan.model, plan.parallel, plan.training, plan.layers_per_stage
    key = kept is not None and ("work", m, tr, par if dev.parallel_kernels else evolve(par, zero=ZeroStage.NONE))
    if key and (hit := kept.get(key)) is not None and hit[0] is plan.cluster and hit[1] is dev:
        return hit[2]
    times, blocking, lc = _layer_work(plan, dev)
    dense = ml.stage_dense_layers(m, stages)   # an MoE model's first layers: dense, priced as such
    kinds = ((times, blocking), _layer_work(ml.dense_plan(plan), dev)[:2] if any(dense) else (times, blocking))
    logits = lt.logits_times(m, tr.micro_batch, m.seq_len // par.cp, par.tp, dev)
    out = (times, blocking, lc, dense, tuple(map(tuple, _stage_work(plan, dev, stages, dense, kinds, logits))),
           _p2p_s(plan, dev), rcp.hardware_flops_per_step(m, tr, stages),
           ao.activation_copies_s(plan, stages, (times[0], blocking[0]), (sum(times[1:]), blocking[1])))
    if key:
        kept[key] = (plan.cluster, dev, out)
    return out


def stage_work(plan: Plan, kept: dict | None = None) -> tuple[float, ...] | None:
    """Per virtual stage and micro-batch, the compute and blocking TP/CP/EP communication that
    ``step_costs`` charges it (``_work``'s, ``kept`` alike) before anything it adds (pipeline
    hops, FSDP2 exposure, ZeRO-3 gathers, replicated KV heads' syncs; all >= 0); None on a
    device with per-message host costs (a calibrated CPU host), whose fused receive posts
    shorten a rank's waits (``analytic._fused_posts``)."""
    _check_device(plan)
    dev = plan_device(plan)
    if dev.p2p_post_s > 0 or hc.host_p2p(dev, plan.parallel.pp, 1):
        return None
    *_, (fwd, bin_, bwt, rec, fcomm, bcomm), _, _, _ = _work(kvr.as_run(plan), dev, kept)
    return tuple(map(sum, zip(fwd, bin_, bwt, rec, fcomm, bcomm)))


def step_costs(plan: Plan, kept: dict | None = None) -> StepCosts:
    """Every per-virtual-stage number of one step (see simcore/model/costs.py); ``kept``: ``_work``'s.
    Replicated key/value heads: the model NxD builds and its kv group's all-reduce (``kv_replication``)."""
    _check_device(plan)
    m, par, tr, stages = plan.model, plan.parallel, plan.training, plan.layers_per_stage
    dev = plan_device(plan)
    if par.kv_replicator > 1:
        return kvr.with_kv_sync(step_costs(kvr.as_run(plan), kept), plan, dev)
    times, blocking, lc, dense, (fwd, bin_, bwt, rec, fcomm, bcomm), p2p, hw, copies = _work(plan, dev, kept)
    nv = len(stages)
    params, rank_costs, columns = dpm.rank_costs(plan, dev)
    dpc = rank_costs[0][0]   # dp_costs of the first rank's parameters, read only
    host_p2p = hc.host_p2p(dev, par.pp, nv)
    fsdp = dpm.fsdp_calls(plan, nv)
    per_block = any(map(_SCATTERS, fsdp))
    mbs = plan.num_microbatches
    gathers = ((0.0,) * nv,) * 2   # no FSDP2 gathers
    if dpc["layer_ag"]:   # once per distinct (layers, dense layers, calls)
        ag, dag, bag, bdag = dpc["layer_ag"], dpc["dense_layer_ag"], dpc["layer_ag_b"], dpc["dense_layer_ag_b"]
        per_stage = {(n, d, f): (((n - d) * ag + d * dag) * f[0] / mbs, ((n - d) * bag + d * bdag) * f[1] / mbs)
                     for n, d, f in set(zip(stages, dense, fsdp))}
        gathers = tuple(zip(*map(per_stage.__getitem__, zip(stages, dense, fsdp))))
    if dpc["ag_exposed"] > 0:   # DeepSpeed ZeRO-3: what its prefetch bucket cannot fetch ahead blocks
        e = dpc["ag_exposed"]
        fcomm = [x + e * g for x, g in zip(fcomm, gathers[0])]
        bcomm = [x + e * g for x, g in zip(bcomm, gathers[1])]
        gathers = tuple([(1 - e) * g for g in side] for side in gathers)
    ddp = dpm.ddp_reduces(plan)
    flat_rs = [d * (dpc["dense_layer_rs"] - dpc["layer_rs"]) for d in dense]   # a dense layer's scatter
    grad, sync, opt, off = _per_step_costs(plan, dev, columns, (fwd, bin_, bwt, rec, fcomm, bcomm), host_p2p,
                                           ddp, fsdp if per_block else (), flat_rs)
    grad, gathers = ec.add_step_ends(plan, rank_costs, fsdp, grad, gathers, dpc["layer_ag"] > 0)
    if par.overlap_param_gather:   # bucket by bucket under the next step's first forward
        lost = ov.lost_share(dev.comm_compute_interference)
        sync = [ov.overlapped_s(x, f, 1.0 / dpc["buckets"], lost) for x, f in zip(sync, fwd)]
    buckets = (dpc["buckets"],) * nv
    if per_block:   # FSDP2: one per block
        per_stage = {k: max(1, k[0]) if k[1] else dpc["buckets"] for k in set(zip(stages, map(_SCATTERS, fsdp)))}
        buckets = tuple(map(per_stage.__getitem__, zip(stages, map(_SCATTERS, fsdp))))
    totals, worst, host = mem.rank_totals(plan, stages, params)
    detail = {"tp_comm_per_layer_s": lc["tp_f"] + lc["tp_b"], "cp_comm_per_layer_s": lc["cp"],
              "ep_comm_per_layer_s": lc["ep_f"] + lc["ep_b"], "fsdp_layer_all_gather_s": dpc["layer_ag"],
              "fsdp_layer_reduce_scatter_s": dpc["layer_rs"], "host_memory_per_node_bytes":
              pk.host_node_bytes(plan, host), "comm_compute_interference": dev.comm_compute_interference}
    return StepCosts(
        plan=plan, layers=tuple(stages), forward_s=tuple(fwd), backward_input_s=tuple(bin_),
        backward_weight_s=tuple(bwt), recompute_s=tuple(rec), forward_comm_s=tuple(fcomm),
        backward_comm_s=tuple(bcomm), p2p_s=p2p, forward_gather_s=tuple(gathers[0]),
        backward_gather_s=tuple(gathers[1]), **host_p2p,
        p2p_post_s=dev.p2p_post_s if host_p2p else 0.0,
        grad_sync_holds_send=ddp and par.pp > 1 and plan.cluster.node.gpu.calibrated,
        grad_reduce_per_step_s=tuple(grad), grad_buckets=tuple(buckets),
        grad_reduce_per_microbatch=mem.sharded_gradients(plan) and per_block,
        param_sync_per_step_s=tuple(sync), optimizer_per_step_s=tuple(opt), offload_per_step_s=tuple(off),
        activation_copies_s=copies,
        model_flops_per_step=_model_flops_per_step(m, tr.global_batch),
        hardware_flops_per_step=hw,
        **pk.summary_fields(totals, worst),
        time_detail_s=detail,
    )


def memory_report(plan: Plan) -> dict:
    """Bytes per GPU by kind and by term on every pipeline rank, host memory for offload,
    HBM, the allocator margin and CUDA context the total includes, the headroom, fits.
    ``headroom_bytes`` is HBM minus the most loaded GPU's total (margin included; negative:
    it does not fit); ``allocator_margin`` is the share ``memory.framework_terms`` applied.
    ``stream_cache`` (per rank, and the most of any in ``stream_cache_bytes``): what FSDP2's
    side streams' pools keep reserved beyond the total, which torch's max_memory_reserved
    counts and the allocator releases on demand (``fsdp_pools.side_stream_cache``)."""
    _check_device(plan)
    plan = kvr.as_run(plan)   # replicated key/value heads: the model NxD builds (``kv_replication``)
    params, parts = mem.stage_params(plan), []
    breakdown = mem.rank_breakdown(plan, params=params, parts=parts)
    per_rank = [kinds for kinds, _ in breakdown]
    # the sharded gradients the peak counted as freed (their pool keeps them): the rank's model
    # states (``parts``) less the gradients its row counts
    zeroed = [max(0.0, states["gradients"] - kinds["gradients"]) if mem.sharded_gradients(plan) else 0.0
              for (states, _, _), kinds in zip(parts, per_rank)]
    cache = [fsdp_pools.side_stream_cache(plan, sp.ends, sp.layer_max, z) for sp, z in zip(params, zeroed)]
    host_node = pk.host_bytes_per_node(plan, per_rank)
    context, margin, _ = pk.framework_terms(plan)
    peak = max(d["total"] for d in per_rank)
    hbm = plan.cluster.node.gpu.hbm_bytes
    return {
        "plan": plan.name, "hbm_bytes": hbm,
        "host_memory_bytes_per_node": plan.cluster.node.host_memory_bytes, "host_offload_bytes_per_node": host_node,
        "ranks": [{"pp_rank": r, **kinds, "terms": terms, "stream_cache": c}
                  for r, ((kinds, terms), c) in enumerate(zip(breakdown, cache))],
        "stream_cache_bytes": max(cache),
        "max_gpu_bytes": peak, "memory_per_gpu_gib": peak / GIB,
        "allocator_margin": margin, "allocator_margin_bytes": max(t["allocator_margin"] for _, t in breakdown),
        "cuda_context_bytes": context,
        "context_label": str(acts.memory_entry(plan).get("label", "CUDA context")),
        "headroom_bytes": hbm - peak, "headroom_gib": (hbm - peak) / GIB,
        "fits": pk.fits(plan, per_rank),
    }
