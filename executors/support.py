"""The layouts this executor cannot run, each refused with one sentence naming the field.

What stays refused needs hardware or libraries a CPU host lacks (offload and fp16 need a
GPU, FP8 needs torchao's kernels, bf16 gradient compression NCCL) or a combination torch's
wrappers do not compose (DDP's communication hooks with DTensor parameters or under
the zero-bubble split backward).
"""
from __future__ import annotations

from simcore.plan.spec import GradCompression, Offload, Plan, Precision, Schedule, ZeroStage


def check_executable(plan: Plan, device_type: str) -> None:
    """The layouts this executor cannot run; ValueError with one sentence each."""
    par, tr = plan.parallel, plan.training
    rules = [
        (tr.offload == Offload.NONE or device_type == "cuda",
         f"training.offload={tr.offload.value} needs an accelerator: FSDP2's CPU offload moves "
         "state off a GPU, and this host has none"),
        (tr.offload == Offload.NONE or par.zero >= ZeroStage.GRADIENTS,
         f"training.offload={tr.offload.value} needs parallel.zero>=2 (FSDP2's CPUOffloadPolicy)"),
        (tr.precision != Precision.FP8, "training.precision=fp8 is not supported by the executor (needs torchao)"),
        (tr.precision != Precision.FP16 or device_type == "cuda",
         "training.precision=fp16 needs a GPU (its grad scaler guards fp16 gradients there); use bf16 on a CPU"),
        (par.tp == 1 or tr.grad_compression == GradCompression.NONE or par.dp * par.cp == 1,
         "training.grad_compression needs parallel.tp=1: DDP's communication hooks cannot "
         "wrap DTensor parameters"),
        (par.schedule != Schedule.ZERO_BUBBLE or par.pp == 1 or tr.grad_compression == GradCompression.NONE
         or par.dp * par.cp == 1,
         "training.grad_compression needs a schedule other than zero-bubble: its split backward "
         "skips DDP's communication hooks"),
        (tr.grad_compression != GradCompression.BF16 or device_type == "cuda",
         "training.grad_compression=bf16 needs a GPU: torch's bf16 compression hook requires NCCL"),
    ]
    for ok, message in rules:
        if not ok:
            raise ValueError(message)
