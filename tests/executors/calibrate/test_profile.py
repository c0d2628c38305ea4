"""The profile document (``executors.calibrate.build``) and its round trip through the
simulator: the host floor, the serial CPU phase, the torch-wrapper and grouped-probe
figures in the simulator's unit, and a quick real calibration end to end."""
import math
from pathlib import Path

import pytest
import torch
import yaml

from executors.calibrate import build
from executors.calibrate import collective_probes as cprobes
from executors.calibrate import profile as cal
from executors.calibrate import probes
from executors.calibrate import wrapper_probes as wprobes
from simcore.model import compute as cmp
from simcore.engine.predict import simulate
from simcore.plan.load import plan_from_dict
from tests.executors.calibrate.synthetic import ALPHA, DOC, alpha_beta_rows


def test_profile_round_trip_sets_the_host_floor(synthetic):
    prof = yaml.safe_load(synthetic.read_text())
    eff = prof["efficiency"]
    assert eff["host_overhead_us"] == pytest.approx(1e6 / (500.0 * 28))   # from the one-rank layer rate
    assert eff["collective"]["nvlink_hop_latency_us"] == pytest.approx(ALPHA * 1e6)
    assert eff["memory"]["framework_bytes"] == 0.0
    plan = plan_from_dict({**DOC, "parallel": {"dp": 1}, "cluster": {"node": "localhost", "gpus_per_node": 1}})
    dev = cmp.device_model(plan.cluster.node.gpu, "fp32")
    assert dev.host_overhead_s == pytest.approx(eff["host_overhead_us"] * 1e-6)
    # a CPU is a serial device: a phase is its device time plus every kernel's dispatch, and
    # the probe layer (the same shape as this model's layer) comes back at exactly its
    # measured per-kernel time, 28 kernels of host overhead
    from simcore.model import workload as wl

    assert dev.dispatch_s == pytest.approx(eff["dispatch_us"] * 1e-6) and 0 < dev.dispatch_s < dev.host_overhead_s
    f, bi, bw = cmp.ops_time_s(wl.layer_forward_ops(plan.model, b=1, s=32), dev)
    assert f + bi + bw == pytest.approx(28 * dev.host_overhead_s)
    device_f, _ = probes.serial_layer_s(probes.probe_spec(), dev.peak_flops, dev.hbm_bytes_per_s, dev.matmul.points,
                                     dev.attention_forward)
    assert f == pytest.approx(device_f + 12 * dev.dispatch_s)


def test_serial_phase_adds_dispatch_to_device_time_and_async_takes_the_larger():
    import dataclasses

    plan = plan_from_dict({**DOC, "cluster": {"node": "dgx-a100-80gb", "nodes": 1}, "parallel": {"dp": 1, "pp": 2},
                          "training": {"global_batch": 4, "micro_batch": 1, "precision": "bf16"}})
    gpu = cmp.device_model(plan.cluster.node.gpu, "bf16")
    assert gpu.dispatch_s is None   # catalog GPUs issue kernels asynchronously
    assert cmp.phase_s(1e-3, 10, gpu) == pytest.approx(max(1e-3 + 10 * gpu.kernel_overhead_s, 10 * gpu.host_overhead_s))
    serial = dataclasses.replace(gpu, dispatch_s=5e-5)
    assert cmp.phase_s(1e-3, 10, serial) == pytest.approx(1e-3 + 10 * 5e-5)


def test_quick_calibration_end_to_end(tmp_path, monkeypatch):
    out = tmp_path / "local.yaml"
    prof = cal.calibrate(out, quick=True, progress=False)
    # the profile records how long it took (a speed target is a benchmark's, not a test's: README)
    assert 0 < prof["measured_on"]["calibration_s"] < float("inf")
    assert prof["efficiency"]["host_overhead_us"] > 0 and prof["device"]["dense_tflops"]["fp32"] > 0
    fits = prof["collectives"]
    assert set(fits) == set(cprobes.WIRE_FACTOR) and all(2 in v for v in fits.values())
    assert set(prof["oversubscription"]["layer_steps_per_s_per_rank"]) == {1, 2}
    assert prof["oversubscription"]["executor_slowdown"][1] == 1.0 and prof["oversubscription"]["executor_slowdown"][2] >= 1.0
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(out))
    pred = simulate(plan_from_dict(DOC))
    assert pred.step_time_s > 0 and math.isfinite(pred.step_time_s)


