"""The ranked table as a reader sees it (simcore/planner/ranking.py): one engine per column,
days, $ and MFU under the engine their step came from, comparisons on one engine (issue 57.4);
and one recommendation for every entry point (issue 57.5)."""
from __future__ import annotations

import re
from dataclasses import replace

import pandas as pd
import pytest

from simcore.planner.ranking import display_table, why_slower
from simcore.planner.search import search
from simcore.planner.space import base_plan, derive_space
from simcore.plan.spec import ZeroStage

SMALL = ("gpt-1.7b", {"node": "dgx-h100", "nodes": 2}, 64)
TOKENS = 1e10
TOP_K = 3


@pytest.fixture(scope="module")
def ranked():
    space = replace(derive_space(base_plan(*SMALL)), cp=(1, 2), micro_batch=(1, 4),
                    zero=(ZeroStage.NONE, ZeroStage.WEIGHTS), vpp=(2,))
    return search(*SMALL, top_k=TOP_K, tokens=TOKENS, progress=False, space=space)


def test_each_column_holds_one_engine_named_in_its_heading(ranked):
    t = ranked.table
    shown = display_table(t, len(t))
    figures = [c for c in shown.columns if c not in ("rank", "layout", "ties", "GiB", "headroom GiB")]
    assert figures and all(c.endswith(("[event]", "[analytic]")) for c in figures)
    ran = t["des_step_time_s"].notna()
    assert ran.sum() == TOP_K
    for c in figures:   # the event engine's columns are blank exactly where it did not run
        if c.endswith("[event]"):
            assert list(shown[c] != "") == list(ran), c
        else:
            assert (shown[c] != "").all(), c
    # days, $ and MFU follow the step of their own engine
    assert t["days"].to_numpy() == pytest.approx((TOKENS / t["tokens_per_s"] / 86400).to_numpy(), rel=1e-9)
    head = t[ran]
    assert (head["des_days"] / head["days"]).to_numpy() == pytest.approx(
        (head["des_step_time_s"] / head["step_time_s"]).to_numpy(), rel=1e-9)
    assert (head["des_usd"] / head["usd"]).to_numpy() == pytest.approx(
        (head["des_step_time_s"] / head["step_time_s"]).to_numpy(), rel=1e-9)
    assert list(shown["MFU [event]"][ran]) == [f"{v:.1%}" for v in head["des_mfu"]]
    assert list(shown["MFU [analytic]"]) == [f"{v:.1%}" for v in t["mfu"]]


def test_the_first_row_is_the_recommendation_and_the_rest_in_time_order(ranked):
    t = ranked.table
    ran = t["des_step_time_s"].notna()
    rest = t.iloc[1:]
    event = rest[ran.iloc[1:]]
    assert list(event["des_step_time_s"]) == sorted(event["des_step_time_s"])
    later = rest[~ran.iloc[1:]]
    assert list(later["step_time_s"]) == sorted(later["step_time_s"])
    # no later row is faster on the analytic path than the rows the event engine re-ranked
    assert later["step_time_s"].min() >= t.loc[ran, "step_time_s"].max()


def _percent(sentence: str, what: str) -> float:
    return float(re.search(rf"{what} ([+-][0-9.]+)%", sentence).group(1))


def test_a_row_is_compared_with_the_first_on_one_engine(ranked):
    """A row the event engine did not run is set against the first row's analytic figures, in
    time and in cost (issue 57: "#11: time +3.2%, cost -3.2%" set analytic $ against the engine's)."""
    t = ranked.table
    best = t.iloc[0]
    for i in range(1, len(t)):
        row = t.iloc[i]
        line = why_slower(row, best)
        pre = "des_" if pd.notna(row["des_step_time_s"]) and pd.notna(best["des_step_time_s"]) else ""
        assert ("(event engine)" in line) == bool(pre)
        time = 100 * (row[pre + "step_time_s"] / best[pre + "step_time_s"] - 1)
        cost = 100 * (row[pre + "usd"] / best[pre + "usd"] - 1)
        assert _percent(line, "time") == pytest.approx(time, abs=0.051)
        assert _percent(line, "cost") == pytest.approx(cost, abs=0.051)
        assert (time >= -0.05) == (cost >= -0.05)   # on one engine a slower row is never cheaper on the same GPUs


