"""Collective cost: alpha-beta on the route a group's ring takes through the cluster.

Time = latency + (bytes each rank moves) / (bus bandwidth), the model of Thakur,
Rabenseifner and Gropp, "Optimization of Collective Communication Operations in MPICH"
(IJHPCA 2005), with NCCL's conventions (nccl-tests ``doc/PERFORMANCE.md``): a ring
all-reduce moves 2(n-1)/n of the buffer through every rank, all-gather and
reduce-scatter (n-1)/n of the full buffer; NCCL's latency model
(``src/graph/tuning.cc``): a base latency plus one hop latency per ring step, network
hops for the steps that cross nodes, tree latency 2*log2(nodes) network hops.

The bus bandwidth of a group comes in closed form from the ClusterSpec (no graph):
inside an NVLink domain the GPU's NVLink rate; across domains, the domain's NICs shared by
every group of the same axis that runs at the same time (e.g. the DP rings of the 8 TP
ranks of a node share its 8 NICs), divided by the fabric's oversubscription once a group
spans more nodes than one leaf switch serves. The NVLink domain is the node, or a
rack-scale domain of several nodes (``ClusterSpec.nvlink_domain``: a GB200 NVL72 rack's 72
GPUs over 18 trays of 4 on one NVLink switch fabric), so a TP, CP or EP group inside the
rack runs at NVLink rate across trays (NCCL's NVLS/MNNVL transport), and a group leaving it
takes the scale-out NICs, every tray's share of them (NCCL PXN relays over NVLink).
Achieved fractions of the link rates (nccl-tests busbw / link rate) come from the GPU's
``efficiency.yaml`` entry. On a torus (``intra: torus``: TPU slices, Trainium instances) a
group's rate inside the domain is its rings per axis (``simcore.model.torus``).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from simcore.model import torus
from simcore.model import workload as wl
from simcore.model.compute import DeviceModel
from simcore.plan.spec import ClusterSpec, GradCompression, Plan, Precision, ZeroImpl, ZeroStage


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupNet:
    """The route of one communication group: its size, its nodes and its bus bandwidth."""

    ranks: int
    nodes: int
    """Nodes the group spans."""
    bus_bytes_per_s: float
    """Achieved per-rank bandwidth of the ring's slowest link."""
    intra_bytes_per_s: float
    """Achieved NVLink (intra-node) bandwidth, for the hierarchical algorithm."""
    base_latency_s: float
    intra_hop_s: float
    inter_hop_s: float
    nic_bytes_per_s: float = 0.0
    """A rank's own share of its domain's NICs, every GPU of the domain sending at once (the
    cross-domain part of an all-to-all); 0 for a group inside one NVLink domain."""

    @property
    def ranks_per_node(self) -> int:
        return max(1, self.ranks // self.nodes)

    @property
    def hop_s(self) -> float:
        """Latency of one point-to-point hop of the group: across nodes where it spans several."""
        return self.inter_hop_s if self.nodes > 1 else self.intra_hop_s


def nodes_per_leaf(cluster: ClusterSpec) -> int:
    """Nodes one leaf switch serves without going up a level: half its ports face down;
    rail-optimized fabrics give every node one port on each rail's leaf."""
    fab = cluster.fabric
    down = max(1, fab.switch_radix // 2)
    if fab.topology.startswith("rail"):
        return down
    return max(1, down // max(1, cluster.node.nics_per_node))


@functools.lru_cache(maxsize=1024)
def blocks_in_domain(block: int, domain: int, gpus: int) -> bool:
    """Whether every aligned block of ``block`` consecutive ranks (one group's span, ranks
    placed in order) lies inside one NVLink domain of ``domain`` GPUs: a block that
    straddles a domain boundary (tp=16 on 72-GPU racks: ranks 64-79) leaves the domain."""
    if block > domain:
        return False
    return domain % block == 0 or all(k * block // domain == ((k + 1) * block - 1) // domain
                                      for k in range(gpus // block))


#: ``group_net``'s answers by (cluster, device model) identity and group shape, each with the
#: two objects it was computed for (an id is reused only once its object is gone); cleared
#: whole when it reaches ``_NETS_MAX`` entries.
_NETS: dict[tuple[int, int, int, int], tuple[ClusterSpec, DeviceModel, GroupNet]] = {}
_NETS_MAX = 4096


def group_net(cluster: ClusterSpec, dev: DeviceModel, ranks: int, stride: int) -> GroupNet:
    """Route of a group of ``ranks`` ranks spaced ``stride`` apart (TP: 1, CP: tp,
    DP: tp*cp, PP: tp*cp*dp), every GPU of an NVLink domain being in one such group.
    ``nodes`` counts the NVLink domains the group spans (nodes, or racks of an NVL72).
    Kept per cluster and device model object and group shape (``_NETS``): a search derives
    its plans from one cluster value, so the look-up costs no hashing of the specs."""
    key = (id(cluster), id(dev), ranks, stride)
    hit = _NETS.get(key)
    if hit is not None and hit[0] is cluster and hit[1] is dev:
        return hit[2]
    if len(_NETS) >= _NETS_MAX:
        _NETS.clear()
    net = _group_net(cluster, dev, ranks, stride)
    _NETS[key] = (cluster, dev, net)
    return net


group_net.cache_clear = _NETS.clear   # as functools' caches answer (tests clear them all)


def mesh_share(gpus_per_node: int, members: int) -> float:
    """The share of a GPU's intra-node bandwidth a group of ``members`` ranks inside one full-mesh node
    reaches: one direct link to each peer (``topologies.build.add_intra``: the GPU's rate over its
    ``gpus_per_node - 1`` links), so a group uses ``members - 1`` of them (AMD MI300X: one xGMI link to
    each of seven peers; the Atlas 800T A2's HCCS mesh, Ascend/msmodeling tensor_cast/device.py @84fec853
    ``InterconnectType.FULL_MESH``). 1 for a group alone on its node."""
    return 1.0 if members <= 1 or gpus_per_node <= 1 else (members - 1) / (gpus_per_node - 1)


def unpriced_group(plan: Plan, dev: DeviceModel) -> str:
    """'' where the catalog prices every communication group of the plan's layout (the groups the
    step model routes: TP, CP, the data-parallel shard and its replicas, EP, a pipeline hop, the
    tied embedding's first and last stage: ``end_comm.tied_s``), else the refusal of the first it
    cannot (``_group_net``: a fabric gap), naming the group: the layout search counts such a layout
    under that rule, as one that breaks a rule."""
    par = plan.parallel
    tied = plan.model.tied_embeddings and par.pp > 1 and not par.v_shape
    groups = (("tensor", par.tp, 1), ("context", par.cp, par.tp), ("data-parallel", par.shard_ranks, par.tp),
              ("replica", par.dp_replicate, par.tp * par.shard_ranks),
              ("expert", par.ep, par.etp if par.etp < par.tp else par.tp * par.cp),
              ("pipeline", 2 if par.pp > 1 else 1, par.tp * par.cp * par.dp),
              ("tied embedding", 2 if tied else 1, (par.pp - 1) * par.tp * par.cp * par.dp))
    for name, ranks, stride in groups:
        if ranks > 1:
            try:
                group_net(plan.cluster, dev, ranks, stride)
            except ValueError as exc:
                return f"the {name} group: {exc}"
    return ""


def replica_all_reduce_s(plan: Plan, dev: DeviceModel, scattered_bytes: float) -> float:
    """Seconds of the all-reduce that follows a reduce-scatter of ``scattered_bytes`` under hybrid
    sharding (``parallel.dp_replicate``; 0 without): its shard, 1 / ``shard_ranks`` of them, over the
    shard's replicas, placed as torch's mesh (pp, dp_replicate, dp_shard, cp, tp) places them (the
    shard group's ranks contiguous after TP's, the replicas that far apart). FSDP2 all-reduces each
    reduce-scattered shard so (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
    ``foreach_reduce``: ``all_reduce_group``, torch 2.13); Megatron-LM's distributed optimizer
    instances the same after their reduce-scatter (``--num-distributed-optimizer-instances``)."""
    par = plan.parallel
    if par.dp_replicate == 1:
        return 0.0
    net = group_net(plan.cluster, dev, par.dp_replicate, par.tp * par.shard_ranks)
    return all_reduce_s(scattered_bytes / par.shard_ranks, net)


def _group_net(cluster: ClusterSpec, dev: DeviceModel, ranks: int, stride: int) -> GroupNet:
    """``group_net`` computed."""
    gpn, dom = cluster.gpus_per_node, cluster.nvlink_domain
    node = cluster.node
    per_domain = max(1, min(ranks, dom // stride))        # members of one group in one domain
    intra = node.gpu.intra_link_bytes_per_s * dev.nvlink_efficiency
    if node.intra.endswith("-mesh") and ranks > 1:   # a mesh is one node (rules._domain_rules): dom == gpn
        intra *= mesh_share(gpn, per_domain)
    if node.torus_dims and ranks > 1:   # a TPU slice or Trainium instance: rings per torus axis
        intra = dev.nvlink_efficiency * torus.group_bytes_per_s(
            node.gpu.intra_link_bytes_per_s, node.torus_dims, node.torus_wrap, node.torus_wrap_all,
            dom, per_domain, stride)
    common = dict(ranks=ranks, intra_bytes_per_s=intra, base_latency_s=dev.base_latency_s,
                  intra_hop_s=dev.nvlink_hop_latency_s, inter_hop_s=dev.net_hop_latency_s)
    inside = stride * ranks <= gpn or (dom > gpn and blocks_in_domain(stride * ranks, dom, cluster.gpus))
    if ranks <= 1 or cluster.nodes == 1 or inside:
        return GroupNet(nodes=1, bus_bytes_per_s=intra, **common)
    domains = max(1, ranks // per_domain)
    concurrent = max(1, dom // per_domain)                # groups sharing this domain's NICs
    fab = cluster.fabric
    if fab is None or cluster.node.nics_per_node == 0:
        raise ValueError(f"cluster.node={cluster.node.name} has no fabric, but a group spans {domains} nodes")
    if math.isnan(fab.nic_bytes_per_s):
        raise ValueError(f"cluster.fabric={fab.name} has no NIC rate in the catalog (a gap), and a group spans "
                         f"{domains} nodes")
    if stride * ranks < dom and dom > gpn:
        # a block smaller than the domain that straddles two of them (16 ranks on 72-GPU
        # racks): its ring crosses between the racks at two GPUs, each through its own NICs,
        # and the step waits for the slowest group
        nic = cluster.node.nics_per_node * fab.nic_bytes_per_s * dev.nic_efficiency / gpn
        return GroupNet(nodes=2, bus_bytes_per_s=min(intra, nic), **common)
    nics = cluster.node.nics_per_node * dom // gpn        # the domain's NICs
    nic = nics * fab.nic_bytes_per_s * dev.nic_efficiency / concurrent
    own = nics * fab.nic_bytes_per_s * dev.nic_efficiency / dom   # every GPU of the domain at once
    if domains * max(1, min(dom, per_domain * stride) // gpn) > nodes_per_leaf(cluster):
        if math.isnan(fab.oversubscription):   # a catalog gap: a NaN would leave min() the NVLink rate
            raise ValueError(f"cluster.fabric={fab.name} has no oversubscription figure in the catalog (a gap), "
                             f"and a group spans {domains} nodes beyond one leaf switch")
        nic /= fab.oversubscription
        own /= fab.oversubscription
    bus = min(intra, nic) if per_domain > 1 else nic
    return GroupNet(nodes=domains, bus_bytes_per_s=bus, nic_bytes_per_s=own, **common)


def _ring_latency(net: GroupNet, steps: int, inter_steps: int) -> float:
    return net.base_latency_s + (steps - inter_steps) * net.intra_hop_s + inter_steps * net.inter_hop_s


def ring_all_reduce_s(size_bytes: float, net: GroupNet) -> float:
    """Ring all-reduce: reduce-scatter then all-gather, 2(n-1)/n of the buffer per rank."""
    n = net.ranks
    if n <= 1 or size_bytes <= 0:
        return 0.0
    lat = _ring_latency(net, 2 * (n - 1), 2 * (net.nodes - 1))
    return lat + 2 * ring_bytes_s(size_bytes, net)


def tree_all_reduce_s(size_bytes: float, net: GroupNet) -> float:
    """NCCL double binary tree: algorithm bandwidth half the bus bandwidth (tuning.cc
    ``ratio = .5``, busBw * 0.9), latency 2*((ranks per node - 1) intra + log2(nodes) inter hops)."""
    if net.ranks <= 1 or size_bytes <= 0:
        return 0.0
    lat = net.base_latency_s + 2 * ((net.ranks_per_node - 1) * net.intra_hop_s
                                    + math.log2(max(1, net.nodes)) * net.inter_hop_s)
    return lat + size_bytes / (0.5 * 0.9 * net.bus_bytes_per_s)


def hierarchical_all_reduce_s(size_bytes: float, net: GroupNet) -> float:
    """Intra-node reduce-scatter, inter-node ring all-reduce of 1/k of the buffer over the
    node's share of NICs, intra-node all-gather (k = ranks per node)."""
    k = net.ranks_per_node
    if net.nodes <= 1 or k <= 1:
        return ring_all_reduce_s(size_bytes, net)
    hops = dict(intra_bytes_per_s=net.intra_bytes_per_s, base_latency_s=net.base_latency_s,
                intra_hop_s=net.intra_hop_s, inter_hop_s=net.inter_hop_s)
    intra = GroupNet(ranks=k, nodes=1, bus_bytes_per_s=net.intra_bytes_per_s, **hops)
    # k sub-rings (one per local rank) run at once and split the group's NIC share
    inter = GroupNet(ranks=net.nodes, nodes=net.nodes, bus_bytes_per_s=net.bus_bytes_per_s / k, **hops)
    return (reduce_scatter_s(size_bytes, intra) + ring_all_reduce_s(size_bytes / k, inter)
            + all_gather_s(size_bytes, intra))


#: Bytes per element of an fp32 activation.
FP32_ACT_BYTES = 4


def comm_act_bytes(precision: Precision) -> int:
    """Bytes per activation element that TP, SP, CP, EP and pipeline communication moves: fp32
    in an fp32 plan, else 16-bit (FP8 and the block-scaled recipes keep communication in bf16:
    Transformer Engine quantizes inside its GEMMs)."""
    return FP32_ACT_BYTES if precision == Precision.FP32 else wl.ACT_BYTES


def grad_wire_bytes(plan: Plan) -> float:
    """Bytes per gradient element on the wire, and in the buffer that accumulates whole
    gradients across micro-batches. 16-bit mixed precision reduces fp32 gradients by default
    in the stacks the Plan stands for:
    - torch DDP under autocast reduces the fp32 gradients of its fp32 parameters;
    - Megatron-LM with ``--bf16`` accumulates and reduces fp32 ``main_grads``
      (megatron/training/arguments.py @d98e8a64dd: ``accumulate_allreduce_grads_in_fp32 =
      True`` for bfloat16 unless ``--grad-reduce-in-bf16``; docs dist_optimizer.md: bf16
      parameters with fp32 gradients, 6 + 12/d bytes a parameter), as Megatron-Bridge and
      NeMo's ``bf16_mixed`` recipes do (``grad_reduce_in_fp32=True``);
    - torchtitan's FSDP2 reduces in fp32 (``training.mixed_precision_reduce``, whose only
      choice is float32), and FSDP2 accumulates unsynced gradients in that ``reduce_dtype``.
    16-bit wires: ``training.grad_compression`` fp16/bf16 (DDP's compress hook, Megatron's
    ``--grad-reduce-in-bf16``, FSDP2 ``reduce_dtype=bfloat16``); DeepSpeed ZeRO, whose
    ``communication_data_type`` defaults to the model's dtype; Megatron's ``--fp16`` (fp16
    gradients: its fp32 accumulation is for bfloat16 only); pure 16-bit training without
    master weights (its gradients are 16-bit)."""
    tr, par = plan.training, plan.parallel
    if tr.precision == Precision.FP32:
        return 4.0
    if tr.grad_compression in (GradCompression.FP16, GradCompression.BF16) or not tr.master_weights:
        return 2.0
    if tr.autocast:   # torch DDP (and ZeroRedundancyOptimizer's) fp32 gradients of fp32 parameters
        return 4.0
    if par.zero >= ZeroStage.OPTIMIZER_STATES and (par.zero_impl == ZeroImpl.DEEPSPEED
                                                    or tr.precision == Precision.FP16):
        return 2.0
    return 4.0


def tp_act_bytes(plan: Plan) -> float:
    """One micro-batch's (b, s/cp, hidden) activation as TP, SP and EP move it."""
    m, tr = plan.model, plan.training
    return comm_act_bytes(tr.precision) * tr.micro_batch * (m.seq_len // plan.parallel.cp) * m.hidden


def tp_call_bytes(plan: Plan) -> dict[str, float]:
    """Bytes of one TP collective of a layer by kind: SP's all-gathers move ``sp_gathered_bytes``,
    its reduce-scatters and plain TP's all-reduces the activation (``tp_act_bytes``)."""
    act = tp_act_bytes(plan)
    return {"all_gather": sp_gathered_bytes(plan), "reduce_scatter": act, "all_reduce": act}


def sp_gathered_bytes(plan: Plan) -> float:
    """The same activation as sequence parallelism's all-gathers move it (``sp_gather_element_bytes``)."""
    m, tr = plan.model, plan.training
    return sp_gather_element_bytes(plan) * tr.micro_batch * (m.seq_len // plan.parallel.cp) * m.hidden


def sp_gather_element_bytes(plan: Plan) -> float:
    """Bytes per element of sequence parallelism's all-gathers (the linear layers' inputs
    forward, their output gradients backward): quantized under Transformer Engine's
    low-precision recipes, whose ``Linear`` hands its quantizer to ``gather_along_first_dim``
    (module/linear.py, module/base.py ``grad_output_preprocess``; distributed.py
    ``_all_gather_fp8`` / ``_all_gather_mxfp8`` / ``_all_gather_nvfp4``, TE d0067d0da), the
    plan's activation bytes otherwise. torchao's tensorwise float8 gathers FP8 as well
    (torchao/float8/float8_tensor_parallel.py ``Float8ColwiseParallel`` casts before it
    redistributes; torchtitan applies it to tensorwise float8 only), its rowwise recipe
    16-bit. SP's reduce-scatters stay 16-bit."""
    tr = plan.training
    if tr.precision == Precision.FP32:
        return FP32_ACT_BYTES
    if tr.precision == Precision.FP8 and tr.fp8_recipe.value == "tensorwise":
        return wl.quantized_bytes("fp8")
    return wl.saved_gemm_input_bytes(tr.precision.value, tr.fp8_recipe.value)


def all_reduce_s(size_bytes: float, net: GroupNet, algorithm: str = "auto") -> float:
    """All-reduce by ``algorithm``: ring, tree, hierarchical, or auto (the fastest of
    ring and tree, as NCCL's tuner picks)."""
    if algorithm == "ring":
        return ring_all_reduce_s(size_bytes, net)
    if algorithm == "tree":
        return tree_all_reduce_s(size_bytes, net)
    if algorithm == "hierarchical":
        return hierarchical_all_reduce_s(size_bytes, net)
    if algorithm == "auto":
        return min(ring_all_reduce_s(size_bytes, net), tree_all_reduce_s(size_bytes, net))
    raise ValueError(f"unknown all-reduce algorithm {algorithm!r} (known: ring, tree, hierarchical, auto)")


def ring_bytes_s(size_bytes: float, net: GroupNet) -> float:
    """The bandwidth term of a ring all-gather or reduce-scatter of ``size_bytes``: (n-1)/n of it
    through every rank, no latency (where a calibrated host's measured wrapper cost holds that)."""
    n = net.ranks
    return (n - 1) / n * size_bytes / net.bus_bytes_per_s


def all_gather_s(size_bytes: float, net: GroupNet) -> float:
    """Ring all-gather of a ``size_bytes`` OUTPUT buffer: (n-1)/n of it through every rank."""
    n = net.ranks
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return _ring_latency(net, n - 1, net.nodes - 1) + ring_bytes_s(size_bytes, net)


def reduce_scatter_s(size_bytes: float, net: GroupNet) -> float:
    """Ring reduce-scatter of a ``size_bytes`` INPUT buffer (the mirror of all-gather)."""
    return all_gather_s(size_bytes, net)


def all_to_all_s(size_bytes: float, net: GroupNet, remote_bytes: float | None = None) -> float:
    """All-to-all of ``size_bytes`` per rank: (n-1)/n of it leaves every rank, one message per
    peer (pairwise exchange; latency one hop per peer). Inside an NVLink domain at the group's
    bus bandwidth. Across domains no ring carries it: each rank sends the share bound for other
    domains (``remote_bytes``, by default (n-k)/n of it, k ranks a domain) through its own share
    of its domain's NICs while every GPU of the domain does the same, and the share for its own
    domain over NVLink alongside: DeepEP's internode dispatch on H800 with one 400 Gb/s NIC (~50
    GB/s) per GPU moves 43-58 GB/s of RDMA traffic per GPU at EP 16-64 against 153 GB/s over
    NVLink inside a node (deepseek-ai/DeepEP docs/legacy.md @0297fc80, "Normal kernels")."""
    n = net.ranks
    if n <= 1 or size_bytes <= 0:
        return 0.0
    latency = net.base_latency_s + (n - 1) * net.hop_s
    if net.nodes <= 1 or net.nic_bytes_per_s <= 0:
        return latency + ring_bytes_s(size_bytes, net)
    k = net.ranks_per_node
    remote = (n - k) / n * size_bytes if remote_bytes is None else remote_bytes
    return latency + max((k - 1) / n * size_bytes / net.intra_bytes_per_s, remote / net.nic_bytes_per_s)


def broadcast_s(size_bytes: float, net: GroupNet) -> float:
    """Pipelined ring broadcast: the whole buffer through every link once."""
    n = net.ranks
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return _ring_latency(net, n - 1, net.nodes - 1) + size_bytes / net.bus_bytes_per_s


def send_recv_s(size_bytes: float, bytes_per_s: float, latency_s: float) -> float:
    """Point-to-point: latency plus size over the link's achieved bandwidth."""
    if size_bytes <= 0:
        return 0.0
    return latency_s + size_bytes / bytes_per_s
