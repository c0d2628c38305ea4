"""Thin memory headroom in a ranking: the search says so when its best leaves too little, names
the best layout that leaves more, and ranks only roomy layouts when asked."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from simcore.plan.spec import PlanError
from simcore.planner.formatting import hbm_gib
from simcore.planner.headroom import (FITS, MAY_NOT_FIT, THIN, MemoryMargin, fit_class, headroom_note, keep_roomy,
                                      memory_margin, recommended_first, thin_gib)
from simcore.planner.search import display_table, search, tally_sentence
from simcore.planner.space import base_plan
from simcore.planner.uncertainty import load_residuals, memory_log_bounds, pick_residuals
from trainplan.cli import main

SMALL = ("gpt-1.7b", {"node": "dgx-h100", "nodes": 2}, 64)


def _table(rows):
    """A ranked table as search returns it: rank, layout, step, memory, headroom on 80 GiB GPUs, fit class."""
    return pd.DataFrame([{"rank": i + 1, "layout": name, "step_time_s": t, "memory_per_gpu_gib": 80 - room,
                          "headroom_gib": room, "fit": fit_class((80 - room) * 2**30, 80 * 2**30)}
                         for i, (name, t, room) in enumerate(rows)])


def test_the_memory_margin_is_the_published_peaks_interval():
    """The margin comes from the residuals bench/validate_memory.py wrote: their 90% bounds."""
    rs, _ = pick_residuals(load_residuals(), "gpu-peak-memory", "all", "memory_per_gpu_gib")
    m = memory_margin()
    assert m.n == len(rs) >= 20
    lo, hi, _, _ = memory_log_bounds()
    assert (m.lo, m.hi) == (pytest.approx(math.exp(lo)), pytest.approx(math.exp(hi)))
    assert m.lo < 1 < m.hi
    assert sum(m.lo <= math.exp(r) <= m.hi for r in rs) / len(rs) >= 0.85   # it covers what it says
    assert thin_gib(80) == pytest.approx(80 * (1 - 1 / m.hi))


def test_fit_classes_follow_the_margin():
    m, gib = MemoryMargin(lo=0.95, hi=1.08, n=30, source="test"), 2**30
    assert fit_class(70 * gib, 80 * gib, m) == FITS                  # 75.6 GiB at worst
    assert fit_class(78 * gib, 80 * gib, m) == THIN                  # fits as predicted, not at worst
    assert fit_class(83 * gib, 80 * gib, m) == MAY_NOT_FIT           # 78.9 GiB at best
    assert fit_class(85 * gib, 80 * gib, m) is None


def test_the_recommendation_keeps_the_margin_and_says_what_it_costs():
    thin = thin_gib(80)
    df = _table([("a", 10.0, -1.0), ("b", 10.05, thin / 2), ("c", 10.2, 12.0), ("d", 11.0, 30.0)])
    assert list(df["fit"]) == [MAY_NOT_FIT, THIN, FITS, FITS]
    ranked = recommended_first(df).assign(rank=range(1, 5))
    assert list(ranked["layout"]) == ["c", "a", "b", "d"]              # the roomy one first, the rest in order
    (note,) = headroom_note(ranked, 80)
    assert f"Kept {thin:.1f} GiB of 80 GiB free per GPU as the memory model's margin" in note
    assert "without it #2 a would be 2.0% faster at 81.0 GiB per GPU (may not fit)" in note
    assert headroom_note(recommended_first(_table([("c", 10.2, 12.0), ("a", 10.5, 0.9)])), 80) == []
    (alone,) = headroom_note(recommended_first(_table([("a", 10.0, thin / 2), ("b", 10.1, thin / 3)])), 80)
    assert alone.startswith(f"The recommended layout leaves only {thin / 2:.1f} GiB of 80 GiB per GPU (thin")
    assert alone.endswith("no layout fits with that margin.")
    shown = display_table(df.assign(step_time_s_lo=df.step_time_s, step_time_s_hi=df.step_time_s, mfu=0.5))
    assert list(shown["headroom GiB"]) == ["-1.0 (may not fit)", f"{thin / 2:.1f} (thin)", "12.0", "30.0"]


def test_min_headroom_ranks_only_the_layouts_that_leave_it(monkeypatch):
    # every layout timed: the search's bound (``simcore.planner.bound``) takes its best from the
    # layouts that leave the headroom asked, so it leaves a different tail untimed with and without
    monkeypatch.setattr("simcore.planner.search.log_ends", lambda base, fams: {})
    every = search(*SMALL, top_k=0, progress=False).table
    room = every["headroom_gib"]
    cut = float(room.median())
    assert (room < cut).any() and (room >= cut).any()
    roomy = search(*SMALL, top_k=0, progress=False, min_headroom_gib=cut).table
    assert (roomy["headroom_gib"] >= cut).all()
    assert list(roomy["layout"]) == list(every.loc[room >= cut, "layout"])   # same order, nothing else
    assert list(roomy["rank"]) == list(range(1, len(roomy) + 1))
    with pytest.raises(PlanError, match=r"no layout of gpt-1.7b on 16 x h100-sxm leaves min_headroom_gib=200 GiB"):
        search(*SMALL, top_k=0, progress=False, min_headroom_gib=200)
    assert keep_roomy(every, hbm_gib(base_plan(*SMALL)), 0.0, "x") is every


def test_plan_command_min_headroom(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "32",
            "--top-k", "0", "--rows", "3"]
    assert main(args + ["--min-headroom", "-1"]) == 2
    assert capsys.readouterr().err.strip() == ("trainplan: error: --min-headroom -1 must be a number of GiB, "
                                               "0 or more")
    assert main(args + ["--min-headroom", "500"]) == 2
    assert "leaves min_headroom_gib=500 GiB" in capsys.readouterr().err


def test_plan_command_refuses_a_zero_sequence_and_a_negative_top_k_in_one_sentence(tmp_path, capsys, monkeypatch):
    """A zero ``--seq-len`` is not "the model's own": it is refused, as is a negative ``--top-k``
    (pandas' ``head(-1)`` would re-simulate every layout but the last), and nothing is written."""
    monkeypatch.chdir(tmp_path)
    args = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "32"]
    assert main(args + ["--seq-len", "0", "--top-k", "0"]) == 2
    assert capsys.readouterr().err.strip() == "trainplan: error: model.seq_len=0 must be at least 1"
    assert main(args + ["--top-k", "-1"]) == 2
    assert capsys.readouterr().err.strip() == ("trainplan: error: top_k=-1 must be 0 or more (the layouts "
                                               "re-simulated on the event engine)")
    assert list(tmp_path.iterdir()) == []


