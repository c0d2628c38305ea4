"""The plans every export test runs on: the shipped plans and layout variants that reach
the branches they do not (ZeRO 0-3, offload, fp16/bf16/fp8, TP/PP/CP/EP, interleaved and
uneven stages, MoE with shared experts, hybrid sharding)."""
from dataclasses import replace
from pathlib import Path

from simcore.plan.load import load_plan, plan_from_dict
from simcore.plan.spec import CpComm, Kernels, Offload, Precision, Schedule, ZeroImpl, ZeroStage

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "plans").glob("*.yaml"))
EXAMPLES = ROOT / "examples"


def _mixtral() -> object:
    return plan_from_dict({
        "model": {"hf_config": str(EXAMPLES / "hf" / "mixtral-8x7b" / "config.json"), "seq_len": 4096},
        "cluster": {"node": "dgx-h100", "nodes": 8},
        "parallel": {"tp": 2, "pp": 4, "dp": 8, "ep": 4, "zero": 1, "sequence_parallel": True},
        "training": {"global_batch": 256, "micro_batch": 1, "recompute": "full", "flash_attention": True}})


def _qwen_moe() -> object:
    return plan_from_dict({
        "model": {"hf_config": str(EXAMPLES / "hf" / "qwen2-57b-a14b" / "config.json"), "seq_len": 4096},
        "cluster": {"node": "dgx-h100", "nodes": 4},
        "parallel": {"tp": 2, "pp": 2, "dp": 8, "ep": 8, "zero": 1, "sequence_parallel": True},
        "training": {"global_batch": 128, "recompute": "selective", "flash_attention": True}})


def _variants() -> dict:
    base = load_plan(ROOT / "plans" / "llama3-8b-fsdp-h100.yaml")
    par, tr = base.parallel, base.training
    out = {
        "v-zero2-offload-fp8": replace(base, parallel=replace(par, zero=ZeroStage.GRADIENTS),
                                       training=replace(tr, offload=Offload.OPTIMIZER, precision=Precision.FP8)),
        "v-zero3-paramoffload": replace(base, training=replace(tr, offload=Offload.OPTIMIZER_PARAMS)),
        "v-zero3-eager": replace(base, training=replace(tr, kernels=Kernels.EAGER)),
        "v-zero3-optim-in-bwd": replace(base, training=replace(tr, optimizer_in_backward=True,
                                                               global_batch=base.parallel.dp * tr.micro_batch)),
        "v-pp-uneven": replace(base, parallel=replace(par, pp=4, dp=2, zero=ZeroStage.NONE, stage_layers=(7, 9, 9, 7))),
        "v-zero-bubble-cp": replace(base, parallel=replace(par, pp=2, cp=2, dp=2, vpp=2, schedule=Schedule.ZERO_BUBBLE)),
        "v-interleaved-tp": replace(base, parallel=replace(par, tp=2, pp=2, dp=2, vpp=2, zero=ZeroStage.NONE,
                                                           sequence_parallel=True,
                                                           schedule=Schedule.INTERLEAVED_1F1B)),
        "v-zero1-fp16-tp-cp": replace(base, parallel=replace(par, tp=2, cp=2, dp=2, zero=ZeroStage.OPTIMIZER_STATES,
                                                             sequence_parallel=True),
                                      training=replace(tr, precision=Precision.FP16)),
        "v-ddp-pp-even": replace(base, parallel=replace(par, pp=4, dp=2, zero=ZeroStage.NONE)),
        # hybrid sharding (parallel.dp_replicate): FSDP2's HSDP, Megatron's distributed-optimizer instances
        "v-hsdp-zero3": replace(base, parallel=replace(par, dp_replicate=2)),
        "v-hsdp-zero1": replace(base, parallel=replace(par, zero=ZeroStage.OPTIMIZER_STATES, dp_replicate=4)),
        "v-mixtral-ep": _mixtral(),
        # DeepSpeed's own ZeRO (the ds_config export refuses FSDP2's ZeRO-2/3), its offload branches and
        # DeepSpeed-Ulysses for a sequence split
        "v-ds-zero3-paramoffload": replace(base, parallel=replace(par, zero_impl=ZeroImpl.DEEPSPEED),
                                           training=replace(tr, offload=Offload.OPTIMIZER_PARAMS)),
        "v-ds-zero2-offload": replace(base, parallel=replace(par, zero=ZeroStage.GRADIENTS, zero_impl=ZeroImpl.DEEPSPEED),
                                      training=replace(tr, offload=Offload.OPTIMIZER)),
        "v-ds-zero1-fp16-tp-ulysses": replace(base, parallel=replace(par, tp=2, cp=2, dp=2, zero=ZeroStage.OPTIMIZER_STATES,
                                                                     sequence_parallel=True, cp_comm=CpComm.A2A,
                                                                     zero_impl=ZeroImpl.DEEPSPEED),
                                              training=replace(tr, precision=Precision.FP16)),
    }
    out = {name: replace(plan, name=name) for name, plan in out.items()}
    out["v-qwen2-moe"] = replace(_qwen_moe(), name="v-qwen2-moe")
    return out


VARIANTS = _variants()
ALL = {p.stem: load_plan(p) for p in PLANS} | VARIANTS
