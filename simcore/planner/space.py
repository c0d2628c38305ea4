"""The space of layouts the search walks: its axes, one point (``Layout``), the candidates.

``SearchSpace`` holds the values each axis may take (``derive_space`` fills it from the
divisibility rules of a model and cluster); ``families`` enumerates the layouts of a GPU
count with recompute and offload left open; ``base_plan`` is the Plan every layout derives
from, and ``Layout.apply`` the Plan of one layout.

Sequence parallelism is switched on with every tp > 1 by default (it moves the same bytes
as TP's all-reduces and divides the activations by tp, Korthikanti et al. 2022, Sec.
4.2.2); ``SearchSpace.sequence_parallel`` can search it too.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from itertools import product
from pathlib import Path

from simcore.plan.load import _cluster, _parallel, plan_from_dict
from simcore.plan.rules import kv_copies
from simcore.plan.spec import (Fp8Recipe, Offload, Plan, Precision, Recompute, RecomputeMethod, Schedule, ZeroImpl,
                               ZeroStage, even_split, evolve)
from simcore.plan.torchtitan_writer import stage_split, torchtitan_autocasts
from simcore.planner.compression import applies as compression_applies, fields as compression_fields
from topologies.hardware import load_catalog

#: Candidate values of the axes the search does not derive from the model and batch.
MICRO_BATCHES = (1, 2, 4, 8)
#: Context-parallel sizes: powers of two (Megatron-Core and torch split the sequence into 2 cp
#: chunks for causal balance), to NeMo's 1M-token runs on 32 (nemo_longctx_2024_h100) and beyond.
CONTEXT_PARALLEL = (1, 2, 4, 8, 16, 32, 64, 128)
#: The largest micro-batch ``derive_space`` proposes, in sequences and in tokens: the published runs tuned
#: theirs to 24 sequences of 2k tokens (vTrain's GPT) and 16 (llm-foundry's MPT-13B); past that a GEMM
#: gains nothing more and the memory check prunes what does not fit.
MAX_MICRO_BATCH, MAX_MICRO_BATCH_TOKENS = 32, 65536
VIRTUAL_STAGES = (2, 3, 4, 5, 6, 7, 8)   # Narayanan et al. 2021 ran 5-8, Megatron-Core 2024 7
RECOMPUTE_ORDER = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
OFFLOAD_ORDER = (Offload.NONE, Offload.OPTIMIZER)
#: How the search spreads the layers over the (virtual) pipeline stages, where the split differs:
#: ``even``, the extra layers on the middle stages (``spec.even_split``: the first and the last
#: stage also hold the embedding and the logits; Llama 3 405B's 126 layers on 16 stages, Dubey et
#: al. 2024, Sec. 3.3.2: "we reduce one Transformer layer each from the first and the last
#: stages"); ``ends``, the embedding and the loss counted as one layer each where the stages divide
#: the layers plus two: Megatron-LM's ``--account-for-embedding-in-pipeline-split
#: --account-for-loss-in-pipeline-split`` (megatron/core/transformer/transformer_block.py
#: ``get_num_layers_to_build`` asserts the division), the Megatron-Bridge Llama 3.1 405B and
#: Qwen3 recipes; ``titan``, torchtitan's rule with its default ``pipeline_parallel_first_stage_less_layers``
#: = ``last_stage_less_layers`` = 1, the extra layers on the first stages
#: (``torchtitan_writer.stage_split``), searched for the torchtitan stacks; ``mtp``, a model with
#: MTP modules (``model.mtp_layers``) counting them as layers of the last stage: every other stage
#: ceil((layers + D) / stages) layers, the last the rest beside the modules, as Megatron-Bridge's
#: DeepSeek-V3 layouts place them ('Et*4|(t*4|)*14tmL', recipes/deepseek/deepseek_v3.py @21d102f5e;
#: Megatron-LM's ``--decoder-last-pipeline-num-layers``).
SPLITS = ("even", "ends", "titan", "mtp")
#: The splits a search proposes unless a stack says otherwise (``SearchSpace.splits``).
DEFAULT_SPLITS = ("even", "ends", "mtp")


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The values each axis may take; ``derive_space`` fills it for a model and cluster."""

    tp: tuple[int, ...]
    pp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...] = (1,)
    vpp: tuple[int, ...] = VIRTUAL_STAGES
    zero: tuple[ZeroStage, ...] = tuple(ZeroStage)
    micro_batch: tuple[int, ...] = MICRO_BATCHES
    schedule: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE,
                                      Schedule.DUALPIPE_V)
    """GPipe is left out by default: the same bubble as 1F1B with all m micro-batches in
    flight instead of p (Narayanan et al. 2021, Sec. 2.2.1), so 1F1B dominates it. DualPipeV
    runs 2 stages a rank (vpp 2), the layers split evenly over its 2 pp stages."""
    recompute: tuple[Recompute, ...] = RECOMPUTE_ORDER
    offload: tuple[Offload, ...] = OFFLOAD_ORDER
    sequence_parallel: tuple[bool, ...] = (True,)
    """Sequence parallelism with tp > 1 (where the sequence splits over tp)."""
    splits: tuple[str, ...] = DEFAULT_SPLITS
    """The layer splits over pipeline stages (``SPLITS``), each where it gives another split."""
    precision: tuple[str, ...] = ()
    """Precisions to search (empty: the base plan's alone), each where the GPU has a peak (``precisions_of``)."""
    fp8_recipe: str = ""
    """The FP8 scaling of the layouts the search trains in fp8 where the base plan is not fp8 (its
    own recipe else; a stack's, ``stacks.STACK_FP8_RECIPE``)."""
    block_recompute: bool = True
    """Where full recompute is what makes a layout fit, recompute only the fewest layers of each
    chunk that do (Megatron-LM's block method; ``evaluate._least_block``)."""
    activation_offload: tuple[bool, ...] = (False, True)
    """With True among them: without a pipeline, where recomputation is what makes a layout
    fit, also the fewest layers whose activations, offloaded to host memory, make it fit
    without recomputing (``training.activation_offload``, below the model's layers as
    Megatron-Core requires); a what-if sweep pins ``[false]`` to leave it out."""
    hybrid: tuple[bool, ...] = (False,)
    """With True among them: each ZeRO layout whose data-parallel ranks span NVLink domains also
    with hybrid sharding, the shard group one domain (``parallel.dp_replicate``: FSDP2's 2-D mesh,
    Megatron's optimizer instances); off by default, as the stacks' recipes leave it."""
    compression: tuple[str, ...] = ("none",)   # methods to try (compression.METHODS), each where a layout can
    kv_replicate: int = 0   # TP ranks a chip where KV heads are copied to fill them (NxD; stacks.kv_replicated_tp)
    ddp_autocast: bool = False
    """A stack that runs its bf16 DDP and one-device layouts (no TP, PP, CP or EP) under
    torch.autocast over fp32 parameters (torchtitan: ``mixed_precision_param``): those layouts
    are Plans with ``training.autocast``, which costs them its cached copies and casts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """One point of the search: the fields of a Plan the search changes."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    zero: ZeroStage
    schedule: Schedule
    micro_batch: int
    recompute: Recompute = Recompute.NONE
    offload: Offload = Offload.NONE
    sequence_parallel: bool = False
    activation_offload: int = 0
    autocast: bool = False
    split: str = "even"   # how the layers spread over the pipeline stages (SPLITS)
    expert_tp: int = 0   # the experts' tensor parallel (parallel.expert_tp; 0: tp): 1 folds the group over TP
    recompute_layers: int = 0
    """With full recompute: 0 every layer; N the first N layers of each chunk (Megatron-LM's
    ``--recompute-method block --recompute-num-layers N``), the rest keep their activations."""
    precision: str = ""
    """The training precision where it is not the base plan's (``SearchSpace.precision``)."""
    fp8_recipe: str = ""
    """With ``precision`` fp8: its scaling where it is not the base plan's (``SearchSpace.fp8_recipe``)."""
    dp_replicate: int = 1   # hybrid sharding's replicas (parallel.dp_replicate; SearchSpace.hybrid)
    compression: str = ""   # a communication compression method (compression.METHODS; '' none)
    kv_replicator: int = 1   # copies of each KV head over the TP ranks (parallel.kv_replicator)

    def apply(self, base: Plan, explicit_stages: bool = False) -> Plan:
        """The Plan of this layout. ``explicit_stages`` writes the default even split into
        ``stage_layers`` too (the same Plan, with the split computed once: faster to evaluate)."""
        stages = None
        if explicit_stages or self.split != "even":
            stages = layer_split(base.model.layers, self.pp * self.vpp, self.split, base.model.mtp_layers)
        impl = base.parallel.zero_impl if self.zero > ZeroStage.NONE else ZeroImpl.FSDP2   # the base's ZeRO
        # the stack's switches (``base_plan``'s ``parallel``), where this layout can take them
        tp_overlap = base.parallel.tp_comm_overlap and self.tp > 1 and self.sequence_parallel
        param_gather = base.parallel.overlap_param_gather and self.zero == ZeroStage.OPTIMIZER_STATES \
            and impl == ZeroImpl.FSDP2
        squeeze, block = compression_fields(self.compression, base.cluster.gpus_per_node)
        par = evolve(base.parallel, tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep,
                      vpp=self.vpp, zero=self.zero, schedule=self.schedule, stage_layers=stages,
                      sequence_parallel=self.sequence_parallel, zero_impl=impl, tp_comm_overlap=tp_overlap,
                      overlap_param_gather=param_gather, expert_tp=self.expert_tp, dp_replicate=self.dp_replicate,
                      kv_replicator=self.kv_replicator, **squeeze)
        if self.recompute_layers:
            block.update(recompute_layers=self.recompute_layers, recompute_method=RecomputeMethod.BLOCK)
        if self.precision:
            block["precision"] = Precision(self.precision)
            if self.fp8_recipe:
                block["fp8_recipe"] = Fp8Recipe(self.fp8_recipe)
        tr = evolve(base.training, micro_batch=self.micro_batch, recompute=self.recompute, offload=self.offload, **block,
                     activation_offload=self.activation_offload or base.training.activation_offload,
                     autocast=self.autocast or base.training.autocast)
        cluster = base.cluster
        gpus = self.tp * self.pp * self.dp * self.cp
        if gpus < cluster.gpus and gpus % cluster.gpus_per_node == 0:   # a smaller booking
            cluster = evolve(cluster, nodes=gpus // cluster.gpus_per_node)
        return evolve(base, cluster=cluster, parallel=par, training=tr, name=self.label())

    def label(self) -> str:
        sched = self.schedule.value + (f"x{self.vpp}" if self.vpp > 1 else "")
        return (f"tp{self.tp}-pp{self.pp}-dp{self.dp}-cp{self.cp}" + (f"-ep{self.ep}" if self.ep > 1 else "")
                + ("-sp" if self.sequence_parallel else "") + f"-z{int(self.zero)}-mb{self.micro_batch}-{sched}-rc:{self.recompute.value}"
                + (f"-block{self.recompute_layers}" if self.recompute_layers else "")
                + (f"-off:{self.offload.value}" if self.offload != Offload.NONE else "")
                + (f"-aoff:{self.activation_offload}" if self.activation_offload else "")
                + ("-amp" if self.autocast else "") + (f"-split:{self.split}" if self.split != "even" else "")
                + (f"-etp{self.expert_tp}" if self.expert_tp else "") + (f"-{self.precision}" if self.precision else "")
                + (f"-hsdp{self.dp_replicate}" if self.dp_replicate > 1 else "")
                + (f"-kvr{self.kv_replicator}" if self.kv_replicator > 1 else "")
                + (f"-{self.compression}" if self.compression else ""))


@functools.lru_cache(maxsize=4096)
def layer_split(layers: int, stages: int, split: str = "even", mtp: int = 0) -> tuple[int, ...] | None:
    """Layers per virtual stage under ``split`` (``SPLITS``; ``mtp``: the model's MTP modules); None
    where it gives no valid split (a middle stage without a layer; ``mtp`` without modules)."""
    if split == "mtp":
        per = -(-(layers + mtp) // stages)
        rest = layers - per * (stages - 1)
        out = (per,) * (stages - 1) + (rest,) if mtp and stages > 1 and 0 <= rest < per else None
    elif split == "even":
        out = even_split(layers, stages)
    elif split == "ends":
        per, extra = divmod(layers + 2, stages)
        out = (per - 1,) + (per,) * (stages - 2) + (per - 1,) if not extra and per >= 1 and stages > 1 else None
    elif split == "titan":
        out = stage_split(layers, stages, 1, 1)
        out = tuple(out) if out is not None else None
    else:
        raise ValueError(f"split={split!r} is not one of: {', '.join(SPLITS)}")
    if out is None or 0 in out[1:-1] or (stages == 1 and out[0] == 0):
        return None
    return out


def stage_splits(space: "SearchSpace", layers: int, stages: int, mtp: int = 0) -> list[str]:
    """The splits of ``space`` that give a valid split of ``layers`` (and ``mtp`` MTP modules) over
    ``stages``, each a different one (the first named wins a tie)."""
    if stages == 1:
        return ["even"]
    seen, out = set(), []
    for name in space.splits:
        split = layer_split(layers, stages, name, mtp)
        if split is not None and split not in seen:
            seen.add(split)
            out.append(name)
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def derive_space(base: Plan, *, uneven_pp: bool = True, max_tp: int | None = None) -> SearchSpace:
    """tp: divisors of heads, KV heads and FFN width up to the GPUs of two NVLink domains (a
    node, or a GB200/GB300 NVL72 rack: TP may span its trays at NVLink rate); pp: every
    count up to the layers, split as ``SPLITS`` say where the stages do not divide the layers
    (only the divisors of the layers without ``uneven_pp``); cp: powers of two dividing the
    sequence (1 alone with Gated DeltaNet layers, which no stack runs context-parallel, tp then
    dividing their heads too: ``linear_attention.rules``; 1 alone with DSA, whose CP is not priced); ep: divisors of the experts (MoE only);
    micro-batch: divisors of the global batch up to ``MAX_MICRO_BATCH`` sequences and
    ``MAX_MICRO_BATCH_TOKENS`` tokens (``families`` keeps those dividing a replica's share)."""
    m, la = base.model, base.model.linear_attention
    g = math.gcd(m.heads, m.kv_heads, m.ffn_hidden, *((la.num_key_heads, la.num_value_heads) if la and la.layers else ()))
    # TP across two domains at most, over their NICs: the most a published run took (vTrain's
    # GPT-18.4B at tp 16 on two DGX A100, Bang et al. 2024, vtrain_runs.csv)
    limit = max_tp or min(2 * base.cluster.nvlink_domain, base.cluster.gpus)
    pp = tuple(range(1, m.layers + 1)) if uneven_pp else tuple(_divisors(m.layers))
    return SearchSpace(
        tp=tuple(d for d in _divisors(g) if d <= limit),
        pp=pp,
        cp=tuple(c for c in CONTEXT_PARALLEL if m.seq_len % c == 0 and c <= base.cluster.gpus
                 and (c == 1 or not (la and la.layers or m.sparse_attention))),
        ep=tuple(_divisors(m.experts)) if m.moe else (1,),
        micro_batch=tuple(d for d in _divisors(base.training.global_batch)
                          if d <= MAX_MICRO_BATCH and (d == 1 or d * m.seq_len <= MAX_MICRO_BATCH_TOKENS)),
    )


def _schedules(space: SearchSpace, pp: int, layers: int, mtp: int = 0) -> list[tuple[Schedule, int, str]]:
    """(schedule, vpp, split) triples for ``pp`` stages: with pp = 1 the schedule does not
    matter; each schedule with every split of ``space`` that gives its own stages."""
    if pp == 1:
        return [(Schedule.ONE_F_ONE_B, 1, "even")]
    out = [(s, 1, split) for s in space.schedule if s not in (Schedule.INTERLEAVED_1F1B, Schedule.DUALPIPE_V)
           for split in stage_splits(space, layers, pp, mtp)]
    if Schedule.DUALPIPE_V in space.schedule and layers >= 2 * pp:   # torch's ScheduleDualPipeV: 2 stages a rank
        out.append((Schedule.DUALPIPE_V, 2, "even"))
    if Schedule.INTERLEAVED_1F1B in space.schedule:
        out += [(Schedule.INTERLEAVED_1F1B, v, split) for v in space.vpp
                for split in stage_splits(space, layers, pp * v, mtp)]
    return out


#: The training precisions a search may try, cheapest arithmetic last (``precisions_of``).
SEARCH_PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4")


def precisions_of(gpu) -> tuple[str, ...]:
    """The 16-bit and lower precisions ``gpu`` has a catalog peak for (``--precision all``)."""
    return tuple(p for p in SEARCH_PRECISIONS[1:] if gpu.peak(p))


def precision_axis(values, gpu) -> tuple[str, ...]:
    """A search's precisions from the user's list (``all``: ``precisions_of(gpu)``), each a known
    precision the GPU has a peak for, or one sentence naming the one it has not."""
    from simcore.plan.spec import PlanError

    if list(values) == ["all"]:
        return precisions_of(gpu)
    out = tuple(Precision.parse(v, "precision").value for v in values)
    if missing := [p for p in out if not gpu.peak(p)]:
        raise PlanError(f"precision={missing[0]} is not supported by {gpu.name} (its catalog entry has no "
                        f"dense_tflops.{missing[0]} peak; it has: {', '.join(precisions_of(gpu))})")
    return out


def _precisions(base: Plan, space: SearchSpace) -> list[str]:
    """The ``Layout.precision`` values of a search: '' for the base plan's own, the others where the
    GPU has a peak for them."""
    own, gpu = base.training.precision.value, base.cluster.node.gpu
    wanted = space.precision or (own,)
    return [("" if p == own else p) for p in wanted if p == own or gpu.peak(p)]


def families(base: Plan, space: SearchSpace, gpus: int) -> list[Layout]:
    """Every layout with recompute / offload left open (``evaluate_family`` picks them)."""
    m, gb = base.model, base.training.global_batch
    out = []
    precisions = _precisions(base, space)
    domain = base.cluster.nvlink_domain
    for tp, pp, cp in product(space.tp, space.pp, space.cp):
        # TP over the NICs only without a pipeline or CP: those cut the same memory with traffic
        # that crosses the NICs once a micro-batch (p2p) or overlaps (the ring), not a layer's collectives
        if gpus % (tp * pp * cp) or tp > domain and (pp > 1 or cp > 1):
            continue
        dp, kvr = gpus // (tp * pp * cp), kv_copies(tp * space.kv_replicate, m.kv_heads) if space.kv_replicate else 1
        eps = [(e, 0) for e in space.ep if (dp * cp) % e == 0]
        # MoE parallel folding: an expert group across TP ranks, the experts unsplit (expert_tp 1;
        # Liu et al. 2025, arXiv 2504.14960; Megatron-Core --expert-tensor-parallel-size 1)
        eps += [(e, 1) for e in space.ep if tp > 1 and (dp * cp) % e and (dp * cp * tp) % e == 0]
        zeros = space.zero if dp * cp > 1 else (ZeroStage.NONE,)
        sps = sorted({s and tp > 1 and (m.seq_len // cp) % tp == 0 for s in space.sequence_parallel})
        for (ep, etp), zero, mb, (sched, vpp, split), sp in product(eps, zeros, space.micro_batch,
                                                                    _schedules(space, pp, m.layers, m.mtp_layers), sps):
            if gb % (dp * mb) or sched == Schedule.DUALPIPE_V and gb // (dp * mb) < 2 * pp:   # DualPipeV: m >= 2 pp
                continue
            for prec in precisions:
                amp = space.ddp_autocast and torchtitan_autocasts(prec or base.training.precision.value, zero, tp, pp,
                                                                  cp, ep)
                lay = Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, zero=zero, schedule=sched,
                             micro_batch=mb, sequence_parallel=sp, autocast=amp, split=split, expert_tp=etp,
                             precision=prec, fp8_recipe=space.fp8_recipe if prec == "fp8" else "",
                             kv_replicator=kvr)
                lays = [lay] + ([evolve(lay, dp_replicate=r)] if True in space.hybrid and
                                (r := hybrid_replicas(base, lay)) > 1 else [])
                out += [evolve(x, compression="" if c == "none" else c) for x in lays for c in space.compression
                        if compression_applies(c, base, lay)]
    return out


def hybrid_replicas(base: Plan, lay: Layout) -> int:
    """Replicas of hybrid sharding whose shard group is one NVLink domain (dp_shard x cp x tp of
    its GPUs); 1 where the layout cannot take it (no ZeRO, DeepSpeed's, experts, a group inside
    one domain already, or no whole number of shards)."""
    domain = base.cluster.nvlink_domain
    if lay.zero == ZeroStage.NONE or lay.ep > 1 or base.parallel.zero_impl != ZeroImpl.FSDP2 \
            or domain % (lay.tp * lay.cp):
        return 1
    shard = domain // (lay.tp * lay.cp)
    if lay.dp % shard or shard * lay.cp < 2:
        return 1
    return lay.dp // shard


#: The ``parallel`` fields a search takes from its caller as the stack's switches (``base_plan``),
#: each layout where it can (``Layout.apply``): TP communication overlap with sequence parallel,
#: the distributed optimizer's overlapped parameter gather, the ZeRO implementation, the MoE
#: dispatcher, context parallel's communication.
SWITCHES = ("tp_comm_overlap", "overlap_param_gather", "zero_impl", "moe_dispatcher", "cp_comm")


def base_plan(model, cluster_doc, global_batch: int, training: dict | None = None,
              parallel: dict | None = None) -> Plan:
    """The Plan every layout derives from: ``model`` is a catalog name, a Plan ``model``
    section or a ModelSpec; ``cluster_doc`` a Plan ``cluster`` section (or a ClusterSpec);
    ``parallel`` the stack's switches (``SWITCHES``), which each layout takes where it can."""
    from simcore.plan.spec import ClusterSpec, ModelSpec, PlanError

    model_doc, spec, cluster = {"name": model} if isinstance(model, str) else model, None, None
    if isinstance(model, ModelSpec):
        spec, model_doc = model, {"name": "gpt-1.7b"}
    if isinstance(cluster_doc, ClusterSpec):
        cluster, cluster_doc = cluster_doc, {"node": cluster_doc.node.name, "nodes": 1}
    doc = {"model": model_doc, "cluster": cluster_doc, "parallel": {"tp": 1, "pp": 1, "dp": 1},
           "training": {"global_batch": global_batch, "flash_attention": True, **(training or {})}}
    probe = _cluster(cluster_doc, load_catalog(), Path("."))   # its cluster (a plan to probe would need a precision)
    if "precision" not in doc["training"]:   # mixed bf16, or fp16 where the GPU has no bf16 (V100)
        gpu = probe.node.gpu
        doc["training"]["precision"] = "bf16" if gpu.peak("bf16") or gpu.peak("fp16") is None else "fp16"
    plan = plan_from_dict(doc)
    if plan.cluster.node.calibrated:   # a CPU host's figures as all its ranks see them (they share its cores)
        gpus = probe.gpus
        every = {**doc, "parallel": {"tp": 1, "pp": 1, "dp": gpus}, "training": {**doc["training"], "global_batch": gpus}}
        plan = replace(plan, cluster=plan_from_dict(every).cluster)
    if spec is not None:
        plan = replace(plan, model=spec)
    if cluster is not None:
        plan = replace(plan, cluster=cluster)
    if parallel:
        if unknown := sorted(set(parallel) - set(SWITCHES)):
            raise PlanError(f"parallel.{unknown[0]} is not a switch a search takes (those are: {', '.join(SWITCHES)})")
        switches = _parallel({"tp": 1, "pp": 1, "dp": 1, **parallel}, plan.cluster.gpus)
        plan = replace(plan, parallel=replace(plan.parallel, **{k: getattr(switches, k) for k in parallel}))
    return plan


def _gpu_counts(plan: Plan, allow_fewer_gpus: bool) -> list[int]:
    """All the cluster's GPUs, or also halves of the nodes down to one node."""
    cl = plan.cluster
    if not allow_fewer_gpus:
        return [cl.gpus]
    nodes, out = cl.nodes, []
    while nodes >= 1:
        out.append(nodes * cl.gpus_per_node)
        if nodes % 2:
            break
        nodes //= 2
    return out
