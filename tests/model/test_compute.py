"""Roofline op times with the catalog's efficiency curves."""
import dataclasses

import pytest

from simcore.model import compute as cmp
from simcore.model import workload as wl
from simcore.plan.spec import PlanError
from topologies.hardware import load_catalog


def dev(name="a100-80gb", precision="bf16"):
    return cmp.device_model(load_catalog().gpus[name], precision)


def test_every_catalog_gpu_has_an_efficiency_entry():
    cat = load_catalog()
    for name, gpu in cat.gpus.items():
        if gpu.gaps:   # issue 54's accelerators: refused until their gaps and curves are sourced (tests/topologies/test_accelerators.py)
            continue
        prec = "bf16" if gpu.peak("bf16") else "fp16"
        d = cmp.device_model(gpu, prec)
        assert 0 < d.matmul.at(1e12) <= 1 and d.matmul.source


def test_large_gemm_is_compute_bound_at_curve_efficiency():
    d = dev()
    op = wl._gemm("g", 8192, 8192, 8192)
    eff = d.matmul.at(op.flops)
    assert cmp.op_forward_s(op, d) == pytest.approx(op.flops / (312e12 * eff))


def test_elementwise_is_memory_bound():
    d = dev()
    op = wl._eltwise("e", 1e9, 2)
    assert cmp.op_forward_s(op, d) == pytest.approx(2e9 * 2 / (d.hbm_bytes_per_s * d.memory_efficiency))


def test_gemm_backward_is_twice_forward_split_input_weight():
    d = dev()
    op = wl._gemm("qkv", 4096, 4096, 4096)
    i, w = cmp.op_backward_s(op, d)
    assert i == pytest.approx(cmp.op_forward_s(op, d)) and w == pytest.approx(i)
    att = wl._gemm("attn_scores", 2048, 2048, 128, count=32, batched=True)
    i, w = cmp.op_backward_s(att, d)
    assert w == 0 and i == pytest.approx(2 * cmp.op_forward_s(att, d))


def test_h100_faster_than_a100_for_the_same_layer():
    m = load_catalog().models["gpt3-175b"]
    from simcore.plan.spec import ModelSpec
    spec = ModelSpec(name="g", **{k: v for k, v in m.items() if k in ("layers", "hidden", "heads", "kv_heads",
                                                                           "ffn_hidden", "vocab", "seq_len")})
    ops = wl.layer_forward_ops(spec, b=1, s=2048, tp=8)
    a = cmp.ops_time_s(ops, dev("a100-80gb"))[0]
    h = cmp.ops_time_s(ops, dev("h100-sxm"))[0]
    assert h < a / 1.5


def test_phase_never_faster_than_host_issue_time():
    d = dataclasses.replace(dev(), host_overhead_s=1e-3)
    assert cmp.phase_s(1e-6, 10, d) == pytest.approx(10e-3)


def test_unsupported_precision_and_uncalibrated_host():
    with pytest.raises(PlanError):
        cmp.device_model(load_catalog().gpus["v100-32gb"], "bf16")


def test_a_phase_is_never_faster_than_the_host_issues_it():
    d = dataclasses.replace(dev(), kernel_overhead_s=1e-6, host_overhead_s=1e-4)
    assert cmp.phase_s(1e-3, 5, d) == pytest.approx(1e-3 + 5e-6)      # device-bound
    assert cmp.phase_s(1e-3, 50, d) == pytest.approx(50 * 1e-4)       # host-bound


def test_cpu_p2p_terms_are_host_kernels_and_absent_from_catalog_gpus():
    d = dev()
    assert d.p2p_send_s == 0.0 and d.busy_p2p_latency_s == 0.0 and d.p2p_post_s == 0.0
    cpu = dataclasses.replace(d, host_overhead_s=50e-6, p2p_send_kernels=4.0, p2p_latency_kernels=10.0,
                              p2p_wake_kernels=1.0, p2p_post_kernels=2.0)
    assert cpu.p2p_send_s == pytest.approx(200e-6) and cpu.p2p_wake_s == pytest.approx(50e-6)
    assert cpu.busy_p2p_latency_s == pytest.approx(500e-6) and cpu.p2p_post_s == pytest.approx(100e-6)
    entry = {"parallel_host": {"tp": {"forward_kernels": 1.0, "backward_kernels": 2.0},
                               "p2p_latency_kernels": 10.0, "p2p_send_kernels": 4.0, "p2p_wake_kernels": 1.0,
                               "p2p_post_kernels": 2.0}}
    terms = cmp._host_terms(entry)
    assert terms["p2p_latency_kernels"] == 10.0 and terms["p2p_send_kernels"] == 4.0
    assert terms["p2p_wake_kernels"] == 1.0 and terms["p2p_post_kernels"] == 2.0
    assert cmp._host_terms({}) == {}
