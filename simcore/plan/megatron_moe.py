"""Megatron-LM's --moe-layer-freq read as the Plan's MoE layer fields (split from
``simcore.plan.megatron_reader``, which re-exports them)."""
from __future__ import annotations

import ast

from simcore.plan.spec import PlanError


def moe_layer_pattern(freq: str, layers: int) -> list[int]:
    """Megatron's --moe-layer-freq as a per-layer pattern (1 MoE, 0 dense), as arguments.py
    ``moe_freq_type`` and gpt_layer_specs.py read it (@d98e8a64): an integer N puts an MoE layer
    at every index divisible by N; a list expression ("([0]*3+[1]*58)", "([1,0]*24)") is the
    pattern, read here without eval (list literals of 0/1, ``*`` by an integer, ``+``)."""
    text = freq.strip()
    if text.isdigit():
        n = int(text)
        if n < 1:
            raise PlanError(f"megatron --moe-layer-freq={freq!r} must be a positive integer or a list expression")
        return [1 if i % n == 0 else 0 for i in range(layers)]
    try:
        pattern = _pattern(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError):
        raise PlanError(f"megatron --moe-layer-freq={freq!r} is neither an integer nor a list expression of "
                        "0s and 1s (as '([0]*3+[1]*58)')") from None
    if len(pattern) != layers:
        raise PlanError(f"megatron --moe-layer-freq={freq!r} gives {len(pattern)} layers, not --num-layers={layers}")
    return pattern


def _pattern(node) -> list[int]:
    if isinstance(node, ast.List) and all(isinstance(e, ast.Constant) and e.value in (0, 1) for e in node.elts):
        return [int(e.value) for e in node.elts]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _pattern(node.left) + _pattern(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        times = node.right if isinstance(node.right, ast.Constant) else node.left
        seq = node.left if times is node.right else node.right
        if isinstance(times, ast.Constant) and isinstance(times.value, int) and 0 <= times.value <= 100_000:
            return _pattern(seq) * times.value
    raise ValueError("not a list expression of 0s and 1s")


def _moe_layer_fields(pattern: list[int]) -> dict:
    """``model.dense_layers`` where the dense layers are the first ones, else ``model.moe_layers``."""
    k = pattern.index(1) if 1 in pattern else len(pattern)
    if pattern == [0] * k + [1] * (len(pattern) - k):
        return {"model.dense_layers": k or None}
    return {"model.moe_layers": [i for i, v in enumerate(pattern) if v]}
