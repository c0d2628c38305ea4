"""executors.calibrate.profile and its probe modules: the fits on synthetic data (closed forms), the
profile's round trip through the simulator, a quick real calibration, and the refit from a
measured run."""
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from executors.calibrate import profile as cal
from executors.calibrate import collective_probes as cprobes
from executors.calibrate import oversubscription as osub
from executors.calibrate import parallel_probes as pprobes
from executors.calibrate import probes, refit
from simcore.model import compute as cmp
from simcore.engine.predict import simulate
from simcore.plan.spec import plan_from_dict

ALPHA, BETA = 2e-4, 1e9
SIZES = (4096, 65536, 1 << 20)


def _rows(op, n, alpha=ALPHA, beta=BETA):
    return [{"op": op, "ranks": n, "bytes": b, "seconds": alpha + cprobes.WIRE_FACTOR[op](n) * b / beta} for b in SIZES]


def test_alpha_beta_fit_recovers_a_noiseless_line():
    fits = cprobes.fit_alpha_beta(_rows("all_reduce", 4) + _rows("all_gather", 2, 1e-3, 5e8))
    assert fits["all_reduce"][4]["alpha_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert fits["all_reduce"][4]["bus_bytes_per_s"] == pytest.approx(BETA, rel=1e-6)
    assert fits["all_gather"][2]["alpha_s"] == pytest.approx(1e-3, rel=1e-6)
    assert fits["all_gather"][2]["bus_bytes_per_s"] == pytest.approx(5e8, rel=1e-6)


def test_ring_latency_split_keeps_the_model_consistent():
    fits = cprobes.fit_alpha_beta(_rows("send_recv", 2, 1e-4) + _rows("all_reduce", 2, 5e-4) + _rows("all_reduce", 4, 1e-4))
    hop, ar = cprobes.split_ring_latency(fits)
    assert hop == pytest.approx(1e-4)
    # ring all-reduce latency = base + 2(n-1) hops (simcore.model.collectives._ring_latency)
    assert ar[2]["base_latency_s"] == pytest.approx(5e-4 - 2 * 1e-4)
    assert ar[4]["base_latency_s"] == 0.0          # 1e-4 - 6e-4 clamps at zero


def test_matmul_curve_is_the_median_per_size_capped_at_one():
    rows = [{"precision": "fp32", "flops": 8.0, "flops_per_s": v} for v in (1.0, 3.0, 2.0)]
    rows += [{"precision": "fp32", "flops": 64.0, "flops_per_s": 5.0}, {"precision": "bf16", "flops": 8.0, "flops_per_s": 9.0}]
    assert cal.matmul_curve(rows, "fp32", 4.0) == [[8.0, 0.5], [64.0, 1.0]]


def test_probe_kernels_match_the_compute_model():
    spec = probes.probe_spec()
    from simcore.model import workload as wl

    ops = wl.layer_forward_ops(spec, b=1, s=spec.seq_len)
    assert probes.probe_kernels(spec) == (12, 16)     # 4 GEMMs get 2 backward kernels each
    assert sum(o.kernels for o in ops) == 12


def test_cpu_half_precision_grid_stops_early():
    shapes = probes.matmul_shapes("bf16", torch.device("cpu"))
    assert max(m for m, _, _ in shapes) == probes.CPU_HALF_MAX_SIZE
    assert max(m for m, _, _ in probes.matmul_shapes("fp32", torch.device("cpu"))) == 1024


def _synthetic_profile():
    matmul = [{"precision": "fp32", "m": s, "k": s, "n": s, "flops": 2.0 * s**3, "seconds": 1.0,
               "flops_per_s": 1e13 * min(1.0, s / 256)} for s in (64, 256, 1024)]
    memory = {"copy_bytes_per_s": 1e12, "kernel_overhead_s": 5e-6}
    coll = [r for op in cprobes.WIRE_FACTOR for n in (2, 4) for r in _rows(op, n)]
    oversub = {"matmul": {1: 1e10, 2: 1e10}, "layer": {1: 500.0, 2: 500.0}}
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28}
    opt = {"per_tensor_s": 2e-5, "param_bytes_per_s": 1e9}
    return cal.build_profile(matmul, memory, coll, oversub, None, torch.device("cpu"), host=host, optimizer=opt)


