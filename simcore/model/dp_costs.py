"""The data-parallel side of a step, per rank: gradient reduction (DDP buckets, ZeRO-1's
reduce-scatter and parameter all-gather, FSDP2's per-block gathers and reduce-scatters, as
many as torch issues), gradient compression, the optimizer step and offload copies."""
from __future__ import annotations

import math

from simcore.model import fsdp_calls as fc
from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import end_comm as ec
from simcore.model import memory as mem
from simcore.model import moe_layers as ml
from simcore.model import workload as wl
from simcore.model import zeropp as zpp
from simcore.model import int8_scatter as i8
from simcore.model import ddp_hooks as hooks
from simcore.model import onebit
from simcore.model import param_layout as pl
from simcore.model.optim_states import flat_partitions, stored_weight_bytes
from simcore.plan.choices import ONEBIT_OPTIMIZERS
from simcore.plan.rules import int8_scatters
from simcore.plan.spec import GradCompression, Offload, Plan, Precision, ZeroImpl, ZeroStage

#: DeepSpeed ZeRO-3's default ``stage3_prefetch_bucket_size``: parameter elements fetched
#: ahead of use (deepspeed/runtime/zero/config.py ``prefetch_bucket_size = pp_int(5e7)``).
DS_PREFETCH_ELEMENTS = 5e7


def deepspeed_gathers(plan: Plan, layer_params: float) -> tuple[int, float]:
    """DeepSpeed ZeRO-3's (all-gathers per layer, exposed share of their time).

    DeepSpeed fetches the parameters of each submodule as it is entered, one all-gather per
    module (deepspeed/runtime/zero/partitioned_param_coordinator.py ``fetch_sub_module``):
    the layer's weight matrices, fused QKV, output projection and the MLP's (norms and
    biases under ``stage3_param_persistence_threshold`` stay whole). It prefetches the next
    modules only up to ``DS_PREFETCH_ELEMENTS`` elements, so of a module of P elements the
    part beyond that bucket is fetched while the GPU waits: exposed share
    max(0, 1 - bucket / P). FSDP2 instead gathers a whole block in one call and prefetches
    the next block whatever its size."""
    modules = 2 + wl.mlp_matrices(plan.model)
    per_module = layer_params / modules
    return modules, max(0.0, 1.0 - DS_PREFETCH_ELEMENTS / per_module) if per_module > 0 else 0.0


def host_link_bytes_per_s(plan: Plan) -> float:
    """Host-link bandwidth per GPU and direction (PCIe, or a superchip's NVLink-C2C): GPUs
    behind one PCIe switch (one Grace) share its uplink."""
    node = plan.cluster.node
    share = min(1.0, node.pcie_switches / plan.cluster.gpus_per_node) if node.pcie_switches else 1.0
    return node.gpu.host_bytes_per_s * share


