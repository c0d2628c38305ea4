"""The refit of a profile from a measured run (``executors.calibrate.refit``), from Python
and from the command line."""
import json

import pytest
import yaml

from executors.calibrate import refit
from executors.measure import plan_identity
from simcore.engine.predict import simulate
from simcore.plan.load import plan_from_dict
from tests.executors.calibrate.synthetic import DOC


def test_refit_from_a_run_scales_the_figures_by_measured_over_predicted(synthetic, tmp_path):
    plan = plan_from_dict(DOC)
    before = simulate(plan, engine="des").time_s
    measured = {"time_s": {"forward": 2 * before["forward"], "backward": 2 * before["backward"],
                           "pp_comm": 3 * before["pp_comm"]}}
    run_json = tmp_path / "measured.json"
    run_json.write_text(json.dumps({"measured": {"breakdown": measured}, "plan": plan_identity(plan)}))   # `validate --json`
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
    run_json.write_text(json.dumps({**measured, "plan": plan_identity(plan)}))   # `run --json` shape
    clamped = refit.refit_profile(synthetic, run_json, plan_from_dict(DOC))
    assert clamped["refits"][-1]["ratios"]["compute"] == refit.REFIT_CLAMP


def test_refit_from_the_command_line(synthetic, tmp_path, capsys):
    from trainplan.cli import main

    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(DOC))
    before = simulate(plan_from_dict(DOC), engine="des").time_s
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps({"time_s": {"forward": 2 * before["forward"], "backward": 2 * before["backward"]},
                                    "plan": plan_identity(plan_from_dict(DOC))}))
    old = yaml.safe_load(synthetic.read_text())
    assert main(["calibrate", "--out", str(synthetic), "--from-run", str(run_json), "--plan", str(plan_path)]) == 0
    out = capsys.readouterr().out
    assert "compute x2" in out
    # what changed and by how much, one line a figure; the previous profile kept as the backup
    fp32 = old["device"]["dense_tflops"]["fp32"]
    assert f"  device.dense_tflops.fp32: {fp32:.4g} -> {fp32 / 2:.4g} (x0.5)" in out.splitlines()
    assert yaml.safe_load((synthetic.parent / "profile.yaml.bak").read_text()) == old
    assert yaml.safe_load(synthetic.read_text())["refits"][0]["ratios"]["compute"] == pytest.approx(2.0)
    # the plan the run executed is required, and said so in one sentence
    assert main(["calibrate", "--out", str(synthetic), "--from-run", str(run_json)]) == 2
    assert "needs --plan" in capsys.readouterr().err


def test_refit_needs_a_phase_breakdown(synthetic, tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"step_time_s": 1.0, "plan": plan_identity(plan_from_dict(DOC))}))
    with pytest.raises(ValueError, match="time_s"):
        refit.refit_profile(synthetic, bad, plan_from_dict(DOC))


def _run_of(doc: dict, tmp_path) -> str:
    """A measured-run document (`run --json` shape) of the plan ``doc``, twice as slow as predicted."""
    plan = plan_from_dict(doc)
    pred = simulate(plan, engine="des").time_s
    path = tmp_path / f"run-{plan_identity(plan)['sha256'][:8]}.json"
    path.write_text(json.dumps({"source": "measured", "time_s": {k: 2 * v for k, v in pred.items()},
                                "plan": plan_identity(plan)}))
    return str(path)


def test_a_run_of_another_plan_is_refused_and_the_profile_left_untouched(synthetic, tmp_path, capsys):
    from trainplan.cli import main

    other = {**DOC, "name": "big", "model": {**DOC["model"], "layers": 8, "hidden": 128},
             "training": {**DOC["training"], "global_batch": 8}}
    plan_path = tmp_path / "plan.yaml"
    plan_path.write_text(yaml.safe_dump(DOC))
    before = synthetic.read_bytes()
    assert main(["calibrate", "--out", str(synthetic), "--from-run", _run_of(other, tmp_path),
                 "--plan", str(plan_path)]) == 2
    err = capsys.readouterr().err
    assert "measured plan 'big', not --plan 't'" in err and "model.layers 8 vs 2" in err
    assert "training.global_batch 8 vs 4" in err and len(err.strip().splitlines()) == 1
    assert synthetic.read_bytes() == before and not (tmp_path / "profile.yaml.bak").exists()
    # a run that does not say what it ran, and a prediction, are refused alike
    anonymous = tmp_path / "anonymous.json"
    anonymous.write_text(json.dumps({"time_s": {"forward": 1.0}}))
    predicted = tmp_path / "predicted.json"
    predicted.write_text(json.dumps({"source": "des", "time_s": {"forward": 1.0}, "plan": plan_identity(plan_from_dict(DOC))}))
    for path, why in ((anonymous, "does not say which plan it ran"), (predicted, "is a prediction")):
        assert main(["calibrate", "--out", str(synthetic), "--from-run", str(path), "--plan", str(plan_path)]) == 2
        assert why in capsys.readouterr().err
    assert synthetic.read_bytes() == before
    # the same plan under another name and file is the same plan
    assert main(["calibrate", "--out", str(synthetic), "--from-run", _run_of({**DOC, "name": "renamed"}, tmp_path),
                 "--plan", str(plan_path)]) == 0
    assert (tmp_path / "profile.yaml.bak").read_bytes() == before
