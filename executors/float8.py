"""FP8 linear layers through torchao's float8 training (``torchao.float8``), as torchtitan's
float8 converter applies them (torchtitan/components/quantization/float8.py): every
``nn.Linear`` of the model but the output head swapped for ``Float8Linear`` with dynamic
scales, per tensor (``tensorwise``) or per row (``rowwise``); the rest of the model runs in
bf16 under autocast (``executors.parallel.Trainer.autocast``). Under ``training.fp8_param_gather``
FSDP2 gathers the weights in FP8 (torchao's ``enable_fsdp_float8_all_gather``: the shard is cast
before the all-gather, one byte a weight) and their scales are computed once after each optimizer
step (``precompute_float8_dynamic_scale_for_fsdp``: one all-reduce of every weight's amax), as
torchtitan's ``enable_fsdp_float8_all_gather`` and ``precompute_float8_dynamic_scale_for_fsdp``
run them. Needs torchao and ``torch._scaled_mm`` on the device: a GPU with FP8 tensor cores
(compute capability 8.9 or later) or, since torch 2.13, the CPU's kernel (``float8_runs``);
``executors.support`` refuses the plan in one sentence otherwise.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging

import torch
from torch import nn

from simcore.plan.spec import Fp8Recipe, Plan

#: torchao's recipe names for the Plan's recipes it runs (delayed and Transformer Engine's
#: current scaling are Transformer Engine's, not torchao's).
TORCHAO_RECIPES = {Fp8Recipe.TENSORWISE: "tensorwise", Fp8Recipe.ROWWISE: "rowwise"}
#: FP8 GEMMs need both dimensions of the weight divisible by 16 (cuBLASLt's FP8 rule, which
#: torchtitan's module filter checks).
FP8_DIM_MULTIPLE = 16
#: Smallest compute capability with FP8 tensor cores (Ada 8.9, Hopper 9.0).
FP8_MIN_CAPABILITY = (8, 9)


def torchao_available() -> bool:
    return importlib.util.find_spec("torchao") is not None


def _float8():
    """``torchao.float8``, imported with torchao's log of C++ extensions it could not load kept
    quiet (its wheel's kernels are built for CUDA torch; float8 training is Python over
    ``torch._scaled_mm``)."""
    log = logging.getLogger("torchao")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import torchao.float8 as float8
    finally:
        log.setLevel(level)
    return float8


@functools.cache
def float8_runs(device_type: str) -> bool:
    """Whether torchao's float8 training can run on ``device_type``: torchao installed, and an
    FP8 GEMM (``torch._scaled_mm``) there: a GPU of ``FP8_MIN_CAPABILITY``, or a CPU whose torch
    has the kernel (2.13 has)."""
    if not torchao_available():
        return False
    if device_type == "cuda":
        return torch.cuda.is_available() and torch.cuda.get_device_capability() >= FP8_MIN_CAPABILITY
    try:
        a, one = torch.zeros(FP8_DIM_MULTIPLE, FP8_DIM_MULTIPLE, dtype=torch.float8_e4m3fn), torch.ones(())
        torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except (RuntimeError, NotImplementedError, AttributeError):
        return False
    return True


def _convertible(module: nn.Module, fqn: str) -> bool:
    """torchtitan's default filter: linear layers with FP8-sized weights, not the output head."""
    return (isinstance(module, nn.Linear) and not fqn.endswith("output")
            and module.in_features % FP8_DIM_MULTIPLE == 0 and module.out_features % FP8_DIM_MULTIPLE == 0)


def apply_float8(module: nn.Module, recipe: Fp8Recipe, all_gather: bool = False) -> nn.Module:
    """Swap ``module``'s linear layers (``_convertible``) for torchao's ``Float8Linear`` in place;
    ``all_gather``: their weights gathered in FP8 by FSDP2 (tensorwise only, torchao's rule)."""
    float8 = _float8()
    config = float8.Float8LinearConfig.from_recipe_name(TORCHAO_RECIPES[recipe])
    if all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    return float8.convert_to_float8_training(module, config=config, module_filter_fn=_convertible)


def precompute_scales(plan: Plan, parts: list[nn.Module]) -> None:
    """After the optimizer step under ``training.fp8_param_gather``: each part's FP8-gathered weights'
    scales, from one all-reduce of their amax (nothing where FSDP2 shards no weight)."""
    if plan.training.fp8_param_gather:
        precompute = _float8().precompute_float8_dynamic_scale_for_fsdp
        for part in parts:
            precompute(part)
