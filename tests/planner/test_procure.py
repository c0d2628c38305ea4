"""Procurement: the answers are right on the options evaluated, buying moves with its life and
utilisation, bad candidates are one sentence, priced GPUs the catalog lacks wait for a node."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest

from simcore.plan.spec import PlanError
from simcore.planner.prices import HOURS_PER_YEAR, buy_sheet
from simcore.planner.procure import hardware_cells, run_procure, states_overflow
from simcore.planner.formatting import money
from simcore.planner.procure_answer import (answer_lines, budget_choice, deadline_choice, display_table, feasible,
                                            mode_fronts, option_sentence, to_resimulate)
from simcore.planner.procure_input import candidates_from_dict, default_gpus
from topologies.hardware import load_catalog

BASE = {"model": {"name": "llama3-70b", "seq_len": 8192}, "tokens": 15e12, "gpus": ["h100-sxm", "b200", "mi300x"],
        "nodes": [16, 32, 64, 128], "deadline_days": 120, "budget_usd": 15e6}


def candidates(**over):
    return candidates_from_dict({**BASE, **over})


@pytest.fixture(scope="module")
def result():
    return run_procure(candidates(), progress=False)


def test_cells_are_gpus_x_sizes_x_fabrics():
    c = candidates(fabrics=["default", "ib-xdr"], nodes=[8, 16])
    cells = hardware_cells(c)
    assert len(cells) == 3 * 2 * 2
    assert {"gpu": "b200", "nodes": 16, "fabric": "ib-xdr"} in cells and {"gpu": "b200", "nodes": 8} in cells


def test_deadline_answer_is_the_cheapest_that_meets_it(result):
    opts, c = feasible(result.options), result.candidates
    pick = deadline_choice(result.options, c.deadline_days)
    assert pick is not None and pick["days"] <= c.deadline_days
    meets = opts[opts["days"] <= c.deadline_days]
    assert (meets["usd"] >= pick["usd"]).all()                       # no cheaper evaluated option meets it
    assert not opts[(opts["usd"] < pick["usd"]) & (opts["days"] <= c.deadline_days)].shape[0]
    assert pick["engine"] == "event"                                   # the answer rests on the event engine


def test_budget_answer_is_the_fastest_within_it(result):
    opts, c = feasible(result.options), result.candidates
    pick = budget_choice(result.options, c.budget_usd)
    assert pick is not None and pick["cash_usd"] <= c.budget_usd
    assert (opts[opts["cash_usd"] <= c.budget_usd]["days"] >= pick["days"]).all()
    assert pick["engine"] == "event"


def test_a_budget_is_held_against_the_cash_a_purchase_needs_up_front(result):
    # issue 57: "fastest within $10M" chose a $428M purchase because its run's amortised share was $8M
    opts = feasible(result.options)
    buy, rent = opts[opts["mode"] == "buy"], opts[opts["mode"] != "buy"]
    assert (buy["cash_usd"] > buy["capex_usd"]).all() and (buy["cash_usd"] >= buy["usd"]).all()
    assert (rent["cash_usd"] == rent["usd"]).all()
    fast = buy.sort_values("days").iloc[0]
    between = (fast["usd"] + fast["cash_usd"]) / 2           # above the run's share, below the capex
    pick = budget_choice(result.options, between)
    assert pick is None or pick["cash_usd"] <= between
    assert pick is None or (pick["mode"], pick["gpu"], pick["nodes"]) != ("buy", fast["gpu"], fast["nodes"])
    res = replace(result, candidates=replace(result.candidates, budget_usd=between))
    line = answer_lines(res)[-1]
    assert f"within {money(between)} paid out" in line
    buy_pick = budget_choice(result.options, float(fast["cash_usd"]))
    if buy_pick is not None and buy_pick["mode"] == "buy":
        sentence = option_sentence(buy_pick)
        assert (f"{money(buy_pick['cash_usd'])} paid out ({money(buy_pick['capex_usd'])} up front for GPUs, servers "
                "and fabric, the facility and energy while it runs), of which the run bears") in sentence


def test_each_front_is_undominated_and_re_simulated(result):
    fronts = mode_fronts(result.options)
    opts = feasible(result.options)
    for _, row in fronts.iterrows():
        same = opts[opts["mode"] == row["mode"]]
        better = same[(same["days"] <= row["days"]) & (same["usd"] <= row["usd"])
                      & ((same["days"] < row["days"]) | (same["usd"] < row["usd"]))]
        assert better.empty, row
        assert row["engine"] == "event"
    assert set(fronts["mode"]) == {"on_demand", "reserved", "spot", "buy"}
    assert not [k for k in to_resimulate(result.options, result.candidates)
                if result.cells.set_index(["gpu", "nodes"]).loc[k[:2], "engine"] != "event"]


def test_the_options_table_counts_gpus_beside_nodes(result):
    # issue 57: a GB200 node is a 4-GPU tray, a B200 node 8 GPUs: "64 nodes" alone compares unlike things
    table = display_table(result.options)
    opts = feasible(result.options)   # in the table's order: by the analytic days every option has
    opts = opts.assign(_d=opts["analytic_days"].fillna(opts["days"])).sort_values(["_d", "usd"], kind="stable")
    assert list(table["GPUs"]) == [int(g) for g in opts["gpus"]]
    assert list(table.columns[:3]) == ["GPU", "GPUs", "nodes"]


def test_the_options_tables_give_each_engine_its_own_columns(result):
    """Issue 57.4: the options re-simulated on the event engine sat in one days column with the
    analytic ones, so an analytic row could look faster than an event-engine one it was not."""
    table = display_table(result.options)
    opts = feasible(result.options)
    event = opts["engine"] == "event"
    assert event.any() and (~event).any()
    assert all(c.endswith(("[event]", "[analytic]")) for c in table.columns if c.split(" [")[0] in
               ("days", "$ of the run", "$ paid out", "MFU", "MWh"))
    assert (table["days [event]"] != "").sum() == event.sum()             # blank where the engine did not run
    assert (table["days [analytic]"] != "").sum() >= (~event).sum()
    days = opts["analytic_days"].fillna(opts["days"]).sort_values(kind="stable")
    shown = [float(d.split(" ")[0].replace(",", "")) for d in table["days [analytic]"] if d]
    assert shown == sorted(shown) and len(days) == len(table)             # one engine orders the rows


def test_options_carry_layout_headroom_energy_and_intervals(result):
    opts = feasible(result.options)
    h100 = opts[(opts["gpu"] == "h100-sxm") & (opts["mode"] == "on_demand")]
    assert h100["layout"].str.startswith("tp").all() and (h100["headroom_gib"] > 0).all()
    assert (h100["energy_kwh"] > 0).all()
    assert (h100["days_lo"] < h100["days"]).all() and (h100["days"] < h100["days_hi"]).all()
    od = opts[opts["mode"] == "on_demand"].set_index(["gpu", "nodes"])
    res = opts[opts["mode"] == "reserved"].set_index(["gpu", "nodes"])
    assert (res["usd"] < od["usd"]).all() and (res["days"] == od["days"]).all()


def test_none_meets_is_said_clearly():
    res = run_procure(candidates(gpus=["h100-sxm"], nodes=[16], deadline_days=1, budget_usd=1000, resimulate=False),
                      progress=False)
    lines = answer_lines(res)
    assert lines[0].startswith("No evaluated option trains llama3-70b on 15 T tokens within 1 days; the fastest is")
    assert lines[1].startswith("No evaluated option trains llama3-70b on 15 T tokens within $1k paid out; the one that "
                               "needs the least cash is")


def _crossover_utilisation(life_years: float, gpu: str = "h100-sxm") -> float:
    """The utilisation at which owning costs the reserved price per used GPU-hour (energy aside)."""
    s = buy_sheet(gpu, "ib-ndr", {"life_years": life_years, "utilisation": 1.0})
    node = load_catalog().node("dgx-h100")
    fixed = s.capex_usd_per_gpu_hour() + s.facility_usd_per_gpu_hour(node.system_power_w / node.gpus_per_node)
    return fixed / load_catalog().prices.gpus[gpu].reserved_usd


def test_buy_rent_crossover_moves_with_life_and_utilisation():
    short, long = _crossover_utilisation(3), _crossover_utilisation(6)
    assert 0 < long < short < 1 and long == pytest.approx(short * 3 / 6, rel=0.35)
    s = buy_sheet("h100-sxm", "ib-ndr", {"life_years": 4, "utilisation": 0.5})
    assert s.capex_usd_per_gpu_hour() == pytest.approx(s.capex_per_gpu / (4 * HOURS_PER_YEAR * 0.5))
    # the same cell, bought: dearer than renting reserved when the cluster idles, cheaper when busy
    base = dict(gpus=["h100-sxm"], nodes=[32], modes=["reserved", "buy"], resimulate=False)
    idle = run_procure(candidates(**base, buy={"utilisation": 0.1 * short}), progress=False).options
    busy = run_procure(candidates(**base, buy={"utilisation": min(1.0, 2 * short)}), progress=False).options
    usd = lambda o, m: float(o[o["mode"] == m]["usd"].iloc[0])  # noqa: E731
    assert usd(idle, "buy") > usd(idle, "reserved") and usd(busy, "buy") < usd(busy, "reserved")


def test_buy_days_add_the_lead_time():
    o = run_procure(candidates(gpus=["b200"], nodes=[64], modes=["on_demand", "buy"], resimulate=False,
                               buy={"lead_time_days": 30}), progress=False).options.set_index("mode")
    assert o.loc["buy", "days"] == pytest.approx(o.loc["on_demand", "days"] + 30)


def test_states_that_overflow_skip_the_search():
    c = candidates(gpus=["a100-80gb"], nodes=[1, 64])
    assert "more than their 80 GiB" in states_overflow(c, {"gpu": "a100-80gb", "nodes": 1})
    assert states_overflow(c, {"gpu": "a100-80gb", "nodes": 64}) == ""
    res = run_procure(candidates(gpus=["a100-80gb"], nodes=[1, 64], resimulate=False), progress=False)
    assert bool(res.cells.set_index("nodes").loc[1, "pruned"]) and res.options["nodes"].min() > 1


@pytest.mark.parametrize("doc, sentence", [
    ({"colour": "red"}, "unknown candidates field 'colour'"),
    ({"nodes": [16, -2]}, "candidates.nodes=[16, -2] must be a non-empty list of positive whole numbers of nodes"),
    ({"tokens": -1}, "candidates.tokens=-1 must be a positive number"),
    ({"deadline_days": "soon"}, "candidates.deadline_days='soon' must be a positive number"),
    ({"buy": {"utilisation": 1.5}}, "candidates.buy.utilisation=1.5 must be a share in (0, 1]"),
    ({"buy": {"life": 3}}, "unknown field 'candidates.buy.life'"),
    ({"gpus": ["tpu-v5"]}, "candidates.gpus: 'tpu-v5' is not one of the GPUs priced in prices.yaml"),
    ({"modes": ["lease"]}, "candidates.modes: 'lease' is not one of the modes"),
    ({"prices": {"b200": {"on_demand": 3}}}, "unknown field 'candidates.prices.b200.on_demand'"),
])
def test_bad_candidates_are_one_sentence(doc, sentence):
    with pytest.raises(PlanError) as err:
        candidates(**doc)
    assert str(err.value).startswith(sentence) and "\n" not in str(err.value)


NEW_GPUS = ("b300", "gb200", "gb300", "mi325x", "mi355x")


def test_new_gpus_are_priced_and_join_the_defaults_with_their_node():
    cat = load_catalog()
    with_node = {raw.get("gpu") for raw in cat.nodes.values()}
    for gpu in NEW_GPUS + ("a100-80gb", "h100-sxm", "h200", "b200", "mi300x"):
        price = cat.prices.gpus[gpu]
        assert price.on_demand_usd > price.reserved_usd > 0 and price.source
        assert cat.prices.purchase["gpus"][gpu]["usd_per_gpu"] > 0 and cat.prices.purchase["gpus"][gpu]["source"]
        assert (gpu in default_gpus()) == (gpu in with_node and gpu in cat.gpus)
    for gpu in NEW_GPUS:
        if gpu not in with_node:
            with pytest.raises(PlanError, match=f"'{gpu}' is priced but the catalog has no node built on it yet"):
                candidates(gpus=[gpu])


def test_every_purchase_figure_has_a_source():
    p = load_catalog().prices.purchase
    assert p["source"] and all(e["source"] for part in ("gpus", "fabrics") for e in p[part].values())
    assert math.isclose(p["facility_usd_per_kw_month"], 184.06)


def test_mixed_pipeline_is_an_event_engine_option_at_the_blended_price():
    res = run_procure(candidates(gpus=["h100-sxm"], nodes=[64], modes=["reserved", "buy"], resimulate=False,
                                 mixed=[{"gpus": ["h100-sxm", "a100-80gb"], "nodes": [64]}]), progress=False)
    o = res.options.set_index(["gpu", "mode"])
    mixed = o.loc[("h100-sxm+a100-80gb", "reserved")]
    prices = load_catalog().prices.gpus
    assert mixed["engine"] == "event" and "on a100-80gb)" in mixed["layout"]
    assert mixed["usd_per_gpu_hour"] == pytest.approx((prices["h100-sxm"].reserved_usd + prices["a100-80gb"].reserved_usd) / 2)
    assert mixed["days"] > o.loc[("h100-sxm", "reserved"), "days"]      # the A100 stages hold the pipeline back
    assert o.loc[("h100-sxm+a100-80gb", "buy"), "usd_per_gpu_hour"] < o.loc[("h100-sxm", "buy"), "usd_per_gpu_hour"]
    assert any("mixed pipeline" in a for a in res.assumptions) and any(a.startswith("GPU a100-80gb:") for a in res.assumptions)


@pytest.mark.parametrize("entry, sentence", [
    ({"gpus": ["h100-sxm"], "nodes": [8]}, "candidates.mixed[0].gpus=['h100-sxm'] must name two different GPU types"),
    ({"gpus": ["h100-sxm", "a100-80gb"], "nodes": [0]}, "candidates.mixed[0].nodes=[0] must be a non-empty list"),
    ({"gpus": ["h100-sxm", "a100-80gb"], "nodes": [8], "share": 1}, "candidates.mixed[0].share=1 must be the share"),
])
def test_bad_mixed_entries_are_one_sentence(entry, sentence):
    with pytest.raises(PlanError) as err:
        candidates(mixed=[entry])
    assert str(err.value).startswith(sentence)


def test_a_bad_model_is_one_sentence_before_any_search():
    with pytest.raises(PlanError, match="unknown model|model"):
        candidates(model="no-such-model")
