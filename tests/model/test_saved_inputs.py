"""The inputs linear layers keep for their weight gradients: quantized under Transformer
Engine's low-precision recipes, 16-bit under torchao's float8 and in BF16 training."""
from __future__ import annotations

import pytest

from simcore.engine.predict import simulate
from simcore.model import workload as wl
from simcore.plan.load import plan_from_dict


def _acts(precision, recipe="delayed", node="dgx-h100"):
    training = {"global_batch": 64, "flash_attention": True, "precision": precision}
    if precision == "fp8":
        training["fp8_recipe"] = recipe
    plan = plan_from_dict({"model": "llama3-70b", "cluster": {"node": node, "nodes": 8},
                           "parallel": {"tp": 8, "pp": 4, "dp": 2, "sequence_parallel": True},
                           "training": training})
    return simulate(plan).memory_bytes["activations"]


def test_te_recipes_keep_quantized_linear_inputs_and_torchao_keeps_16_bit():
    bf16 = _acts("bf16")
    assert _acts("fp8", "tensorwise") == bf16 == _acts("fp8", "rowwise")
    delayed, current = _acts("fp8", "delayed"), _acts("fp8", "current")
    assert delayed == current < bf16
    assert _acts("nvfp4", node="dgx-b200") < _acts("mxfp8", node="dgx-b200") < _acts("bf16", node="dgx-b200")


def test_the_layer_saves_four_linear_inputs_at_the_given_width():
    # per layer, one micro-batch: QKV and FC1 inputs (h each), the projection input
    # (attention width) and the FC2 input (ffn width) change with the saved width; the rest not
    m = plan_from_dict({"model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 1},
                        "training": {"global_batch": 8}}).model
    b, s = 1, 4096
    two, one = (wl.activation_bytes_per_layer(m, b=b, s=s, flash=True, gemm_input=g) for g in (2.0, 1.0))
    linear_inputs = s * b * (2 * m.hidden + wl.attention_out_width(m) + m.ffn_hidden)
    assert two - one == pytest.approx(linear_inputs)
    assert wl.saved_gemm_input_bytes("bf16", "delayed") == wl.ACT_BYTES
    assert wl.saved_gemm_input_bytes("mxfp8", "delayed") == pytest.approx(1 + 1 / 32)