DOC = {"name": "t", "model": {"name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32,
                              "tied_embeddings": False},
       "cluster": {"node": "localhost", "gpus_per_node": 2}, "parallel": {"pp": 2, "dp": 1},
       "training": {"global_batch": 4, "micro_batch": 1, "precision": "fp32"}}


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(_synthetic_profile()))
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    return path


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
    device_f, _ = cmp.serial_layer_s(probes.probe_spec(), dev.peak_flops, dev.hbm_bytes_per_s, dev.matmul.points,
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


def test_cold_layer_gemms_alone_make_the_curve_and_hot_squares_set_the_peak():
    rows = probes.bench_layer_gemms(tokens=(8,), hidden=(16, 32), min_time_s=0.001)
    assert [r["form"] for r in rows] == ["layer-fwd", "layer-dx", "layer-dw"] * 2
    assert all(r["cold"] and r["flops"] == 2.0 * 8 * r["k"] * 4 * r["k"] and r["flops_per_s"] > 0 for r in rows)
    hot = [{"precision": "fp32", "m": 4, "k": 4, "n": 4, "flops": 128.0, "flops_per_s": 2.0}]
    cold = [{"precision": "fp32", "flops": f, "flops_per_s": v, "cold": True} for f, v in ((128.0, 0.5), (128.0, 1.5), (1024.0, 1.0))]
    assert cal.matmul_curve(hot + cold, "fp32", 2.0) == [[128.0, 0.5], [1024.0, 0.5]]
    assert cal.matmul_curve(hot, "fp32", 2.0) == [[128.0, 1.0]]


def test_checkpointing_host_cost_is_what_the_recompute_model_does_not_charge(synthetic):
    from simcore.plan.spec import Recompute

    prof = yaml.safe_load(synthetic.read_text())
    eff, peak = prof["efficiency"], prof["device"]["dense_tflops"]["fp32"] * 1e12
    bw = prof["device"]["hbm_tbyte_per_s"] * 1e12
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28,
            "checkpointed": {"full": {"forward_s": 6e-4, "backward_s": 1.5e-3},
                             "selective": {"forward_s": 4e-4, "backward_s": 5e-4}}}
    out = probes.recompute_kernels(host, peak, bw, eff)
    device = sum(cmp.serial_layer_s(probes.probe_spec(), peak, bw, eff["matmul"]["points"], eff["attention"]["forward"]))
    dispatch = 1e-3 / 28 - device / 28
    rec = cmp.serial_layer_s(probes.probe_spec(), peak, bw, eff["matmul"]["points"], eff["attention"]["forward"],
                             dispatch, Recompute.FULL)[0]
    assert out["recompute_full"]["forward_kernels"] == pytest.approx(2e-4 * 28 / 1e-3)
    assert out["recompute_full"]["backward_kernels"] == pytest.approx((9e-4 - rec) * 28 / 1e-3)
    assert out["recompute_selective"] == {"forward_kernels": 0.0, "backward_kernels": 0.0}   # never negative


def test_refit_from_a_run_scales_the_figures_by_measured_over_predicted(synthetic, tmp_path):
    plan = plan_from_dict(DOC)
    before = simulate(plan, engine="des").time_s
    measured = {"time_s": {"forward": 2 * before["forward"], "backward": 2 * before["backward"],
                           "pp_comm": 3 * before["pp_comm"]}}
    run_json = tmp_path / "measured.json"
    run_json.write_text(json.dumps({"measured": {"breakdown": measured}}))   # `validate --json` shape
    old = yaml.safe_load(synthetic.read_text())
    new = refit.refit_profile(synthetic, run_json, plan)
    assert new["efficiency"]["host_overhead_us"] == pytest.approx(2 * old["efficiency"]["host_overhead_us"])
    assert new["device"]["dense_tflops"]["fp32"] == pytest.approx(old["device"]["dense_tflops"]["fp32"] / 2)
    hop = new["efficiency"]["collective"]["nvlink_hop_latency_us"]
    assert hop == pytest.approx(3 * old["efficiency"]["collective"]["nvlink_hop_latency_us"])
    assert new["refits"][0]["ratios"]["compute"] == pytest.approx(2.0)
    after = simulate(plan_from_dict(DOC), engine="des").time_s
    assert after["forward"] == pytest.approx(2 * before["forward"], rel=1e-6)   # overhead and FLOPs both x2
    measured["time_s"]["forward"] = 1000 * after["forward"]
    run_json.write_text(json.dumps(measured))
    clamped = refit.refit_profile(synthetic, run_json, plan_from_dict(DOC))
    assert clamped["refits"][-1]["ratios"]["compute"] == refit.REFIT_CLAMP


def test_refit_from_the_command_line(synthetic, tmp_path, capsys):
    from trainplan.cli import main

    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(DOC))
    before = simulate(plan_from_dict(DOC), engine="des").time_s
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps({"time_s": {"forward": 2 * before["forward"], "backward": 2 * before["backward"]}}))
    assert main(["calibrate", "--out", str(synthetic), "--from-run", str(run_json), "--plan", str(plan_path)]) == 0
    assert "compute x2" in capsys.readouterr().out
    assert yaml.safe_load(synthetic.read_text())["refits"][0]["ratios"]["compute"] == pytest.approx(2.0)
    # the plan the run executed is required, and said so in one sentence
    assert main(["calibrate", "--out", str(synthetic), "--from-run", str(run_json)]) == 2
    assert "needs --plan" in capsys.readouterr().err


def test_refit_needs_a_phase_breakdown(synthetic, tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"step_time_s": 1.0}))
    with pytest.raises(ValueError, match="time_s"):
        refit.refit_profile(synthetic, bad, plan_from_dict(DOC))


def test_quick_calibration_end_to_end(tmp_path, monkeypatch):
    out = tmp_path / "local.yaml"
    prof = cal.calibrate(out, quick=True, progress=False)
    assert prof["measured_on"]["calibration_s"] < 60
    assert prof["efficiency"]["host_overhead_us"] > 0 and prof["device"]["dense_tflops"]["fp32"] > 0
    fits = prof["collectives"]
    assert set(fits) == set(cprobes.WIRE_FACTOR) and all(2 in v for v in fits.values())
    assert set(prof["oversubscription"]["layer_steps_per_s_per_rank"]) == {1, 2}
    assert prof["oversubscription"]["executor_slowdown"][1] == 1.0 and prof["oversubscription"]["executor_slowdown"][2] >= 1.0
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(out))
    pred = simulate(plan_from_dict(DOC))
    assert pred.step_time_s > 0 and math.isfinite(pred.step_time_s)