def test_a_procurement_answer_says_when_its_price_is_not_a_published_one():
    """An answer that rests on an assumed or derived price (prices.yaml marks them) says so."""
    from simcore.planner.procure_answer import option_sentence

    row = {"mode": "reserved", "nodes": 128, "node": "mi355x-8", "gpu": "mi355x", "gpus": 1024, "fabric": "roce-400",
           "days": 88.7, "days_lo": 80.0, "days_hi": 95.0, "usd": 1.3e7, "usd_lo": 1.2e7, "usd_hi": 1.4e7,
           "usd_per_gpu_hour": 5.98, "layout": "tp1-pp4-dp128", "mfu": 0.37, "engine": "analytic",
           "memory_per_gpu_gib": 220.0, "headroom_gib": 64.3}
    assert "; its mi355x rental price is derived (prices.yaml: OCI MI300X list" in option_sentence(row)
    assert "check it against a quote" in option_sentence(row)
    assert "its b300 purchase price is an assumption (prices.yaml: b200 x 1.2)" in option_sentence(
        {**row, "mode": "buy", "gpu": "b300", "capex_usd": 4.28e8})
    assert "price is" not in option_sentence({**row, "gpu": "h100-sxm"})   # Oracle's list price
    assert option_sentence({**row, "days_lo": math.nan, "days_hi": math.nan}).endswith(
        "; no published run on mi355x checks its predicted time (no interval)")
    assert "no published run" not in option_sentence(row)


def test_a_procurement_answer_says_a_thin_layout():
    from simcore.planner.procure_answer import option_sentence

    row = {"mode": "reserved", "nodes": 32, "node": "dgx-h100", "gpus": 256, "fabric": "ib-ndr", "days": 30.0,
           "days_lo": 28.0, "days_hi": 33.0, "usd": 1e6, "usd_lo": 9e5, "usd_hi": 1.1e6, "usd_per_gpu_hour": 2.5,
           "layout": "tp4-pp4-dp16", "mfu": 0.45, "engine": "event", "memory_per_gpu_gib": 79.1, "headroom_gib": 0.9}
    assert "0.9 GiB memory headroom (thin: the memory model's peaks lie within" in option_sentence(row)
    roomy = option_sentence({**row, "memory_per_gpu_gib": 60.0, "headroom_gib": 20.0})
    assert "20.0 GiB memory headroom, MFU" in roomy and "thin" not in roomy


def test_plan_command_takes_a_config_json_as_its_help_says(tmp_path, capsys, monkeypatch):
    """``--model`` takes a catalog name or a config.json path (as a Plan's ``model:`` does)."""
    from pathlib import Path

    from simcore.plan.load import load_plan

    config = Path(__file__).resolve().parents[2] / "examples" / "hf" / "llama3.2-1b" / "config.json"
    monkeypatch.chdir(tmp_path)
    args = ["plan", "--model", str(config), "--seq-len", "2048", "--cluster", "dgx-h100", "--nodes", "1",
            "--global-batch", "16", "--top-k", "0", "--rows", "2", "--out", "best.yaml"]
    assert main(args) == 0
    plan = load_plan(tmp_path / "best.yaml")
    assert (plan.model.layers, plan.model.hidden, plan.model.vocab, plan.model.seq_len) == (16, 2048, 128256, 2048)


def test_layouts_over_only_by_the_allocators_assumed_margin_are_counted_and_fit_without_it():
    """The caching allocator's 10% is an assumption (``peak.ALLOCATOR_MARGIN``): the search counts
    the layouts it alone pushes out, and under expandable segments (margin 0) those are ranked."""
    args = ("llama3-8b", {"node": "dgx-h100", "nodes": 1}, 64)
    default = search(*args, top_k=0, progress=False).tally
    bare = search(*args, top_k=0, progress=False, training={"allocator_margin": 0.0}).tally
    assert 0 < default.margin_only <= default.no_fit
    assert bare.margin_only == 0
    # every layout the margin alone pushed out is in a fit class without it
    assert bare.no_fit <= default.no_fit - default.margin_only
    assert "only by the caching allocator's assumed margin" in tally_sentence(default)
    assert "allocator" not in tally_sentence(bare)
