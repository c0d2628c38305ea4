"""bench/fit.py: the catalog's FITTED figures are what the stated fit gives, and no hand edit
sits between them; the intervals built from the leave-one-source-out residuals cover what
they say."""
from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest
import yaml

from simcore.planner import uncertainty as u

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = ROOT.parent / "shared" / "validation"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        yield {name: importlib.import_module(name) for name in ("fitting", "fit_rows", "fit")}
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_the_writer_reproduces_the_catalog_byte_for_byte(bench):
    # the catalog's fitted figures read back and written again: every line unchanged
    F, fit = bench["fitting"], bench["fit"]
    assert fit.catalog_text(F.stored_values()) == fit.EFFICIENCY.read_text()
    assert F.efficiency_with({}) == F.BASE


def test_fits_yaml_holds_the_catalogs_figures(bench):
    # validation/fits.yaml (its leave-one-source-out figures) was written by the fit that wrote the catalog
    F = bench["fitting"]
    fits = yaml.safe_load((ROOT / "validation" / "fits.yaml").read_text())
    assert {k: f["value"] for k, f in fits["figures"].items()} == F.stored_values()
    for f in F.FIGURES:
        assert f.lo <= F.stored_values()[f.name] <= f.hi, f.name
        assert F.on_grid(f, F.stored_values()[f.name]) == F.stored_values()[f.name], f.name
    assert set(fits["leave_one_source_out"]) >= {"vtrain_single", "narayanan2021_table1"}


def test_a_figure_is_written_to_every_entry_that_takes_it(bench):
    F = bench["fitting"]
    eff = F.efficiency_with({"kernel_overhead_us": 41.0, "fp8_rowwise": 0.6, "triton_ratio": 2.0,
                             "h100_plateau": 0.7, "h100_500w_clock": 0.8})
    assert all(e["kernel_overhead_us"] == 41.0 for e in eff.values() if "kernel_overhead_us" in e)
    assert {eff[g]["fp8_recipes"]["rowwise"] for g in F.HOPPER_FP8} == {0.6}
    flash2 = eff["h100-sxm"]["attention"]["kernels"]["flash2"]["forward"]
    assert eff["h100-sxm"]["attention"]["kernels"]["triton"]["forward"] == round(flash2 / 2.0, 3)
    assert eff["h100-sxm"]["matmul"]["points"][-1][1] == 0.7
    assert eff["b200"]["matmul"]["points"][-1][1] == round(0.7 * 0.93, 3)   # XLA's B200/H100 ratio
    assert eff[F.H100_500W]["matmul"]["points"][-1][1] == pytest.approx(0.7 * 0.8)
    assert F.stored_values(eff)["h100_500w_clock"] == 0.8


@pytest.mark.skipif(not VALIDATION.exists(), reason="../shared/validation is not beside the repository")
def test_the_catalog_is_where_the_fit_stops(bench):
    # the stored figures are a fixed point of the stated procedure: from them no step on any figure's
    # grid lowers its block's loss (about 15 s; the whole fit from the priors, about a minute, is
    # `bench/fit.py --check`, which reproduces the catalog)
    R, F = bench["fit_rows"], bench["fitting"]
    stored = F.stored_values()
    assert R.fit(R.load_rows(VALIDATION), start=stored) == stored


def test_the_intervals_cover_what_they_say():
    # validation/residuals.yaml holds each published GPU kind's leave-one-source-out residuals;
    # the 90% interval the planner builds for a layout class contains 85-95% of the kind's
    # residuals (bench/crossval.py): its own among them from 20 rows on, where the intervals
    # are empirical quantiles; below, each residual against the interval built without it
    tables = u.load_residuals()
    covers = u.published_covers(tables)
    assert covers, "validation/residuals.yaml has no published kinds (bench/validate_published.py --write-residuals)"
    for kind in covers:
        by_class = {c: f["step_time_s"] for c, f in tables[kind]["residuals"].items()}
        total = sum(len(rs) for rs in by_class.values())
        if total < 10:
            continue
        inside = 0
        for cls, rs in by_class.items():
            for i, x in enumerate(rs):
                if total >= u.EMPIRICAL_MIN_N:
                    picked = u.pick_residuals(tables, kind, cls, "step_time_s")[0]
                else:
                    rest = {c: {"step_time_s": r[:i] + r[i + 1:] if c == cls else r} for c, r in by_class.items()}
                    picked = u.pick_residuals({kind: {"residuals": rest}}, kind, cls, "step_time_s")[0]
                lo, hi = u.log_bounds(picked)
                inside += lo <= x <= hi
        assert 0.85 <= inside / total <= 0.95, (kind, inside / total)


def _plan(**over):
    from simcore.plan.load import plan_from_dict

    doc = {"model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"dp": 8, "zero": 1},
           "training": {"global_batch": 64, "micro_batch": 1}}
    for k, v in over.items():
        doc[k] = {**doc[k], **v}
    return plan_from_dict(doc)


