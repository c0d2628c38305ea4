"""MXFP8 and NVFP4 (``training.precision``): only the blocks' linear layers run in them, they
pay their casts and cached copies, and no plan wins for nothing (hypothesis draws layouts)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import compute as cmp
from simcore.model import workload as wl
from simcore.model import memory as mem
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError

MODELS = ("gpt-1.7b", "llama3-8b", "llama2-13b", "llama3-70b")
BLACKWELL = ("dgx-b200", "gb200-nvl72", "hgx-b300", "gb300-nvl72")
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


def _doc(model, node, precision, *, tp=1, pp=1, zero=1, recompute="none", gpus=64):
    return {"model": {"name": model, "seq_len": 4096}, "cluster": {"node": node, "nodes": gpus // 8 if
                                                                   node.startswith(("dgx", "hgx")) else gpus // 4},
            "parallel": {"tp": tp, "pp": pp, "dp": gpus // (tp * pp), "zero": zero, "sequence_parallel": tp > 1},
            "training": {"global_batch": 512, "precision": precision, "recompute": recompute,
                         "flash_attention": True}}


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(BLACKWELL), precision=st.sampled_from(["mxfp8", "nvfp4"]),
       tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1, 3]),
       recompute=st.sampled_from(["none", "full"]))
def test_block_scaled_precision_gains_less_than_its_gemms_do(model, node, precision, tp, pp, zero, recompute):
    """Attention, norms, the output layer and the communication stay 16-bit and the casts
    are extra: the step gains less than the format's GEMM peak ratio over BF16."""
    try:
        bf16, low = (plan_from_dict(_doc(model, node, p, tp=tp, pp=pp, zero=zero, recompute=recompute))
                     for p in ("bf16", precision))
    except PlanError:
        return
    dev = cmp.device_model(low.cluster.node.gpu, precision)
    gemm_gain = dev.linear_peak_flops * dev.fp8_matmul_ratio / dev.peak_flops
    assert gemm_gain >= 2.0   # the datasheet ratio: FP8 2x, FP4 4x or more of BF16 on Blackwell
    assert simulate(bf16).step_time_s / simulate(low).step_time_s < gemm_gain


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(BLACKWELL), tp=st.sampled_from([1, 2, 8]),
       zero=st.sampled_from([0, 1]))
def test_block_scaled_copies_cost_memory_and_fp4_is_smaller(model, node, tp, zero):
    """Each linear weight is cached rowwise and columnwise with its block scales: MXFP8 holds
    more than BF16 does, NVFP4 (half-byte elements, one scale per 16) less than MXFP8."""
    try:
        plans = [plan_from_dict(_doc(model, node, p, tp=tp, zero=zero)) for p in ("bf16", "mxfp8", "nvfp4")]
    except PlanError:
        return
    cached = [mem.comm_buffer_terms(p, mem.stage_params(p)[0])["fp8_weights"] for p in plans]
    assert cached[0] == 0.0 < cached[2] < cached[1]


def test_block_scaled_precisions_leave_attention_and_the_output_layer_at_16_bit():
    plan = plan_from_dict(_doc("llama3-8b", "gb200-nvl72", "bf16"))
    gpu = plan.cluster.node.gpu
    bf16, mx, nv = (cmp.device_model(gpu, p) for p in ("bf16", "mxfp8", "nvfp4"))
    ops = {op.name: op for op in wl.layer_forward_ops(plan.model, b=1, s=8192, flash=True)
           + wl.logits_forward_ops(plan.model, b=1, s=8192)}
    for name in ("flash_attention", "logits", "layernorm_1"):
        assert cmp.op_forward_s(ops[name], mx) == cmp.op_forward_s(ops[name], nv) == cmp.op_forward_s(ops[name], bf16)
    for name in ("qkv", "mlp_in", "mlp_out"):
        assert cmp.op_forward_s(ops[name], nv) < cmp.op_forward_s(ops[name], mx) < cmp.op_forward_s(ops[name], bf16)


def test_block_scaled_casts_write_their_scales():
    """Per element of a GEMM input: MXFP8 writes two 1-byte copies and 2/32 bytes of E8M0
    scales; NVFP4 two half-byte copies and 2/16 bytes of E4M3 scales, after a per-tensor amax read."""
    assert wl.quantized_bytes("mxfp8") == 1 + 1 / 32
    assert wl.quantized_bytes("nvfp4") == 0.5 + 1 / 16
    assert wl.cast_passes("fp8", False) < wl.cast_passes("mxfp8", False) < wl.cast_passes("fp8", True)
    assert wl.cast_passes("nvfp4", False) == (2 + 2 * (0.5 + 1 / 16) + 2) / 2


@pytest.mark.parametrize("node, precision", [("dgx-h100", "nvfp4"), ("dgx-h100", "mxfp8"), ("mi300x-8", "mxfp8"),
                                             ("mi355x-8", "nvfp4"), ("dgx-a100-80gb", "nvfp4")])
def test_block_scaled_precision_is_refused_where_the_hardware_lacks_it(node, precision):
    with pytest.raises(PlanError) as err:
        plan_from_dict(_doc("llama3-8b", node, precision))
    msg = str(err.value)
    assert msg.startswith(f"training.precision={precision} is not supported by ") and "\n" not in msg
    assert f"dense_tflops.{precision}" in msg
