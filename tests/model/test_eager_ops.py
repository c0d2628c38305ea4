"""The executor's eager autocast stack on a GPU (``simcore.model.eager_ops``): counted on a GPU
profile of the executor's runs in 16-bit precision alone, its passes by hand, never faster than
the fused set, and no extra launches charged (the per-kernel host cost already carries them)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.model import compute as cmp
from simcore.model import eager_ops as eager
from simcore.model import workload as wl
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "topologies" / "catalog" / "profiles" / "h200-141gb.yaml"


def _gpu(monkeypatch, precision):
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(H200))
    plan = plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 2048, "layers": 4},
                           "cluster": {"node": "localhost", "gpus_per_node": 1},
                           "training": {"global_batch": 2, "precision": precision}})
    return cmp.device_model(plan.cluster.node.gpu, precision)


def test_only_a_gpu_profile_of_the_executor_in_16_bits_runs_the_eager_stack(monkeypatch):
    assert _gpu(monkeypatch, "bf16").eager_autocast and _gpu(monkeypatch, "fp16").eager_autocast
    assert not _gpu(monkeypatch, "fp32").eager_autocast          # no autocast: the fp32 stack
    catalog = plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "hgx-h200"},
                              "training": {"global_batch": 64}})
    assert not cmp.device_model(catalog.cluster.node.gpu, "bf16").eager_autocast   # a fused stack


def test_the_passes_by_hand():
    m = ModelSpec(name="t", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=100, seq_len=8,
                  gated_mlp=True, position_embedding="rope")
    ops = {o.name: o.bytes for o in eager.layer_ops(m, b=2, s=8)}
    t, h, kv = 16, 64, 32                                          # tokens, hidden, K/V width (2 of 4 heads)
    assert ops["eager_norms_fp32"] == 2 * 4 * t * h                # 8 B an element where the fused norm moves 4
    assert ops["eager_input_casts"] == 5 * 6 * t * h               # wq, wk, wv, w1, w3: read fp32, write 16-bit
    assert ops["eager_residual_fp32"] == 2 * 4 * t * h
    assert ops["eager_attention_out_copy"] == 4 * t * h
    assert ops["eager_rope"] == 20 * t * (h + kv)
    assert ops["eager_swiglu"] == 4 * t * 128
    params = 2 * h * h + 2 * h * kv + 3 * h * 128                  # wq, wo, wk, wv, w1, w2, w3
    assert ops["eager_weight_casts"] == 6 * params
    assert {o.name: o.bytes for o in eager.logits_ops(m, b=2, s=8)} == {"eager_logits_upcast": 6 * t * 100}
    assert all(o.kernels == 0 for o in eager.layer_ops(m, b=2, s=8))


@settings(max_examples=30, deadline=None)
@given(b=st.sampled_from([1, 2, 4, 8]), s=st.sampled_from([256, 1024, 4096]), tp=st.sampled_from([1, 2, 4]))
def test_the_eager_stack_is_never_faster_and_launches_nothing_more(b, s, tp):
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {"TRAINPLAN_PROFILE": str(H200)}):   # this test alone reads the profile
        plan = plan_from_dict({"model": {"name": "llama3-8b", "seq_len": s},
                               "cluster": {"node": "localhost", "gpus_per_node": 1},
                               "training": {"global_batch": b, "precision": "bf16"}})
        dev = cmp.device_model(plan.cluster.node.gpu, "bf16")
    fused = dataclasses.replace(dev, eager_autocast=False)
    ops = wl.layer_forward_ops(plan.model, b=b, s=s, tp=tp, flash=True)
    with_eager = ops + eager.layer_ops(plan.model, b=b, s=s, tp=tp)
    f0, bi0, bw0 = cmp.ops_time_s(ops, fused)
    f1, bi1, bw1 = cmp.ops_time_s(with_eager, dev)
    assert f1 >= f0 and bi1 + bw1 >= bi0 + bw0                    # equal only where the host bounds the phase
    assert sum(cmp.op_forward_s(o, dev) for o in with_eager) > sum(cmp.op_forward_s(o, fused) for o in ops)
    assert sum(o.kernels for o in with_eager) == sum(o.kernels for o in ops)


def test_uncompiled_modules_by_hand():
    m = ModelSpec(name="t", layers=2, hidden=64, heads=4, kv_heads=2, ffn_hidden=128, vocab=100, seq_len=8,
                  gated_mlp=True, position_embedding="rope")
    ops = {o.name: o.bytes for o in eager.python_layer_ops(m, b=2, s=8)}
    t, h, kv = 16, 64, 32
    # x.float() 2+4, pow 4+4, mean 4, x * rsqrt 4+4, type_as 4+2, * weight 2+2: 36 B where the fused norm moves 4
    assert ops["eager_python_rmsnorm"] == 2 * (36 - 4) * t * h
    assert ops["eager_rope"] == 20 * t * (h + kv)              # upcast 6, complex product 8, type_as 6
    assert ops["eager_swiglu"] == 4 * t * 128 and ops["eager_attention_out_copy"] == 4 * t * h
    gpt = ModelSpec(name="g", layers=2, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=100, seq_len=8)
    assert [o.name for o in eager.python_layer_ops(gpt, b=2, s=8)] == ["eager_attention_out_copy"]


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["llama3-8b", "gpt-3.6b", "mixtral-8x7b"]), tp=st.sampled_from([1, 2, 8]),
       recompute=st.sampled_from(["none", "selective", "full", "op"]), mb=st.sampled_from([1, 2, 4]))
def test_uncompiled_modules_are_never_faster_than_compiled(model, tp, recompute, mb):
    from simcore.engine.predict import simulate

    doc = {"model": {"name": model, "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": 2},
           "parallel": {"tp": tp, "dp": 16 // tp, "sequence_parallel": tp > 1},
           "training": {"global_batch": 64, "micro_batch": mb, "recompute": recompute, "flash_attention": True}}
    fused = simulate(plan_from_dict(doc))
    eager_run = simulate(plan_from_dict({**doc, "training": {**doc["training"], "kernels": "eager"}}))
    # equal only where the host bounds the phases (the passes add device time, no launches) or
    # where the model has no Python norm, SwiGLU or RoPE (GPT: the attention output's copy alone)
    tie = 1 - 1e-12                                              # equal times summed in another order
    assert eager_run.step_time_s >= fused.step_time_s * tie
    assert eager_run.time_s["forward"] >= fused.time_s["forward"] * tie
    assert eager_run.memory_per_gpu_gib >= fused.memory_per_gpu_gib


def test_compiling_a_llama_saves_its_python_norms_rope_and_swiglu():
    from simcore.engine.predict import simulate

    # torchtitan's Llama: SDPA's flash kernel (without it, Megatron's unfused fp32 softmax at 8k
    # tokens would dominate the step)
    doc = {"model": {"name": "llama3-8b", "seq_len": 8192}, "cluster": {"node": "dgx-h100"},
           "parallel": {"dp": 8, "zero": 3},
           "training": {"global_batch": 16, "micro_batch": 2, "recompute": "op", "flash_attention": True}}
    fused = simulate(plan_from_dict(doc))
    eager_run = simulate(plan_from_dict({**doc, "training": {**doc["training"], "kernels": "eager"}}))
    gain = eager_run.step_time_s / fused.step_time_s
    assert 1.05 < gain < 1.4 and eager_run.time_s["forward"] > fused.time_s["forward"]


def test_the_autocast_host_factor_a_gpu_calibration_measures_scales_the_executor_s_16_bit_host_cost(
        tmp_path, monkeypatch):
    import yaml

    from executors.calibrate.build import _host_efficiency

    eff = {}
    host = {"forward_s": 1e-3, "backward_s": 2e-3, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 3e-3 / 28, "autocast": {"forward_s": 1.5e-3, "backward_s": 2.7e-3}}
    _host_efficiency(eff, host, {}, False, 1e12, 1e12, "test")
    assert eff["autocast_host_factor"] == pytest.approx(4.2 / 3.0)
    prof = yaml.safe_load(H200.read_text())
    prof["efficiency"]["autocast_host_factor"] = 1.4
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    before = {p: _gpu(monkeypatch, p) for p in ("bf16", "fp32")}
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    plan = plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 2048, "layers": 4},
                           "cluster": {"node": "localhost", "gpus_per_node": 1}, "training": {"global_batch": 2}})
    after = {p: cmp.device_model(plan.cluster.node.gpu, p) for p in ("bf16", "fp32")}
    assert after["bf16"].host_overhead_s == pytest.approx(1.4 * before["bf16"].host_overhead_s)
    assert after["fp32"].host_overhead_s == pytest.approx(before["fp32"].host_overhead_s)
    # the optimizer's per-tensor launches are AdamW's, outside autocast: the factor leaves them alone
    for p in ("bf16", "fp32"):
        launch = before[p].optimizer_per_tensor_kernels * before[p].host_overhead_s
        assert launch > 0
        assert after[p].optimizer_per_tensor_kernels * after[p].host_overhead_s == pytest.approx(launch)


def test_a_gpu_profile_prices_the_executor_s_adamw_at_its_measured_rates(monkeypatch):
    import yaml

    from simcore.model import memory as mem
    from simcore.model import step_costs as sim

    from simcore.model import dp_costs as dpm

    monkeypatch.setenv("TRAINPLAN_PROFILE", str(H200))
    opt = yaml.safe_load(H200.read_text())["efficiency"]["optimizer"]
    rate, per_tensor = opt["param_gbyte_per_s"] * 1e9, opt["per_tensor_us"] * 1e-6
    for precision, master in (("bf16", True), ("fp32", True), ("bf16", False)):
        plan = plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 2048, "layers": 4},
                               "cluster": {"node": "localhost", "gpus_per_node": 1},
                               "training": {"global_batch": 2, "precision": precision, "master_weights": master}})
        stepped = 4 if master else 2   # autocast steps fp32 parameters; pure bf16 its 16-bit ones
        tensors = sum(dpm.param_tensors(plan, 0))                  # each launches AdamW's foreach kernels
        want = tensors * per_tensor + mem.stage_params(plan)[0].total * stepped / rate
        assert tensors == 4 * 9 + 3 and sim.step_costs(plan).optimizer_per_step_s[0] == pytest.approx(want)