def dp_costs(plan: Plan, dev: cmp.DeviceModel, sp: mem.StageParams, layer_params: float) -> dict[str, float]:
    """Per-step gradient reduction, parameter sync, per-micro-batch FSDP gathers, optimizer, offload;
    FSDP2's gather and scatter of one layer (``layer_ag``, ``layer_rs``; ``layer_ag_b`` the
    backward's gather, ZeRO++ hpZ's where it differs) and of an MoE model's dense layer
    (``dense_layer_ag``, ``dense_layer_rs``, ``dense_layer_ag_b``: the same where it has none)."""
    par, tr, cl = plan.parallel, plan.training, plan.cluster
    nd, wb, gb = par.dp * par.cp, mem.param_bytes(tr), coll.grad_wire_bytes(plan)
    out = dict(grad=0.0, sync=0.0, gather=0.0, layer_rs=0.0, layer_ag=0.0, ag_exposed=0.0, buckets=1, compress=0.0)
    # the model's ends (``end_comm``): FSDP2's root group of this rank, the tied embedding's all-reduce
    out["root_ag"], out["root_rs"] = ec.fsdp_root_s(plan, dev, sp)
    out["tied"] = ec.tied_s(plan, dev)
    if nd > 1:
        # dp x cp ranks, or one replica's (``collectives.replica_all_reduce_s``: their replicas)
        net, params = coll.group_net(cl, dev, par.shard_ranks, par.tp), sp.total
        # expert parallel: the experts' gradients reduce over the ranks holding the same experts
        # only (Megatron-Core's expert data-parallel group; torchtitan's dp_shard_mod_ep mesh):
        # none where each rank holds its own, and the dense ones over all dp x cp ranks
        edp, expert = nd // par.ep, sp.expert
        enet = coll.group_net(cl, dev, edp, par.tp * par.ep) if edp > 1 else None
        dense = params - expert
        if tr.grad_compression == GradCompression.POWERSGD:
            gb = 4.0 * 2 * hooks.POWERSGD_RANK / math.sqrt(max(1.0, layer_params))  # (m+n)r of m*n per matrix
            out["compress"] = cmp.stream_s(12.0 * params, dev)
        elif tr.grad_compression.bits:   # int8 (int4) and a scale a group; the DDP hook's passes (error feedback's
            gb = tr.grad_compression.bits / 8 + hooks.SCALE_BYTES / hooks.INT8_GROUP   # too); FSDP2's: int8_scatter
            ef = tr.grad_compression == GradCompression.INT8_EF
            out["compress"] = 0.0 if par.zero >= ZeroStage.GRADIENTS else cmp.stream_s(
                (hooks.INT8_PASS_BYTES + hooks.INT8_CHUNK_BYTES / nd + ef * hooks.EF_PASS_BYTES * (1 + 1 / nd)) * params, dev)
        elif tr.grad_compression != GradCompression.NONE:
            out["compress"] = cmp.stream_s(6.0 * params, dev)   # read fp32, write 16-bit
        buckets = max(1, math.ceil(gb * params / mem.DDP_BUCKET_BYTES))
        hooked = par.zero == ZeroStage.NONE and tr.grad_compression != GradCompression.NONE and not expert
        if tr.optimizer in ONEBIT_OPTIMIZERS:
            # DeepSpeed's 1-bit optimizers' compression stage: no gradient all-reduce; in the step, after
            # the backward, the momentum's compressed all-reduce and its kernels (0/1 Adam: one step in 16)
            out["sync"], buckets = onebit.sync_s(tr.optimizer, params, net, dev), 1
        elif hooked:   # DDP's communication hook, bucket by bucket as torch runs it
            out["grad"], out["compress"], buckets = _hook_costs(plan, dev, sp, layer_params, net)
        elif dev.lone_all_reduce_s > 0 and par.zero <= ZeroStage.OPTIMIZER_STATES and par.dp_replicate == 1:
            # CPU host: DDP's bucket all-reduces (ZeRO-1 too: ZeroRedundancyOptimizer keeps DDP; not hybrid),
            # each a lone call issued after compute, plus the ring's bytes term
            out["grad"] = buckets * dev.lone_all_reduce_s + 2 * coll.ring_bytes_s(gb * dense, net) \
                + (2 * coll.ring_bytes_s(gb * expert, enet) if enet else 0.0)
            if par.zero == ZeroStage.OPTIMIZER_STATES:   # the parameter broadcasts' bytes (their calls: step_costs)
                out["sync"] = coll.ring_bytes_s(wb * params, net)
        elif par.zero == ZeroStage.NONE:
            out["grad"] = coll.all_reduce_s(gb * dense, net) + (coll.all_reduce_s(gb * expert, enet) if enet else 0.0)
        elif par.zero == ZeroStage.OPTIMIZER_STATES:
            out["grad"] = coll.reduce_scatter_s(gb * dense, net) + (coll.reduce_scatter_s(gb * expert, enet)
                                                                    if enet else 0.0)
            # Megatron's optimizer instances: the shard all-reduced across them after the reduce-scatter
            out["grad"] += coll.replica_all_reduce_s(plan, dev, gb * dense)
            # the updated parameters as stored (FP8 primary weights: their FP8 bytes)
            out["sync"] = coll.all_gather_s(stored_weight_bytes(plan, dense, sp.ends), net) + (
                coll.all_gather_s(stored_weight_bytes(plan, expert, 0.0), enet) if enet else 0.0)
        else:   # FSDP2, ZeRO-2 and 3: per block, as often as fsdp_calls.fsdp_stage_calls counts
            expert_l = mem.layer_params_per_gpu(plan)[1]
            fp8_ag = tr.fp8_param_gather and par.zero_impl == ZeroImpl.FSDP2   # torchao: the blocks' linears in FP8
            sizes = (1.0 if fp8_ag else wb, gb)
            out.update(_fsdp_layer(plan, dev, (net, enet), sizes, (layer_params - expert_l, expert_l)))
            if fp8_ag:   # precompute_float8_dynamic_scale_for_fsdp after the step: the shards' amax, one all-reduce
                linears = (4 + wl.mlp_matrices(plan.model)) * round((params - sp.ends) / max(layer_params, 1.0))
                out["sync"] += cmp.stream_s(wb * params / par.shard_ranks, dev) + coll.all_reduce_s(4.0 * linears, net)
            if par.zero_impl == ZeroImpl.DEEPSPEED and par.zero < ZeroStage.WEIGHTS:
                # DeepSpeed's ZeRO-2 keeps whole 16-bit parameters: one all-gather of the updated
                # shards a step (stage_1_and_2.py ``step``)
                out["sync"] = coll.all_gather_s(wb * params, net)
            if plan.model.dense_count:
                flat = mem.layer_params_per_gpu(ml.dense_plan(plan))[0]   # a dense layer: no experts
                one = _fsdp_layer(plan, dev, (net, enet), sizes, (flat, 0.0))
                out["dense_layer_ag"], out["dense_layer_rs"] = one["layer_ag"], one["layer_rs"]
                out["dense_layer_ag_b"] = one["layer_ag_b"]
        out["buckets"] = buckets
    out.setdefault("layer_ag_b", out["layer_ag"])
    for key in ("layer_ag", "layer_rs", "layer_ag_b"):
        out.setdefault("dense_" + key, out[key])
    return out


