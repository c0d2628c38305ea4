"""DualPipeV as data: the order torch's ``ScheduleDualPipeV`` builds (its ``pipeline_order``, pairs
included, and its lowering with sends, receives, UNSHARD/RESHARD and REDUCE_GRAD), element by
element; the V placement; the rules torch's constructor checks, refused by ``check_plan``."""
from __future__ import annotations

import re

import pytest

from simcore.model.actions import Overlap, leaves
from simcore.model.schedules import Action, Op, build_schedule, format_grid, lower
from simcore.plan.choices import PlanError
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import Schedule
from tests.model.test_schedules import _FakeStage, _ours, dependency_order

SHAPES = [(1, 2), (2, 4), (2, 5), (3, 6), (3, 10), (4, 8), (4, 9), (4, 13), (5, 12), (6, 12), (8, 16), (8, 19)]


def _torch(pp: int, m: int):
    sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    return sched.ScheduleDualPipeV([_FakeStage(0, 2 * pp, pp), _FakeStage(2 * pp - 1, 2 * pp, pp)], m)


@pytest.mark.parametrize("pp, m", SHAPES)
def test_dualpipev_is_torchs_order_element_by_element(pp, m):
    theirs = _torch(pp, m)
    ours = build_schedule(Schedule.DUALPIPE_V, pp, m, 2, paired=True)
    assert ours == _ours(theirs.pipeline_order)                      # pairs as (F;B)OVERLAP_F_B
    assert lower(ours, pp, m, 2) == _ours(theirs.pipeline_order_with_comms)
    fmt = pytest.importorskip("torch.distributed.pipelining.schedules")._format_pipeline_order
    assert format_grid(ours, by="step") == fmt(theirs.pipeline_order)


def test_overlap_prints_and_parses_as_torchs():
    pair = Action.from_str("(0F5;5B2)OVERLAP_F_B")
    assert pair == Overlap(Action(0, Op.F, 5), Action(5, Op.B, 2)) and str(pair) == "(0F5;5B2)OVERLAP_F_B"
    assert leaves(pair) == (Action(0, Op.F, 5), Action(5, Op.B, 2)) and leaves(Action(1, Op.W, 0)) == (Action(1, Op.W, 0),)


@pytest.mark.parametrize("pp, m", SHAPES)
def test_every_rank_runs_its_v_each_microbatch_once_in_dependency_order(pp, m):
    """Rank r holds stages r and 2pp - 1 - r; each stage runs F, then B or I and later W, of every
    micro-batch; the flat order (what torch's runtime runs) is the pairs' forward, then backward."""
    flat, paired = build_schedule("dualpipev", pp, m, 2), build_schedule("dualpipev", pp, m, 2, paired=True)
    for rank in range(pp):
        assert flat[rank] == [x for a in paired[rank] for x in leaves(a)]
        assert None not in flat[rank]                                  # an order, not a timeline
        assert {a.stage for a in flat[rank]} == {rank, 2 * pp - 1 - rank}
        seen = dependency_order(flat[rank])
        for s in (rank, 2 * pp - 1 - rank):
            for i in range(m):
                assert (s, Op.F, i) in seen and ((s, Op.B, i) in seen) != ((s, Op.I, i) in seen and (s, Op.W, i) in seen)


def test_the_shapes_torch_refuses_are_refused():
    with pytest.raises(ValueError, match="parallel.vpp=2"):
        build_schedule("dualpipev", 2, 8, 1)
    with pytest.raises(ValueError, match="at least as many micro-batches"):
        build_schedule("dualpipev", 4, 7, 2)
    torch_sched = pytest.importorskip("torch.distributed.pipelining.schedules")
    with pytest.raises(ValueError, match="at least as many microbatches as stages"):
        torch_sched.ScheduleDualPipeV([_FakeStage(0, 8, 4), _FakeStage(7, 8, 4)], 7)


@pytest.mark.parametrize("parallel, gb, message", [
    ({"pp": 2, "vpp": 1}, 8, "parallel.schedule=dualpipev needs parallel.vpp=2, not 1"),
    ({"pp": 2, "vpp": 3}, 8, "parallel.schedule=dualpipev needs parallel.vpp=2, not 3"),
    ({"pp": 4, "vpp": 2}, 7, "the dualpipev schedule needs at least as many micro-batches per step (7) as stages"),
    ({"pp": 1, "vpp": 2}, 8, "parallel.schedule=dualpipev needs parallel.pp > 1"),
])
def test_check_plan_names_the_rule_torch_checks(parallel, gb, message):
    doc = {"model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "nodes": 1},
           "parallel": {"tp": 1, "dp": 1, "schedule": "dualpipev", **parallel},
           "training": {"global_batch": gb, "micro_batch": 1}}
    with pytest.raises(PlanError, match=re.escape(message)):
        plan_from_dict(doc)
    doc["training"]["global_batch"] = 2 * 2 * max(parallel["pp"], 1)
    doc["parallel"]["vpp"] = 2
    if parallel["pp"] > 1:
        plan = plan_from_dict(doc)
        assert len(build_schedule(plan.parallel.schedule, plan.parallel.pp, plan.num_microbatches, 2)) == plan.parallel.pp


@pytest.mark.parametrize("zero", [2, 3])
def test_fsdp_counts_its_gathers_on_torchs_lowered_order(zero):
    """FSDP2 under DualPipeV: the gathers and reduce-scatters the model charges (``fsdp_stage_calls``)
    are those of torch's lowered order, UNSHARD/RESHARD and REDUCE_GRAD included, pairs run in turn."""
    from simcore.model.fsdp_calls import fsdp_phase_calls, fsdp_stage_calls

    doc = {"model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "nodes": 2},
           "parallel": {"tp": 1, "pp": 4, "dp": 4, "vpp": 2, "zero": zero, "schedule": "dualpipev"},
           "training": {"global_batch": 44, "micro_batch": 1}}
    plan = plan_from_dict(doc)
    pp, m = 4, plan.num_microbatches
    lowered = lower(build_schedule("dualpipev", pp, m, 2, paired=True), pp, m, 2)
    for rank, acts in lowered.items():
        flat = [x for a in acts for x in leaves(a)]
        for stage in (rank, 2 * pp - 1 - rank):
            assert fsdp_stage_calls(plan, stage) == fsdp_phase_calls(flat, stage, zero == 3, True)
