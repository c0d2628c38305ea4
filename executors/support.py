"""The layouts this executor cannot run, each refused with one sentence naming the field.

What stays refused needs hardware or libraries a CPU host lacks (offload and fp16 need a
GPU, FP8 a GPU with FP8 tensor cores and torchao, bf16 gradient compression NCCL, TP communication overlap
CUDA's userbuffers) or a combination torch's wrappers do not compose (DDP's communication
hooks with DTensor parameters or under the zero-bubble and DualPipeV split backward, and FSDP2's
ZeRO-3 under it, which loses weight gradients); the strategies of
other stacks the model prices (DeepSpeed's ZeRO, context parallel's all-gather and Ulysses
variants, Megatron's uniform recompute groups) are not run here.
"""
from __future__ import annotations

import math

from executors.act_offload import check_activation_offload
from executors.float8 import TORCHAO_RECIPES, float8_runs
from executors.recompute import check_recompute
from simcore.plan.rules import int8_scatters, torch_rounds
from simcore.plan.spec import (CpComm, GradCompression, MoeDispatcher, Offload, Optimizer, Plan, Precision, Schedule,
                               StateDtype, ZeroImpl, ZeroStage)


def uses_replicate(plan: Plan) -> bool:
    """ZeRO 0/1 by torch's FSDP2-based ``replicate`` instead of DDP: with TP (DDP cannot hold
    DTensor parameters), and under the zero-bubble and DualPipeV schedules, whose split backward
    runs the weight gradients outside autograd's backward where DDP's reducer hooks never fire,
    while pipelining reduces a ``ReplicateModule``'s gradients itself (``stage.py`` REDUCE_GRAD)."""
    par = plan.parallel
    split = par.schedule in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V)
    return par.zero < ZeroStage.GRADIENTS and (par.tp > 1 or (split and par.pp > 1))


def _dtensor_parameters(plan: Plan) -> bool:
    """Whether the executor's parameters are DTensors: FSDP2's (ZeRO 2-3) or its ``replicate``'s."""
    return plan.parallel.zero >= ZeroStage.GRADIENTS or uses_replicate(plan)


def _split_backward_rules(plan: Plan) -> list[tuple[bool, str]]:
    """The zero-bubble and DualPipeV schedules' (a backward split into I and W)."""
    par, tr = plan.parallel, plan.training
    split = par.schedule in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V) and par.pp > 1 and par.dp * par.cp > 1
    return [
        (not split or tr.grad_compression == GradCompression.NONE,
         f"training.grad_compression needs a schedule other than {par.schedule.value}: its split backward "
         "skips DDP's communication hooks"),
        (not split or par.zero < ZeroStage.WEIGHTS,
         f"parallel.zero=3 with parallel.schedule={par.schedule.value} is priced, not run: torch 2.13's FSDP2 "
         "reshards a stage after each forward, and the weight gradients its split backward computes later "
         "are lost (the executor's update differs from the single process's; parallel.zero=2 runs it)"),
    ]


def _ddp_buckets(plan: Plan) -> int:
    """DDP buckets of the first pipeline rank's gradients (``simcore.model.ddp_hooks``)."""
    from simcore.model import ddp_hooks, param_layout as pl

    params = [p for part in pl.stage_parts(plan, 0) for p in pl.part_params(plan.model, part)]
    return len(ddp_hooks.bucket_members([ddp_hooks.FP32 * math.prod(p.shape) for p in params]))


def _optimizer_rules(plan: Plan) -> list[tuple[bool, str]]:
    from simcore.plan.choices import ONEBIT_OPTIMIZERS   # DeepSpeed's 1-bit Adam, 1-bit LAMB, 0/1 Adam

    tr = plan.training
    return [
        (tr.optimizer != Optimizer.ADAMW8BIT, "training.optimizer=adamw8bit is priced, not run: its 8-bit states "
         "need bitsandbytes' CUDA kernels or torchao's compiled ones, which the executor does not install"),
        (tr.optimizer not in ONEBIT_OPTIMIZERS, f"training.optimizer={tr.optimizer.value} is priced, not run: it is "
         "DeepSpeed's optimizer (its NCCL backend packs signs with CuPy), and the executor does not run DeepSpeed"),
        (tr.optimizer != Optimizer.ADAFACTOR or not _dtensor_parameters(plan), "training.optimizer=adafactor "
         "is priced, not run, with DTensor parameters (parallel.tp>1, zero>=2, or split-backward pipelining): "
         "torch.optim.Adafactor's factored statistics fail on sharded DTensors"),
    ]


