"""simcore.planner.uncertainty: intervals from residual tables, checked against closed forms."""
import math
import statistics
from types import SimpleNamespace

import pytest

from simcore.planner import uncertainty as u


def test_quantile_is_type7_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]          # sorted 1 2 3 4: position (n-1)q
    assert u.quantile(xs, 0.0) == 1.0
    assert u.quantile(xs, 1.0) == 4.0
    assert u.quantile(xs, 0.5) == pytest.approx(2.5)
    assert u.quantile(xs, 0.25) == pytest.approx(1.75)


def test_small_sample_uses_students_prediction_interval():
    rs = [-0.1, 0.0, 0.1]              # mean 0, sd 0.1, 2 degrees of freedom: t_0.95 = 2.919986 (exact)
    lo, hi = u.log_bounds(rs, 0.9)
    half = 2.919985580353724 * 0.1 * math.sqrt(1 + 1 / 3)
    assert (lo, hi) == pytest.approx((-half, half))
    plo, phi = u.interval(2.0, rs, 0.9)
    assert (plo, phi) == pytest.approx((2.0 * math.exp(-half), 2.0 * math.exp(half)))


@pytest.mark.parametrize("dof, table", [(1, 6.313752), (3, 2.353363), (5, 2.015048), (9, 1.833113),
                                        (19, 1.729133)])
def test_t_quantile_against_the_table(dof, table):
    """Student's t at 0.95 (the 90% interval's upper quantile), from a printed table."""
    assert u.t_quantile(0.95, dof) == pytest.approx(table, rel=2e-3)


def test_a_students_interval_covers_90_percent_of_new_draws_from_small_samples():
    """Simulated: normal samples of 5, then a new draw; the interval holds it 90% of the time
    (the normal quantile's held it about 84%)."""
    import random
    rng, hit, trials = random.Random(7), 0, 4000
    for _ in range(trials):
        xs = [rng.gauss(0, 1) for _ in range(5)]
        lo, hi = u.log_bounds(xs, 0.9)
        hit += lo <= rng.gauss(0, 1) <= hi
    assert 0.88 <= hit / trials <= 0.92


def test_large_sample_uses_empirical_quantiles():
    rs = [i / 100 for i in range(-50, 51)]   # 101 points: the 5% and 95% quantiles are -0.45, 0.45
    assert u.log_bounds(rs, 0.9) == pytest.approx((-0.45, 0.45))


def test_interval_of_a_constant_bias_is_that_bias():
    lo, hi = u.interval(1.0, [math.log(1.2)] * 5)
    assert lo == pytest.approx(1.2) and hi == pytest.approx(1.2)


@pytest.mark.parametrize("rs, level", [([0.1], 0.9), ([0.1, 0.2], 1.0), ([0.1, 0.2], 0.0)])
def test_bad_inputs_raise(rs, level):
    with pytest.raises(ValueError):
        u.log_bounds(rs, level)


def test_residual_is_log_ratio_and_nan_when_undefined():
    assert u.residual(2.0, 3.0) == pytest.approx(math.log(1.5))
    assert math.isnan(u.residual(0.0, 1.0))


def _par(**kw):
    base = dict(tp=1, pp=1, dp=1, cp=1, ep=1, zero=0)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw, cls", [({}, "single"), ({"dp": 2}, "dp"), ({"dp": 2, "zero": 3}, "zero3"),
                                     ({"dp": 2, "pp": 2}, "dp+pp"), ({"tp": 2, "pp": 2}, "tp+pp"),
                                     ({"tp": 2}, "tp")])
def test_layout_class(kw, cls):
    assert u.layout_class(_par(**kw)) == cls


def _plan(gpu_name="cpu-x86_64", vendor="cpu", **par):
    node = SimpleNamespace(gpu=SimpleNamespace(name=gpu_name, vendor=vendor))
    return SimpleNamespace(cluster=SimpleNamespace(node=node), parallel=_par(**par))


