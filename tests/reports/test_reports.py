"""Reports: built from small inputs, figures carry their series, HTML is self-contained."""
from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from reports.build import memory_section, validate_report
from reports.compare import compare
from reports.plots import memory_figure, predicted_vs_measured_figure
from reports.render import Report, Section, render
from trainplan.validate import MatrixResult, load_matrix, summary_row
from simcore.plan.spec import PlanError
from simcore.results import StepResult


def result(source: str, step: float, mem_gib: float, **time_s) -> StepResult:
    return StepResult(source=source, plan_name="toy", step_time_s=step, tokens_per_s=1000 / step,
                      model_tflops_per_gpu=1.0, hardware_tflops_per_gpu=1.0, mfu=0.3, hfu=0.3,
                      compute_s=0.7 * step, exposed_comm_s=0.2 * step, bubble_s=0.1 * step, offload_s=0.0,
                      memory_per_gpu_gib=mem_gib, fits=True,
                      memory_bytes={"weights": mem_gib * 2**30 / 2, "activations": mem_gib * 2**30 / 2},
                      time_s=time_s)


def matrix() -> MatrixResult:
    comps = (compare(result("des", 1.1, 2.0, forward=0.3), result("measured", 1.0, 2.0, forward=0.25)),
             compare(result("des", 0.45, 1.0, forward=0.1), result("measured", 0.5, 1.1, forward=0.1)))
    rows = [summary_row(n, c) for n, c in zip(["a", "b"], comps)]
    return MatrixResult(table=pd.DataFrame(rows), comparisons=comps, failures=(("c", "offload needs a GPU"),))


def test_compare_signs_and_phases():
    comp = matrix().comparisons[0]
    assert comp.error("step_time_s") == pytest.approx(0.1)
    assert comp.error("phase.forward") == pytest.approx(0.2)
    assert comp.error("memory.weights") == pytest.approx(0.0)


def test_pred_vs_measured_figure_has_one_point_per_layout():
    fig = predicted_vs_measured_figure(matrix().table)
    ax = fig.axes[0]
    offsets = ax.collections[-1].get_offsets()
    assert len(offsets) == 2
    assert sorted(map(float, offsets[:, 0])) == [0.5, 1.0]


def test_memory_figure_stacks_kinds_against_hbm():
    ranks = [{"pp_rank": 0, "weights": 2**30, "activations": 3 * 2**30},
             {"pp_rank": 1, "weights": 2**30, "activations": 2**30}]
    ax = memory_figure(ranks, 8 * 2**30).axes[0]
    heights = [p.get_height() for p in ax.patches]
    assert len(heights) == 2 * 6  # two ranks, six kinds (zeros included)
    assert any(line.get_ydata()[0] == pytest.approx(8.0) for line in ax.lines)


def test_validate_report_renders_self_contained(tmp_path):
    report = validate_report(matrix(), profile={"measured_on": {"host": "h", "date": "d"}, "device": {"source": "s"}})
    assert dict(report.summary)["layouts compared"] == "2"
    html_path = render(report, tmp_path)
    html = html_path.read_text()
    assert html.count("<img") == 1 and "data:image/png;base64," in html
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", html)
    assert "offload needs a GPU" in html
    md = (tmp_path / "report.md").read_text()
    for png in re.findall(r"\]\(([^)]+\.png)\)", md):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp"))  # nothing half-written left behind


def test_render_tables_and_assumptions(tmp_path):
    report = Report(title="T", summary=(("best", "x"),),
                    sections=(Section("tab", table=pd.DataFrame({"layout": ["p", "q"], "days": [1.5, 2.0]})),),
                    assumptions=(("price", "catalog"),))
    html = render(report, tmp_path).read_text()
    assert html.count("<tr") == 3 and "catalog" in html


def test_memory_section_text():
    from simcore.plan.load import plan_from_dict
    from simcore.model.step_costs import memory_report

    plan = plan_from_dict({"name": "m", "model": "llama3-8b", "cluster": {"node": "dgx-h100"},
                           "parallel": {"dp": 8, "zero": 3},
                           "training": {"global_batch": 8, "flash_attention": True, "recompute": "full"}})
    report = memory_report(plan)
    sec = memory_section(plan, report)
    room = report["hbm_bytes"] / 2**30 - report["memory_per_gpu_gib"]
    assert sec.text.endswith(f"; fits, headroom {room:.1f} GiB.") and sec.figure is not None
    no_flash = plan_from_dict({"name": "m", "model": "llama3-8b", "cluster": {"node": "dgx-h100"},
                               "parallel": {"dp": 8, "zero": 3}, "training": {"global_batch": 8}})
    assert "does NOT fit" in memory_section(no_flash, memory_report(no_flash)).text  # the s^2 scores


