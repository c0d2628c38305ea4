"""The cross-field rules of a Plan: ``check_plan`` raises PlanError naming the first one
broken (``simcore.plan.load`` applies it to every Plan it builds)."""
from __future__ import annotations

import math

from simcore.plan import linear_attention, sparse_attention
from simcore.plan.choices import ONEBIT_OPTIMIZERS
from simcore.plan.spec import (ONEBIT_FREEZE_STEP, AttentionKernel, CpComm, Fp8Recipe, FsdpRoot, GradCompression,
                               MoeDispatcher, Offload, Optimizer, Plan, PlanError, Precision, Recompute, Schedule,
                               StateDtype, ZeroImpl, ZeroStage)


def _fsdp_root_rule(plan: Plan) -> tuple[bool, str]:
    """``parallel.fsdp_root`` other than ``resharded`` names FSDP2 ZeRO-3 groups around the loss."""
    par = plan.parallel
    ok = par.fsdp_root == FsdpRoot.RESHARDED or (par.zero == ZeroStage.WEIGHTS and par.zero_impl == ZeroImpl.FSDP2
                                                 and par.pp == 1 and par.dp * par.cp > 1)
    if par.fsdp_root == FsdpRoot.OUTPUT_KEPT and plan.model.tied_embeddings:
        return False, "parallel.fsdp_root=output_kept needs an untied output (its group and the embedding's are two)"
    return ok, (f"parallel.fsdp_root={par.fsdp_root.value} needs FSDP2 ZeRO-3 over data parallel ranks without a "
                "pipeline (parallel.zero=3, zero_impl=fsdp2, pp=1, dp*cp > 1)")


def torch_rounds(pp: int, microbatches: int) -> int:
    """The rounds of torch.distributed.pipelining's looped schedules (ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble, torch/distributed/pipelining/schedules.py ``number_of_rounds``):
    max(1, micro-batches // pp); they refuse micro-batches that are not a multiple of it."""
    return max(1, microbatches // pp)


def _schedule_rules(plan: Plan) -> list[tuple[bool, str]]:
    """The pipeline schedule's: virtual stages, and the micro-batches its looped forms take
    (Megatron's interleaved rule, m a multiple of its micro-batch group, pp by default; torch's
    rounds rule for zero-bubble; DualPipeV's two stages a rank and m >= 2 pp, as torch's
    ``ScheduleDualPipeV`` constructor checks them)."""
    par, m = plan.parallel, plan.num_microbatches
    rounds, group = torch_rounds(par.pp, m), par.microbatch_group
    dual = par.schedule == Schedule.DUALPIPE_V
    return [
        (par.vpp == 1 or par.schedule in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V),
         f"parallel.vpp={par.vpp} needs parallel.schedule interleaved-1f1b, zero-bubble or dualpipev, "
         f"not {par.schedule.value}"),
        # torch's ScheduleDualPipeV.__init__: "exactly 2 stages per rank", "at least as many microbatches as stages"
        (not dual or par.vpp == 2, f"parallel.schedule=dualpipev needs parallel.vpp=2, not {par.vpp} (torch's "
                                   "ScheduleDualPipeV runs exactly 2 stages per rank, placed as a V)"),
        (not dual or par.pp > 1, "parallel.schedule=dualpipev needs parallel.pp > 1"),
        (not dual or m >= 2 * par.pp, f"the dualpipev schedule needs at least as many micro-batches per step ({m}) "
                                      f"as stages (2 x parallel.pp = {2 * par.pp}), as torch's ScheduleDualPipeV does"),
        (par.vpp == 1 or par.pp > 1, "parallel.vpp > 1 needs parallel.pp > 1"),
        (par.schedule != Schedule.INTERLEAVED_1F1B or par.pp == 1 or group or m % par.pp == 0,
         f"the interleaved schedule needs the micro-batches per step ({m}) to be a multiple of parallel.pp={par.pp}"),
        (not group or par.schedule == Schedule.INTERLEAVED_1F1B and par.vpp > 1 and par.zero <= 1,
         f"parallel.microbatch_group={group} needs parallel.schedule interleaved-1f1b with parallel.vpp > 1 and "
         "parallel.zero <= 1 (Megatron's schedule; FSDP under a pipeline runs torch's, whose groups are its rounds)"),
        # Megatron-Core (pipeline_parallel/schedules.py): pp <= N <= m; an uneven last group is not modelled
        (not group or par.pp <= group <= m and m % group == 0,
         f"parallel.microbatch_group={group} must divide the micro-batches per step ({m}) and be at least "
         f"parallel.pp={par.pp}"),
        (par.schedule != Schedule.ZERO_BUBBLE or m % rounds == 0,
         f"the zero-bubble schedule needs the micro-batches per step ({m}) to be a multiple of "
         f"max(1, micro-batches // parallel.pp) = {rounds} (torch's rounds rule)"),
    ]


