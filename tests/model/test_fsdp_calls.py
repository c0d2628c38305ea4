"""FSDP2's calls per step (``fsdp_calls.fsdp_stage_calls``): the closed forms the model
uses equal the walk over the lowered actions that ``trainplan collectives`` lists, and the
prediction charges each call it lists (no ZeRO-2 or ZeRO-3 without its traffic)."""
from __future__ import annotations

import pytest

from simcore.engine.predict import simulate
from simcore.model import compute as cmp
from simcore.model import end_comm as ec
from simcore.model import fsdp_calls as cp
from simcore.model import memory as mem
from simcore.model.fsdp_calls import _fsdp_stage_calls, _lowered_actions, _phase_calls_by_stage
from simcore.model.step_costs import step_costs
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import Schedule

SHAPES = [(sch, pp, m, vpp) for sch in Schedule for pp in (2, 3, 4) for m in (1, 2, 4, 6, 8, 12)
          for vpp in ((1,) if sch in (Schedule.GPIPE, Schedule.ONE_F_ONE_B) else (2, 3, 4))]


def _walk(schedule, pp, m, vpp, reshard):
    try:
        ranks = _lowered_actions(schedule, pp, m, vpp)
    except ValueError:   # a shape torch refuses (e.g. interleaved with m not a multiple of pp)
        return None
    calls = {}
    for acts in ranks:
        calls.update(_phase_calls_by_stage(acts, reshard, pp > 1))
    return [calls.get(v, (0, 0, 0)) for v in range(pp * vpp)]


@pytest.mark.parametrize("reshard", [False, True], ids=["zero2", "zero3"])
def test_closed_forms_equal_the_walk_over_torchs_actions(reshard):
    checked = 0
    for schedule, pp, m, vpp in SHAPES:
        walked = _walk(schedule, pp, m, vpp, reshard)
        if walked is None:
            continue
        assert [_fsdp_stage_calls(schedule, pp, m, vpp, reshard, v) for v in range(pp * vpp)] == walked, \
            (schedule, pp, m, vpp)
        checked += 1
    assert checked > 40
    assert _fsdp_stage_calls(Schedule.ONE_F_ONE_B, 1, 8, 1, reshard, 0) == (8, 8 if reshard else 0, 8)


@pytest.mark.parametrize("reshard", [False, True], ids=["zero2", "zero3"])
def test_long_runtime_schedules_extrapolate_exactly_to_the_walk(reshard):
    """Past STEADY_GROUPS + 1 groups of pp micro-batches the counts are extrapolated from two
    shorter walks; they equal the walk of the whole step."""
    checked = 0
    for schedule in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE):
        for pp, vpp, groups in ((2, 2, 11), (4, 3, 7), (8, 5, 6), (3, 4, 9)):
            m = pp * groups
            assert m > (cp.STEADY_GROUPS + 1) * pp
            walked = _walk(schedule, pp, m, vpp, reshard)
            assert walked is not None
            assert [_fsdp_stage_calls(schedule, pp, m, vpp, reshard, v) for v in range(pp * vpp)] == walked, \
                (schedule, pp, m, vpp)
            checked += 1
    assert checked == 8


