"""MoE token dispatch (``parallel.moe_dispatcher``): DeepEP sends a token once to each rank
holding one of its experts, where the all-to-all dispatcher sends one copy per expert. It
saves exactly the copies that share a rank: never more, and nothing at all when every
token's experts sit on different ranks."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model.step_costs import dispatch_ranks, step_costs
from simcore.plan.load import plan_from_dict
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan, megatron_args

BASE = {"model": "mixtral-8x7b", "cluster": {"node": "dgx-h100", "nodes": 8},
        "training": {"global_batch": 256, "flash_attention": True, "recompute": "selective"}}


def _plan(**parallel):
    return plan_from_dict({**BASE, "parallel": {"tp": 2, "pp": 2, "dp": 16, "zero": 1, "sequence_parallel": True,
                                                **parallel}})


@given(experts=st.sampled_from([8, 16, 64, 128, 256]), top_k=st.sampled_from([1, 2, 4, 8]),
       ep=st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_a_token_reaches_between_one_rank_and_one_per_expert(experts, top_k, ep):
    if ep > experts or experts % ep or top_k > experts:
        return
    ranks = dispatch_ranks(experts, top_k, ep)
    assert 1.0 - 1e-12 <= ranks <= min(top_k, ep) + 1e-12
    if top_k == 1 or ep == experts:   # one expert, or one expert a rank: every copy travels
        assert ranks == pytest.approx(top_k if ep > 1 else 1.0)


def test_dispatch_ranks_by_hand():
    # 4 experts on 2 ranks, top-2: the pair lands on one rank with probability 2/6
    assert dispatch_ranks(4, 2, 2) == pytest.approx(2 * (1 - math.comb(2, 2) / math.comb(4, 2)))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(ep=st.sampled_from([2, 4, 8]))
def test_deepep_saves_only_the_copies_that_share_a_rank(ep):
    a2a, deep = _plan(ep=ep), _plan(ep=ep, moe_dispatcher="deepep")
    ca, cd = step_costs(a2a), step_costs(deep)
    # the EP all-to-all time per layer falls, never below one copy of each token a rank
    ta, td = ca.time_detail_s["ep_comm_per_layer_s"], cd.time_detail_s["ep_comm_per_layer_s"]
    m = a2a.model
    nodes = ep * a2a.parallel.tp > a2a.cluster.gpus_per_node   # the group leaves the node (ep 8 here)
    if ep < m.experts or nodes:   # several experts a rank, or a token once per node over RDMA
        assert 0 < td < ta
    else:                # one expert a rank inside a node: every copy travels either way
        assert td == pytest.approx(ta)
    if not nodes:
        share = dispatch_ranks(m.experts, m.top_k, ep) / (m.top_k * m.capacity_factor)
        assert td >= share * ta * (1 - 1e-9) - 1e-12   # latency terms are paid in full either way
    # nothing else moves: the same compute, the same memory
    assert cd.forward_s == ca.forward_s and simulate(deep).memory_bytes == simulate(a2a).memory_bytes


def test_the_dispatcher_is_checked_refused_and_round_trips_through_megatron():
    with pytest.raises(PlanError, match=r"^parallel.moe_dispatcher=deepep needs an MoE model"):
        plan_from_dict({**BASE, "model": "llama3-8b",
                        "parallel": {"tp": 2, "dp": 32, "sequence_parallel": True, "moe_dispatcher": "deepep"}})
    with pytest.raises(PlanError, match=r"^parallel.moe_dispatcher"):
        _plan(ep=4, moe_dispatcher="nccl")
    from executors.support import check_executable
    with pytest.raises(ValueError, match=r"^parallel.moe_dispatcher=deepep is priced, not run"):
        check_executable(_plan(ep=4, moe_dispatcher="deepep"), "cpu")
    from simcore.model.collective_plan import expected_calls
    with pytest.raises(ValueError, match=r"^parallel.moe_dispatcher=deepep: DeepEP's dispatch is not modelled"):
        expected_calls(_plan(ep=4, moe_dispatcher="deepep"), 0)
    plan = _plan(ep=8, moe_dispatcher="deepep")
    args = dict(megatron_args(plan))
    assert args["--moe-token-dispatcher-type"] == "flex" and "--moe-enable-deepep" in args
    back = read_megatron(export_plan(plan, "megatron")).fields
    assert back["parallel.moe_dispatcher"] == "deepep" and back["parallel.ep"] == 8
    assert "parallel.moe_dispatcher" not in read_megatron(export_plan(_plan(ep=8), "megatron")).fields