def test_executor_activation_formula_matches_the_saved_tensor_hooks():
    """Differential: simcore.model.workload's count of what executors.model saves, against the
    executor's own saved-tensor measurement, for two widths and one and two layers."""
    from executors.measure import SavedActivations
    from executors.model import build_model, loss_fn
    from simcore.model import workload as wl
    from simcore.plan.spec import ModelSpec

    torch.manual_seed(0)
    for layers, h, a in ((1, 64, 4), (2, 128, 8)):
        spec = ModelSpec(name="t", layers=layers, hidden=h, heads=a, kv_heads=a, ffn_hidden=4 * h, vocab=256,
                         seq_len=32, tied_embeddings=False)
        model = build_model(spec)
        saved = SavedActivations(model.parameters())
        x, y = torch.randint(0, 256, (1, 32)), torch.randint(0, 256, (1, 32))
        with saved.hooks():
            loss_fn(model(x), y).backward()
        want = layers * wl.executor_activation_bytes_per_layer(spec, b=1, s=32) \
            + wl.executor_embedding_activation_bytes(spec, b=1, s=32) + wl.executor_logits_activation_bytes(spec, b=1, s=32)
        assert saved.peak == pytest.approx(want, abs=8)   # the 4-byte scalar loss is not modelled


def test_parallel_probe_kernels_are_the_median_of_per_round_ratios():
    # 10 kernels per layer (4 + 6); round i: plain (4i, 6i) ms, so i ms per kernel; tp adds
    # (8i, 3i) ms = (8, 3) kernels in that round's units, except round 2 where tp's extra
    # doubles (a load spike on the wrapped variant only): the median ignores it
    def rnd(i, spike=1.0):
        return {"plain": (4e-3 * i, 6e-3 * i), "tp": (4e-3 * i + spike * 8e-3 * i, 6e-3 * i + spike * 3e-3 * i)}

    rows = [{"rounds": [rnd(1), rnd(2, spike=2.0), rnd(3)]}] * 2
    f, b = pprobes._round_kernels(rows, "tp", 4, 6)
    assert f == pytest.approx(8.0) and b == pytest.approx(3.0)
    # a wrapper faster than plain (noise) clamps to zero extra kernels
    rows = [{"rounds": [{"plain": (1e-3, 1e-3), "tp": (0.5e-3, 0.9e-3)}]}]
    assert pprobes._round_kernels(rows, "tp", 1, 1) == (0.0, 0.0)
    # a wrapped model end counts over its own plain counterpart, in the plain layer's unit
    rows = [{"rounds": [{**rnd(i), "head": (1e-3 * i, 2e-3 * i), "tp_head": (3e-3 * i, 2.5e-3 * i)}
                        for i in (1, 2, 3)]}]
    f, b = pprobes._round_kernels(rows, "tp_head", 4, 6, base="head")
    assert f == pytest.approx(2.0) and b == pytest.approx(0.5)


def test_wrapper_costs_are_a_line_through_two_model_depths():
    # per round, the plain layer runs (4i, 6i) ms: i ms per kernel. The plain model at depth
    # L runs L x the layer plus (1, 1) ms of ends; wrapped, each layer costs (5, 8) kernels
    # more and the ends (3, 4) more, FSDP2's root group or TP's embedding and head together.
    # TP's embedding alone costs (1, 3) kernels over plain and its head (3, 1): the fitted
    # ends split in that ratio
    lo, hi = pprobes.WRAPPER_FIT_LAYERS

    def rnd(i):
        ms = lambda f, b: (1e-3 * i * f, 1e-3 * i * b)
        row = {"plain": ms(4, 6), "embed": ms(1, 1), "head": ms(1, 1)}
        for n in (lo, hi):
            row[f"model{n}"] = ms(4 * n + 1, 6 * n + 1)
            for mode in pprobes.WRAPPER_MODES:
                row[f"{mode}{n}"] = ms(9 * n + 4, 14 * n + 5)
        for mode in ("tp", "tp_sp"):
            row[f"{mode}_embed"], row[f"{mode}_head"] = ms(2, 4), ms(4, 2)
        return row

    rows = [{"rounds": [rnd(i) for i in (1, 2, 3)]}] * 2
    out = pprobes.parallel_host_kernels(rows, 4, 6)
    for mode in pprobes.WRAPPER_MODES:
        assert out[mode] == pytest.approx({"forward_kernels": 5.0, "backward_kernels": 8.0})
    for zero in (2, 3):
        assert out[f"fsdp_zero{zero}_root"] == pytest.approx({"forward_kernels": 3.0, "backward_kernels": 4.0})
    assert out["tp_embed"] == pytest.approx({"forward_kernels": 0.75, "backward_kernels": 3.0})
    assert out["tp_head"] == pytest.approx({"forward_kernels": 2.25, "backward_kernels": 1.0})
    assert set(out) == {*pprobes.WRAPPER_MODES, *pprobes.WRAPPER_ENDS}


def test_comm_share_is_the_recorded_exposed_comm_over_the_wrappers_extra_time():
    # recorded steps of the deeper probe model: plain (4, 6) ms; each wrapper adds (10, 20) ms,
    # of which the recorder saw (4, 15) ms on rank 0 and (6, 5) ms on rank 1 in collectives:
    # shares (0.5, 0.5), ranks averaged. More comm than extra time (a recorder artefact) caps
    # at 1; no extra time at all leaves the wrapper's cost all communication (1)
    deep = pprobes.WRAPPER_FIT_LAYERS[-1]

    def row(cf, cb, extra=(10e-3, 20e-3)):
        rec = {f"model{deep}": [4e-3, 6e-3, 0.0, 0.0]}
        rec.update({f"{m}{deep}": [4e-3 + extra[0], 6e-3 + extra[1], cf, cb] for m in pprobes.WRAPPER_MODES})
        return {"recorded": rec}

    out = pprobes.comm_shares([row(4e-3, 15e-3), row(6e-3, 5e-3)])
    assert set(out) == set(pprobes.WRAPPER_MODES)
    assert out["tp"] == pytest.approx([0.5, 0.5])
    assert pprobes.comm_shares([row(30e-3, 0.0)])["fsdp_zero3"] == pytest.approx([1.0, 0.0])
    assert pprobes.comm_shares([row(1e-3, 1e-3, extra=(0.0, -1e-3))])["tp_sp"] == [1.0, 1.0]