def _plan(zero, pp=1, global_batch=32, schedule="1f1b"):
    return plan_from_dict({"model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "nodes": 2},
                           "parallel": {"dp": 16 // pp, "pp": pp, "zero": zero, "schedule": schedule},
                           "training": {"global_batch": global_batch, "micro_batch": 1}})


def test_zero2_under_accumulation_pays_for_its_sharded_gradients():
    """Alone, ZeRO-2 (FSDP2, reshard_after_forward=False) reduce-scatters and all-gathers every
    micro-batch: more traffic than ZeRO-1's once per step, so it cannot hold 1/dp of the
    gradients and be as fast. Pipelined it reduces once but keeps whole gradients."""
    z1, z2 = _plan(1), _plan(2)
    assert z2.num_microbatches == 2
    r1, r2 = simulate(z1), simulate(z2)
    assert r2.memory_bytes["gradients"] < r1.memory_bytes["gradients"]
    assert r2.step_time_s > r1.step_time_s
    c2 = step_costs(z2)
    assert c2.grad_reduce_per_microbatch and c2.forward_gather_s[0] > 0 and c2.backward_gather_s == (0.0,)
    p1, p2 = _plan(1, pp=2), _plan(2, pp=2)
    assert simulate(p2).memory_bytes["gradients"] == simulate(p1).memory_bytes["gradients"]
    assert not step_costs(p2).grad_reduce_per_microbatch


@pytest.mark.parametrize("zero,pp,schedule", [(2, 1, "1f1b"), (3, 1, "1f1b"), (2, 2, "1f1b"), (3, 2, "1f1b"),
                                              (3, 2, "gpipe"), (3, 2, "interleaved-1f1b")])
def test_the_prediction_charges_every_gather_and_scatter_the_collectives_list_names(zero, pp, schedule):
    plan = _plan(zero, pp=pp, global_batch=64, schedule=schedule)
    c, m = step_costs(plan), plan.num_microbatches
    ag, rs = (c.time_detail_s[k] for k in ("fsdp_layer_all_gather_s", "fsdp_layer_reduce_scatter_s"))
    params = mem.stage_params(plan)
    dev = cmp.device_model(plan.cluster.node.gpu, plan.training.precision.value)
    for v, layers in enumerate(c.layers):
        forward, backward, scatters = cp.fsdp_stage_calls(plan, v)
        # each rank's root group (embedding, final norm, output) on its first virtual stage, as often as a block
        root_ag, root_rs = ec.fsdp_root_s(plan, dev, params[v]) if v < pp else (0.0, 0.0)
        assert m * c.forward_gather_s[v] == pytest.approx((layers * ag + root_ag) * forward)
        assert m * c.backward_gather_s[v] == pytest.approx((layers * ag + root_ag) * backward)
        tied = ec.tied_s(plan, dev) if v in (0, len(c.layers) - 1) else 0.0   # the embedding group's all-reduce
        assert c.grad_reduce_per_step_s[v] == pytest.approx((layers * rs + root_rs) * scatters + tied)
        # the same counts as the per-rank list of `trainplan collectives` (one call per block)
        acts = cp.rank_actions(plan, v % pp)
        assert cp.fsdp_unit_calls(acts, v, zero == 3, pp > 1) == (forward + backward, scatters)


@pytest.mark.parametrize("reshard", [False, True], ids=["zero2", "zero3"])
def test_the_walk_on_numbers_equals_the_walk_over_torchs_actions_on_deep_shapes(reshard):
    """``_fsdp_rank_calls`` walks a rank's compute actions as (kind, chunk) numbers, the window of
    ``add_unshard_reshard`` and REDUCE_GRAD included: on deeper pipelines and more virtual stages
    than ``SHAPES`` (every stage's window differs past ``MAX_ACTIVE_STAGES``) it equals the walk
    over the lowered actions, rank by rank, without extrapolation."""
    checked = 0
    for schedule, pp, m, vpp in [(Schedule.INTERLEAVED_1F1B, 5, 10, 5), (Schedule.INTERLEAVED_1F1B, 6, 6, 7),
                                 (Schedule.INTERLEAVED_1F1B, 8, 24, 4), (Schedule.INTERLEAVED_1F1B, 3, 27, 8),
                                 (Schedule.INTERLEAVED_1F1B, 7, 3, 6), (Schedule.ZERO_BUBBLE, 5, 15, 5),
                                 (Schedule.ZERO_BUBBLE, 4, 20, 8), (Schedule.ZERO_BUBBLE, 6, 12, 3),
                                 (Schedule.ZERO_BUBBLE, 9, 18, 1), (Schedule.DUALPIPE_V, 5, 13, 2)]:
        walked = _walk(schedule, pp, m, vpp, reshard)
        assert walked is not None, (schedule, pp, m, vpp)
        assert [_fsdp_stage_calls(schedule, pp, m, vpp, reshard, v) for v in range(pp * vpp)] == walked, \
            (schedule, pp, m, vpp)
        if schedule != Schedule.DUALPIPE_V and vpp > 1:   # the rank walk itself, where it answers
            for r in range(pp):
                assert cp._fsdp_rank_calls(schedule, pp, m, vpp, reshard, r) == \
                    _phase_calls_by_stage(_lowered_actions(schedule, pp, m, vpp)[r], reshard, True), (schedule, pp, m, r)
        checked += 1
    assert checked == 10