def _hook_costs(plan: Plan, dev: cmp.DeviceModel, sp: mem.StageParams, layer_params: float,
                net: coll.GroupNet) -> tuple[float, float, int]:
    """(communication, kernels, buckets) of DDP's communication hook (``ddp_hooks.hook_costs``)
    over the dp x cp ranks of ``net``."""
    tr, nd = plan.training, plan.parallel.dp * plan.parallel.cp

    def one(nbytes: float) -> float:
        if dev.lone_all_reduce_s > 0:   # a CPU host's lone call and the ring's bytes
            return dev.lone_all_reduce_s + 2 * coll.ring_bytes_s(nbytes, net)
        return coll.all_reduce_s(nbytes, net)

    def call(kind: str, nbytes: float) -> float:   # the int8 hook's all-to-all and all-gather
        if dev.lone_all_reduce_s > 0:   # a lone gloo call, one pass of the ring's bytes
            return dev.lone_all_reduce_s + coll.ring_bytes_s(nbytes, net)
        return (coll.all_to_all_s if kind == "all_to_all" else coll.all_gather_s)(nbytes, net)
    shapes = grad_shapes(plan, sp, layer_params, tr.grad_compression.bits > 0)
    comm, kernels = hooks.hook_costs(tr.grad_compression.value, shapes, hooks.POWERSGD_RANK, dev, one, nd, call)
    return comm, kernels, len(hooks.bucket_members([hooks.FP32 * math.prod(s) for s in shapes]))


