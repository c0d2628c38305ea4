"""The oversubscription tables and the anchor of the compute figures to the executor's
own one-rank steps (``executors.calibrate.oversubscription``)."""
import pytest
import yaml

from executors.calibrate import oversubscription as osub
from simcore.engine.predict import simulate


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
