"""MoE routing with a capacity, the auxiliary loss, and expert parallelism against one process."""
from __future__ import annotations

import pytest
import torch

from executors.model import MoE
from executors.moe import capacity, route
from simcore.plan.spec import ModelSpec
from tests.executors.test_executor_parallel import GPT, LLAMA, check_against_reference, run_layouts
from tests.executors.test_executor_tied_cp import plan

SPEC = ModelSpec(name="m", layers=1, hidden=16, heads=2, kv_heads=2, ffn_hidden=32, vocab=8, seq_len=4,
                 experts=2, top_k=1, capacity_factor=0.5)


def test_capacity_drops_the_tokens_beyond_it_in_token_order():
    moe = MoE(SPEC)
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, 0] = 1.0          # feature 0 > 0 routes to expert 0, else expert 1
    x = torch.randn(8, 16)
    x[:, 0] = torch.tensor([1.0, 1, 1, 1, 1, -1, -1, 1])  # six tokens for expert 0, two for expert 1
    cap = capacity(8, 2, 1, 0.5)
    assert cap == 2
    out = moe(x[None])[0]
    kept0 = [0, 1]                               # the first two of expert 0's tokens
    torch.testing.assert_close(out[kept0], moe.experts["0"](x[kept0]))
    torch.testing.assert_close(out[[5, 6]], moe.experts["1"](x[[5, 6]]))
    assert out[[2, 3, 4, 7]].abs().max().item() == 0.0   # dropped: the residual carries them


def test_auxiliary_loss_is_one_when_balanced_and_grows_with_imbalance():
    _, _, _, balanced = route(torch.zeros(8, 4), top_k=2, cap=8)
    assert balanced.item() == pytest.approx(1.0)
    skewed = torch.zeros(8, 4)
    skewed[:, 0] = 3.0
    assert route(skewed, top_k=2, cap=8)[3].item() > 1.2


def test_auxiliary_loss_reaches_the_router_gradient():
    moe = MoE(SPEC)
    x = torch.randn(1, 8, 16)
    moe.aux_scale = 0.0
    moe(x).sum().backward()
    without = moe.router.weight.grad.clone()
    moe.router.weight.grad = None
    moe.aux_scale = 1.0
    moe(x).sum().backward()
    assert (moe.router.weight.grad - without).abs().max().item() > 0


# --------------------------------------------------------------------------- expert parallel

MOE_LLAMA = dict(LLAMA, experts=4, top_k=2)            # capacity_factor 1: some tokens dropped
MOE_GPT = dict(GPT, experts=4, top_k=1, capacity_factor=1.5)
#: An MoE model whose first layer is dense (DeepSeek's first_k_dense_replace): no experts there.
MOE_DENSE1 = dict(MOE_GPT, dense_layers=1, dense_ffn_hidden=96)
TWO_RANK = {
    "ep2-dp2": plan(MOE_LLAMA, dp=2, ep=2),
    "ep2-dp2-dense1": plan(MOE_DENSE1, dp=2, ep=2),
}
#: Under cp a call routes a sequence's share, so capacity and the auxiliary loss see other
#: token groups than one process does: ep over cp ranks is compared with the same cp run
#: without expert parallelism, which routes the same groups.
EP_CP, CP_ONLY = plan(MOE_GPT, cp=2, ep=2), plan(MOE_GPT, cp=2)
FOUR_RANK = {
    "ep2-dp4-zero1": plan(MOE_LLAMA, dp=4, ep=2, zero=1),
    "ep4-dp4-zero3": plan(MOE_GPT, dp=4, ep=4, zero=3),
    "ep2-dp2-pp2": plan(MOE_GPT, dp=2, pp=2, ep=2),
    "ep2-dp2-tp2-sp": plan(MOE_LLAMA, dp=2, tp=2, ep=2, sequence_parallel=True),
}


@pytest.fixture(scope="module")
def two_rank():
    return dict(zip([*TWO_RANK, "ep2-cp2", "cp2"], run_layouts(2, [*TWO_RANK.values(), EP_CP, CP_ONLY])))


@pytest.fixture(scope="module")
def four_rank():
    return dict(zip(FOUR_RANK, run_layouts(4, list(FOUR_RANK.values()))))


@pytest.mark.parametrize("name", list(TWO_RANK))
def test_two_rank_expert_parallel_matches_single_process(two_rank, name):
    check_against_reference(TWO_RANK[name], two_rank[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FOUR_RANK))
def test_four_rank_expert_parallel_matches_single_process(four_rank, name):
    check_against_reference(FOUR_RANK[name], four_rank[name])


def test_expert_parallel_over_context_parallel_ranks_matches_cp_alone(two_rank):
    ep, alone = two_rank["ep2-cp2"], two_rank["cp2"]
    assert ep[0]["losses"] == pytest.approx(alone[0]["losses"], rel=1e-6)
    merged = {k: v for r in ep for k, v in r["params"].items()}
    assert set(merged) == set(alone[0]["params"])
    for name, p in alone[0]["params"].items():
        torch.testing.assert_close(merged[name], p, rtol=1e-5, atol=1e-7, msg=lambda m: f"{name}: {m}")


def _layout(**parallel):
    """A Plan with this layout (past check_plan: eight ranks exceed the test's cluster)."""
    import dataclasses

    p = plan(MOE_LLAMA, dp=2, ep=2)
    return dataclasses.replace(p, parallel=dataclasses.replace(p.parallel, **parallel))


def test_expert_groups_are_carved_from_dp_x_cp():
    from executors.groups import embedding_groups, expert_groups

    # ranks = ((dp * 2) + cp) * 2 + tp: for each tp rank the (dp, cp) ranks in mesh order
    ep, edp = expert_groups(_layout(dp=2, cp=2, tp=2, ep=2))
    assert ep == [[0, 2], [4, 6], [1, 3], [5, 7]]           # consecutive: the cp pairs
    assert edp == [[0, 4], [2, 6], [1, 5], [3, 7]]          # the same experts: the dp pairs
    ep4, edp4 = expert_groups(_layout(dp=4, ep=4))
    assert ep4 == [[0, 1, 2, 3]] and edp4 == [[0], [1], [2], [3]]
    assert embedding_groups(_layout(pp=4, dp=2, ep=1)) == [[0, 6], [1, 7]]