def _model_rules(plan: Plan) -> list[tuple[bool, str]]:
    m = plan.model
    return [(m.mtp_layers == 0, f"model.mtp_layers={m.mtp_layers} is priced, not run: the executor builds no "
             "multi-token-prediction modules (as transformers builds none); run it with model.mtp_layers: 0"),
            (m.linear_attention is None, "model.linear_attention is priced, not run: the executor's blocks are softmax "
             "attention only (no Gated DeltaNet layer, no attention output gate)"),
            (m.sparse_attention is None, "model.sparse_attention is priced, not run: the executor's blocks are dense "
             "softmax attention (no DSA indexer, no sparse attention kernel)")]


def block_note(plan: Plan) -> str:
    """A sentence where the Plan's block (``model.norm``, ``bias``, ``activation``, ``qk_norm``,
    ``attention_sinks``: ``simcore.plan.model_props``) is not the one ``executors.model`` builds
    (``built_block``): the run trains that block, the prediction prices the Plan's ('' where they
    are the same)."""
    from executors.model import built_block

    m = plan.model
    differ = [f"model.{k}={getattr(getattr(m, k), 'value', getattr(m, k))}" for k, v in built_block(m).items()
              if getattr(m, k) != v]
    return (f"the executor builds its own block ({', '.join(differ)} are priced, not built: it runs "
            f"{'RMSNorm' if m.gated_mlp else 'LayerNorm without its shift'}, no linear biases, "
            f"{'SwiGLU' if m.gated_mlp else 'GeLU'}, no QK norm, no sinks)") if differ else ""


def _kv_copies_rule(plan: Plan) -> tuple[bool, str]:
    r = plan.parallel.kv_replicator
    return r == 1, (f"parallel.kv_replicator={r} is priced, not run: the executor's attention splits the key/value "
                    "heads it has (NeuronX Distributed's copies and kv shared group are not built)")


def _fp8_rules(plan: Plan, device_type: str) -> list[tuple[bool, str]]:
    """torchao's float8 (``executors.float8``): where it runs, its recipes, and its FP8 all-gather."""
    par, tr = plan.parallel, plan.training
    return [
        (tr.precision != Precision.FP8 or float8_runs(device_type),
         "training.precision=fp8 needs torchao (torchao.float8) and an FP8 GEMM (torch._scaled_mm) on this device: "
         "a GPU with FP8 tensor cores, or a CPU under torch>=2.13"),
        (tr.precision != Precision.FP8 or tr.fp8_recipe in TORCHAO_RECIPES,
         f"training.fp8_recipe={tr.fp8_recipe.value} is priced, not run: the executor's FP8 is torchao's "
         "(fp8_recipe: tensorwise or rowwise)"),
        (tr.precision != Precision.FP8 or par.tp == 1, "training.precision=fp8 runs with parallel.tp=1: torchao's "
         "float8 tensor-parallel styles are not applied by the executor"),
        (not tr.fp8_param_gather or par.zero >= ZeroStage.GRADIENTS, "training.fp8_param_gather with parallel.zero=1 "
         "is priced, not run: the executor's ZeRO-1 broadcasts fp32 parameters; torchao gathers FP8 weights under "
         "FSDP2 (parallel.zero: 2 or 3)"),
        (not tr.fp8_param_gather or not plan.model.moe, "training.fp8_param_gather runs on dense models in the "
         "executor (its MoE router is no FP8 linear layer, and expert-parallel weights are not FSDP2's)"),
    ]