def test_matrix_file_errors(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("base: {}\n")
    with pytest.raises(PlanError, match="needs a 'layouts' mapping"):
        load_matrix(bad)
    good = tmp_path / "g.yaml"
    good.write_text("base: {training: {global_batch: 8}}\nlayouts:\n  a: {parallel: {dp: 2}}\n")
    (name, doc), = load_matrix(good)
    assert name == "a" and doc["parallel"] == {"dp": 2} and doc["training"]["global_batch"] == 8


# ---------------------------------------------------------------- plan and what-if reports

@pytest.fixture(scope="module")
def small_plan_report(tmp_path_factory):
    from reports.build import plan_report
    from simcore.planner.runcost import run_cost
    from simcore.planner.search import search
    from simcore.planner.space import SearchSpace
    from simcore.engine.predict import simulate
    from simcore.model.step_costs import memory_report
    from simcore.plan.spec import Recompute, Schedule, ZeroStage

    space = SearchSpace(tp=(1, 2), pp=(1, 2), cp=(1,), zero=(ZeroStage.OPTIMIZER_STATES,), micro_batch=(1, 2),
                        schedule=(Schedule.ONE_F_ONE_B,), recompute=(Recompute.NONE, Recompute.FULL))
    res = search({"name": "gpt-1.7b"}, {"node": "dgx-h100", "nodes": 1}, 32, top_k=1, tokens=1e10,
                 progress=False, space=space)
    pred = simulate(res.best, engine="des")
    cost = run_cost(res.best, pred, 1e10, monte_carlo=0)
    report = plan_report(res, cost, pred, memory_report(res.best), tokens=1e10)
    out = tmp_path_factory.mktemp("plan")
    return res, report, render(report, out)


def test_plan_report_answers_first(small_plan_report):
    res, report, _ = small_plan_report
    summary = dict(report.summary)
    assert summary["recommended layout"] == res.table.iloc[0]["layout"]
    assert summary["time to train"].endswith("days") and summary["cost (on-demand)"].startswith("$")
    top = next(s for s in report.sections if s.heading == "Top layouts")
    assert list(top.table["layout"]) == list(res.table["layout"].head(15))
    headings = [s.heading for s in report.sections]
    assert {"Where the step time goes", "Cost against time", "Memory per GPU",
            "One step of the recommended plan"} <= set(headings)


def test_plan_report_breakdown_has_one_bar_per_layout(small_plan_report):
    res, report, _ = small_plan_report
    fig = next(s.figure for s in report.sections if s.name == "breakdown")
    bars = [p for p in fig.axes[0].patches if p.get_width() > 0]
    assert len({round(p.get_y(), 3) for p in bars}) == min(10, len(res.table))


def test_plan_report_html_is_self_contained(small_plan_report):
    _, report, html_path = small_plan_report
    html = html_path.read_text()
    assert html.count("<img") == sum(s.figure is not None for s in report.sections)
    assert not re.search(r"(src|href)=['\"]?(https?:|//)", html)
    assert (html_path.parent / "report.md").exists()


def test_whatif_report_has_heat_maps_and_every_cell(tmp_path):
    from reports.build import whatif_report
    from simcore.planner.whatif import run_whatif, sweep_from_dict

    sweep = sweep_from_dict({"name": "t", "model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "nodes": 1},
                             "global_batch": 64, "tokens": 1e10,
                             "grid": {"gpu": ["a100-80gb", "h100-sxm"], "nodes": [1, 2]},
                             "space": {"tp": [1, 2], "pp": [1], "cp": [1], "zero": [1], "micro_batch": [2]},
                             "failures": False})
    res = run_whatif(sweep, progress=False)
    report = whatif_report(res)
    assert {s.name for s in report.sections if s.figure is not None} >= {"heatmap_days", "heatmap_usd", "pareto"}
    cells = next(s.table for s in report.sections if s.heading == "Every cell")
    assert len(cells) == 4 and set(cells["gpu"]) == {"a100-80gb", "h100-sxm"}
    assert dict(report.summary)["cells"] == "4 of 4 fit"
    html = render(report, tmp_path).read_text()
    assert html.count("<img") == 3


def _labelled_ticks(axis, lo: float, hi: float) -> list[str]:
    return [t.get_text() for t, v in zip(axis.get_majorticklabels(), axis.get_majorticklocs()) if lo <= v <= hi]


def test_readable_axes_and_numbers():
    """Issue 28.5: a narrow log-log range has several labelled ticks; $ axes read $1.2M, never
    with an offset ("1e8"); float noise is 0; MFU is a percent in tables as on the cards."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from reports.planning_plots import pareto_figure
    from reports.render import _fmt_table

    fig = predicted_vs_measured_figure(matrix().table)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert len(_labelled_ticks(ax.xaxis, lo, hi)) >= 3 and len(_labelled_ticks(ax.yaxis, lo, hi)) >= 3
    df = pd.DataFrame({"layout": list("abc"), "days": [600.0, 620.0, 14000.0], "usd": [8.1e8, 7.9e8, 9e8]})
    fig = pareto_figure(df)
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    assert ax.yaxis.get_offset_text().get_text() == ""
    assert all(t.get_text().startswith("$") and t.get_text().endswith("M") for t in ax.get_yticklabels()
               if t.get_text())
    assert ax.get_xlim()[1] < 14000                                   # the dominated outlier is off the range
    table = _fmt_table(pd.DataFrame({"mfu": [0.54, 0.5349], "x": [1.388e-17, 2.5], "usd": [37575906.0, 8e8]}))
    assert list(table["mfu"]) == ["54.0%", "53.5%"] and table["x"][0] == "0"
    assert list(table["usd"]) == ["$37.6M", "$800M"]


def test_phases_the_measurement_holds_inside_others_are_folded_into_them():
    pred = result("des", 1.0, 2.0, forward=0.2, backward=0.4, recompute=0.2, activation_offload=0.1,
                  activation_reload=0.05)
    meas = result("measured", 1.0, 2.0, forward=0.3, backward=0.65)
    comp = compare(pred, meas)
    assert comp.error("phase.forward") == pytest.approx(0.0)     # 0.2 + 0.1 waiting for the copies
    assert comp.error("phase.backward") == pytest.approx(0.0)    # 0.4 + 0.2 recomputed + 0.05 reloads
    assert math.isnan(comp.error("phase.recompute"))
    # a measurement with a phase of its own keeps it apart
    apart = compare(pred, result("measured", 1.0, 2.0, forward=0.2, backward=0.4, recompute=0.2))
    assert apart.error("phase.recompute") == pytest.approx(0.0) and apart.error("phase.backward") == pytest.approx(0.125)
