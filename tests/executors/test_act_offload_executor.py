"""The executor's activation offload (``executors.act_offload``), run on the CPU, where the host
copy is a plain copy: the hooks move the saved tensors of the first N blocks alone (never a
parameter, one copy per tensor however many ops save it), the loss and gradients do not change,
the backward reloads at most the block it runs and the one before it, and the module names stay
as they were (FSDP2 and the checkpoints key on them)."""
from __future__ import annotations

import pytest
import torch

from executors.act_offload import LayerOffload, apply_activation_offload, offload_host_peak
from executors.model import build_model, loss_fn
from simcore.plan.load import plan_from_dict

LLAMA = dict(name="test-llama", layers=4, hidden=32, heads=4, kv_heads=2, vocab=64, seq_len=16, gated_mlp=True,
             position_embedding="rope", ffn_hidden=64, tied_embeddings=False)


def _training(off):
    return plan_from_dict({"model": LLAMA, "cluster": {"node": "dgx-h100", "gpus_per_node": 1},
                           "training": {"global_batch": 2, "activation_offload": off}}).training


def _step(off, micro_batches=1):
    torch.manual_seed(0)
    model = build_model(plan_from_dict({"model": LLAMA, "cluster": {"node": "dgx-h100", "gpus_per_node": 1},
                                        "training": {"global_batch": 2}}).model, seed=1)
    hooks = apply_activation_offload(model, _training(off), torch.device("cpu"))
    losses = []
    for _ in range(micro_batches):
        tokens = torch.randint(0, 64, (2, 17))
        loss = loss_fn(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        losses.append(loss.detach())
    return losses, {n: p.grad.clone() for n, p in model.named_parameters()}, model, hooks


@pytest.mark.parametrize("off", [1, 3, 4])
def test_offload_keeps_the_loss_and_gradients_and_the_names(off):
    ref_losses, ref, ref_model, none = _step(0, micro_batches=2)
    losses, got, model, hooks = _step(off, micro_batches=2)
    assert none is None and isinstance(hooks, LayerOffload)
    torch.testing.assert_close(losses, ref_losses)
    assert list(got) == list(ref)                       # the parameter names are unchanged
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], msg=name)
    assert hooks.packed > 0 and offload_host_peak([model]) == hooks.peak_host_bytes > 0
    assert hooks.peak_reloaded_blocks <= 2              # the block whose backward runs and the next


def test_the_host_holds_the_offloaded_blocks_stash_in_proportion_and_no_parameter(monkeypatch):
    peaks = {off: _step(off)[3].peak_host_bytes for off in (1, 2, 4)}
    # every block has the same shapes, so its stash is the same: the host bytes grow by one block each
    assert peaks[2] == 2 * peaks[1] and peaks[4] == 4 * peaks[1]
    moved = []
    pack = LayerOffload.pack

    def spy(self, block, t):
        out = pack(self, block, t)
        if out is not t:
            moved.append(t.untyped_storage().data_ptr())
        return out
    monkeypatch.setattr(LayerOffload, "pack", spy)
    _, _, model, _ = _step(4)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert moved and not weights & set(moved)    # F.linear saves weight.t(): a view that stays


def test_a_tensor_saved_by_several_ops_moves_once():
    off = LayerOffload(torch.device("cpu"))
    x = torch.randn(8, 8, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: off.pack(0, t), off.unpack):
        y = x * x                                       # mul saves x twice
        w = torch.nn.Parameter(torch.randn(8, 8))
        z = (y @ w).sum()                               # the parameter stays where it is
    assert off.packed == 2                              # x, and y (saved by the matmul)
    z.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach() * (w.detach().sum(1)))