def check_executable(plan: Plan, device_type: str) -> None:
    """The layouts this executor cannot run; ValueError with one sentence each."""
    par, tr = plan.parallel, plan.training
    gloo_powersgd = tr.grad_compression == GradCompression.POWERSGD and device_type != "cuda"
    buckets = _ddp_buckets(plan) if gloo_powersgd else 1
    rules = [
        *_model_rules(plan), _kv_copies_rule(plan), *_fp8_rules(plan, device_type),
        (tr.offload == Offload.NONE or device_type == "cuda",
         f"training.offload={tr.offload.value} needs an accelerator: FSDP2's CPU offload moves "
         "state off a GPU, and this host has none"),
        (tr.offload == Offload.NONE or par.zero >= ZeroStage.GRADIENTS,
         f"training.offload={tr.offload.value} needs parallel.zero>=2 (FSDP2's CPUOffloadPolicy)"),
        (tr.offload != Offload.OPTIMIZER, "training.offload=optimizer is priced, not run: FSDP2's CPUOffloadPolicy "
         "keeps the parameters and gradients on the host too (training.offload: optimizer+params)"),
        (tr.precision not in (Precision.MXFP8, Precision.NVFP4),
         f"training.precision={tr.precision.value} is not supported by the executor (needs Transformer Engine)"),
        (tr.precision != Precision.FP16 or device_type == "cuda",
         "training.precision=fp16 needs a GPU (its grad scaler guards fp16 gradients there); use bf16 on a CPU"),
        (par.tp == 1 or tr.grad_compression == GradCompression.NONE or par.dp * par.cp == 1 or int8_scatters(plan),
         "training.grad_compression needs parallel.tp=1: DDP's communication hooks cannot "
         "wrap DTensor parameters"),
        *_split_backward_rules(plan),
        (tr.grad_compression == GradCompression.NONE or par.zero == 0 or par.dp * par.cp == 1 or int8_scatters(plan),
         f"training.grad_compression={tr.grad_compression.value} with parallel.zero={int(par.zero)} is priced, "
         "not run: the executor's ZeRO and FSDP2 reduce the fp32 gradients autocast keeps"),
        (tr.grad_compression != GradCompression.BF16 or device_type == "cuda",
         "training.grad_compression=bf16 needs a GPU: torch's bf16 compression hook requires NCCL"),
        (buckets <= 1, f"training.grad_compression=powersgd on gloo needs the gradients in one DDP bucket (this "
         f"model's fill {buckets}): torch's powerSGD_hook issues each bucket's later all-reduces from completion "
         "callbacks, whose order gloo does not keep across ranks (a collective mismatch)"),
    ]
    rules += [
        (not tr.activation_offload or device_type == "cuda", "training.activation_offload needs a GPU: it "
         "moves saved activations from device memory to pinned host memory, where a CPU rank's already are"),
        (not par.overlap_param_gather, "parallel.overlap_param_gather is priced, not run: the executor's "
         "ZeroRedundancyOptimizer broadcasts the parameters after the step"),
        (not par.tp_comm_overlap, "parallel.tp_comm_overlap is not run by the executor: overlapping TP's "
         "collectives with the GEMMs needs CUDA (Transformer Engine's userbuffers, torch's symmetric memory)"),
        (par.cp == 1 or par.cp_comm == CpComm.P2P, f"parallel.cp_comm={par.cp_comm.value} is not run by the "
         "executor: its context parallelism is the ring (p2p)"),
        (par.zero_impl == ZeroImpl.FSDP2, "parallel.zero_impl=deepspeed is priced, not run: the executor runs "
         "ZeRO as torch's FSDP2 (zero_impl: fsdp2)"),
        (par.dp_replicate == 1 or par.zero >= ZeroStage.GRADIENTS and par.cp == 1,
         f"parallel.dp_replicate={par.dp_replicate} runs with parallel.zero 2 or 3 and cp 1 (FSDP2 on a (replicate, "
         "shard) mesh); Megatron's ZeRO-1 instances and a context-parallel shard group are priced, not run"),
        (par.stage_layers is None or 0 not in par.stage_layers, "parallel.stage_layers with a stage of 0 "
         "layers (the embedding or the loss alone) is priced, not run by the executor"),
        (par.etp == par.tp, f"parallel.expert_tp={par.expert_tp} is priced, not run: the executor's experts are "
         "split over the tp ranks and its ep ranks come from dp x cp (expert_tp = tp)"),
        (not tr.optimizer_in_backward, "training.optimizer_in_backward is priced, not run: the executor steps "
         "its optimizer after the backward"),
        *_optimizer_rules(plan),
        (par.moe_dispatcher == MoeDispatcher.ALLTOALL, "parallel.moe_dispatcher=deepep is priced, not run: the "
         "executor dispatches tokens with all_to_all_single (moe_dispatcher: alltoall)"),
        (not par.moe_a2a_overlap, "parallel.moe_a2a_overlap is priced, not run: torch's pipeline schedules run one "
         "micro-batch's forward or backward at a time"),
        (tr.moe_routing.value == "balanced", f"training.moe_routing={tr.moe_routing.value} is priced, not run: the "
         "executor's MoE routes by its own gate"),
        (not tr.attention_unpad, "training.attention_unpad is priced, not run: the executor's attention is "
         "SDPA on the whole batch"),
        (par.microbatch_group in (0, plan.num_microbatches // torch_rounds(par.pp, plan.num_microbatches)),
         f"parallel.microbatch_group={par.microbatch_group} is priced, not run: torch's ScheduleInterleaved1F1B "
         "runs max(1, micro-batches // pp) rounds of equal groups"),
        (tr.optimizer_state_dtype == StateDtype.FP32, f"training.optimizer_state_dtype={tr.optimizer_state_dtype.value} "
         "is priced, not run: torch's AdamW keeps its moments in the parameters' dtype"),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(message)
    check_recompute(tr)
    check_activation_offload(tr)
