"""MoE parallel folding (``parallel.expert_tp`` below ``tp``): the expert grid ep x
expert_tp folded over tp x cp x dp, as Megatron-Core's ``--expert-tensor-parallel-size``.
It buys larger expert GEMMs and no TP collectives in the MoE block with more expert
weights per GPU: never both for free."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan, megatron_args

BASE = {"model": "mixtral-8x7b", "cluster": {"node": "dgx-h100", "nodes": 8},
        "training": {"global_batch": 256, "flash_attention": True, "recompute": "selective"}}


def _plan(**parallel):
    return plan_from_dict({**BASE, "parallel": {"pp": 2, "zero": 1, "sequence_parallel": True, **parallel}})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(tp=st.sampled_from([2, 4]), ep=st.sampled_from([2, 4, 8]))
def test_folding_holds_more_expert_weights_for_its_gains(tp, ep):
    dp = 64 // (2 * tp)
    if (dp % ep) or (tp * dp) % ep:
        return
    unfolded, folded = simulate(_plan(tp=tp, dp=dp, ep=ep)), simulate(_plan(tp=tp, dp=dp, ep=ep, expert_tp=1))
    # the same ep with experts whole on each rank: tp times the expert weights
    assert folded.memory_bytes["weights"] > unfolded.memory_bytes["weights"]
    # the same model FLOPs in the step, whatever the grid
    assert folded.model_tflops_per_gpu * folded.step_time_s == pytest.approx(
        unfolded.model_tflops_per_gpu * unfolded.step_time_s)


def test_the_same_expert_shards_folded_or_not_hold_the_same_weights():
    # ep 8 x expert_tp 1 and ep 2 x expert_tp 4 both give a GPU 1/8 of the experts
    a, b = simulate(_plan(tp=4, dp=8, ep=8, expert_tp=1)), simulate(_plan(tp=4, dp=8, ep=2))
    assert a.memory_bytes["weights"] == pytest.approx(b.memory_bytes["weights"])


def test_expert_tp_is_checked_in_one_sentence_and_round_trips_through_megatron():
    with pytest.raises(PlanError, match=r"^parallel.expert_tp=3 must divide parallel.tp=4"):
        _plan(tp=4, dp=8, ep=2, expert_tp=3)
    with pytest.raises(PlanError, match=r"^parallel.ep\*expert_tp=16 must divide parallel.tp\*cp\*dp=8"):
        _plan(tp=4, dp=2, ep=8, expert_tp=2)
    with pytest.raises(PlanError, match=r"needs an MoE model"):
        plan_from_dict({**BASE, "model": "llama3-8b", "parallel": {"tp": 4, "dp": 16, "expert_tp": 1,
                                                                   "sequence_parallel": True}})
    plan = _plan(tp=4, dp=8, ep=8, expert_tp=1)
    args = dict(megatron_args(plan))
    assert args["--expert-tensor-parallel-size"] == 1 and args["--expert-model-parallel-size"] == 8
    back = read_megatron(export_plan(plan, "megatron")).fields
    assert back["parallel.expert_tp"] == 1 and back["parallel.ep"] == 8
