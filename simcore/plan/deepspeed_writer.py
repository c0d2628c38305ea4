"""Export to DeepSpeed: the plain-JSON ds_config (Hugging Face ``TrainingArguments(deepspeed=)``,
accelerate's ``DeepSpeedPlugin``, Megatron-DeepSpeed), and the layouts DeepSpeed cannot run.

A ds_config holds the batch, precision, ZeRO stage and offload, and tensor parallel as AutoTP
(``tensor_parallel.autotp_size``, DeepSpeed >= 0.16.4: deepspeed/runtime/tensor_parallel/config.py
``TPTrainingConfig``, engine.py ``_configure_tensor_parallel``; docs/_tutorials/autotp-training.md).
It cannot state the other splits, so a plan with them is refused, never written as data parallel:
pipeline stages are ``PipelineModule(num_stages=)`` in the model code (deepspeed/runtime/pipe/module.py;
the config's ``pipeline.stages`` is read by nothing), experts' ``ep_size`` an argument of
``deepspeed.moe.layer.MoE``, and DeepSpeed-Ulysses' sequence split the model's attention wrapper
(deepspeed/sequence/layer.py ``DistributedAttention``). AutoTP's row-parallel layers all-reduce whole
activations (deepspeed/module_inject/layers.py ``LinearAllreduce``): no Megatron-style sequence parallel.
What DeepSpeed runs differently from the plan is refused too, so that a plan ranked for DeepSpeed
(``trainplan plan --stack deepspeed``) is charged DeepSpeed's physics: its own ZeRO-2/3
(``parallel.zero_impl: deepspeed``, not FSDP2's), and no hybrid sharding (``parallel.dp_replicate``:
DeepSpeed's is MiCS, ``mics_shard_size``, not modelled). Sources at DeepSpeed v0.19.5 (cf443004, 2026-08-09),
which also runs AutoTP under ZeRO-3 (eec237ee; 0.16.4 to 0.19.3 assert stage <= 2).
"""
from __future__ import annotations

import json

from simcore.plan.choices import ONEBIT_OPTIMIZERS
from simcore.plan.spec import Plan, ZeroImpl, ZeroStage

_DEEPSPEED_SRC = ("deepspeedai/DeepSpeed deepspeed/runtime/constants.py (088be892), "
                  "zero/config.py (1b88ac36), zero/offload_config.py (1978617c), 2025; "
                  "tensor_parallel/config.py (v0.19.5, cf443004)")


#: ZeRO++'s zero_optimization keys, the Plan's parallel fields of the same names.
ZEROPP_KEYS = ("zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients")


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
    for key in ZEROPP_KEYS:   # ZeRO++ (DeepSpeed docs/_tutorials/zeropp.md), where the plan turns it on
        value = getattr(par, key)
        if value is True or (not isinstance(value, bool) and value != 1):
            zero[key] = value
    cfg["zero_optimization"] = zero
    if par.tp > 1:   # AutoTP shards the model's linear layers at deepspeed.initialize
        cfg["tensor_parallel"] = {"autotp_size": par.tp}
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
    if tr.optimizer.value in ONEBIT_TYPES:   # DeepSpeed's 1-bit optimizers and their warm-up
        kind, step = ONEBIT_TYPES[tr.optimizer.value]
        cfg["optimizer"] = {"type": kind, "params": {step: tr.onebit_freeze_step}}
    else:
        cfg["optimizer"] = {"type": "AdamW"} if tr.optimizer.value == "adamw" else \
            {"type": "Adam", "params": {"adam_w_mode": False}}
    return cfg


#: DeepSpeed's 1-bit optimizers as a ds_config names them (``optimizer.type``, matched lower-cased by
#: runtime/config.py; docs/_tutorials/onebit-adam.md, onebit-lamb.md, zero-one-adam.md @edaa7221) and the
#: parameter ``training.onebit_freeze_step`` is: 1-bit Adam's and LAMB's ``freeze_step``, 0/1 Adam's
#: ``var_freeze_step``.
ONEBIT_TYPES = {"onebit_adam": ("OneBitAdam", "freeze_step"), "onebit_lamb": ("OneBitLamb", "freeze_step"),
                "zero_one_adam": ("ZeroOneAdam", "var_freeze_step")}


