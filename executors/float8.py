"""FP8 linear layers through torchao's float8 training (``torchao.float8``), as torchtitan's
float8 converter applies them (torchtitan/components/quantization/float8.py): every
``nn.Linear`` of the model but the output head swapped for ``Float8Linear`` with dynamic
scales, per tensor (``tensorwise``) or per row (``rowwise``); the rest of the model runs in
bf16 under autocast (``executors.parallel.Trainer.autocast``). Needs a GPU with FP8 tensor
cores (compute capability 8.9 or later) and torchao installed; ``executors.support`` refuses
the plan in one sentence otherwise.
"""
from __future__ import annotations

import importlib.util

from torch import nn

from simcore.plan.spec import Fp8Recipe

#: torchao's recipe names for the Plan's recipes it runs (delayed and Transformer Engine's
#: current scaling are Transformer Engine's, not torchao's).
TORCHAO_RECIPES = {Fp8Recipe.TENSORWISE: "tensorwise", Fp8Recipe.ROWWISE: "rowwise"}
#: FP8 GEMMs need both dimensions of the weight divisible by 16 (cuBLASLt's FP8 rule, which
#: torchtitan's module filter checks).
FP8_DIM_MULTIPLE = 16


def torchao_available() -> bool:
    return importlib.util.find_spec("torchao") is not None


def _convertible(module: nn.Module, fqn: str) -> bool:
    """torchtitan's default filter: linear layers with FP8-sized weights, not the output head."""
    return (isinstance(module, nn.Linear) and not fqn.endswith("output")
            and module.in_features % FP8_DIM_MULTIPLE == 0 and module.out_features % FP8_DIM_MULTIPLE == 0)


def apply_float8(module: nn.Module, recipe: Fp8Recipe) -> nn.Module:
    """Swap ``module``'s linear layers (``_convertible``) for torchao's ``Float8Linear`` in place."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(TORCHAO_RECIPES[recipe])
    return convert_to_float8_training(module, config=config, module_filter_fn=_convertible)