def test_plan_report_plan_and_the_demo_recommend_the_same_layout(tmp_path, monkeypatch):
    """Issue 57.5: `plan`, `report plan` and the demo's planning report pick one layout for the
    same inputs (simcore.planner.headroom.recommended_first behind all three)."""
    import yaml

    from trainplan.cli import main

    args = dict(model="gpt-1.7b", cluster="dgx-h100", nodes=2, global_batch=64, seq_len=2048, tokens=TOKENS)
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--model", args["model"], "--cluster", args["cluster"], "--nodes", "2", "--global-batch",
                 "64", "--seq-len", "2048", "--tokens", str(TOKENS), "--out", "plan.yaml"]) == 0
    assert main(["report", "plan", "--model", args["model"], "--cluster", args["cluster"], "--nodes", "2",
                 "--global-batch", "64", "--seq-len", "2048", "--tokens", str(TOKENS), "--out", "report"]) == 0
    _quick_demo(monkeypatch, args)
    assert main(["demo", "--out", "demo"]) == 0   # the demo's own path, its what-if and validation stubbed
    picked = [yaml.safe_load((tmp_path / p).read_text())["parallel"] for p in
              ("plan.yaml", "report/best-plan.yaml", "demo/plan/best-plan.yaml")]
    assert picked[0] == picked[1] == picked[2]
    layouts = {pd.read_csv(tmp_path / d / "layouts.csv")["layout"].iloc[0] for d in ("report", "demo/plan")}
    assert len(layouts) == 1


def _quick_demo(monkeypatch, plan: dict) -> None:
    """The demo on ``plan``, its what-if and its validation (minutes of real runs) stubbed."""
    from pathlib import Path

    import simcore.planner.whatif as whatif
    from trainplan import jobs

    monkeypatch.setattr(jobs, "DEMO_PLAN", plan)
    monkeypatch.setattr(whatif, "run_whatif", lambda *a, **k: None)
    monkeypatch.setattr(jobs, "whatif_answer", lambda res, out: (Path(out) / "index.html", (("fastest", "stub"),)))
    monkeypatch.setattr(jobs, "validation", lambda m, out, **k: (Path(out) / "index.html", (("worst", "stub"),)))


def test_the_demo_prints_its_answer_not_only_report_paths(tmp_path, monkeypatch, capsys):
    """Issue 57.8: `make demo` printed three report paths and no result."""
    from trainplan.cli import main

    monkeypatch.chdir(tmp_path)
    _quick_demo(monkeypatch, dict(model="gpt-1.7b", cluster="dgx-h100", nodes=2, global_batch=64, seq_len=2048,
                                  tokens=TOKENS))
    assert main(["demo", "--out", "demo"]) == 0
    out = capsys.readouterr().out
    answer = out[out.index("the answer (planning report):"):out.index("what-if:")]
    layout = pd.read_csv(tmp_path / "demo/plan/layouts.csv")["layout"].iloc[0]
    assert f"recommended layout  {layout}" in answer
    assert re.search(r"time to train +[0-9.,]+ \([0-9.,]+-[0-9.,]+\) days", answer), answer   # days, interval
    assert re.search(r"cost \(on-demand\) +\$[0-9.,]+[kMB]? \(\$[0-9.,]+[kMB]?-\$", answer), answer
    assert "intervals: 90%" in out and out.index("the answer") < out.index("reports:")


def test_layouts_the_event_engine_cannot_play_keep_their_analytic_figures(monkeypatch):
    """Issue 57.6: `plan --global-batch 131072` re-simulated layouts of 16,384 micro-batches on the
    event engine for minutes; past its budget a layout keeps the analytic figures, and a sentence says so."""
    import simcore.plan.bounds as bounds

    monkeypatch.setattr(bounds, "EVENT_PASSES", 0)   # every layout is past it
    res = search(*SMALL, top_k=2, progress=False)
    assert res.table["des_step_time_s"].isna().all() and res.table["des_skipped"].iloc[:2].all()
    assert any(line.startswith("2 of the layouts ranked first were not re-simulated on the event engine")
               for line in res.explanations)
    with pytest.raises(ValueError, match="top_k=33 is over 32"):
        search(*SMALL, top_k=33, progress=False)