def export_deepspeed(plan: Plan) -> str:
    """Plain JSON: Hugging Face ``TrainingArguments(deepspeed=path)``, accelerate's
    ``DeepSpeedPlugin(hf_ds_config=path)``, Megatron-DeepSpeed and ``json.load`` take no
    comments (DeepSpeed itself reads hjson); the notes go to stderr (``export_with_notes``)."""
    return json.dumps(deepspeed_config(plan), indent=2) + "\n"


def deepspeed_notes(plan: Plan) -> list[str]:
    par = plan.parallel
    notes = [f"DeepSpeed config for plan '{plan.name or plan.model.name}'; keys as spelt in {_DEEPSPEED_SRC}",
             "not held in a ds_config: the model, recompute and flash attention; the optimizer's lr goes in "
             "optimizer.params"]
    if par.tp > 1:
        notes.append(f"tp={par.tp} is AutoTP (tensor_parallel.autotp_size): DeepSpeed >= 0.16.4"
                     + (", >= 0.19.5 under ZeRO-3" if par.zero == ZeroStage.WEIGHTS else "")
                     + "; every rank of a TP group must be fed the same batch")
    if plan.training.optimizer in ONEBIT_OPTIMIZERS:   # pip's deepspeed 0.19.8 wheel holds no runtime/fp16/onebit
        notes.append(f"optimizer {ONEBIT_OPTIMIZERS[plan.training.optimizer]} needs DeepSpeed 0.19.6 or earlier: "
                     "0.19.8 has no 1-bit optimizers (runtime/fp16/onebit is gone, its engine takes the type for "
                     "a torch.optim class and fails)")
    return notes


def _refuse(field_: str, value, why: str = "") -> ValueError:
    return ValueError(f"{field_}={value} has no DeepSpeed config option" + (f": {why}" if why else ""))


def _layout_refusals(plan: Plan) -> None:
    """What a ds_config cannot state, or DeepSpeed runs otherwise than the plan says (the module's docstring)."""
    par = plan.parallel
    if par.dp_replicate > 1:   # first: whatever else the plan says, DeepSpeed has no HSDP to write
        raise _refuse("parallel.dp_replicate", par.dp_replicate, "DeepSpeed's hybrid sharding is MiCS "
                      "(zero_optimization.mics_shard_size), which the Plan does not model")
    if par.zero >= ZeroStage.GRADIENTS and par.zero_impl != ZeroImpl.DEEPSPEED:
        raise _refuse("parallel.zero_impl", par.zero_impl.value, f"DeepSpeed runs its own ZeRO-{int(par.zero)} "
                      "(parallel.zero_impl: deepspeed models it)")
    if par.pp > 1:
        raise _refuse("parallel.pp", par.pp, "the pipeline's stages are PipelineModule(num_stages=) in the model "
                      "code (deepspeed/runtime/pipe/module.py)")
    if par.cp > 1:
        raise _refuse("parallel.cp", par.cp, "DeepSpeed-Ulysses' sequence split wraps the model's attention "
                      "(deepspeed/sequence/layer.py DistributedAttention)")
    if par.ep > 1:
        raise _refuse("parallel.ep", par.ep, "expert parallel is the ep_size of the model code's "
                      "deepspeed.moe.layer.MoE")
    if par.tp > 1 and par.sequence_parallel:
        raise _refuse("parallel.sequence_parallel", "true", "AutoTP's row-parallel layers all-reduce whole "
                      "activations (deepspeed/module_inject/layers.py LinearAllreduce)")
    if plan.model.moe and par.etp != par.tp:
        raise _refuse("parallel.expert_tp", par.etp, f"AutoTP splits every linear layer {par.tp} ways")
    if par.moe_a2a_overlap:
        raise _refuse("parallel.moe_a2a_overlap", "true", "Megatron-Core's combined 1F1B schedule pairs the all-to-alls")
    if plan.training.moe_routing.value != "balanced":
        raise _refuse("training.moe_routing", plan.training.moe_routing.value, "NeMo AutoModel's fake gate routes so")