TABLES = {"cpu-gloo": {"measured": {"set": "local", "when": "2026-01-01"},
                       "residuals": {"dp": {"step_time_s": [0.1, 0.2, 0.3]},
                                     "pp": {"step_time_s": [-0.1]}}}}


def test_prediction_interval_uses_own_class_then_pooled():
    own = u.prediction_interval(_plan(dp=2), 1.0, tables=TABLES)
    assert own.n == 3 and "layout class dp" in own.source and "local" in own.source
    mu, sd = 0.2, statistics.stdev([0.1, 0.2, 0.3])
    half = u.t_quantile(0.95, 2) * sd * math.sqrt(4 / 3)   # 2.919986: 3 residuals, 2 degrees of freedom
    assert (own.lo, own.hi) == pytest.approx((math.exp(mu - half), math.exp(mu + half)))
    pooled = u.prediction_interval(_plan(pp=2), 1.0, tables=TABLES)
    assert pooled.n == 4 and "pooled" in pooled.source
    assert u.prediction_interval(_plan("h100-sxm", "nvidia", dp=2), 1.0, tables=TABLES) is None


def test_residual_table_and_merge_round_trip():
    rows = [{"class": "dp", "pred_step_time_s": 1.0, "meas_step_time_s": 2.0},
            {"class": "dp", "pred_step_time_s": 1.0, "meas_step_time_s": 0.0}]
    table = u.residual_table(rows, ("step_time_s",))
    assert table == {"dp": {"step_time_s": [round(math.log(2.0), 5)]}}
    doc = u.merge_residuals({"kinds": {"h100-sxm": {"residuals": {}}}}, "cpu-gloo", table, {"set": "s"})
    assert set(doc["kinds"]) == {"h100-sxm", "cpu-gloo"} and doc["kinds"]["cpu-gloo"]["residuals"] == table


def test_uncertainty_does_not_import_torch():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(u))
    names = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "torch" not in names and "torch" not in mods


def test_interval_fields_for_the_cli():
    pred = SimpleNamespace(step_time_s=2.0)
    got = u.interval_fields(_plan(dp=2), pred, tables=TABLES)
    assert got["interval_s"][0] < 2.0 * math.exp(0.2) < got["interval_s"][1] and "class dp" in got["interval_source"]
    none = u.interval_fields(_plan("h100-sxm", "nvidia"), pred, tables=TABLES)
    assert none["interval_s"] is None and "h100-sxm" in none["interval_source"]


def test_a_tpu_job_across_slices_reads_the_multislice_residuals():
    # Google's DCN figures are judgements (fabrics.yaml ``judgements``): a job spanning slices over it
    # reads the residuals of the published multislice runs, one slice its kind's; other fabrics do not split
    from simcore.plan.load import plan_from_dict

    def kind(node, nodes, **par):
        doc = {"model": "llama3-8b", "cluster": {"node": node, "nodes": nodes}, "parallel": {"zero": 3, **par},
               "training": {"global_batch": 1024}}
        return u.residual_kind(plan_from_dict(doc).cluster)

    assert kind("tpu-v5e-host", 32, dp=256) == "tpu-v5e"                       # one 16x16 slice
    assert kind("tpu-v5e-host", 64, dp=512) == "tpu-v5e over gcp-dcn-100"      # two slices
    assert kind("dgx-h100", 64, dp=512) == "h100-sxm"                          # NICs between NVLink domains
    assert kind("trn1-32xl", 32, dp=512, zero=1) == "trn1"                      # EFA: a sourced figure
    tables = {"tpu-v5e": {"residuals": {"zero3": {"step_time_s": [0.1, -0.1, 0.05]}}}}
    rs, _ = u.pick_residuals(tables, "tpu-v5e over gcp-dcn-100", "zero3", "step_time_s")
    assert rs == [0.1, -0.1, 0.05]                                             # none of its own: the kind's
