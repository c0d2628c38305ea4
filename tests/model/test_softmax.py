"""Megatron's attention softmax without flash attention: the fused kernel runs only for the
shapes ``FusedScaleMaskSoftmax.is_kernel_available`` takes; the rest pay its fp32 torch
fallback in kernels, traffic and kept activations, on a GPU stack only."""
from __future__ import annotations

import pytest

from simcore.engine.predict import simulate
from simcore.model import workload as wl
from simcore.model.softmax import fused_softmax
from simcore.plan.load import plan_from_dict
from tests.model.test_simulate_cpu_host import _tiny


@pytest.mark.parametrize("batches, sq, sk, fused", [
    (2, 1024, 1024, False),     # tp 8 of 16 heads at micro-batch 1: 2 score matrices
    (4, 1024, 1024, True),      # ... at micro-batch 2
    (6, 2048, 2048, False),     # 3 heads a rank (48 heads over tp 16) at micro-batch 2
    (8, 8192, 8192, False),     # past the kernel's 4096 keys
    (4, 64, 64, False),         # up to 128 keys two batches a warp: 8 a block
    (8, 64, 64, True),
    (4, 16, 16, False),         # 16 keys or fewer: never
])
def test_the_fused_kernel_takes_the_shapes_megatron_s_check_takes(batches, sq, sk, fused):
    assert fused_softmax(batches, sq, sk) is fused


def _gpt(mb, tp, flash=False, recompute="full", node="dgx-a100-80gb"):
    return plan_from_dict({"model": {"name": "gpt-l24", "layers": 24, "hidden": 1024, "heads": 16, "vocab": 51200,
                                     "seq_len": 1024},
                           "cluster": {"node": node}, "parallel": {"tp": tp, "dp": 8 // tp},
                           "training": {"global_batch": 16 * (8 // tp), "micro_batch": mb, "precision": "fp16",
                                        "recompute": recompute, "flash_attention": flash}})


def test_a_shape_the_kernel_refuses_costs_kernels_time_and_memory(monkeypatch):
    unfused = _gpt(1, 8, recompute="none")
    slow = simulate(unfused)
    from simcore.model import layer_times as lt
    from simcore.model import softmax
    monkeypatch.setattr(softmax, "fused_softmax", lambda *a: True)
    monkeypatch.setattr(wl, "fused_softmax", lambda *a: True)
    lt.layer_times.cache_clear(), lt.layer_slack.cache_clear()
    from simcore.model import activations
    activations._layer_terms.cache_clear()
    fast = simulate(unfused)
    lt.layer_times.cache_clear(), lt.layer_slack.cache_clear()
    activations._layer_terms.cache_clear()
    assert slow.step_time_s > fast.step_time_s
    assert slow.time_s["forward"] > fast.time_s["forward"]
    assert slow.memory_per_gpu_gib > fast.memory_per_gpu_gib   # the fp32 softmax output kept


def test_the_fallback_is_megatron_s_only():
    ops = wl.attention_core_ops(_gpt(1, 8).model, 1, 1024, 8, 1, False)
    assert [o.kernels for o in ops] == [1, 1, 1]       # a stack of its own: one fused pass
    ops = wl.attention_core_ops(_gpt(1, 8).model, 1, 1024, 8, 1, False, megatron_softmax=True)
    soft = [o for o in ops if o.name == "softmax_dropout"][0]
    assert soft.kernels == 6 and soft.kernels * soft.bytes > 2 * 4.5 * 2 * 1024 * 1024
    # flash attention has no softmax kernel to fall back from
    assert [o.name for o in wl.attention_core_ops(_gpt(1, 8).model, 1, 1024, 8, 1, True, megatron_softmax=True)] \
        == ["flash_attention"]


def test_the_per_sample_step_at_tp8_falls_from_micro_batch_1_to_2():
    """vTrain (Megatron-DeepSpeed, A100): tp 8 of 16 heads runs the unfused softmax at
    micro-batch 1 only; the same samples in micro-batches of 2 take less time, not just less
    host time (ground_truth_single.csv: 5.0 ms a layer and sample against 4.1)."""
    assert simulate(_gpt(1, 8)).step_time_s > simulate(_gpt(2, 8)).step_time_s * 1.1


def test_a_cpu_host_keeps_its_own_softmax():
    from simcore.model import layer_times as lt
    plan = _tiny(tp=4)   # 1 head a rank at micro-batch 1: Megatron's kernel would refuse it
    assert not fused_softmax(plan.training.micro_batch * plan.model.heads // 4, 32, 32)
    from simcore.model import compute as cmp
    dev = cmp.device_model(plan.cluster.node.gpu, "fp32")
    assert not lt._megatron_softmax(dev)
