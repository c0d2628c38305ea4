"""``training.attention_kernel``: the flash kernel the stack runs, its efficiency catalog
data per GPU; a faster kernel buys exactly its attention time, nothing else."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError


def _plan(model="llama3-8b", node="dgx-h100", kernel="auto", seq_len=8192, flash=True, **parallel):
    return plan_from_dict({"model": {"name": model, "seq_len": seq_len}, "cluster": {"node": node, "nodes": 2},
                           "parallel": {"dp": 16, "zero": 1, **parallel},
                           "training": {"global_batch": 64, "flash_attention": flash, "attention_kernel": kernel}})


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(model=st.sampled_from(["gpt-1.7b", "llama3-8b", "llama2-13b"]), node=st.sampled_from(["dgx-h100", "hgx-h200"]),
       seq_len=st.sampled_from([2048, 8192, 32768]), zero=st.sampled_from([0, 1, 3]))
def test_the_kernels_order_the_step_and_change_only_the_attention(model, node, seq_len, zero):
    triton, fa2, auto, fa3 = (_plan(model, node, k, seq_len, zero=zero) for k in ("triton", "flash2", "auto", "flash3"))
    times = [simulate(p).step_time_s for p in (triton, auto, fa3)]
    # Hopper: the 2022 Triton kernel < Dao's FlashAttention-2 < the cuDNN fused kernel (auto) < FA3
    assert times[0] > simulate(fa2).step_time_s > times[1] > times[2]
    # what changes is the attention core's compute: the same memory, the same FLOPs
    # counted, and the step moves by no more than the compute it holds
    res = [simulate(p) for p in (triton, auto, fa3)]
    assert res[0].memory_per_gpu_gib == res[1].memory_per_gpu_gib == res[2].memory_per_gpu_gib
    assert res[0].model_tflops_per_gpu * times[0] == pytest.approx(res[2].model_tflops_per_gpu * times[2])
    assert times[0] - times[2] <= res[0].compute_s - res[2].compute_s + 1e-9
    assert res[0].compute_s > res[1].compute_s > res[2].compute_s

def test_flash2_is_the_a100s_own_kernel():
    """On A100 the catalog's attention entry is FlashAttention-2 itself: naming it changes nothing."""
    assert simulate(_plan(node="dgx-a100-80gb", kernel="flash2")).step_time_s == \
        simulate(_plan(node="dgx-a100-80gb")).step_time_s


def test_a_kernel_the_catalog_has_no_figure_for_is_refused_in_one_sentence():
    with pytest.raises(PlanError, match=r"^training.attention_kernel=flash3 has no efficiency for a100-80gb"):
        simulate(_plan(node="dgx-a100-80gb", kernel="flash3"))
    with pytest.raises(PlanError, match=r"^training.attention_kernel=triton needs training.flash_attention=true"):
        _plan(kernel="triton", flash=False)
    with pytest.raises(PlanError, match=r"training.attention_kernel"):
        _plan(kernel="flash9")


def test_unpadding_for_flash_attn_s_varlen_kernel_costs_time_and_memory_and_buys_nothing():
    """``training.attention_unpad``: llm-foundry's MPT (and Hugging Face's flash_attention_2 with a
    mask) gather Q, K, V into an unpadded batch and scatter the output back every layer."""
    doc = {"model": {"name": "gpt-1.7b", "seq_len": 2048}, "cluster": {"node": "dgx-h100"},
           "parallel": {"dp": 8, "zero": 2},
           "training": {"global_batch": 96, "micro_batch": 12, "flash_attention": True, "attention_kernel": "flash2"}}
    whole = simulate(plan_from_dict(doc))
    unpad = simulate(plan_from_dict({**doc, "training": {**doc["training"], "attention_unpad": True}}))
    assert unpad.step_time_s > whole.step_time_s and unpad.time_s["forward"] > whole.time_s["forward"]
    assert unpad.memory_per_gpu_gib > whole.memory_per_gpu_gib    # flash-attn's unpadded output kept
    assert unpad.model_tflops_per_gpu < whole.model_tflops_per_gpu   # the same FLOPs counted, in more time
    # the copies are memory-bound passes: a few percent of a GEMM-bound step, not a multiple
    assert unpad.step_time_s < 1.15 * whole.step_time_s


def test_unpadding_needs_flash_attention_and_the_stacks_that_do_not_unpad_refuse_it():
    from simcore.plan.writers import export_plan
    with pytest.raises(PlanError, match=r"^training.attention_unpad=true needs training.flash_attention=true"):
        plan_from_dict({"model": {"name": "gpt-1.7b"}, "cluster": {"node": "dgx-h100"}, "parallel": {"dp": 8},
                        "training": {"global_batch": 8, "attention_unpad": True}})
    plan = _plan(kernel="flash2", zero=3)   # FSDP2: a layout both Megatron and torchtitan run
    unpad = plan_from_dict({**_doc(plan), "training": {**_doc(plan)["training"], "attention_unpad": True}})
    for to in ("megatron", "torchtitan"):
        with pytest.raises(ValueError, match=r"^training.attention_unpad=true has no (Megatron-LM|torchtitan) option"):
            export_plan(unpad, to)
    ds = plan_from_dict({**_doc(unpad), "parallel": {**_doc(unpad)["parallel"], "zero_impl": "deepspeed"}})
    export_plan(ds, "deepspeed")   # a ds_config under Hugging Face's Trainer, whose FA2 unpads
    from executors.support import check_executable
    with pytest.raises(ValueError, match=r"^training.attention_unpad is priced, not run"):
        check_executable(unpad, "cuda")


def _doc(plan):
    from simcore.plan.load import plan_to_dict
    return plan_to_dict(plan)