def grad_shapes(plan: Plan, sp: mem.StageParams, layer_params: float, exact: bool = False) -> list[tuple[int, ...]]:
    """A rank's gradient tensors (their TP-local shapes) in DDP's ready order, the reverse of
    the executor's model's (``param_layout``): its blocks and the vocabulary matrices its
    parameters hold (the embedding, the output), as many as ``sp`` counts. ``exact`` (the int8
    hook's, whose padding and scales follow each bucket's size) also holds the final norm and
    puts each end where it is ready (the output and the norm first, the embedding last); the
    others' order, the vocabulary matrices first, is the one the analytic goldens pin."""
    m, tp = plan.model, plan.parallel.tp
    blocks = round((sp.total - sp.ends) / layer_params) if layer_params else 0
    ends = round(sp.ends / (m.vocab * m.hidden / tp)) if sp.ends else 0
    params = [p for i in range(blocks) for p in pl.block_params(m, i)]
    shapes = [pl.local_shape(p, tp, 0) for p in params]
    if not exact:
        return (shapes + [(m.vocab // tp, m.hidden)] * ends)[::-1]
    norm = round(sp.ends - ends * (m.vocab // tp) * m.hidden)   # the final norm's elements (the head's rank)
    head = 1 if norm and ends and not (plan.parallel.pp == 1 and m.tied_embeddings) else 0
    return [(m.vocab // tp, m.hidden)] * head + [(norm,)] * bool(norm) + shapes[::-1] \
        + [(m.vocab // tp, m.hidden)] * (ends - head)


def _fsdp_layer(plan: Plan, dev: cmp.DeviceModel, nets: tuple, sizes: tuple[float, float],
                params: tuple[float, float]) -> dict[str, float]:
    """FSDP2's (DeepSpeed's ZeRO-2/3) all-gather and reduce-scatter of one layer of ``params``
    (replicated, expert) parameters per GPU, each part over its group (``nets``: the data-parallel
    one and the expert data-parallel one, None where each rank holds its own experts), ``sizes``
    the (parameter, gradient) bytes on the wire; and the exposed share of DeepSpeed's gathers."""
    par = plan.parallel
    (net, enet), (wb, gb), (dense_l, expert_l) = nets, sizes, params

    def both(call, nbytes_dense: float, nbytes_expert: float) -> float:   # the dense and the experts' groups
        return call(nbytes_dense, net) + (call(nbytes_expert, enet) if enet else 0.0)

    out = {"layer_ag": both(coll.all_gather_s, wb * dense_l, wb * expert_l), "ag_exposed": 0.0}
    out["layer_rs"] = both(coll.reduce_scatter_s, gb * dense_l, gb * expert_l)
    if par.zero_impl == ZeroImpl.DEEPSPEED and par.zero >= ZeroStage.WEIGHTS:
        calls, out["ag_exposed"] = deepspeed_gathers(plan, dense_l + expert_l)
        out["layer_ag"], out["layer_ag_b"] = _deepspeed_layer_gathers(plan, dev, net, wb, dense_l + expert_l, calls)
        if par.zero_quantized_gradients:   # ZeRO++ qgZ: the world by node (rules: whole nodes, dp only)
            cl, local = plan.cluster, plan.cluster.gpus_per_node
            nets = (coll.group_net(cl, dev, local, 1), coll.group_net(cl, dev, par.gpus // local, local))
            groups = max(plan.model.hidden, plan.model.ffn_hidden, par.gpus)   # max(rows, cols, world)
            out["layer_rs"] = zpp.qgz_layer_s(dense_l + expert_l, gb, calls, nets, dev, groups)
    elif par.zero_impl == ZeroImpl.DEEPSPEED:   # ZeRO-2: no gathers per layer
        out["layer_ag"] = 0.0
    measured = dev.measured("fsdp_zero3" if par.zero >= ZeroStage.WEIGHTS else "fsdp_zero2")
    if measured:   # a calibrated host's measured layer cost holds the latency: the bytes' term only
        out["layer_ag"], out["layer_rs"] = (both(coll.ring_bytes_s, b * dense_l, b * expert_l) for b in (wb, gb))
        out.pop("layer_ag_b", None)
    if int8_scatters(plan):   # FSDP2's int8 reduce-scatter: an all-to-all and its kernels (one group: no experts')
        out["layer_rs"] = i8.call_s(dense_l + expert_l, net, dev, measured, plan.training.grad_compression.bits)
    out["layer_rs"] += coll.replica_all_reduce_s(plan, dev, gb * dense_l)   # HSDP: the replicas' all-reduce
    out.setdefault("layer_ag_b", out["layer_ag"])
    return out


def _deepspeed_layer_gathers(plan: Plan, dev: cmp.DeviceModel, net, wb: float, layer: float,
                             calls: int) -> tuple[float, float]:
    """DeepSpeed ZeRO-3's (forward, backward) all-gathers of a layer of ``layer`` parameters in
    ``calls`` modules, with ZeRO++ (``simcore.model.zeropp``): qwZ's int8 bytes and kernels, and
    hpZ's backward over the secondary group (its partition already quantized: dequantized only)."""
    par = plan.parallel
    quantized, hpz = par.zero_quantized_weights, min(par.zero_hpz_partition_size, par.gpus)
    module, wire = layer / calls, zpp.gather_bytes(wb, par.zero_quantized_weights)
    fwd = calls * (coll.all_gather_s(wire * module, net)
                   + (zpp.qwz_kernels_s(module, module / net.ranks, wb, dev) if quantized else 0.0))
    if hpz <= 1:
        return fwd, fwd
    hnet = coll.group_net(plan.cluster, dev, hpz, 1)   # contiguous ranks (ZeRO++ runs without TP)
    return fwd, calls * (coll.all_gather_s(wire * module, hnet)
                         + (zpp.qwz_kernels_s(module, 0.0, wb, dev) if quantized else 0.0))


def param_tensors(plan: Plan, rank: int) -> tuple[int, int]:
    """(plain, DTensor) parameter tensors pipeline rank ``rank`` holds in the executor's model
    (executors/model.py: bias-free projections, two norms per layer; the embedding on the
    first stage, the final norm and output on the last). FSDP2 and TP+DP (``replicate``)
    make every parameter a DTensor; TP alone its split matrices and embeddings, and with
    sequence parallel the norms too (torch/distributed/tensor/parallel/style.py)."""
    m, par = plan.model, plan.parallel
    layers = par.by_rank(plan.layers_per_stage)[rank]
    dense = ml.rank_dense_layers(m, plan.layers_per_stage, par.pp, par.v_shape)[rank]   # an MoE model's dense layers
    mats = 4 + (m.experts * wl.mlp_matrices(m) + 1 if m.moe else wl.mlp_matrices(m))
    matrices, norms, plain_emb = (layers - dense) * mats + dense * (4 + wl.mlp_matrices(m)), layers * 2, 0
    if rank == 0:
        matrices += 1
        plain_emb += 1 if m.position_embedding.value == "learned" else 0
    if rank == par.stage_rank(par.pp * par.vpp - 1):   # the last stage's rank (DualPipeV: 0)
        matrices += 0 if m.tied_embeddings and par.pp == 1 else 1
        norms += 1
    total = matrices + norms + plain_emb
    if (par.zero >= ZeroStage.GRADIENTS and par.dp > 1) or (par.tp > 1 and par.dp > 1):
        return 0, total
    if par.tp > 1:
        dt = matrices + (norms if par.sequence_parallel else 0)
        return total - dt, dt
    return total, 0


def _host_optimizer_s(plan: Plan, dev: cmp.DeviceModel, owned: float, tensors: tuple[int, int]) -> float:
    """The executor's eager optimizer on a calibrated host (a CPU, or a GPU whose profile timed
    torch's AdamW there): per-tensor host cost (plain or DTensor, ZeroRedundancyOptimizer steps
    1/N_d of the tensors; CPU profiles) plus the parameter bytes at the measured rate. The
    executor steps fp32 parameters under autocast (``master_weights``), 16-bit ones without."""
    par, tr = plan.parallel, plan.training
    share = 1.0 / par.shard_ranks if par.zero == ZeroStage.OPTIMIZER_STATES else 1.0
    per_tensor = share * (tensors[0] * dev.optimizer_per_tensor_kernels
                          + tensors[1] * dev.optimizer_dtensor_per_tensor_kernels) * dev.host_overhead_s
    stepped = 4 if tr.master_weights else mem.weight_bytes_per_param(tr.precision)
    return per_tensor + owned * stepped / dev.optimizer_bytes_per_s


def optimizer_costs(plan: Plan, dev: cmp.DeviceModel, sp: mem.StageParams,
                     tensors: tuple[int, int] = (0, 0)) -> tuple[float, float]:
    """(optimizer on the GPU or host, offload copies) per step for this rank's shard."""
    par, tr = plan.parallel, plan.training
    owned = sp.total / par.shard_ranks if par.zero >= ZeroStage.OPTIMIZER_STATES else sp.total
    k = mem.optimizer_bytes_per_param(tr, plan.model.hidden, flat_partitions(plan))
    wb, extra = mem.param_bytes(tr), onebit.step_kernel_s(tr.optimizer, owned, dev)   # 1-bit LAMB's, 0/1 Adam's
    if tr.offload == Offload.NONE and dev.optimizer_bytes_per_s > 0:
        return _host_optimizer_s(plan, dev, owned, tensors) + extra, 0.0
    if tr.offload == Offload.NONE:   # read grad, states; write states and the 16-bit copy
        return cmp.stream_s(owned * (2 * k + 2 * wb), dev) + extra, 0.0
    host_bw = dev.host_memory_bytes_per_s / plan.cluster.gpus_per_node
    host = owned * dev.adam_host_bytes_per_param / host_bw if host_bw > 0 else math.inf
    if fsdp2_offload(plan):
        return fsdp2_offload_s(plan, owned, host, host_bw)
    copies = 2 * wb * owned / host_link_bytes_per_s(plan)       # gradients down, parameters up
    return host, copies


def fsdp2_offload(plan: Plan) -> bool:
    """FSDP2's ``CPUOffloadPolicy``, whose copies run inside the forward and backward, in series
    with the compute and the host optimizer (DeepSpeed's offload overlaps its copies with the
    host Adam step)."""
    tr = plan.training
    return tr.offload == Offload.OPTIMIZER_PARAMS and plan.parallel.zero_impl == ZeroImpl.FSDP2


#: Host bytes per parameter of one gradient accumulation on the CPU (read both fp32 operands,
#: write the sum).
HOST_ACCUMULATE_BYTES = 12


def fsdp2_offload_s(plan: Plan, owned: float, host_adam_s: float, host_bw: float) -> tuple[float, float]:
    """(host optimizer and gradient accumulation, host-device copies) per step of FSDP2's
    ``CPUOffloadPolicy``: the sharded parameters live on the host in their own dtype (fp32
    under master weights) and every all-gather copies them to the GPU first, every
    reduce-scatter copies its gradient shard back and, from the second micro-batch on, adds it
    to the host's (torch/distributed/fsdp/_fully_shard/_fsdp_param.py ``offload_to_cpu``,
    _fsdp_collectives.py ``foreach_reduce``: ``non_blocking`` D2H, then ``+=`` on the CPU). The
    calls are FSDP2's own (``fsdp_calls``): alone, one gather in forward (ZeRO-3 again in
    backward) and one reduce-scatter per micro-batch. Measured on one H100 (validation/gpu_runs.csv):
    the forward of four micro-batches took 295 ms longer than without offload, four uploads of
    3.8 GB at the 55 GB/s measured pinned copy rate."""
    tr = plan.training
    f, b, r = fc.fsdp_stages_calls(plan, 1)[0]
    stored = mem.weight_bytes_per_param(Precision.FP32 if tr.master_weights else tr.precision)   # the shards' dtype
    copies = (f + b + r) * stored * owned / host_link_bytes_per_s(plan)
    accumulate = max(0, r - 1) * HOST_ACCUMULATE_BYTES * owned / host_bw if host_bw > 0 else math.inf
    return host_adam_s + accumulate, copies


def fsdp_calls(plan: Plan, stages: int) -> tuple[tuple[int, int, int], ...]:
    """Per virtual stage, FSDP2's (forward all-gathers, backward all-gathers, reduce-scatters)
    per block and step: the calls ``trainplan collectives`` lists, so that the prediction
    charges each one (none without FSDP2 or data parallelism)."""
    par = plan.parallel
    if par.zero < ZeroStage.GRADIENTS or par.dp * par.cp == 1:
        return ((0, 0, 0),) * stages
    return fc.fsdp_stages_calls(plan, stages)


#: ``rank_costs``' answers by what they read (``_kinds_key``), each with the cluster it was
#: computed for (kept by identity); cleared whole at ``_KINDS_MAX``.
_KINDS: dict[tuple, tuple] = {}
_KINDS_MAX = 4096


def _kinds_key(plan: Plan, dev: cmp.DeviceModel) -> tuple:
    """What ``rank_costs`` reads of a plan: the model, the layout, the cluster (by identity), the
    device model and, of the training section, the precision, optimizer, offload and gradient
    compression (a search's micro-batch and recompute variants of a layout share them)."""
    tr = plan.training
    return plan.model, plan.parallel, id(plan.cluster), dev, tr.precision, tr.optimizer, tr.offload, tr.grad_compression


def ddp_reduces(plan: Plan) -> bool:
    """Whether DDP reduces the gradients (ZeRO 0-1 with data parallel; FSDP2 otherwise)."""
    return plan.parallel.zero <= ZeroStage.OPTIMIZER_STATES and plan.parallel.dp * plan.parallel.cp > 1


def rank_costs(plan: Plan, dev: cmp.DeviceModel) -> tuple[tuple[mem.StageParams, ...], list[tuple], tuple]:
    """(``memory.stage_params``; per pipeline rank its ``dp_costs``, its ``optimizer_costs``
    and its (plain, DTensor) parameter tensors, counted only where the device has a host
    optimizer's per-tensor cost; ``_stage_columns``), kept per ``_kinds_key``. Ranks holding
    equal parameters (one ``StageParams`` value) and tensors share one tuple; the dicts are
    read only."""
    key = _kinds_key(plan, dev)
    hit = _KINDS.get(key)
    if hit is not None and hit[0] is plan.cluster:
        return hit[1]
    if len(_KINDS) >= _KINDS_MAX:
        _KINDS.clear()
    params = mem.stage_params(plan)
    layer_params = sum(mem.layer_params_per_gpu(plan))
    if dev.optimizer_bytes_per_s <= 0:   # one entry per kind of rank: params holds the values, their ids are theirs
        kinds = {id(sp): (dp_costs(plan, dev, sp, layer_params), optimizer_costs(plan, dev, sp), (0, 0))
                 for sp in dict(zip(map(id, params), params)).values()}
        costs = list(map(kinds.__getitem__, map(id, params)))
    else:
        per_params: dict = {}
        costs = []
        for r, sp in enumerate(params):
            tensors = param_tensors(plan, r)
            if (id(sp), tensors) not in per_params:
                per_params[id(sp), tensors] = (dp_costs(plan, dev, sp, layer_params),
                                               optimizer_costs(plan, dev, sp, tensors), tensors)
            costs.append(per_params[id(sp), tensors])
    _KINDS[key] = (plan.cluster, (params, costs, _stage_columns(plan, dev, costs)))
    return _KINDS[key][1]


def _stage_columns(plan: Plan, dev: cmp.DeviceModel, costs: list[tuple]) -> tuple[tuple[float, ...], ...]:
    """Per virtual stage, from its rank's ``costs``: (gradient reduction, FSDP2 reduce-scatter
    per block, parameter sync, optimizer, offload) per step, a rank's split over its chunks."""
    par = plan.parallel
    share = 1.0 / par.vpp
    bcast = 0.0
    if dev.optimizer_bytes_per_s > 0 and ddp_reduces(plan) and par.zero == ZeroStage.OPTIMIZER_STATES:
        # ZeroRedundancyOptimizer: one bucket broadcast per rank, each a lone call after the optimizer
        bcast = par.dp * (dev.lone_broadcast_s or dev.broadcast_latency_s)
    per_kind: dict[int, tuple[float, ...]] = {}     # one entry per kind of rank (costs shares tuples)
    for rc in dict(zip(map(id, costs), costs)).values():
        d, (o, c), _ = rc
        per_kind[id(rc)] = ((d["grad"] + d["compress"]) * share, d["layer_rs"], d["sync"] * share + bcast,
                            o * share, c * share)
    ranks = costs + costs[::-1] if par.v_shape else costs * par.vpp   # virtual stage v's rank: v % pp, or the V
    return tuple(zip(*map(per_kind.__getitem__, map(id, ranks))))


rank_costs.cache_clear = _KINDS.clear   # as functools' caches answer (tests clear them all)
