"""trainplan.validate / reports.compare: the matrix file, the comparison arithmetic, the
intervals, and (CI) two tiny layouts predicted and run for real with a generous bound."""
import dataclasses
import math
from pathlib import Path

import pytest

from reports.compare import compare
from trainplan.validate import load_matrix, validate_matrix
from simcore.engine.predict import simulate
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError

MATRIX = Path(__file__).resolve().parents[2] / "validation" / "local.yaml"


def test_matrix_layouts_merge_into_the_base():
    layouts = dict(load_matrix(MATRIX))
    assert len(layouts) == 27
    wider = layouts["dp2-wider"]
    assert wider["model"]["hidden"] == 128 and wider["model"]["layers"] == 4   # merged, not replaced
    assert wider["name"] == "dp2-wider" and wider["parallel"] == {"dp": 2}
    for name, doc in layouts.items():   # every layout is a valid Plan
        assert plan_from_dict(doc, MATRIX.parent).name == name


@pytest.mark.parametrize("text, match", [("layouts: {}\n", "layouts"), ("a: [\n", "not valid YAML")])
def test_bad_matrix_files_are_refused(tmp_path, text, match):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(PlanError, match=match):
        load_matrix(path)


def test_unknown_layout_is_named():
    with pytest.raises(PlanError, match="unknown layout 'nope'"):
        validate_matrix(MATRIX, only=["nope"], progress=False)


def _plan(name="dp2"):
    return plan_from_dict(dict(load_matrix(MATRIX))[name], MATRIX.parent)


def test_compare_errors_are_relative_to_the_measurement():
    pred = simulate(_plan())
    meas = dataclasses.replace(pred, source="measured", step_time_s=2 * pred.step_time_s,
                               time_s={**pred.time_s, "forward": pred.time_s["forward"] / 2})
    c = compare(pred, meas)
    assert c.error("step_time_s") == pytest.approx(-0.5)
    assert c.error("phase.forward") == pytest.approx(1.0)
    assert c.error("memory_per_gpu_gib") == pytest.approx(0.0)


def test_compare_carries_intervals_from_residual_tables():
    plan = _plan()
    pred = simulate(plan)
    tables = {"cpu-gloo": {"measured": {"set": "test"}, "residuals": {"dp": {"step_time_s": [0.0, 0.1, 0.2]}}}}
    c = compare(pred, dataclasses.replace(pred, step_time_s=1.1 * pred.step_time_s), plan=plan, tables=tables)
    iv = c.intervals["step_time_s"]
    assert iv.lo < 1.1 * pred.step_time_s < iv.hi and iv.n == 3
    assert c.to_json()["intervals"]["step_time_s"]["measured_inside"] is True
    assert "memory_per_gpu_gib" not in c.intervals        # no memory residuals in the table


def test_two_layouts_predicted_and_run(tmp_path):
    """CI: the loop closes on dp2 and pp2-1f1b (few steps). The bound is generous (a factor
    of 20 on the step, 5% on the weights): this checks the machinery, not the accuracy
    (that is bench/validate_local.py). Each layout's two traces go to the trace folder."""
    result = validate_matrix(MATRIX, only=["dp2", "pp2-1f1b"], steps=3, warmup=1, progress=False,
                             trace_dir=tmp_path / "traces")
    assert result.failures == ()
    assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == [
        f"{n}-{k}.json" for n in ("dp2", "pp2-1f1b") for k in ("measured", "predicted")]
    assert list(result.table["layout"]) == ["dp2", "pp2-1f1b"]
    assert list(result.table["class"]) == ["dp", "pp"]
    for comp, row in zip(result.comparisons, result.table.to_dict(orient="records")):
        p, m = comp.predicted, comp.measured
        assert m.source == "measured" and m.step_time_s > 0
        assert abs(math.log(p.step_time_s / m.step_time_s)) < math.log(20)
        assert row["step_err"] == pytest.approx((p.step_time_s - m.step_time_s) / m.step_time_s)
        assert comp.error("memory.weights") == pytest.approx(0.0, abs=0.05)


def _bench_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "validate_local.py"
    spec = importlib.util.spec_from_file_location("validate_local_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_takes_a_layouts_median_repeat_and_keeps_the_average_beside_it():
    bench = _bench_module()

    def run(pred, meas):
        return {"layout": "tp2", "pred_step_s": pred, "meas_step_s": meas, "step_err": (pred - meas) / meas,
                "step_lo_s": 0.8 * pred, "step_hi_s": 1.2 * pred, "pred_mem_gib": 1.0, "meas_mem_gib": 1.0,
                "mem_err": 0.0}

    # one disturbed repeat (measured 2.4x its prediction) of three does not decide the layout
    runs = [run(1.03, 1.0), run(1.0, 2.44), run(1.11, 1.0)]
    row = bench.combine(runs)
    assert row["step_err"] == pytest.approx(0.03) and row["meas_step_s"] == 1.0 and row["in_interval"]
    assert row["mean_step_err"] == pytest.approx((3.14 / 3 - 4.44 / 3) / (4.44 / 3))
    assert row["repeat_errs"] == "+3% -59% +11%"
    # an even count averages the middle two
    row = bench.combine(runs + [run(1.2, 1.0)])
    assert row["pred_step_s"] == pytest.approx((1.03 + 1.11) / 2) and row["meas_step_s"] == pytest.approx(1.0)
