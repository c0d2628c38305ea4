"""DualPipeV on the executor: torch's own ``ScheduleDualPipeV`` over gloo, its stages placed as
a V (rank r: stages r and 2pp - 1 - r), against the single-process reference (the loss of every
step, every parameter's update), and the pipeline sends and receives it issues against
``trainplan collectives``' count (tests/executors/test_executor_parallel.py's harness)."""
from __future__ import annotations

import pytest

from executors import parallel
from simcore.model.collective_plan import by_kind_axis, expected_calls
from tests.executors.test_executor_parallel import GPT, check_against_reference, counts, make_plan, run_layouts
from tests.executors.test_executor_tied_cp import check_tied

TWO_RANK = {
    "pp2-dualpipev": make_plan(pp=2, vpp=2, schedule="dualpipev"),   # 4 stages of one layer, 8 micro-batches
    "pp2-dualpipev-m4": make_plan(pp=2, vpp=2, schedule="dualpipev", gb=4),   # as few micro-batches as stages
    # the tied embedding's two copies both on rank 0: their gradients summed there, no embedding group
    "pp2-dualpipev-tied": make_plan(dict(GPT, tied_embeddings=True), pp=2, vpp=2, schedule="dualpipev"),
}
FOUR_RANK = {"dp2xpp2-dualpipev": make_plan(dp=2, pp=2, vpp=2, schedule="dualpipev"),   # replicate, not DDP
             "dp2xpp2-zero2-dualpipev": make_plan(dp=2, pp=2, vpp=2, zero=2, schedule="dualpipev")}


@pytest.fixture(scope="module")
def two_rank():
    return dict(zip(TWO_RANK, run_layouts(2, list(TWO_RANK.values()))))


@pytest.mark.parametrize("name", list(TWO_RANK))
def test_dualpipev_matches_single_process(two_rank, name):
    check_tied(TWO_RANK[name], two_rank[name])   # a tied embedding's two copies equal, then every update


@pytest.mark.parametrize("name", list(TWO_RANK))
def test_dualpipev_sends_what_the_collectives_list_says(two_rank, name):
    plan = TWO_RANK[name]
    for rank in range(2):
        want = {k: n for k, n in by_kind_axis(expected_calls(plan, rank)).items() if k[1] == "pp"}
        assert {k: n for k, n in counts(two_rank[name], rank).items() if k[1] == "pp"} == want


def test_dualpipev_places_its_stages_as_a_v():
    plan = make_plan(pp=2, vpp=2, schedule="dualpipev")
    assert [parallel.stage_ids(plan, r) for r in range(2)] == [[0, 3], [1, 2]]


@pytest.mark.parametrize("schedule, vpp", [("dualpipev", 2), ("zero-bubble", 1)])
def test_zero3_under_a_split_backward_is_refused_in_one_sentence(schedule, vpp):
    """torch 2.13's FSDP2 loses the weight gradients a split backward computes after the stage's
    parameters were resharded by a later forward (measured: the last stages' updates wrong)."""
    plan = make_plan(dp=2, pp=2, vpp=vpp, zero=3, schedule=schedule)
    with pytest.raises(ValueError, match=f"parallel.zero=3 with parallel.schedule={schedule} is priced, not run"):
        parallel.check_executable(plan, "cpu")


@pytest.fixture(scope="module")
def four_rank():
    return dict(zip(FOUR_RANK, run_layouts(4, list(FOUR_RANK.values()))))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FOUR_RANK))
def test_dualpipev_under_data_parallel_matches_single_process_and_the_collectives_list(four_rank, name):
    """replicate's all-reduce (ZeRO 0) or FSDP2's gathers and reduce-scatters (ZeRO-2) on the V."""
    plan = FOUR_RANK[name]
    assert parallel.uses_replicate(plan) == (plan.parallel.zero == 0)
    check_against_reference(plan, four_rank[name])
    for rank in range(4):
        assert counts(four_rank[name], rank) == dict(by_kind_axis(expected_calls(plan, rank)))