def check_plan(plan: Plan) -> None:
    """Every cross-field rule of a Plan; raises PlanError naming the first one broken (first the
    bounds no run could pass, ``simcore.plan.bounds``)."""
    from simcore.plan.bounds import check_bounds

    check_bounds(plan)
    m, par, tr, cl = plan.model, plan.parallel, plan.training, plan.cluster
    rules = [
        (m.heads % m.kv_heads == 0, f"model.kv_heads={m.kv_heads} does not divide model.heads={m.heads}"),
        (m.kv_channels or m.hidden % m.heads == 0,
         f"model.heads={m.heads} does not divide model.hidden={m.hidden} (or give model.kv_channels)"),
        (not (m.dense_layers or m.shared_ffn_hidden or m.dense_ffn_hidden) or m.moe,
         "model.dense_layers, dense_ffn_hidden and shared_ffn_hidden need an MoE model (model.experts > 0)"),
        (m.dense_layers < m.layers, f"model.dense_layers={m.dense_layers} must be fewer than model.layers={m.layers}"),
        (not m.mla or m.qk_rope_head_dim > 0 and m.v_head_dim > 0 and m.kv_channels > 0,
         "model.kv_lora_rank (multi-latent attention) needs model.kv_channels, qk_rope_head_dim and v_head_dim"),
        (m.heads % par.tp == 0, f"parallel.tp={par.tp} does not divide model.heads={m.heads}"),
        *_kv_head_rules(plan),
        (m.ffn_hidden % par.tp == 0, f"parallel.tp={par.tp} does not divide model.ffn_hidden={m.ffn_hidden}"),
        (m.top_k <= m.experts, f"model.top_k={m.top_k} exceeds model.experts={m.experts}"),
        (not m.experts or m.top_k >= 1, f"model.top_k must be at least 1 when model.experts={m.experts}"),
        (par.gpus <= cl.gpus, f"plan needs {par.gpus} GPUs (tp*pp*dp*cp) but cluster has {cl.gpus}"),
        *_domain_rules(plan),
        (cl.nodes == 1 or cl.fabric is not None or cl.gpus <= cl.nvlink_domain,   # one NVLink / UB / ICI domain
         f"cluster.nodes={cl.nodes} needs a network: cluster.node={cl.node.name} has no fabric, set cluster.fabric"),
        (tr.global_batch % (par.dp * tr.micro_batch) == 0,
         f"training.global_batch={tr.global_batch} is not a multiple of parallel.dp*training.micro_batch"
         f"={par.dp * tr.micro_batch}"),
        (m.seq_len % par.cp == 0, f"parallel.cp={par.cp} does not divide model.seq_len={m.seq_len}"),
        (not par.sequence_parallel or par.tp > 1, "parallel.sequence_parallel needs parallel.tp > 1"),
        (not par.sequence_parallel or (m.seq_len // par.cp) % par.tp == 0,
         f"parallel.tp={par.tp} does not divide the sequence per context rank ({m.seq_len // par.cp}) "
         "as sequence_parallel needs"),
        (not par.overlap_param_gather or (par.zero == ZeroStage.OPTIMIZER_STATES and par.zero_impl == ZeroImpl.FSDP2),
         "parallel.overlap_param_gather needs parallel.zero=1 with parallel.zero_impl=fsdp2 "
         "(Megatron's distributed optimizer)"),
        (not par.tp_comm_overlap or par.sequence_parallel,
         "parallel.tp_comm_overlap needs parallel.sequence_parallel (Megatron-Core overlaps SP's all-gathers "
         "and reduce-scatters with the GEMMs)"),
        (par.zero_impl == ZeroImpl.FSDP2 or par.zero >= ZeroStage.OPTIMIZER_STATES,
         "parallel.zero_impl=deepspeed needs parallel.zero 1, 2 or 3"),
        (par.zero_impl == ZeroImpl.FSDP2 or par.pp == 1 or par.zero <= ZeroStage.OPTIMIZER_STATES,
         f"parallel.zero_impl=deepspeed with parallel.pp={par.pp} needs parallel.zero 0 or 1 "
         "(DeepSpeed's pipeline engine runs ZeRO-1 at most)"),
        (par.ep == 1 or m.experts > 0, f"parallel.ep={par.ep} needs an MoE model (model.experts > 0)"),
        (par.moe_dispatcher == MoeDispatcher.ALLTOALL or m.experts > 0,
         "parallel.moe_dispatcher=deepep needs an MoE model (model.experts > 0)"),
        (par.ep == 1 or m.experts % par.ep == 0,
         f"parallel.ep={par.ep} does not divide model.experts={m.experts}"),
        (par.etp != par.tp or par.ep == 1 or (par.dp * par.cp) % par.ep == 0,
         f"parallel.ep={par.ep} does not divide parallel.dp*cp={par.dp * par.cp} (expert ranks come from them)"),
        *_expert_tp_rules(plan), *_moe_overlap_rules(plan), _fsdp_root_rule(plan), *_zeropp_rules(plan), *_hsdp_rules(plan),
        *_moe_layer_rules(m), *_schedule_rules(plan), *linear_attention.rules(plan), *sparse_attention.rules(plan),
        (0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout} must be at least 0 and below 1"),
        (0.0 < m.sliding_window_layers <= 1.0,
         f"model.sliding_window_layers={m.sliding_window_layers} must be a share of the layers in (0, 1]"),
        (par.stage_layers is not None or m.layers >= par.pp * par.vpp,
         f"model.layers={m.layers} gives fewer than one layer per virtual stage (pp*vpp={par.pp * par.vpp})"),
        *_training_rules(plan),
    ]
    for ok, message in rules:
        if not ok:
            raise PlanError(message)
    if par.stage_layers is not None:
        stages = par.pp * par.vpp
        if len(par.stage_layers) != stages:
            raise PlanError(f"parallel.stage_layers has {len(par.stage_layers)} entries but pp*vpp={stages}")
        if 0 in par.stage_layers[1:-1] or (len(par.stage_layers) == 1 and par.stage_layers[0] == 0):
            raise PlanError("parallel.stage_layers may be 0 only on the first and the last virtual stage (the "
                            "embedding or the loss alone: Megatron's account_for_embedding/loss_in_pipeline_split)")
        if sum(par.stage_layers) != m.layers:
            raise PlanError(f"parallel.stage_layers adds up to {sum(par.stage_layers)}, "
                            f"not model.layers={m.layers}")
    gpu = cl.node.gpu
    if gpu.name != "uncalibrated-host" and gpu.peak(tr.precision.value) is None:
        raise PlanError(f"training.precision={tr.precision.value} is not supported by {gpu.name} "
                        f"(its catalog entry has no dense_tflops.{tr.precision.value} peak)")


def _expert_tp_rules(plan: Plan) -> list[tuple[bool, str]]:
    """``parallel.expert_tp`` (MoE parallel folding): an MoE model, a divisor of tp, the
    expert grid ep x expert_tp inside tp x cp x dp, and sequence parallel under TP."""
    par, m = plan.parallel, plan.model
    if not par.expert_tp or par.expert_tp == par.tp:
        return []
    return [
        (m.experts > 0, f"parallel.expert_tp={par.expert_tp} needs an MoE model (model.experts > 0)"),
        (par.tp % par.expert_tp == 0, f"parallel.expert_tp={par.expert_tp} must divide parallel.tp={par.tp}"),
        ((par.tp * par.cp * par.dp) % (par.ep * par.expert_tp) == 0,
         f"parallel.ep*expert_tp={par.ep * par.expert_tp} must divide parallel.tp*cp*dp="
         f"{par.tp * par.cp * par.dp} (the folded expert grid)"),
        (par.sequence_parallel, f"parallel.expert_tp={par.expert_tp} below parallel.tp={par.tp} needs "
                                "parallel.sequence_parallel (Megatron-Core's MoE under TP)"),
    ]


def _moe_overlap_rules(plan: Plan) -> list[tuple[bool, str]]:
    """``parallel.moe_a2a_overlap`` as Megatron-Core's TransformerConfig checks
    ``overlap_moe_expert_parallel_comm`` (megatron/core/transformer/transformer_config.py
    @d98e8a64): expert parallel, interleaving under a pipeline, no full recompute, a 16-bit
    model; and ``training.moe_routing`` on an MoE model."""
    par, tr, m = plan.parallel, plan.training, plan.model
    rules = [(tr.moe_routing.value == "balanced" or m.experts > 0,
              f"training.moe_routing={tr.moe_routing.value} needs an MoE model (model.experts > 0)")]
    if not par.moe_a2a_overlap:
        return rules
    return rules + [
        (par.ep > 1, "parallel.moe_a2a_overlap needs expert parallelism (parallel.ep > 1)"),
        (par.pp == 1 or par.vpp > 1 and not par.v_shape, f"parallel.moe_a2a_overlap with parallel.pp={par.pp} needs "
         "the interleaved schedule (parallel.vpp > 1), as Megatron-Core's combined 1F1B does"),
        (tr.recompute not in (Recompute.FULL, Recompute.LAYER),
         f"parallel.moe_a2a_overlap needs training.recompute other than {tr.recompute.value} (whole layers "
         "recomputed re-run the all-to-alls it pairs)"),
        (tr.precision.value != "fp32", "parallel.moe_a2a_overlap needs a 16-bit model (training.precision not fp32)"),
    ]


def _training_rules(plan: Plan) -> list[tuple[bool, str]]:
    """The rules of the ``training`` section's choices against the rest of the Plan."""
    par, tr, m, gpu = plan.parallel, plan.training, plan.model, plan.cluster.node.gpu
    return [
        (tr.attention_kernel == AttentionKernel.AUTO or tr.flash_attention,
         f"training.attention_kernel={tr.attention_kernel.value} needs training.flash_attention=true"),
        (not tr.attention_unpad or tr.flash_attention, "training.attention_unpad=true needs training.flash_attention=true"),
        (tr.fp8_recipe == Fp8Recipe.DELAYED or tr.precision == Precision.FP8,
         f"training.fp8_recipe={tr.fp8_recipe.value} applies to training.precision=fp8, not {tr.precision.value}"),
        (tr.offload != Offload.OPTIMIZER_PARAMS or par.zero == ZeroStage.WEIGHTS,
         "training.offload=optimizer+params needs parallel.zero=3 (FSDP2 offloads sharded parameters)"),
        (tr.offload == Offload.NONE or gpu.vendor == "cpu" or gpu.host_bytes_per_s > 0,
         f"training.offload={tr.offload.value} moves states over the host link, whose bandwidth "
         f"(pcie_gbyte_per_s_bidir) is a gap in the catalog entry of the GPU: {gpu.name}"),
        (tr.recompute not in (Recompute.FULL, Recompute.LAYER) or tr.recompute_layers <= m.layers,
         f"training.recompute's {tr.recompute_layers} layers exceed model.layers={m.layers}"),
        (tr.master_weights or tr.precision.value in ("bf16", "fp16"),
         f"training.master_weights=false needs a 16-bit training.precision, not {tr.precision.value}"),
        (not tr.autocast or (tr.precision.value in ("bf16", "fp16") and tr.master_weights),
         f"training.autocast casts fp32 parameters to a 16-bit training.precision (bf16 or fp16, with "
         f"master_weights), not {tr.precision.value}{'' if tr.master_weights else ' without master weights'}"),
        (not tr.autocast or (par.zero <= ZeroStage.OPTIMIZER_STATES and par.pp == 1),
         "training.autocast runs over replicated fp32 parameters on one pipeline stage (DDP, ZeRO-1: "
         "parallel.zero<=1, parallel.pp=1); FSDP casts through its MixedPrecisionPolicy instead"),
        (not tr.optimizer_in_backward or (plan.num_microbatches == 1 and par.pp == 1 and (
            par.dp * par.cp == 1 or (par.zero >= ZeroStage.GRADIENTS and par.zero_impl == ZeroImpl.FSDP2))),
         "training.optimizer_in_backward needs one micro-batch per step, parallel.pp=1 and, with data "
         "parallel, FSDP2 (parallel.zero>=2): each gradient is stepped and freed as the backward makes it"),
        (tr.activation_offload <= m.layers,
         f"training.activation_offload={tr.activation_offload} exceeds model.layers={m.layers}"),
        (not tr.activation_offload or (gpu.vendor != "cpu" and gpu.host_bytes_per_s > 0),
         f"training.activation_offload moves activations from a GPU to host memory; cluster.node="
         f"{plan.cluster.node.name} has no host link to move them over (a CPU host's activations are in host memory)"),
        (not tr.activation_offload or par.pp == 1,
         f"training.activation_offload={tr.activation_offload} needs parallel.pp=1 (Megatron-Core refuses CPU "
         "offloading with pipeline parallelism, transformer_config.py; torchtune's offloading has no pipeline)"),
        (tr.grad_compression != GradCompression.POWERSGD or par.zero == ZeroStage.NONE,
         "training.grad_compression=powersgd needs parallel.zero=0 (it is a DDP communication hook)"),
        (not tr.grad_compression.bits or par.zero == ZeroStage.NONE or int8_scatters(plan),
         f"training.grad_compression={tr.grad_compression.value} needs parallel.zero=0, not {int(par.zero)}: it is a DDP communication "
         "hook (executors.int8_hook); int8 and int4, without error feedback, also run as FSDP2's reduce-scatter "
         "(parallel.zero 2-3, zero_impl fsdp2, ep=1)"),
        (tr.optimizer not in ONEBIT_OPTIMIZERS or par.zero == ZeroStage.NONE and tr.grad_compression ==
         GradCompression.NONE and par.ep == 1, f"training.optimizer={tr.optimizer.value} needs parallel.zero=0 "
         f"(DeepSpeed: \"{ONEBIT_OPTIMIZERS.get(tr.optimizer)} is not compatible with ZeRO\"), "
         "training.grad_compression=none (it compresses its own all-reduces) and parallel.ep=1 (its one "
         "data-parallel group cannot reduce experts apart)"),
        (tr.optimizer in ONEBIT_OPTIMIZERS or tr.onebit_freeze_step == ONEBIT_FREEZE_STEP,
         "training.onebit_freeze_step is 1-bit Adam's warm-up (1-bit LAMB's freeze_step, 0/1 Adam's "
         "var_freeze_step): set training.optimizer=onebit_adam, onebit_lamb or zero_one_adam"),
        (not tr.fp8_param_gather or fp8_gather_runs(tr.precision, par.zero_impl, par.zero, tr.fp8_recipe),
         "training.fp8_param_gather needs training.precision=fp8 with parallel.zero=1 (Megatron's distributed "
         "optimizer keeps the fp32 weights it re-quantizes) or FSDP2 (zero 2-3) with training.fp8_recipe=tensorwise "
         "(torchao's float8 all-gather)"),
        (tr.optimizer_state_dtype == StateDtype.FP32 or tr.optimizer in (Optimizer.ADAMW, Optimizer.ADAM)
         and tr.master_weights and not tr.autocast, f"training.optimizer_state_dtype={tr.optimizer_state_dtype.value} "
         "needs optimizer adamw or adam with master weights (the precision-aware Adam of Transformer Engine)"),
    ]


def int8_scatters(plan) -> bool:
    """Whether ``training.grad_compression: int8`` (``int4``) runs as FSDP2's reduce-scatter
    (``executors.int8_hook`` ``Int8ReduceScatter``): ZeRO-2/3 on FSDP2, one data-parallel group of
    parameters (no experts' own); under hybrid sharding (``dp_replicate``) the quantized reduce-scatter
    runs over the shard group and FSDP2's own all-reduce over the replicas follows it in the reduce
    dtype (torch 2.13's ``FSDPModule`` replaces the reduce-scatter and the all-gather only:
    ``set_custom_reduce_scatter``, no custom all-reduce); ``int8_ef`` never (its residual would be the
    unsharded gradient, which ZeRO-2/3 shard away)."""
    par = plan.parallel
    return plan.training.grad_compression in (GradCompression.INT8, GradCompression.INT4) and \
        fsdp2_one_group(par.zero, par.zero_impl, par.ep)


def fsdp2_one_group(zero: ZeroStage, zero_impl: ZeroImpl, ep: int) -> bool:
    """FSDP2's ZeRO-2/3 over one group of parameters (no experts' own): the layouts whose
    reduce-scatter the quantized one replaces (``int8_scatters``; the search's ``compression.applies``)."""
    return zero >= ZeroStage.GRADIENTS and zero_impl == ZeroImpl.FSDP2 and ep == 1


def fp8_gather_runs(precision: Precision, zero_impl: ZeroImpl, zero: ZeroStage, recipe: Fp8Recipe) -> bool:
    """Whether a layout can gather its weights in FP8 (``training.fp8_param_gather``): fp8 training with
    Megatron's distributed optimizer (zero 1) or FSDP2 (zero 2-3) under torchao's tensorwise recipe."""
    return precision == Precision.FP8 and zero_impl == ZeroImpl.FSDP2 and (
        zero == ZeroStage.OPTIMIZER_STATES or zero >= ZeroStage.GRADIENTS and recipe == Fp8Recipe.TENSORWISE)


def _moe_layer_rules(m) -> list[tuple[bool, str]]:
    """``model.moe_layers``: an MoE model's, one way to place the dense layers, valid indices."""
    return [
        (not m.moe_layers or m.moe, "model.moe_layers needs an MoE model (model.experts > 0)"),
        (not m.moe_layers or not m.dense_layers, "model.moe_layers and model.dense_layers are two ways to place the "
         "dense layers: give one"),
        (list(m.moe_layers) == sorted(set(m.moe_layers)) and all(0 <= i < m.layers for i in m.moe_layers),
         f"model.moe_layers must be increasing layer indices from 0 to model.layers-1={m.layers - 1}"),
    ]


def _zeropp_rules(plan: Plan) -> list[tuple[bool, str]]:
    """ZeRO++ (Wang et al. 2023, arXiv 2306.10209) as DeepSpeed runs it: a ZeRO-3 feature whose
    groups are built over the whole world (deepspeed/utils/groups.py
    ``_create_zero_param_parallel_group``: contiguous ranks; runtime/comm/coalesced_collectives.py
    ``all_to_all_quant_reduce``: the world by node), i.e. over the data-parallel ranks only where
    no model parallelism shares the world."""
    par, cl = plan.parallel, plan.cluster
    on = [name for name, v in (("zero_quantized_weights", par.zero_quantized_weights),
                               ("zero_hpz_partition_size", par.zero_hpz_partition_size != 1),
                               ("zero_quantized_gradients", par.zero_quantized_gradients)) if v]
    if not on:
        return []
    hpz = par.zero_hpz_partition_size
    return [
        (par.zero == ZeroStage.WEIGHTS and par.zero_impl == ZeroImpl.DEEPSPEED,
         f"parallel.{on[0]} (ZeRO++) needs parallel.zero=3 with parallel.zero_impl=deepspeed"),
        (par.tp == par.pp == par.cp == 1,
         f"parallel.{on[0]} (ZeRO++) needs parallel.tp=pp=cp=1: DeepSpeed builds its groups over the whole "
         "world, which is the data-parallel group only without model parallelism"),
        (hpz >= 1 and par.gpus % min(hpz, par.gpus) == 0,
         f"parallel.zero_hpz_partition_size={hpz} does not divide the {par.gpus} GPUs into secondary groups"),
        (not par.zero_quantized_gradients or par.gpus % cl.gpus_per_node == 0,
         f"parallel.zero_quantized_gradients needs whole nodes ({par.gpus} GPUs on {cl.gpus_per_node}-GPU nodes): "
         "its all-to-alls run inside each node, then across them"),
    ]


def _hsdp_rules(plan: Plan) -> list[tuple[bool, str]]:
    """Hybrid sharding (``parallel.dp_replicate``): replicas of what ZeRO shards, as FSDP2 on a
    (replicate, shard) mesh and Megatron's distributed-optimizer instances run it."""
    par = plan.parallel
    r = par.dp_replicate
    if r == 1:
        return []
    return [
        (par.dp % r == 0, f"parallel.dp_replicate={r} does not divide parallel.dp={par.dp}"),
        (par.dp % r or par.shard_ranks > 1, f"parallel.dp_replicate={r} leaves each shard on one rank: that is "
                                            "replication, parallel.zero=0"),
        (par.zero >= ZeroStage.OPTIMIZER_STATES,
         f"parallel.dp_replicate={r} needs parallel.zero 1, 2 or 3 (it replicates what ZeRO shards)"),
        (par.zero_impl == ZeroImpl.FSDP2,
         f"parallel.dp_replicate={r} needs parallel.zero_impl=fsdp2 (DeepSpeed's hybrid shards, MiCS, are not modelled)"),
        (par.ep == 1, f"parallel.dp_replicate={r} with parallel.ep={par.ep} is not modelled (the experts' data-parallel "
                      "group would shard differently)"),
    ]


def kv_copies(ranks: int, kv_heads: int) -> int:
    """The fewest copies of each key/value head that give each of ``ranks`` TP ranks whole heads."""
    return ranks // math.gcd(ranks, kv_heads)


def _kv_head_rules(plan: Plan) -> list[tuple[bool, str]]:
    """The key/value heads a TP rank holds: tp divides them, or ``parallel.kv_replicator`` copies them as
    NeuronX Distributed does (its two asserts on ``kv_size_multiplier``, src/neuronx_distributed/modules/
    qkv_linear.py @fbac349b ``GQAQKVColumnParallelLinear.__init__``); Ulysses splits a rank's heads over cp."""
    m, par = plan.model, plan.parallel
    r = par.kv_replicator
    local = m.kv_heads * r // par.tp
    a2a = (par.cp_comm != CpComm.A2A or (m.heads // par.tp) % par.cp == 0 and local % par.cp == 0,
           f"parallel.cp_comm=a2a needs parallel.cp={par.cp} to divide the heads per TP rank "
           f"({m.heads // par.tp} query, {local} key/value): Ulysses splits heads over the cp ranks")
    if r == 1:
        return [(m.kv_heads % par.tp == 0,
                 f"parallel.tp={par.tp} does not divide model.kv_heads={m.kv_heads} (parallel.kv_replicator copies "
                 "the key/value heads across the TP ranks, as NeuronX Distributed does)"), a2a]
    return [
        (not m.mla, f"parallel.kv_replicator={r} needs grouped-query attention: multi-latent attention "
                    "(model.kv_lora_rank) has no key/value heads to replicate"),
        (par.tp % r == 0, f"parallel.kv_replicator={r} does not divide parallel.tp={par.tp} "
                          "(each key/value head's copies form a kv shared group inside the TP group)"),
        (m.kv_heads * r % par.tp == 0,
         f"parallel.tp={par.tp} does not divide model.kv_heads x parallel.kv_replicator = {m.kv_heads} x {r} "
         f"= {m.kv_heads * r} (the replicated key/value heads split evenly over the TP ranks)"),
        (m.heads % (m.kv_heads * r) == 0,
         f"model.kv_heads x parallel.kv_replicator = {m.kv_heads * r} does not divide model.heads={m.heads} "
         "(each rank's query heads share its key/value heads evenly: examples/training/llama/modeling_llama_nxd.py "
         "num_key_value_groups)"), a2a,
    ]


def _domain_rules(plan: Plan) -> list[tuple[bool, str]]:
    """The rules of ``cluster.nvlink_domain_gpus``: whole nodes, and NVLink switches to span several."""
    cl = plan.cluster
    domain = cl.nvlink_domain_gpus
    return [
        (not domain or domain % cl.gpus_per_node == 0,
         f"cluster.nvlink_domain_gpus={domain} must be a multiple of "
         f"cluster.gpus_per_node={cl.gpus_per_node} (an NVLink domain is whole nodes)"),
        (not domain or domain <= cl.gpus_per_node or cl.node.intra in ("nvswitch", "torus"),
         f"cluster.nvlink_domain_gpus={domain} spans several nodes, which needs NVLink switches or a torus "
         f"(cluster.node={cl.node.name} has intra {cl.node.intra})"),
    ]


def plan_warnings(plan: Plan) -> list[str]:
    """Sentences for a valid Plan that asks something the catalog cannot vouch for: a model
    made longer or deeper than the catalog entry of that name was trained (the prediction
    then extrapolates). Empty when nothing is odd. (Warnings on the prediction itself, a
    step or memory beyond reason, are ``simcore.planner.sanity``'s.)"""
    from topologies.hardware import load_catalog

    m = plan.model
    entry = load_catalog().models.get(m.name)
    out = []
    if isinstance(entry, dict):
        for key, what in (("seq_len", "its trained context"), ("layers", "its published depth")):
            ref = entry.get(key)
            if isinstance(ref, int) and getattr(m, key) > ref:
                out.append(f"model.{key}={getattr(m, key):,} is {getattr(m, key) / ref:,.3g}x {what} "
                           f"({ref:,} in the catalog's {m.name}): the prediction extrapolates")
    return out
