"""Export to DeepSpeed: the plain-JSON ds_config (Hugging Face ``TrainingArguments(deepspeed=)``,
accelerate's ``DeepSpeedPlugin``, Megatron-DeepSpeed), and the layouts DeepSpeed cannot run.

A ds_config holds the batch, precision, ZeRO stage and offload; tp, pp and the sequence split are
Megatron-DeepSpeed's (or the model code's). What DeepSpeed runs differently from the plan is
refused, so that a plan ranked for DeepSpeed (``trainplan plan --stack deepspeed``) is charged
DeepSpeed's physics: its own ZeRO-2/3 (``parallel.zero_impl: deepspeed``, not FSDP2's), its pipeline
engine's one schedule (deepspeed/runtime/pipe/schedule.py ``TrainSchedule``, 1F1B; no interleaved
or zero-bubble form) and, for a sequence split, DeepSpeed-Ulysses' all-to-all
(deepspeed/sequence/layer.py ``DistributedAttention``; Megatron-DeepSpeed ``--ds-sequence-parallel-size``).
"""
from __future__ import annotations

import json

from simcore.plan.spec import CpComm, Plan, Schedule, ZeroImpl, ZeroStage

_DEEPSPEED_SRC = ("deepspeedai/DeepSpeed deepspeed/runtime/constants.py (088be892), "
                  "zero/config.py (1b88ac36), zero/offload_config.py (1978617c), 2025")


def deepspeed_config(plan: Plan) -> dict:
    """The ds_config.json object for this plan."""
    tr, par = plan.training, plan.parallel
    _layout_refusals(plan)
    cfg: dict = {"train_batch_size": tr.global_batch, "train_micro_batch_size_per_gpu": tr.micro_batch,
                 "gradient_accumulation_steps": plan.num_microbatches}
    if tr.precision.value in ("fp8", "mxfp8", "nvfp4"):
        raise _refuse("training.precision", tr.precision.value,
                      f"{tr.precision.value.upper()} comes from Transformer Engine layers")
    if tr.precision.value in ("bf16", "fp16"):
        cfg[tr.precision.value] = {"enabled": True}
    zero: dict = {"stage": int(par.zero)}
    if tr.offload.value != "none":
        if par.zero == 0:
            raise ValueError(f"training.offload={tr.offload.value} needs parallel.zero >= 1 in DeepSpeed "
                             "(ZeRO-Offload)")
        zero["offload_optimizer"] = {"device": "cpu"}
        if tr.offload.value == "optimizer+params":
            zero["offload_param"] = {"device": "cpu"}
    cfg["zero_optimization"] = zero
    if tr.grad_compression.value in ("fp16", "bf16"):
        cfg["communication_data_type"] = tr.grad_compression.value
    elif tr.grad_compression.value != "none":
        raise _refuse("training.grad_compression", tr.grad_compression.value)
    if tr.optimizer_in_backward:
        raise _refuse("training.optimizer_in_backward", "true")
    if tr.activation_offload:
        raise _refuse("training.activation_offload", tr.activation_offload,
                      "it offloads only checkpointed activations (activation_checkpointing.cpu_checkpointing)")
    if tr.optimizer_state_dtype.value != "fp32":
        raise _refuse("training.optimizer_state_dtype", tr.optimizer_state_dtype.value)
    if tr.optimizer.value in ("sgd", "adamw8bit", "adafactor"):
        raise _refuse("training.optimizer", tr.optimizer.value,
                      "its optimizer types have none; pass the optimizer to deepspeed.initialize")
    cfg["optimizer"] = ({"type": "AdamW"} if tr.optimizer.value == "adamw"
                        else {"type": "Adam", "params": {"adam_w_mode": False}})
    return cfg


def export_deepspeed(plan: Plan) -> str:
    """Plain JSON: Hugging Face ``TrainingArguments(deepspeed=path)``, accelerate's
    ``DeepSpeedPlugin(hf_ds_config=path)``, Megatron-DeepSpeed and ``json.load`` take no
    comments (DeepSpeed itself reads hjson); the notes go to stderr (``export_with_notes``)."""
    return json.dumps(deepspeed_config(plan), indent=2) + "\n"


def deepspeed_notes(plan: Plan) -> list[str]:
    par = plan.parallel
    return [f"DeepSpeed config for plan '{plan.name or plan.model.name}'; keys as spelt in {_DEEPSPEED_SRC}",
            f"not held in a ds_config: the model, tp={par.tp} pp={par.pp} cp={par.cp} (set by Megatron-DeepSpeed "
            "or the model code), recompute and flash attention; the optimizer's lr goes in optimizer.params"]


def _refuse(field_: str, value, why: str = "") -> ValueError:
    return ValueError(f"{field_}={value} has no DeepSpeed config option" + (f": {why}" if why else ""))


def _layout_refusals(plan: Plan) -> None:
    """What DeepSpeed runs otherwise than the plan says (the module's docstring)."""
    par = plan.parallel
    if par.zero >= ZeroStage.GRADIENTS and par.zero_impl != ZeroImpl.DEEPSPEED:
        raise _refuse("parallel.zero_impl", par.zero_impl.value, f"DeepSpeed runs its own ZeRO-{int(par.zero)} "
                      "(parallel.zero_impl: deepspeed models it)")
    if par.pp > 1 and par.schedule != Schedule.ONE_F_ONE_B:
        raise _refuse("parallel.schedule", par.schedule.value, "its pipeline engine runs one 1F1B schedule "
                      "(deepspeed/runtime/pipe/schedule.py TrainSchedule)")
    if par.moe_a2a_overlap:
        raise _refuse("parallel.moe_a2a_overlap", "true", "Megatron-Core's combined 1F1B schedule pairs the all-to-alls")
    if plan.training.moe_routing.value != "balanced":
        raise _refuse("training.moe_routing", plan.training.moe_routing.value, "NeMo AutoModel's fake gate routes so")
    if par.cp > 1 and par.cp_comm != CpComm.A2A:
        raise _refuse("parallel.cp_comm", par.cp_comm.value, "its sequence parallelism is DeepSpeed-Ulysses' "
                      "all-to-all (parallel.cp_comm: a2a)")