def test_oversubscription_tables_carry_the_executor_slowdown():
    # one-rank rates stand; with n ranks each is the one-rank rate over the step's slowdown,
    # whatever the lone GEMM or layer read with n ranks (here they slowed less: 9/10, 90/100)
    measured = {"matmul": {1: 10.0, 2: 9.0, 4: 5.0}, "layer": {1: 100.0, 2: 90.0, 4: 40.0},
                "slowdown": {1: 1.0, 2: 1.25, 4: 2.5}}
    out = osub.derive_oversubscription(measured)
    assert out["matmul"] == pytest.approx({1: 10.0, 2: 8.0, 4: 4.0})
    assert out["layer"] == pytest.approx({1: 100.0, 2: 80.0, 4: 40.0})
    # without a slowdown figure the measured tables stand
    assert osub.derive_oversubscription({k: v for k, v in measured.items() if k != "slowdown"})["layer"][2] == 90.0
    # the probe plan is the validation model, data-parallel on n ranks, 4 micro-batches each
    plan = osub._probe_plan(2)
    assert plan.parallel.dp == 2 and plan.model.layers == 4 and plan.num_microbatches == 4


def test_anchor_makes_the_executor_one_rank_step_predicted_as_measured(synthetic):
    prof = yaml.safe_load(synthetic.read_text())
    before = simulate(osub._probe_plan(1), engine="analytic").time_s
    prof["raw"]["executor_one_rank"] = {"forward": 1.5 * before["forward"], "backward": 1.5 * before["backward"]}
    host_unit, peak = prof["efficiency"]["host_overhead_us"], prof["device"]["dense_tflops"]["fp32"]
    dispatch = prof["efficiency"]["dispatch_us"]
    out = osub.anchor_to_executor(prof, synthetic)
    assert out["device"]["dense_tflops"]["fp32"] == pytest.approx(peak / 1.5)
    assert out["efficiency"]["dispatch_us"] == pytest.approx(dispatch * 1.5)
    assert out["efficiency"]["executor_anchor"]["ratio"] == pytest.approx(1.5)
    assert out["efficiency"]["host_overhead_us"] == host_unit    # the unit of the parallel host costs stays
    after = simulate(osub._probe_plan(1), engine="analytic").time_s  # the profile file was rewritten
    assert after["forward"] + after["backward"] == pytest.approx(1.5 * (before["forward"] + before["backward"]))
    osub._scale_compute(out, 1 / 1.5, host_unit=False)                 # what a refresh undoes first
    assert out["device"]["dense_tflops"]["fp32"] == pytest.approx(peak)
    assert out["efficiency"]["dispatch_us"] == pytest.approx(dispatch)


def test_anchor_fits_a_dispatch_and_a_device_ratio_from_two_widths(synthetic):
    # the executor's steps ran 1.5x the predicted dispatch and 2x the predicted device time, at
    # hidden 64 (mostly dispatch) and at the wide probe's 256 (mostly device): both come back
    prof = yaml.safe_load(synthetic.read_text())
    doubled = yaml.safe_load(synthetic.read_text())
    osub._scale_compute(doubled, 2.0, host_unit=False, device=1.0)
    doubled_path = synthetic.parent / "doubled.yaml"
    doubled_path.write_text(yaml.safe_dump(doubled))
    (db, gb), (dw, gw) = (osub._dispatch_split(synthetic, doubled_path, spec) for spec in (osub.STEP_PROBE_MODEL,
                                                                                           osub.WIDE_PROBE_MODEL))
    assert db > 0 and gb > 0 and gw / dw > gb / db    # the wide step is the more device-bound
    peak, dispatch = prof["device"]["dense_tflops"]["fp32"], prof["efficiency"]["dispatch_us"]
    base, wide = 1.5 * db + 2.0 * gb, 1.5 * dw + 2.0 * gw
    prof["raw"]["executor_one_rank"] = {"forward": 0.4 * base, "backward": 0.6 * base,
                                        "wide_forward": 0.3 * wide, "wide_backward": 0.7 * wide}
    out = osub.anchor_to_executor(prof, synthetic)
    anchor = out["efficiency"]["executor_anchor"]
    assert anchor["ratio"] == pytest.approx(1.5) and anchor["device_ratio"] == pytest.approx(2.0)
    assert out["efficiency"]["dispatch_us"] == pytest.approx(dispatch * 1.5)
    assert out["device"]["dense_tflops"]["fp32"] == pytest.approx(peak / 2.0)
    for spec, want in ((osub.STEP_PROBE_MODEL, base), (osub.WIDE_PROBE_MODEL, wide)):
        t = simulate(osub._probe_plan(1, synthetic, spec), engine="analytic").time_s
        assert t["forward"] + t["backward"] == pytest.approx(want)
    # a wide step that leaves a ratio not positive falls back to one ratio from the first step
    prof = yaml.safe_load(synthetic.read_text())
    osub._scale_compute(prof, 1 / 1.5, host_unit=False, device=1 / 2.0)
    prof["raw"]["executor_one_rank"] = {"forward": 0.4 * base, "backward": 0.6 * base,
                                        "wide_forward": 0.01 * dw, "wide_backward": 0.01 * dw}
    synthetic.write_text(yaml.safe_dump(prof))                         # the file holds the profile
    anchor = osub.anchor_to_executor(prof, synthetic)["efficiency"]["executor_anchor"]
    assert anchor["ratio"] == anchor["device_ratio"] == pytest.approx(base / (db + gb))
    assert "one ratio for both" in anchor["source"]


