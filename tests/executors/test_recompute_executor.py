"""The executor runs every recompute policy the Plan can state (or refuses it in one
sentence): the policy wraps the blocks the model charges, and recomputation never changes
the loss or the gradients."""
from __future__ import annotations

import pytest
import torch

from executors.model import build_model, loss_fn
from executors.recompute import apply_recompute
from executors.support import check_executable
from simcore.plan.load import plan_from_dict

GPT = dict(name="test-llama", layers=4, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, gated_mlp=True,
           position_embedding="rope", ffn_hidden=64, tied_embeddings=False)


def _plan(recompute, **parallel):
    return plan_from_dict({"model": GPT, "cluster": {"node": "dgx-h100"},
                           "parallel": {"dp": 1, **parallel},
                           "training": {"global_batch": 2, "recompute": recompute}})


def _grads(recompute):
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (2, 17))
    model = build_model(_plan("none").model, seed=1)
    if recompute is not None:
        apply_recompute(model, _plan(recompute).training)
    loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    names = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}
    return loss.detach(), names, model


def _wrapped(model) -> list[bool]:
    return ["CheckpointWrapper" in type(b).__name__ for b in model.layers.values()]


@pytest.mark.parametrize("recompute", ["selective", "full", "op", "layer:2", {"layers": 3, "method": "block"}],
                         ids=["selective", "full", "op", "layer2", "block3"])
def test_recompute_keeps_the_loss_and_gradients(recompute):
    ref_loss, ref, _ = _grads(None)
    loss, got, model = _grads(recompute)
    torch.testing.assert_close(loss, ref_loss)
    assert got.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6, msg=name)
    expected = {"selective": [False] * 4, "full": [True] * 4, "op": [True] * 4,
                "layer:2": [False, True, False, True]}.get(recompute if isinstance(recompute, str) else "",
                                                            [True, True, True, False])
    assert _wrapped(model) == expected


def test_refused_in_one_sentence():
    cases = [(_plan({"layers": 2, "method": "uniform"}), "method: uniform} is not run by the executor"),
             (_plan("none", tp=2, sequence_parallel=True, tp_comm_overlap=True), "tp_comm_overlap is not run"),
             (_plan("none", cp=2, cp_comm="all_gather"), "cp_comm=all_gather is not run by the executor"),
             (_plan("none", dp=2, zero=3, zero_impl="deepspeed"), "zero_impl=deepspeed is priced, not run")]
    for plan, message in cases:
        with pytest.raises(ValueError, match=message):
            check_executable(plan, "cpu")
