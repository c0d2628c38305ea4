"""Issue 28.1-28.3: money a procurement reader can trust. Every day and $ figure is finite and
non-negative or the run is 'infeasible' with one sentence; more interruptions never make a run
shorter; spot runs as operators run it; the Monte-Carlo costs events, not steps or nodes."""
from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.runs import monte_carlo_runs
from simcore.plan.load import load_plan, plan_from_dict
from simcore.planner import montecarlo as mc
from simcore.planner.failures import expected_wall_s
from simcore.planner.runcost import run_cost, summary_lines
from simcore.planner.spot import INFEASIBLE_GOODPUT, poisson_cdf, spare_pool

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ("on_demand", "reserved", "spot")


def plan_on(nodes: int):
    return plan_from_dict({"name": f"p{nodes}", "model": "gpt-1.7b",
                           "cluster": {"node": "dgx-h100", "nodes": nodes, "fabric": "ib-ndr"},
                           "parallel": {"tp": 8, "pp": 1, "dp": nodes}, "training": {"global_batch": 8 * nodes}})


def assert_honest(rc) -> None:
    """Finite and non-negative, or infeasible with a sentence and no figure."""
    for name in SCENARIOS:
        s = getattr(rc, name)
        if s.infeasible:
            assert "infeasible" in s.infeasible and s.infeasible.count(". ") == 0
            assert math.isnan(s.usd) and math.isnan(s.wall_s)
            continue
        for v in (s.wall_s, s.usd, s.gpu_hours, s.expected_interruptions, s.lost_work_s, s.restart_total_s):
            assert math.isfinite(v) and v >= 0, (name, v)
        assert s.wall_s >= rc.useful_s * (1 - 1e-12)
        assert INFEASIBLE_GOODPUT <= s.goodput <= 1 + 1e-12
        for key in ("days", "usd"):
            if key in s.interval:
                lo, hi = s.interval[key]
                assert lo <= getattr(s, "days" if key == "days" else "usd") * (1 + 1e-9) and \
                    (math.isnan(hi) or hi >= lo)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.sampled_from([1, 8, 64, 512, 4096, 12800]), step=st.floats(0.05, 600),
       tokens=st.floats(1e8, 3e13), fail=st.floats(0, 1e-3), preempt=st.floats(0, 2.0),
       restart=st.floats(0, 7200))
def test_every_money_and_time_figure_is_finite_or_infeasible(nodes, step, tokens, fail, preempt, restart):
    prices = {"failures_per_gpu_hour": fail, "spot_preemptions_per_node_hour": preempt, "restart_s": restart}
    rc = run_cost(plan_on(nodes), SimpleNamespace(step_time_s=step, compute_s=step / 2), tokens, prices=prices,
                  monte_carlo=0)
    assert_honest(rc)
    text = "\n".join(summary_lines(rc))
    assert "e+" not in text and "nan" not in text.lower() and "inf " not in text


@settings(max_examples=25, deadline=None)
@given(nodes=st.sampled_from([8, 64, 512]), step=st.floats(0.5, 60), preempt=st.floats(1e-4, 0.5),
       factor=st.floats(1.1, 10))
def test_more_preemptions_never_make_spot_faster(nodes, step, preempt, factor):
    """With the spare pool held fixed (sized automatically, more preemptions buy more spares,
    which may well finish sooner: that is the operator's choice, not physics)."""
    pred = SimpleNamespace(step_time_s=step, compute_s=step)
    days, usd = [], []
    for rate in (preempt, preempt * factor):
        sp = run_cost(plan_on(nodes), pred, 1e12, prices={"spot_preemptions_per_node_hour": rate,
                                                          "spot_spare_nodes": 2}, monte_carlo=0).spot
        days.append(math.inf if sp.infeasible else sp.wall_s)
        usd.append(math.inf if sp.infeasible else sp.usd)
    assert days[1] >= days[0] * (1 - 1e-9) and usd[1] >= usd[0] * (1 - 1e-9)


@settings(max_examples=25, deadline=None)
@given(step=st.floats(0.5, 60), fail=st.floats(1e-6, 1e-3), factor=st.floats(1.1, 10))
def test_more_failures_never_make_on_demand_faster(step, fail, factor):
    pred = SimpleNamespace(step_time_s=step, compute_s=step)
    walls = []
    for rate in (fail, fail * factor):
        od = run_cost(plan_on(64), pred, 1e12, prices={"failures_per_gpu_hour": rate}, monte_carlo=0).on_demand
        walls.append(math.inf if od.infeasible else od.wall_s)
    assert walls[1] >= walls[0] * (1 - 1e-9)