def test_wrapper_host_costs_are_converted_to_the_simulators_per_kernel_unit():
    # the parallel probe counted TP's extra cost in its own 2-rank per-kernel time (50 us);
    # the simulator's 2-rank per-kernel time is the one-rank one over the executor-derived
    # slowdown: 1 / (400 layers/s x 28 kernels) = 89 us, so the count shrinks by 50/89
    matmul = [{"precision": "fp32", "m": 64, "k": 64, "n": 64, "flops": 2.0 * 64**3, "seconds": 1.0, "flops_per_s": 1e10}]
    memory = {"copy_bytes_per_s": 1e10, "kernel_overhead_s": 5e-6}
    coll = [r for op in cprobes.WIRE_FACTOR for n in (2, 4) for r in _rows(op, n)]
    oversub = {"matmul": {1: 1e10, 2: 8e9}, "layer": {1: 500.0, 2: 400.0}}
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28}
    modes = {k: {"forward_kernels": 10.0, "backward_kernels": 20.0} for k in ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3")}
    parallel = {"ranks": 2, "per_kernel_s": 50e-6, **modes, "optimizer_per_tensor_kernels": 1.0,
                "optimizer_dtensor_per_tensor_kernels": 4.0}
    prof = cal.build_profile(matmul, memory, coll, oversub, None, torch.device("cpu"), host=host, parallel=parallel)
    ph = prof["efficiency"]["parallel_host"]
    assert pprobes.wrapper_kernels(parallel, oversub["layer"]) == {k: ph[k] for k in pprobes.wrapper_kernels(parallel, oversub["layer"])}
    unit = 50e-6 * 400.0 * 28
    assert ph["parallel_unit_factor"] == pytest.approx(unit)
    assert ph["tp"] == pytest.approx({"forward_kernels": 10 * unit, "backward_kernels": 20 * unit})
    assert ph["optimizer_dtensor_per_tensor_kernels"] == pytest.approx(4 * unit)
    # what the simulator then charges at 2 ranks is the probe's measured seconds
    per_kernel_2 = prof["efficiency"]["host_overhead_us"] * 1e-6 * 500.0 / 400.0
    assert ph["tp"]["forward_kernels"] * per_kernel_2 == pytest.approx(10 * 50e-6)
    assert ph["recompute_unit_factor"] == pytest.approx(1e-3 / 28 * 500.0 * 28)


def test_latency_bound_collective_fit_is_capped_at_the_copy_bandwidth():
    # three latency-bound sizes whose times fall with size (noise): the unconstrained
    # slope is negative and 1/slope would run away; the cap holds beta at the host's copy
    # bandwidth, marks the fit, and alpha is refitted under the capped slope
    rows = [{"op": "all_reduce", "ranks": 2, "bytes": b, "seconds": t}
            for b, t in ((4096, 2.1e-4), (65536, 2.0e-4), (1 << 20, 1.9e-4))]
    fit = cprobes.fit_alpha_beta(rows, max_bytes_per_s=1e10)["all_reduce"][2]
    assert fit["bus_bytes_per_s"] == 1e10 and fit["capped_at_copy_bandwidth"]
    assert 0.0 < fit["alpha_s"] < 2.1e-4
    # a fit below the cap is left alone and unmarked
    fit = cprobes.fit_alpha_beta(_rows("all_reduce", 4), max_bytes_per_s=1e10)["all_reduce"][4]
    assert fit["bus_bytes_per_s"] == pytest.approx(BETA, rel=1e-6) and "capped_at_copy_bandwidth" not in fit


def test_busy_rank_figures_in_kernel_units():
    # 60 relay round trips: each rank computes 1 ms per message, a message's transit costs
    # 0.1 ms of which the send call 0.02 ms; posting a receive takes rank 0 0.04 ms and
    # rank 1 0.06 ms; the stream's receiver waits 0.3 ms beyond the compute per message; the
    # lone collectives take the slower rank's call. Unit: 10 us.
    r = pprobes.P2P_PROBE_REPS
    rows = [{"p2p": (r * 2e-3 + 2 * r * 1e-4, r * 1e-3, r * 2e-5, r * 4e-5), "stream": (r * 1e-3, r * 1e-3),
             "lone": {"all_reduce": 1.0e-3, "broadcast": 4e-4}},
            {"p2p": (0.0, r * 1e-3, r * 2e-5, r * 6e-5), "stream": (r * 1.3e-3, r * 1e-3),
             "lone": {"all_reduce": 1.5e-3, "broadcast": 3e-4}}]
    raw, k = pprobes._busy_rank_kernels(rows, 1e-5)
    assert raw["p2p_per_message_s"] == pytest.approx(1e-4) and raw["p2p_send_s"] == pytest.approx(2e-5)
    assert raw["p2p_post_s"] == pytest.approx(5e-5)
    assert k == pytest.approx({"p2p_send_kernels": 2.0, "p2p_latency_kernels": 30.0, "p2p_wake_kernels": 8.0,
                               "p2p_post_kernels": 5.0, "lone_all_reduce_kernels": 150.0,
                               "lone_broadcast_kernels": 40.0})
    # a probe that ran no lone collectives (world > 2) gives the pipeline figures alone
    k = pprobes._busy_rank_kernels([{kk: v for kk, v in row.items() if kk != "lone"} for row in rows], 1e-5)[1]
    assert set(k) == {"p2p_send_kernels", "p2p_latency_kernels", "p2p_wake_kernels", "p2p_post_kernels"}
    # the receive wait holds the post: a post read longer than the wait is capped by it
    rows[1]["stream"] = (r * 1.02e-3, r * 1e-3)
    assert pprobes._busy_rank_kernels(rows, 1e-5)[1]["p2p_post_kernels"] == pytest.approx(2.0)
    # four ranks relay in two pairs at once: each pair's figures, averaged over the pairs
    slow = [dict(rows[0], p2p=(r * 2e-3 + 2 * r * 3e-4, r * 1e-3, r * 2e-5, r * 4e-5)), rows[1]]
    raw = pprobes._busy_rank_kernels(rows + slow, 1e-5)[0]
    assert raw["p2p_per_message_s"] == pytest.approx(2e-4) and raw["p2p_send_s"] == pytest.approx(2e-5)


def test_grouped_parallel_probe_runs_two_pairs_side_by_side():
    """Four real ranks: two TP pairs, each wrapping its own model and relaying between its
    own two ranks; the wrapper costs more than the plain model, and a world that does not
    split into pairs is refused."""
    out = pprobes.bench_parallel_host(world=4, reps=4, rounds=1, modes=("tp",))
    assert out["ranks"] == 4 and set(out["comm_share"]) == {"tp"}
    assert out["tp"]["forward_kernels"] > 0 and out["tp"]["backward_kernels"] > 0
    assert {"tp_embed", "tp_head"} <= set(out) and "tp_sp" not in out and "fsdp_zero3" not in out
    assert "optimizer_per_tensor_kernels" not in out and "pipeline_chunk" not in out
    assert out["p2p_send_kernels"] > 0 and out["raw"]["p2p_per_message_s"] > 0
    with pytest.raises(ValueError, match="groups of 2"):
        pprobes.bench_parallel_host(world=3)


def test_host_costs_are_pooled_over_this_hosts_last_calibrations():
    def prof(tp, chunk, date, host="vm"):
        return {"measured_on": {"host": host, "torch": "2.13.0+cpu", "device": "cpu", "date": date},
                "efficiency": {"parallel_host": {"tp": {"forward_kernels": tp, "backward_kernels": 2 * tp},
                                                 "pipeline_chunk": {"forward_kernels": chunk, "backward_kernels": 1.0},
                                                 "p2p_send_kernels": 3.0, "source": "probe"}}}

    # a first calibration stands alone
    first = cal.pool_host_costs(prof(100.0, 1.0, "d1"), None)
    assert first["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 100.0
    # the next ones take the median per entry and direction over the history kept so far
    second = cal.pool_host_costs(prof(60.0, 5.0, "d2"), first)
    third = cal.pool_host_costs(prof(110.0, 2.0, "d3"), second)
    ph = third["efficiency"]["parallel_host"]
    assert ph["tp"] == {"forward_kernels": 100.0, "backward_kernels": 200.0}
    assert ph["pipeline_chunk"]["forward_kernels"] == 2.0 and ph["pooled_calibrations"] == 3
    assert ph["p2p_send_kernels"] == 3.0                  # re-measured by every refresh: not pooled
    assert "median over the last 3" in ph["source"] and ph["source"].count("pooled:") == 1
    # only the last HOST_COST_HISTORY calibrations count
    cur = third
    for i in range(cal.HOST_COST_HISTORY):
        cur = cal.pool_host_costs(prof(10.0, 1.0, f"e{i}"), cur)
    assert cur["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 10.0
    assert len(cur["raw"]["host_cost_history"]) == cal.HOST_COST_HISTORY
    # a profile from before the history counts with its own figures
    legacy = prof(80.0, 1.0, "d0")
    assert cal.pool_host_costs(prof(60.0, 1.0, "d1"), legacy)["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 70.0
    # another host's (or torch's) history is not mixed in
    other = cal.pool_host_costs(prof(50.0, 1.0, "f1", host="other"), third)
    assert other["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 50.0
    assert len(other["raw"]["host_cost_history"]) == 1
    # nor a history measured by another probe method, nor a legacy profile of one
    newer = prof(40.0, 1.0, "g1")
    newer["efficiency"]["parallel_host"]["probe_method"] = pprobes.PARALLEL_PROBE_METHOD
    pooled = cal.pool_host_costs(newer, third)
    assert pooled["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 40.0
    assert pooled["raw"]["host_cost_history"][-1]["method"] == pprobes.PARALLEL_PROBE_METHOD
    assert cal.pool_host_costs(prof(40.0, 1.0, "g2"), legacy)["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 60.0
    # the wrappers' communication shares are pooled alike, over the calibrations that measured them
    cur = first
    for share, date in (([0.2, 0.4], "h1"), ([0.6, 0.5], "h2"), ([0.5, 0.9], "h3")):
        p = prof(100.0, 1.0, date)
        p["efficiency"]["parallel_host"]["comm_share"] = {"tp": share}
        cur = cal.pool_host_costs(p, cur)
    assert cur["efficiency"]["parallel_host"]["comm_share"] == {"tp": [0.5, 0.5]}
    # the grouped probe's point-to-point figures, which no refresh re-measures, are pooled too
    cur = first
    for lat, date in ((30.0, "k1"), (25.0, "k2"), (4.0, "k3")):
        p = prof(100.0, 1.0, date)
        p["efficiency"]["parallel_host"].update({"p2p_latency_kernels@4": lat, "p2p_latency_kernels": lat})
        cur = cal.pool_host_costs(p, cur)
    assert cur["efficiency"]["parallel_host"]["p2p_latency_kernels@4"] == 25.0
    assert cur["efficiency"]["parallel_host"]["p2p_latency_kernels"] == 4.0   # this calibration's own
    assert [h.get("p2p_latency_kernels@4") for h in cur["raw"]["host_cost_history"]] == [None, 30.0, 25.0, 4.0]
    assert len(cur["raw"]["host_cost_history"]) == 4      # the first had no shares: not in their median


def test_host_costs_pool_in_a_share_of_the_executors_one_rank_step():
    def prof(tp, opt, unit_us, step_s, date):
        return {"measured_on": {"host": "vm", "torch": "2.13.0+cpu", "device": "cpu", "date": date},
                "efficiency": {"host_overhead_us": unit_us, "host_overhead_source": "probe layer",
                               "parallel_host": {"tp": {"forward_kernels": tp, "backward_kernels": 2 * tp},
                                                 "optimizer_per_tensor_kernels": opt,
                                                 "p2p_send_kernels": 3.0, "source": "probe"}},
                "raw": {"executor_one_rank": {"forward": step_s / 2, "backward": step_s / 2}}}

    # one calibration: the unit is its own host kernel time, now as a share of its step
    first = cal.pool_host_costs(prof(100.0, 4.0, 40.0, 0.02, "d1"), None)
    eff = first["efficiency"]
    assert eff["host_overhead_per_step"] == pytest.approx(40e-6 / 0.02)
    assert eff["host_overhead_us"] == pytest.approx(40.0) and eff["parallel_host"]["tp"]["forward_kernels"] == 100.0
    # a calibration whose probe layer read the host 2x slow against its step counted half the
    # kernels for the same wrapper seconds: in the pooled unit its counts agree with the first's
    second = cal.pool_host_costs(prof(50.0, 2.0, 80.0, 0.02, "d2"), first)
    third = cal.pool_host_costs(prof(100.0, 4.0, 40.0, 0.02, "d3"), second)
    eff = third["efficiency"]
    assert eff["host_overhead_per_step"] == pytest.approx(40e-6 / 0.02)     # the median share
    assert eff["parallel_host"]["tp"] == {"forward_kernels": pytest.approx(100.0), "backward_kernels": pytest.approx(200.0)}
    assert eff["host_overhead_us"] == pytest.approx(40.0)
    # the seconds each calibration measured come back: kernels x unit
    assert second["efficiency"]["parallel_host"]["tp"]["forward_kernels"] * second["efficiency"]["host_overhead_us"] \
        == pytest.approx(100.0 * 40.0)
    # this calibration's own unmeasured-by-refresh figures move into the pooled unit; the
    # refresh's own (p2p) stay
    assert second["efficiency"]["parallel_host"]["optimizer_per_tensor_kernels"] * \
        second["efficiency"]["host_overhead_us"] == pytest.approx(2.0 * 80.0)
    assert third["efficiency"]["parallel_host"]["p2p_send_kernels"] == 3.0
    assert "executor one-rank step" in eff["parallel_host"]["source"] and "as a share" in eff["host_overhead_source"]
    # a history without the step (an older calibration) is not mixed with one that has it
    legacy = cal.pool_host_costs(
        {k: v for k, v in prof(30.0, 1.0, 40.0, 0.02, "d0").items() if k != "raw"}, None)
    assert "unit_per_step" not in legacy["raw"]["host_cost_history"][0]
    fresh = cal.pool_host_costs(prof(100.0, 4.0, 40.0, 0.02, "d4"), legacy)
    assert len(fresh["raw"]["host_cost_history"]) == 1 and fresh["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 100.0


def _refreshable_profile(**efficiency) -> dict:
    """The CPU profile figures ``refresh_host_speed`` reads, the host kernel time a share of the step."""
    return {"measured_on": {"device": "cpu"},
            "device": {"dense_tflops": {"fp32": 0.05}, "hbm_tbyte_per_s": 0.01},
            "efficiency": {"host_overhead_us": 40.0, "host_overhead_per_step": 2e-3, **efficiency},
            "oversubscription": {"matmul_flops_per_s_per_rank": {1: 5e10}},
            "raw": {"host_overhead": {"per_kernel_s": 4e-5, "forward_kernels": 12, "backward_kernels": 16}}}


def test_refresh_takes_the_host_kernel_time_from_the_executors_step(tmp_path, monkeypatch):
    """The refresh's host kernel time is the pooled share of the one-rank step it measures."""
    prof = _refreshable_profile()
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    oversub = {"matmul": {1: 5e10}, "layer": {1: 1000.0, 2: 600.0}, "slowdown": {1: 1.0},
               "one_rank_step": {"forward": 0.012, "backward": 0.018}}
    monkeypatch.setattr(cal, "bench_oversubscription", lambda **kw: oversub)
    monkeypatch.setattr(cal, "anchor_to_executor", lambda p, path: p)
    out = cal.refresh_host_speed(path)
    assert out["efficiency"]["host_overhead_us"] == pytest.approx(2e-3 * 0.030 * 1e6)   # 60 us
    # without the pooled share the probe layer's per-kernel time stands, as before
    del prof["efficiency"]["host_overhead_per_step"]
    path.write_text(yaml.safe_dump(prof))
    out = cal.refresh_host_speed(path)
    assert out["efficiency"]["host_overhead_us"] == pytest.approx(1e6 / (1000.0 * 28))


def test_point_to_point_figures_return_the_probes_seconds_in_a_plan(tmp_path, monkeypatch):
    """The pipeline point-to-point figures are counted in the probe's own per-kernel time on
    two busy ranks; converted, a 2-rank plan on the profile charges the seconds the probe
    measured, whatever the simulator's host kernel time (the refresh converts its own)."""
    from simcore.model import compute as cmp
    from simcore.plan.spec import plan_from_dict

    prof = yaml.safe_load((Path(__file__).resolve().parents[2] / "data" / "localhost-profile.yaml").read_text())
    eff = prof["efficiency"]
    eff["host_overhead_us"] = 30.0
    eff["host_oversubscription"] = {"1": 1000.0, "2": 800.0}   # 2 ranks: 37.5 us per kernel
    probe_kernel_s = 60e-6
    eff["parallel_host"].update({"p2p_send_kernels": 3.0, "p2p_latency_kernels": 10.0, "p2p_wake_kernels": 1.0,
                                 "p2p_post_kernels": 0.5, "lone_all_reduce_kernels": 20.0,
                                 "lone_broadcast_kernels": 5.0})
    cal.p2p_in_sim_unit(eff, probe_kernel_s, 2)
    assert eff["parallel_host"]["p2p_unit_factor"] == pytest.approx(60.0 / 37.5)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    plan = plan_from_dict({"model": {"name": "tiny", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256,
                                     "seq_len": 32, "tied_embeddings": False},
                           "cluster": {"node": "localhost", "gpus_per_node": 2}, "parallel": {"dp": 1, "pp": 2},
                           "training": {"global_batch": 8, "micro_batch": 1, "precision": "fp32"}})
    dev = cmp.device_model(plan.cluster.node.gpu, "fp32")
    assert dev.p2p_send_s == pytest.approx(3.0 * probe_kernel_s)
    assert dev.busy_p2p_latency_s == pytest.approx(10.0 * probe_kernel_s)
    assert dev.p2p_wake_s == pytest.approx(1.0 * probe_kernel_s)
    assert dev.p2p_post_s == pytest.approx(0.5 * probe_kernel_s)
    from simcore.model.step_costs import step_costs
    assert step_costs(plan).p2p_post_s == pytest.approx(0.5 * probe_kernel_s)   # 1F1B: the engine fuses it
    # the lone collectives stay in the probe's unit (converted, they sent dp2-pp2 59% over)
    assert dev.lone_all_reduce_s == pytest.approx(20.0 * 37.5e-6)
    assert dev.lone_broadcast_s == pytest.approx(5.0 * 37.5e-6)

    # the refresh converts the figures it re-measures with the unit it sets
    refreshed = _refreshable_profile(parallel_host={"p2p_send_kernels": 99.0})
    path.write_text(yaml.safe_dump(refreshed))
    monkeypatch.setattr(cal, "bench_oversubscription", lambda **kw: {
        "matmul": {1: 5e10}, "layer": {1: 1000.0, 2: 600.0}, "slowdown": {1: 1.0},
        "one_rank_step": {"forward": 0.012, "backward": 0.018}})
    monkeypatch.setattr(cal, "bench_p2p", lambda: {"kernels": {"p2p_send_kernels": 3.0}, "per_kernel_s": 80e-6,
                                                   "ranks": 2})
    monkeypatch.setattr(cal, "anchor_to_executor", lambda p, path: p)
    out = cal.refresh_host_speed(path)["efficiency"]
    unit_2 = out["host_overhead_us"] * 1e-6 * 1000.0 / 600.0   # 60 us x 5/3: the simulator's 2-rank kernel
    assert out["parallel_host"]["p2p_send_kernels"] * unit_2 == pytest.approx(3.0 * 80e-6)


def test_grouped_probe_figures_stand_for_runs_nearer_its_rank_count(tmp_path, monkeypatch):
    """The parallel probe on four ranks (two TP pairs side by side) keeps its figures as
    ``name@4``: a plan with four ranks on the host is charged them, one with two the
    two-rank probe's, and neither sees the other's entries."""
    from simcore.model import compute as cmp
    from simcore.plan.spec import plan_from_dict
    from topologies.hardware import parallel_host_for_ranks

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
    from topologies.hardware import CatalogError
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
    coll = [r for op in cprobes.WIRE_FACTOR for n in (2, 4) for r in _rows(op, n)]
    oversub = {"matmul": {1: 1e10, 2: 8e9, 4: 4e9}, "layer": {1: 500.0, 2: 400.0, 4: 250.0}}
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28}
    modes = {k: {"forward_kernels": 10.0, "backward_kernels": 20.0} for k in ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3")}
    parallel = {"ranks": 2, "per_kernel_s": 50e-6, **modes, "optimizer_per_tensor_kernels": 1.0,
                "optimizer_dtensor_per_tensor_kernels": 4.0, "comm_share": {"tp": [0.4, 0.3]}}
    grouped = {"ranks": 4, "per_kernel_s": 60e-6, "tp": {"forward_kernels": 30.0, "backward_kernels": 40.0},
               "comm_share": {"tp": [0.7, 0.6]}, "p2p_send_kernels": 2.0, "p2p_latency_kernels": 20.0}
    prof = cal.build_profile(matmul, memory, coll, oversub, None, torch.device("cpu"), host=host,
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
    assert cal.at_ranks(grouped, {1: 500.0, 2: 400.0}) == {}