TABLES = {"h100-sxm": {"measured": {"set": "s", "covers": {
    "rows": 40, "gpus": 64, "precisions": ["bf16", "fp8"], "tp": 8, "pp": 4, "cp": 2, "ep": 8,
    "experts": 64, "top_k": 8, "expert_width": 0.25}},
    "residuals": {"dp": {"step_time_s": [-0.1, 0.0, 0.1, 0.05, -0.05]}}}}


def test_a_question_inside_the_published_runs_is_not_widened():
    got = u.interval_fields(_plan(), type("P", (), {"step_time_s": 1.0}), tables=TABLES)
    lo, hi = u.log_bounds([-0.1, 0.0, 0.1, 0.05, -0.05])
    assert got["extrapolated"] is None
    assert got["interval_s"] == pytest.approx([math.exp(lo), math.exp(hi)])


def test_what_no_published_run_covers_widens_the_interval_and_says_so():
    plan = _plan(cluster={"nodes": 16}, parallel={"dp": 32, "tp": 4}, training={"precision": "fp32"})
    factor, line = u.extrapolation(plan, TABLES)
    assert factor == pytest.approx(u.EXTRAPOLATION_WIDENING ** 2)
    assert "128 GPUs (published runs reach 64)" in line and "precision fp32" in line
    got = u.interval_fields(plan, type("P", (), {"step_time_s": 1.0}), tables=TABLES)
    lo, hi = u.widen(*u.log_bounds([-0.1, 0.0, 0.1, 0.05, -0.05]), factor)
    assert got["interval_s"] == pytest.approx([math.exp(lo), math.exp(hi)]) and got["extrapolated"] == line
    assert line in got["interval_source"] and line.count("\n") == 0


def test_a_gpu_no_run_was_published_on_gets_every_kinds_residuals_widened():
    plan = _plan(cluster={"node": "dgx-b200"})
    factor, line = u.extrapolation(plan, TABLES)
    assert line == "extrapolated: b200: no published run on this GPU"
    got = u.interval_fields(plan, type("P", (), {"step_time_s": 1.0}), tables=TABLES)
    assert got["interval_s"] is not None and "every published GPU kind pooled" in got["interval_source"]


def test_a_gpu_whose_runs_only_fitted_its_figures_is_widened_as_an_unpublished_one_and_says_why():
    """trn1: its one source fitted its plateau, so no residual of it is out of sample
    (bench/validate_published.py writes it ``in_sample_only``, no table)."""
    plan = _plan(cluster={"node": "dgx-b200"})
    tables = {**TABLES, "b200": {"measured": {"set": "one source", "in_sample_only": True}}}
    factor, line = u.extrapolation(plan, tables)
    assert line == "extrapolated: b200: its published runs fitted its figures, none is out of sample"
    assert factor == u.extrapolation(plan, TABLES)[0]
    step = type("P", (), {"step_time_s": 1.0})
    got = u.interval_fields(plan, step, tables=tables)
    assert got["interval_s"] == u.interval_fields(plan, step, tables=TABLES)["interval_s"]
    assert "every published GPU kind pooled" in got["interval_source"]


def test_moe_beyond_the_published_shapes_is_named():
    assert u.extrapolated("h100-sxm", 8, "bf16", {}, (256, 8, 2048 / 7168), TABLES) == [
        "MoE granularity 256 experts, top-8, expert width 0.286 x hidden (published runs reach 64, "
        "top-8, 0.25)"]
    assert u.extrapolated("h100-sxm", 8, "bf16", {"ep": 8}, (64, 8, 0.3), TABLES) == []
    assert u.extrapolated("cpu-gloo", 999, "fp32", {}, None, {**TABLES, "cpu-gloo": {"residuals": {}}}) == []


def test_the_search_widens_per_layout_class():
    import pandas as pd

    df = pd.DataFrame({"tp": [1, 16], "pp": [1, 1], "dp": [8, 1], "cp": [1, 1], "ep": [1, 1], "zero": [1, 1],
                       "step_time_s": [1.0, 1.0]})
    out = u.interval_columns(df, _plan().cluster.node, ("step_time_s",), tables=TABLES, plan=_plan())
    assert pd.isna(out.extrapolated[0]) and "tp 16 (published runs reach 8)" in out.extrapolated[1]
    plain = u.interval_columns(df, _plan().cluster.node, ("step_time_s",), tables=TABLES)
    assert "extrapolated" not in plain


def test_a_share_outside_the_band_is_put_down_to_sampling_only_where_few_rows_allow_it():
    # bench/crossval.py: 10 rows can show 80, 90 or 100% only; 10 of 10 under a true 95% has
    # chance 0.95^10 = 0.60, 70 of 70 only 0.028, and 80% of 1,564 rows is far outside the band
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        verdict = importlib.import_module("crossval").coverage_verdict
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert verdict(10, 1.0) == "consistent (p=0.60)"
    assert verdict(70, 1.0) == verdict(1564, 0.80) == verdict(20, 0.5) == "MISSED"
    assert verdict(40, 0.9) == verdict(1564, 0.899) == "met"
    assert verdict(9, 1.0) == "-"
