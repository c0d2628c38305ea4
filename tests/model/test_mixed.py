"""Mixed hardware and stragglers on real plans; representative against full mode at 64 GPUs."""
from __future__ import annotations

import pytest

from simcore.engine.des import simulate_des, stage_stragglers
from simcore.model.mixed import mixed_costs
from simcore.model.step_costs import step_costs
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError


def plan(**par):
    return plan_from_dict({"model": "gpt-18b", "cluster": {"node": "dgx-h100", "nodes": 8},
                           "parallel": {"tp": 2, "pp": 4, "dp": 8, **par}, "training": {"global_batch": 64}})


def test_mixed_costs_change_only_the_chosen_stage():
    p = plan()
    base, mixed = step_costs(p), mixed_costs(p, {2: "a100-80gb"})
    for v in range(base.stages):
        same = v % 4 != 2
        assert (mixed.forward_s[v] == base.forward_s[v]) == same
        assert (mixed.backward_input_s[v] == base.backward_input_s[v]) == same
    assert mixed.forward_s[2] > 2 * base.forward_s[2]  # A100 bf16 peak is about a third of H100
    assert mixed.p2p_s == base.p2p_s and mixed.grad_reduce_per_step_s == base.grad_reduce_per_step_s
    assert mixed_costs(p, {2: "h100-sxm"}).forward_s == base.forward_s  # its own GPU: no change


def test_the_pipeline_waits_on_the_slow_stage():
    p = plan()
    uniform = simulate_des(step_costs(p)).step_time_s
    mixed = simulate_des(mixed_costs(p, {1: "a100-80gb"})).step_time_s
    assert mixed > 1.4 * uniform  # one stage of four at ~1/3 the speed holds up the pipeline
    straggled = simulate_des(step_costs(p), stragglers=stage_stragglers(p, {1: 1.5})).step_time_s
    assert uniform < straggled < mixed


def test_unknown_gpu_or_stage_is_one_sentence():
    with pytest.raises(PlanError, match="unknown GPU 'h1000'"):
        mixed_costs(plan(), {0: "h1000"})
    with pytest.raises(PlanError, match="pipeline stage 7 does not exist"):
        mixed_costs(plan(), {7: "a100-80gb"})


def test_representative_mode_equals_full_mode_on_64_gpus():
    p = plan(zero=1)
    costs = step_costs(p)
    rep, full = simulate_des(costs), simulate_des(costs, mode="full")
    assert full.extra["simulated_ranks"] > rep.extra["simulated_ranks"]
    assert full.step_time_s == pytest.approx(rep.step_time_s, rel=0.01)
    assert full.bubble_s == pytest.approx(rep.bubble_s, rel=0.01, abs=1e-6)
