"""Differential tests of tied embeddings under TP/PP and of context parallelism.

As in ``test_executor_parallel.py``: each layout runs two fp32 SGD steps on 2 or 4 forked
gloo ranks, and the loss and every parameter's update must equal the single-process run of
the same model on the same global batch; the collectives each rank issues are compared with
``simcore.model.collective_plan``'s list for the plan.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from simcore.plan.load import plan_from_dict
from simcore.plan.spec import Precision
from tests.executors.test_executor_parallel import (GPT, LLAMA, check_against_reference, reference,
                                                    relative_update_error, run_layouts)

TIED_GPT = dict(GPT, tied_embeddings=True)
TIED_LLAMA = dict(LLAMA, tied_embeddings=True)


def plan(model, *, gb=8, mb=1, recompute="none", **parallel):
    doc = {"model": model, "cluster": {"node": "localhost", "gpus_per_node": 4},
           "parallel": {"dp": 1, **parallel},
           "training": {"global_batch": gb, "micro_batch": mb, "optimizer": "sgd", "precision": "fp32",
                        "recompute": recompute}}
    return plan_from_dict(doc)


TWO_RANK = {
    "tied-pp2": plan(TIED_GPT, pp=2),
    "tied-pp2-interleaved": plan(TIED_GPT, pp=2, vpp=2, schedule="interleaved-1f1b"),
    "tied-tp2": plan(TIED_LLAMA, tp=2),
    "tied-tp2-sp": plan(TIED_LLAMA, tp=2, sequence_parallel=True),
    "cp2": plan(GPT, cp=2),
    "cp2-llama-selective": plan(LLAMA, cp=2, recompute="selective"),
    "cp2-tied-full-recompute": plan(TIED_GPT, cp=2, recompute="full"),
}
#: bf16 autocast: the ring's blocks run in bf16, its merge and gradients in fp32 (set past
#: check_plan, as test_executor_parallel's dp2-bf16: a calibrated CPU profile may list no bf16 peak)
CP_BF16 = dataclasses.replace(plan(LLAMA, cp=2), training=dataclasses.replace(plan(LLAMA, cp=2).training,
                                                                              precision=Precision.BF16))
FOUR_RANK = {
    "tied-pp2-tp2": plan(TIED_LLAMA, pp=2, tp=2, schedule="gpipe"),
    "tied-pp2-dp2-zero2": plan(TIED_GPT, pp=2, dp=2, zero=2),
    "tied-pp4": plan(TIED_GPT, pp=4),
    "cp4": plan(LLAMA, cp=4),
    "cp4-contiguous": plan(dict(GPT, seq_len=12), cp=4),
    "cp2-dp2": plan(GPT, cp=2, dp=2),
    "cp2-dp2-zero3": plan(LLAMA, cp=2, dp=2, zero=3),
    "cp2-tp2-sp": plan(LLAMA, cp=2, tp=2, sequence_parallel=True),
    "cp2-pp2": plan(GPT, cp=2, pp=2),
    "zero1-dp2-tp2-sp": plan(LLAMA, dp=2, tp=2, zero=1, sequence_parallel=True),   # executors.zero1
    "zero1-cp2-tp2": plan(LLAMA, cp=2, tp=2, zero=1),
    "zero-bubble-dp2-pp2": plan(GPT, dp=2, pp=2, vpp=2, schedule="zero-bubble"),      # replicate, not DDP
    "zero-bubble-zero1-dp2-pp2": plan(GPT, dp=2, pp=2, schedule="zero-bubble", zero=1),
}


def check_tied(plan, results):
    """The last stage's copy of a tied weight equals the first stage's, which equals the
    single-process run's embedding; then the usual comparison of every parameter."""
    if plan.model.tied_embeddings and plan.parallel.pp > 1:
        copies = [r["params"].pop("output.weight") for r in results if "output.weight" in r["params"]]
        assert copies, "the last stage holds no copy of the tied weight"
        first = next(r["params"]["embed.tok.weight"] for r in results if "embed.tok.weight" in r["params"])
        for copy in copies:
            torch.testing.assert_close(copy, first, rtol=0, atol=0)
    check_against_reference(plan, results)


@pytest.fixture(scope="module")
def two_rank():
    return dict(zip([*TWO_RANK, "cp2-bf16"], run_layouts(2, [*TWO_RANK.values(), CP_BF16])))


@pytest.fixture(scope="module")
def four_rank():
    return dict(zip(FOUR_RANK, run_layouts(4, list(FOUR_RANK.values()))))


@pytest.mark.parametrize("name", list(TWO_RANK))
def test_two_rank_layout_matches_single_process(two_rank, name):
    check_tied(TWO_RANK[name], two_rank[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FOUR_RANK))
def test_four_rank_layout_matches_single_process(four_rank, name):
    check_tied(FOUR_RANK[name], four_rank[name])


def test_context_parallel_under_bf16_autocast_is_close(two_rank):
    # bf16 keeps 8 significant bits: losses within 1%, updates within a few percent
    assert two_rank["cp2-bf16"][0]["losses"] == pytest.approx(reference(CP_BF16)[0], rel=1e-2)
    assert 0 < relative_update_error(CP_BF16, two_rank["cp2-bf16"]) < 5e-2


# --------------------------------------------------------------------------- ring attention pieces

def test_head_tail_split_balances_causal_work():
    from executors.ring_attention import cp_positions

    pieces = [cp_positions(16, 4, r) for r in range(4)]
    assert torch.cat(pieces).sort().values.tolist() == list(range(16))
    assert pieces[0].tolist() == [0, 1, 14, 15] and pieces[3].tolist() == [6, 7, 8, 9]
    work = {int(sum(p + 1)) for p in pieces}          # keys each rank's queries attend to
    assert work == {34}
    assert cp_positions(12, 4, 1).tolist() == [3, 4, 5]  # 2*cp does not divide: contiguous


def test_math_blocks_equal_the_fused_kernel():
    from executors.ring_attention import _backward_block, _forward_block

    gen = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 8, 4, generator=gen) for _ in range(4))
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    fused = _forward_block(q, k, v, causal, True, 0.5)
    math = _forward_block(q, k, v, causal, False, 0.5)     # a general mask takes the math path
    for a, b in zip(fused, math):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    out, lse = fused
    for a, b in zip(_backward_block(q, k, v, out, do, lse, causal, True, 0.5),
                    _backward_block(q, k, v, out, do, lse, causal, False, 0.5)):
        torch.testing.assert_close(a.float(), b, rtol=1e-4, atol=1e-5)
