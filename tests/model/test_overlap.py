"""Overlapped communication: the interleaved schedule's pipeline sends hide behind the next
chunk (and only what a chunk cannot cover is exposed, in both engines), and TP comm overlap
slows its GEMMs only for the userbuffers transfers that run on SMs."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.analytic import _hops, analytic
from simcore.engine.des import simulate_des
from simcore.model import comm_ledger
from simcore.model import compute as cmp
from simcore.model import overlap as ov
from simcore.model.layer_comm import layer_comm
from simcore.model.step_costs import step_costs
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError


def _plan(*, pp=8, vpp=5, tp=4, nodes=8, node="dgx-h100", model="llama3-70b", tp_comm_overlap=False):
    return plan_from_dict({"model": {"name": model, "seq_len": 8192}, "cluster": {"node": node, "nodes": nodes},
                           "parallel": {"tp": tp, "pp": pp, "dp": nodes * 8 // (tp * pp), "vpp": vpp,
                                        "schedule": "interleaved-1f1b" if vpp > 1 else "1f1b",
                                        "sequence_parallel": tp > 1, "tp_comm_overlap": tp_comm_overlap},
                           "training": {"global_batch": 128, "micro_batch": 1, "flash_attention": True}})


def test_interleaved_sends_hide_behind_the_next_chunk_in_both_engines():
    costs = step_costs(_plan())
    assert costs.p2p_s > 0
    assert _hops(costs) == [0.0] * 8           # a chunk's compute covers its sends
    ana, des = analytic(costs), simulate_des(costs)
    assert des.step_time_s == pytest.approx(ana.step_time_s, rel=0.02)


def test_a_send_longer_than_the_chunk_exposes_the_excess_and_1f1b_exposes_it_all():
    costs = step_costs(_plan())
    slow = dataclasses.replace(costs, p2p_s=costs.forward_s[0] + 0.5)
    bwd = costs.backward_input_s[0] + costs.backward_weight_s[0] + costs.recompute_s[0]
    excess = 0.5 + max(0.0, slow.p2p_s - bwd)
    assert _hops(slow)[0] == pytest.approx(5 * excess)     # five virtual stages on rank 0
    assert analytic(slow).step_time_s > analytic(costs).step_time_s
    blocking = step_costs(_plan(vpp=1))
    assert _hops(blocking) == [2 * blocking.p2p_s] * 8      # Megatron's batched p2p: the send waits


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(pp=st.sampled_from([2, 4, 8]), vpp=st.sampled_from([2, 4]), tp=st.sampled_from([2, 4, 8]),
       node=st.sampled_from(["dgx-a100-80gb", "dgx-h100"]))
def test_interleaving_never_hides_more_than_the_sends_cost(pp, vpp, tp, node):
    """The exposed part of the sends lies between nothing and all of them."""
    try:
        costs = step_costs(_plan(pp=pp, vpp=vpp, tp=tp, node=node, nodes=pp * tp // 8 * 2 or 2))
    except PlanError:
        return
    for exposed in _hops(costs):
        assert 0.0 <= exposed <= 2 * costs.p2p_s * vpp + 1e-15


def test_userbuffers_slow_the_gemms_only_for_their_sm_transfers():
    """Overlapped TP traffic costs the reduce-scatters' last chunk plus the SM transfers' share
    of the NCCL slow-down, never less than that chunk and never more than NCCL-driven overlap
    of the same chunks."""
    plan = _plan(tp_comm_overlap=True)
    dev = cmp.device_model(plan.cluster.node.gpu, plan.training.precision.value)
    lc = layer_comm(plan, dev)
    lost = 1 - 1 / dev.comm_compute_interference
    tp_f, tp_b = ov.tp_exposed(plan, dev, lc, lost)
    gf, gb, split_f, split_b = ov.tp_gemm_times(plan.model, 1, 8192, 4, 1, 1, True, dev)
    assert tp_f >= lc["tp_f"] * ov.UB_TAIL_SHARE[0] / 4 and tp_b >= lc["tp_b"] * ov.UB_TAIL_SHARE[1] / 4
    nccl_f = ov.overlapped_s(lc["tp_f"], gf, ov.UB_TAIL_SHARE[0] / 4, lost) + split_f
    nccl_b = ov.overlapped_s(lc["tp_b"], gb, ov.UB_TAIL_SHARE[1] / 4, lost) + split_b
    assert tp_f < nccl_f and tp_b < nccl_b
    assert ov.UB_SM_SHARE[0] < 1 and ov.UB_SM_SHARE[1] < 1


def test_overlap_moves_the_same_bytes():
    """Overlap changes when the bytes move, not how many: the ledger of every axis is the same
    with and without TP comm overlap."""
    plain, over = (comm_ledger.step_bytes(_plan(tp_comm_overlap=o)) for o in (False, True))
    assert plain == over and sum(plain.values()) > 0
