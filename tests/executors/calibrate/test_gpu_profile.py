"""A GPU profile from synthetic GPU probe results (the driver's answers stubbed): its figures
are the measured rates, it loads as a localhost node, and it predicts the single-GPU matrix."""
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from executors.calibrate import build
from executors.calibrate import collective_probes as cprobes
from executors.calibrate.gpu_probes import gpu_matmul_shapes
from tests.executors.calibrate.synthetic import alpha_beta_rows

ROOT = Path(__file__).resolve().parents[3]
PEAK = {"fp32": 50e12, "tf32": 400e12, "bf16": 700e12, "fp16": 700e12, "fp8": 1200e12}


def _gemms():
    rows = []
    for p, peak in PEAK.items():
        for m, k, n in gpu_matmul_shapes((256, 1024, 4096, 16384)):
            flops = 2.0 * m * n * k
            share = min(1.0, flops / 1e12) ** 0.25 * (0.9 if p == "fp8" and flops < 1e12 else 1.0)
            rows.append({"precision": p, "m": m, "k": k, "n": n, "flops": flops, "seconds": flops / (peak * share),
                         "flops_per_s": peak * share})
    return rows


def _attention():
    return [{"seq": s, "batch": 16384 // s, "heads": 16, "head_dim": 128, "forward_s": 1e-3, "backward_s": 2e-3,
             "forward_flops_per_s": 400e12 * min(1.0, s / 2048) ** 0.3, "backward_flops_per_s": 300e12}
            for s in (512, 1024, 2048, 4096)]


@pytest.fixture
def gpu_profile(monkeypatch, tmp_path):
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=80 * 1024**3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpu = {"facts": {"name": props.name}, "attention": _attention(),
           "host_copies": {"h2d_pinned": 50e9, "h2d_pageable": 20e9, "d2h_pinned": 50e9, "d2h_pageable": 10e9},
           "cpu_optimizer": {"per_tensor_s": 1e-5, "param_bytes_per_s": 2e9}}
    memory = {"copy_bytes_per_s": 3e12, "kernel_overhead_s": 3e-6}
    coll = [r for op in cprobes.WIRE_FACTOR for n in (2, 4) for r in alpha_beta_rows(op, n)]
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28}
    prof = build.build_profile(_gemms(), memory, coll, {}, torch.device("cuda", 0), host=host,
                               optimizer={"per_tensor_s": 5e-6, "param_bytes_per_s": 1e12}, gpu=gpu)
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(prof, sort_keys=False))
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    return prof


def test_gpu_profile_keeps_the_measured_rates(gpu_profile):
    dev, eff = gpu_profile["device"], gpu_profile["efficiency"]
    assert dev["name"] == "nvidia-h100-80gb-hbm3"
    assert dev["dense_tflops"] == {p: pytest.approx(v / 1e12) for p, v in PEAK.items()}
    assert dev["pcie_gbyte_per_s_bidir"] == pytest.approx(100.0)
    # FlashAttention: the 2048-token rate over the bf16 peak, the length curve below it
    assert eff["attention"]["forward"] == pytest.approx(400 / 700, rel=1e-3)
    assert eff["attention"]["backward"] == pytest.approx(300 / 700, rel=1e-3)
    assert [s for s, _ in eff["attention"]["length_points"]] == [512, 1024, 2048]
    assert eff["attention"]["length_points"][-1][1] == 1.0 and eff["attention"]["length_points"][0][1] < 1.0
    # fp8 reaches 0.9 of its peak's share below 1 TFLOP and all of it above
    assert 0.9 <= eff["fp8_matmul_ratio"] <= 1.0
    assert eff["offload"]["host_memory_gbyte_per_s"] == pytest.approx(16.0)
    assert "gloo" in eff["collective"]["source"] and gpu_profile["measured_on"]["backend"] == "gloo"


def test_gpu_profile_predicts_the_single_gpu_matrix(gpu_profile):
    from simcore.engine.predict import simulate
    from simcore.plan.load import plan_from_dict
    from trainplan.validate import load_matrix

    times = {}
    for name, doc in load_matrix(ROOT / "validation" / "gpu.yaml"):
        plan = plan_from_dict(doc, ROOT / "validation")
        assert plan.cluster.node.calibrated
        times[name] = simulate(plan, engine="des").step_time_s
    assert times["bf16-full-recompute"] > times["bf16"] > times["bf16-mb1"]
    assert times["fp32"] > times["bf16"]     # fp32 runs at the fp32 peak, a fourteenth of bf16's here
    assert times["bf16-offload"] > times["bf16"]
