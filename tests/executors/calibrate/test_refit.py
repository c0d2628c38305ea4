"""The refit of a profile from a measured run (``executors.calibrate.refit``), from Python
and from the command line."""
import json

import pytest
import yaml

from executors.calibrate import refit
from simcore.engine.predict import simulate
from simcore.plan.load import plan_from_dict
from tests.executors.calibrate.synthetic import DOC


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
