"""The layout search's bound (``simcore.planner.bound``): a family is left untimed only where its
step floor's interval lies above the best's, so the answer and every layout near it are the same
as when every layout is timed."""
from __future__ import annotations

import math

import pytest

from simcore.engine.analytic import step_floor
from simcore.plan.spec import Offload, Recompute, evolve
from simcore.planner import bound
from simcore.planner.ranking import explain_ranking
from simcore.planner.search import _layout_of, search
from simcore.planner.space import base_plan, derive_space
from simcore.planner.tally import Tally

SMALL = ("gpt-1.7b", {"node": "dgx-h100", "nodes": 2}, 64)
PRESSED = ({"name": "llama3-8b", "seq_len": 8192}, {"node": "dgx-h100", "nodes": 4}, 256)   # recompute, FSDP


def _every(monkeypatch, question, **kw):
    """The search with every layout timed (no interval ends: no bound)."""
    with monkeypatch.context() as m:
        m.setattr("simcore.planner.search.log_ends", lambda base, fams: {})
        return search(*question, top_k=0, progress=False, **kw)


@pytest.fixture(scope="module")
def small_every():
    with pytest.MonkeyPatch.context() as m:
        return _every(m, SMALL)


@pytest.mark.parametrize("question, covers", [
    (SMALL, lambda t: {"1f1b", "interleaved-1f1b", "zero-bubble", "dualpipev"} <= set(t["schedule"])),
    (PRESSED, lambda t: {0, 3} <= set(t["zero"]) and (t["recompute"] == "full").any()),
], ids=["schedules", "memory-pressed"])
def test_a_family_s_floor_is_under_every_row_it_gives(monkeypatch, question, covers):
    """The floor is taken at the family's lightest setting (no recompute, no offload); every row the
    family gives, at whatever recompute, offload, ZeRO stage or schedule, takes at least that."""
    res = _every(monkeypatch, question)
    base = base_plan(*question)
    assert derive_space(base).recompute[0] == Recompute.NONE and derive_space(base).offload[0] == Offload.NONE
    table = res.table
    assert covers(table)
    for _, row in table.iterrows():
        lay = _layout_of(row)
        lightest = evolve(lay, recompute=Recompute.NONE, recompute_layers=0, offload=Offload.NONE,
                          activation_offload=0).apply(base, True)
        assert 0 < step_floor(lightest) <= row["step_time_s"] * (1 + 1e-12), row["layout"]


def test_the_bound_leaves_only_layouts_the_ranking_could_not_put_first(small_every):
    res = search(*SMALL, top_k=0, progress=False)
    every = small_every.table
    assert res.tally.bounded > 0 and len(res.table) < len(every)
    assert list(res.table["layout"].head(20)) == list(every["layout"].head(20))
    left = every[~every["layout"].isin(res.table["layout"])]
    fits_hi = every.loc[every["fit"] == "fits", "step_time_s_hi"].min()
    assert (left["step_time_s_lo"] > fits_hi).all()   # beyond both intervals of a layout that fits
    assert "left untimed (on their compute, blocking communication and bubble alone" in res.explanations[0]
    assert res.tally.simulated == len(res.table) + res.table["ties"].sum()


def test_an_axis_value_left_whole_is_said(small_every):
    res = search(*SMALL, top_k=0, progress=False)
    left = {a: sorted(set(res.tally.bounded_values.get(a, ())) - set(res.table[a])) for a in ("tp", "pp", "cp")}
    assert any(left.values())
    for axis, values in left.items():
        for v in values:
            assert any(x.startswith(f"no layout with {axis}={v} is ranked: on their compute") for x in res.explanations)
    tally = Tally(candidates=1, bounded=1, bounded_values={"pp": {999}})
    assert "no layout with pp=999 is ranked" in " ".join(explain_ranking(res.table, tally))
    assert not any("no layout with" in x for x in explain_ranking(res.table, Tally(candidates=1)))


def test_the_bound_of_each_objective():
    rows = [{"step_time_s": 10.0, "gpus": 16, "fit": "fits", "memory_per_gpu_gib": 70.0, "tp": 1, "pp": 1, "cp": 1,
             "ep": 1, "dp": 16, "zero": 1, "dp_replicate": 1},
            {"step_time_s": 12.0, "gpus": 8, "fit": "fits", "memory_per_gpu_gib": 50.0, "tp": 1, "pp": 1, "cp": 1,
             "ep": 1, "dp": 8, "zero": 1, "dp_replicate": 1},
            {"step_time_s": 5.0, "gpus": 16, "fit": "thin", "memory_per_gpu_gib": 79.0, "tp": 1, "pp": 1, "cp": 1,
             "ep": 1, "dp": 16, "zero": 1, "dp_replicate": 1}]
    key = ("dp", 1, 1, 1, 1, 1)
    ends = {key: (-0.1, 0.2)}
    value, per_gpu, lows = bound.bound_of(rows, "time", 80.0, ends)
    assert (value, per_gpu) == (pytest.approx(10.0 * math.exp(0.2)), False)   # the best that fits with the margin
    assert lows == {key: pytest.approx(math.exp(-0.1))}
    assert bound.bound_of(rows, "time", 60.0, ends)[0] == pytest.approx(12.0 * math.exp(0.2))   # the headroom asked
    assert bound.bound_of(rows, "cost", 80.0, ends)[:2] == (pytest.approx(96.0 * math.exp(0.2)), True)
    assert bound.bound_of(rows, "time", 80.0, ends, runs=lambda r: r["gpus"] == 8)[0] == \
        pytest.approx(12.0 * math.exp(0.2))   # the stack's
    skewed = {key: (0.1, 0.3)}   # an interval above the prediction: the bound stays at the step, not under it
    assert bound.bound_of(rows, "time", 80.0, skewed)[1:] == (False, {key: 1.0})
    assert bound.bound_of(rows, "time", 80.0, {key: (-0.3, -0.1)})[0] == pytest.approx(10.0)
    for args in (("pareto", 80.0, ends), ("time", 80.0, {}), ("time", 10.0, ends)):
        assert bound.bound_of(rows, *args)[0] == math.inf   # the front, no interval, nothing fits


def test_the_sample_keeps_each_layout_s_micro_batches_together():
    base = base_plan(*SMALL)
    from simcore.planner.space import families
    fams = families(base, derive_space(base), 16)
    first, rest = bound.split_sample(fams)
    assert sorted(map(repr, first + rest)) == sorted(map(repr, fams))
    assert 0 < len(first) < len(fams) / (bound.SAMPLE_STRIDE / 2)
    from simcore.planner.evaluate import _without_micro_batch
    assert not {_without_micro_batch(f) for f in first} & {_without_micro_batch(f) for f in rest}