def test_wrapper_host_costs_are_converted_to_the_simulators_per_kernel_unit():
    # the parallel probe counted TP's extra cost in its own 2-rank per-kernel time (50 us);
    # the simulator's 2-rank per-kernel time is the one-rank one over the executor-derived
    # slowdown: 1 / (400 layers/s x 28 kernels) = 89 us, so the count shrinks by 50/89
    matmul = [{"precision": "fp32", "m": 64, "k": 64, "n": 64, "flops": 2.0 * 64**3, "seconds": 1.0, "flops_per_s": 1e10}]
    memory = {"copy_bytes_per_s": 1e10, "kernel_overhead_s": 5e-6}
    coll = [r for op in cprobes.WIRE_FACTOR for n in (2, 4) for r in alpha_beta_rows(op, n)]
    oversub = {"matmul": {1: 1e10, 2: 8e9}, "layer": {1: 500.0, 2: 400.0}}
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28}
    modes = {k: {"forward_kernels": 10.0, "backward_kernels": 20.0} for k in ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3")}
    parallel = {"ranks": 2, "per_kernel_s": 50e-6, **modes, "optimizer_per_tensor_kernels": 1.0,
                "optimizer_dtensor_per_tensor_kernels": 4.0}
    prof = build.build_profile(matmul, memory, coll, oversub, torch.device("cpu"), host=host, parallel=parallel)
    ph = prof["efficiency"]["parallel_host"]
    assert wprobes.wrapper_kernels(parallel, oversub["layer"]) == {k: ph[k] for k in wprobes.wrapper_kernels(parallel, oversub["layer"])}
    unit = 50e-6 * 400.0 * 28
    assert ph["parallel_unit_factor"] == pytest.approx(unit)
    assert ph["tp"] == pytest.approx({"forward_kernels": 10 * unit, "backward_kernels": 20 * unit})
    assert ph["optimizer_dtensor_per_tensor_kernels"] == pytest.approx(4 * unit)
    # what the simulator then charges at 2 ranks is the probe's measured seconds
    per_kernel_2 = prof["efficiency"]["host_overhead_us"] * 1e-6 * 500.0 / 400.0
    assert ph["tp"]["forward_kernels"] * per_kernel_2 == pytest.approx(10 * 50e-6)
    assert ph["recompute_unit_factor"] == pytest.approx(1e-3 / 28 * 500.0 * 28)


def test_grouped_probe_figures_stand_for_runs_nearer_its_rank_count(tmp_path, monkeypatch):
    """The parallel probe on four ranks (two TP pairs side by side) keeps its figures as
    ``name@4``: a plan with four ranks on the host is charged them, one with two the
    two-rank probe's, and neither sees the other's entries."""
    from simcore.model import compute as cmp
    from simcore.plan.load import plan_from_dict
    from topologies.profile import parallel_host_for_ranks

    prof = yaml.safe_load((Path(__file__).resolve().parents[2] / "data" / "localhost-profile.yaml").read_text())
    eff = prof["efficiency"]
    eff["host_oversubscription"] = {"1": 1000.0, "2": 800.0, "4": 500.0}
    ph = eff["parallel_host"]
    ph.update({"probe_ranks": 2, "tp@4": {"forward_kernels": 300.0, "backward_kernels": 400.0},
               "p2p_send_kernels@4": 7.0})
    ph["comm_share"]["tp@4"] = [0.9, 0.8]
    for n, tp, share, send in ((1, ph["tp"], ph["comm_share"]["tp"], ph["p2p_send_kernels"]),
                               (2, ph["tp"], ph["comm_share"]["tp"], ph["p2p_send_kernels"]),
                               (3, ph["tp@4"], [0.9, 0.8], 7.0), (4, ph["tp@4"], [0.9, 0.8], 7.0),
                               (8, ph["tp@4"], [0.9, 0.8], 7.0)):
        got = parallel_host_for_ranks(ph, n)
        assert got["tp"] == tp and got["comm_share"]["tp"] == share and got["p2p_send_kernels"] == send, n
        assert not any("@" in k for k in [*got, *got["comm_share"]])
        assert got["fsdp_zero3"] == ph["fsdp_zero3"]   # not probed on four ranks: the two-rank figure
    from topologies.components import CatalogError
    with pytest.raises(CatalogError, match=r"parallel_host.tp@four: what follows '@' must be a rank count"):
        parallel_host_for_ranks({**ph, "tp@four": ph["tp"]}, 4)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    doc = {"model": {"name": "tiny", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32,
                     "tied_embeddings": False},
           "cluster": {"node": "localhost", "gpus_per_node": 4},
           "training": {"global_batch": 8, "micro_batch": 1, "precision": "fp32"}}
    four = cmp.device_model(plan_from_dict({**doc, "parallel": {"tp": 2, "pp": 2, "dp": 1}}).cluster.node.gpu, "fp32")
    two = cmp.device_model(plan_from_dict({**doc, "parallel": {"tp": 2, "dp": 1}}).cluster.node.gpu, "fp32")
    assert four.host_overhead_s == pytest.approx(two.host_overhead_s * 800.0 / 500.0)
    assert four.parallel_extra_s("tp") == pytest.approx((300.0 * four.host_overhead_s, 400.0 * four.host_overhead_s))
    assert two.parallel_extra_s("tp") == pytest.approx((ph["tp"]["forward_kernels"] * two.host_overhead_s,
                                                        ph["tp"]["backward_kernels"] * two.host_overhead_s))
    assert four.parallel_split_s("tp")[0] == pytest.approx((0.9 * 300.0 * four.host_overhead_s,
                                                            0.8 * 400.0 * four.host_overhead_s))
    assert four.p2p_send_kernels == 7.0 and two.p2p_send_kernels == ph["p2p_send_kernels"]
    assert not any("@" in name for name, *_ in four.parallel_kernels)


def test_grouped_probe_figures_are_kept_in_the_simulators_unit_for_their_rank_count():
    """A grouped probe's wrapper costs are converted with the four-rank slowdown and kept
    under ``@4`` beside the two-rank ones; its point-to-point figures come back as the
    seconds it measured once ``p2p_in_sim_unit`` has run on them."""
    matmul = [{"precision": "fp32", "m": 64, "k": 64, "n": 64, "flops": 2.0 * 64**3, "seconds": 1.0, "flops_per_s": 1e10}]
    memory = {"copy_bytes_per_s": 1e10, "kernel_overhead_s": 5e-6}
    coll = [r for op in cprobes.WIRE_FACTOR for n in (2, 4) for r in alpha_beta_rows(op, n)]
    oversub = {"matmul": {1: 1e10, 2: 8e9, 4: 4e9}, "layer": {1: 500.0, 2: 400.0, 4: 250.0}}
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28}
    modes = {k: {"forward_kernels": 10.0, "backward_kernels": 20.0} for k in ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3")}
    parallel = {"ranks": 2, "per_kernel_s": 50e-6, **modes, "optimizer_per_tensor_kernels": 1.0,
                "optimizer_dtensor_per_tensor_kernels": 4.0, "comm_share": {"tp": [0.4, 0.3]}}
    grouped = {"ranks": 4, "per_kernel_s": 60e-6, "tp": {"forward_kernels": 30.0, "backward_kernels": 40.0},
               "comm_share": {"tp": [0.7, 0.6]}, "p2p_send_kernels": 2.0, "p2p_latency_kernels": 20.0}
    prof = build.build_profile(matmul, memory, coll, oversub, torch.device("cpu"), host=host,
                             parallel=parallel, grouped=grouped)
    eff = prof["efficiency"]
    ph = eff["parallel_host"]
    assert ph["probe_ranks"] == 2 and ph["comm_share"] == {"tp": [0.4, 0.3], "tp@4": [0.7, 0.6]}
    unit_4 = 60e-6 * 250.0 * 28
    assert ph["parallel_unit_factor@4"] == pytest.approx(unit_4)
    assert ph["tp@4"] == pytest.approx({"forward_kernels": 30 * unit_4, "backward_kernels": 40 * unit_4})
    assert ph["tp"] == pytest.approx({"forward_kernels": 10 * 50e-6 * 400.0 * 28, "backward_kernels": 20 * 50e-6 * 400.0 * 28})
    per_kernel_4 = eff["host_overhead_us"] * 1e-6 * 500.0 / 250.0   # the simulator's, four ranks running
    assert ph["tp@4"]["forward_kernels"] * per_kernel_4 == pytest.approx(30 * 60e-6)
    assert "optimizer_per_tensor_kernels@4" not in ph   # the grouped probe times no optimizer
    cal.p2p_in_sim_unit(eff, 60e-6, 4, "@4")
    assert ph["p2p_send_kernels@4"] * per_kernel_4 == pytest.approx(2.0 * 60e-6)
    assert ph["p2p_latency_kernels@4"] * per_kernel_4 == pytest.approx(20.0 * 60e-6)
    assert "p2p_unit_factor" not in ph and ph["p2p_unit_factor@4"] == pytest.approx(60e-6 / per_kernel_4)
    # a slowdown table without four ranks (the quick calibration's) has nothing to convert by
    assert build.at_ranks(grouped, {1: 500.0, 2: 400.0}) == {}
