"""The collectives of context parallel, expert parallel and tied-embedding layouts equal the
simulator's list (``simcore.model.collective_plan``), per rank, in counts and recorded bytes,
as ``tests/model/test_collective_plan.py`` checks the other layouts."""
from __future__ import annotations

from collections import Counter

import pytest

from executors import procs
from simcore.model import collective_plan as cp
from tests.executors.test_executor_moe import MOE_DENSE1, MOE_GPT, MOE_LLAMA
from tests.executors.test_executor_tied_cp import GPT, LLAMA, TIED_GPT, TIED_LLAMA, plan
from tests.model.test_collective_plan import record_step


def recorded_bytes(p, calls: Counter) -> Counter:
    """What ``executors.record`` records of each call: the first tensor argument, i.e. the
    shard for FSDP2's reduce-scatter and DTensor's all-gather; receives are not drawn."""
    par = p.parallel
    sizes = {"dp": par.dp * par.cp, "cp": par.dp * par.cp, "tp": par.tp, "pp": par.pp}
    out: Counter = Counter()
    for c, n in calls.items():
        shard = (c.kind, c.issuer) in (("reduce_scatter", "fsdp2"), ("all_gather", "dtensor"))
        if c.kind != "recv":
            out[(c.kind, c.axis, c.bytes // sizes[c.axis] if shard else c.bytes)] += n
    return out


TWO_RANK = {
    "tied-pp2": plan(TIED_GPT, pp=2),
    "tied-tp2": plan(TIED_LLAMA, tp=2),
    "cp2": plan(GPT, cp=2),
    "cp2-selective": plan(LLAMA, cp=2, recompute="selective"),
    "cp2-op": plan(LLAMA, cp=2, recompute="op"),
    "cp2-layer2": plan(GPT, cp=2, recompute="layer:2"),
    "ep2-dp2-op": plan(MOE_LLAMA, dp=2, ep=2, recompute="op"),   # the saved all-to-alls are not re-sent
    "cp2-zero2": plan(GPT, cp=2, zero=2),
    "ep2-dp2": plan(MOE_GPT, dp=2, ep=2),
    "ep2-dp2-dense1": plan(MOE_DENSE1, dp=2, ep=2),   # no all-to-all in the dense first layer
    "moe-dp2": plan(MOE_GPT, dp=2),
    "moe-tp2": plan(MOE_LLAMA, tp=2),
    "moe-tp2-sp": plan(MOE_GPT, tp=2, sequence_parallel=True),
}
FOUR_RANK = {
    "tied-pp2-dp2-zero3": plan(TIED_GPT, pp=2, dp=2, zero=3, schedule="gpipe"),
    "tied-pp2-tp2-sp": plan(TIED_LLAMA, pp=2, tp=2, sequence_parallel=True),
    "cp2-dp2": plan(GPT, cp=2, dp=2),
    "cp2-tp2-sp": plan(LLAMA, cp=2, tp=2, sequence_parallel=True),
    "cp2-tp2-sp-op": plan(LLAMA, cp=2, tp=2, sequence_parallel=True, recompute="op"),
    "cp2-pp2": plan(GPT, cp=2, pp=2),
    "ep2-dp4": plan(MOE_LLAMA, dp=4, ep=2),
    "ep2-cp2-dp2": plan(MOE_GPT, dp=2, cp=2, ep=2),
    "ep2-dp4-zero1": plan(MOE_GPT, dp=4, ep=2, zero=1),
    "ep2-dp2-tp2-sp": plan(MOE_LLAMA, dp=2, tp=2, ep=2, sequence_parallel=True),
    "zero1-dp2-tp2": plan(LLAMA, dp=2, tp=2, zero=1),
    "zero1-dp2-tp2-sp": plan(GPT, dp=2, tp=2, zero=1, sequence_parallel=True),
    "zero1-cp2-tp2": plan(LLAMA, cp=2, tp=2, zero=1),
    "zero1-ep2-dp2-tp2": plan(MOE_GPT, dp=2, tp=2, ep=2, zero=1),
    "zero-bubble-dp2-pp2": plan(GPT, dp=2, pp=2, vpp=2, schedule="zero-bubble"),
    "zero-bubble-zero1-dp2-pp2": plan(GPT, dp=2, pp=2, schedule="zero-bubble", zero=1),
}


def _run(world, layouts):
    results = procs.spawn(record_step, world, (list(layouts.values()),), timeout_s=240, start_method="fork")
    return {name: [results[r][i] for r in range(world)] for i, name in enumerate(layouts)}


@pytest.fixture(scope="module")
def two_rank():
    return _run(2, TWO_RANK)


@pytest.fixture(scope="module")
def four_rank():
    return _run(4, FOUR_RANK)


def _check(p, measured):
    expected = cp.expected_collectives(p)
    for rank, rec in enumerate(measured):
        assert rec["counts"] == expected[rank], f"rank {rank}"
        assert rec["bytes"] == recorded_bytes(p, cp.expected_calls(p, rank)), f"rank {rank}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TWO_RANK))
def test_two_rank_collectives_match_the_prediction(two_rank, name):
    _check(TWO_RANK[name], two_rank[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FOUR_RANK))
def test_four_rank_collectives_match_the_prediction(four_rank, name):
    _check(FOUR_RANK[name], four_rank[name])