def test_daly_in_log_space_is_inf_not_an_overflow():
    assert expected_wall_s(1e9, 60, 10, 5000, 5.0) == math.inf          # e^{R/M} = e^{1000}: no OverflowError
    assert math.isfinite(expected_wall_s(1e6, 600, 10, 60, 36000))


def test_issue_examples_no_longer_diverge():
    """GPT-3 (shipped) spot is no longer $228 M / 3,097 days; 102,400 GPUs say 'infeasible'."""
    plan = load_plan(ROOT / "plans" / "gpt3-175b-a100.yaml")
    pred = SimpleNamespace(step_time_s=21.66, compute_s=18.0)
    rc = run_cost(plan, pred, 3e11, monte_carlo=0)
    assert_honest(rc)
    assert rc.spot.days < 3 * rc.on_demand.days and rc.spot.usd < 2 * rc.on_demand.usd
    big = plan_on(12800)
    rc = run_cost(big, SimpleNamespace(step_time_s=10.0, compute_s=8.0), 1.5e13, monte_carlo=200)
    assert rc.spot.infeasible.startswith("spot is infeasible") and rc.spot.monte_carlo == {}
    line = next(ln for ln in summary_lines(rc) if ln.strip().startswith("spot"))
    assert "infeasible" in line and "$" not in line
    assert rc.to_json()["spot"]["usd"] is None                          # JSON null, never NaN


def test_spares_are_the_fewest_that_keep_the_job_whole():
    p = 0.05 / 3600
    spares, avail = spare_pool(192, p, 1800, 0.99)
    assert avail >= 0.99
    mean_out = p * (192 + spares - 1) * 1800
    assert poisson_cdf(spares - 1, mean_out) < 0.99                      # one fewer falls short
    assert poisson_cdf(3, 2.0) == pytest.approx(sum(math.exp(-2) * 2**k / math.factorial(k) for k in range(4)))


def test_a_checkpoint_on_notice_saves_the_work():
    """Short steps and checkpoints fit the provider's notice: preemptions lose no work, so spot
    with notice is faster than the same spot run without one."""
    pred = SimpleNamespace(step_time_s=2.0, compute_s=2.0)
    with_notice = run_cost(plan_on(64), pred, 1e12, monte_carlo=0).spot
    without = run_cost(plan_on(64), pred, 1e12, prices={"spot_notice_s": 0.0}, monte_carlo=0).spot
    assert with_notice.wall_s < without.wall_s
    assert with_notice.spare_nodes >= 1 and with_notice.usd_per_gpu_hour < run_cost(
        plan_on(64), pred, 1e12, monte_carlo=0).on_demand.usd_per_gpu_hour


def test_numpy_monte_carlo_matches_daly_and_simpy():
    kw = dict(work_s=100 * 3600, interval_s=3600, checkpoint_s=360)
    r = mc.daly_runs(4000, 7, recover_s=1800, rate_per_s=1 / 36000, **kw)
    assert r.wall_s.mean() == pytest.approx(expected_wall_s(100 * 3600, 3600, 360, 1800, 36000), rel=0.01)
    simpy = [s.wall_s for s in monte_carlo_runs(300, 7, restore_s=1800, restart_s=0.0,
                                                failure_rate_per_s=1 / 36000, **kw)]
    assert np.mean(simpy) == pytest.approx(r.wall_s.mean(), rel=0.02)
    assert np.percentile(simpy, 90) == pytest.approx(np.percentile(r.wall_s, 90), rel=0.03)
    again = mc.daly_runs(4000, 7, recover_s=1800, rate_per_s=1 / 36000, **kw)
    assert np.array_equal(again.wall_s, r.wall_s)                        # seeded


def test_monte_carlo_cost_follows_events_not_steps():
    """10^12 checkpoint segments with a handful of failures: drawn per failure (negative
    binomial over the segments), so it returns at once and agrees with Daly's closed form; a
    loop over segments or steps would never finish. bench/cost.py times the real commands."""
    kw = dict(work_s=1e9, interval_s=1e-3, checkpoint_s=1e-6, recover_s=60.0)
    r = mc.daly_runs(2000, 1, rate_per_s=2e-8, **kw)
    assert r.interruptions.mean() == pytest.approx(20, rel=0.1)
    assert r.wall_s.mean() == pytest.approx(expected_wall_s(1e9, 1e-3, 1e-6, 60.0, 5e7), rel=1e-3)
    assert mc.runs_for_budget(200, 1e9) == 0                            # refused, not run for hours
    assert mc.runs_for_budget(200, 1e6) == mc.MIN_RUNS
    assert mc.runs_for_budget(200, 10) == 200
