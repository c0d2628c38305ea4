"""The executor's model (executors/model.py): shapes, closed-form counts, and the
properties each component must have (causality, GQA, RoPE, MoE routing)."""
from __future__ import annotations

import math

import pytest
import torch

from executors.model import FeedForward, MoE, apply_rope, build_model, count_parameters, loss_fn, rope_tables
from simcore.plan.spec import ModelSpec, PositionEmbedding

GPT = ModelSpec(name="t", layers=2, hidden=32, heads=4, kv_heads=4, ffn_hidden=128, vocab=64, seq_len=16,
                tied_embeddings=False)
LLAMA = ModelSpec(name="l", layers=2, hidden=32, heads=4, kv_heads=2, ffn_hidden=64, vocab=64, seq_len=16,
                  gated_mlp=True, position_embedding=PositionEmbedding.ROPE, tied_embeddings=False)


def test_parameter_count_closed_form():
    h, f, v, t, L = 32, 128, 64, 16, 2
    block = 2 * h + 4 * h * h + 2 * h * f  # two norms (no bias), Q K V O, w1 w2
    assert count_parameters(build_model(GPT)) == L * block + v * h + t * h + h + h * v
    hd, kv = 8, 2  # GQA: K and V project to kv_heads * head_dim
    block = 2 * 32 + 2 * 32 * 32 + 2 * 32 * kv * hd + 3 * 32 * 64
    assert count_parameters(build_model(LLAMA)) == L * block + 64 * 32 + 32 + 32 * 64
    tied = ModelSpec(**{**{f: getattr(GPT, f) for f in GPT.__slots__}, "tied_embeddings": True})
    assert count_parameters(build_model(tied)) == count_parameters(build_model(GPT)) - v * h


def test_same_seed_same_model_and_initial_loss_is_uniform():
    a, b = build_model(LLAMA, seed=3), build_model(LLAMA, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    tokens = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = a(tokens)
    assert logits.shape == (4, 16, 64)
    # N(0, 0.02) weights give nearly uniform next-token probabilities: loss ~ ln(vocab)
    assert loss_fn(logits, tokens).item() == pytest.approx(math.log(64), abs=0.05)


@pytest.mark.parametrize("spec", [GPT, LLAMA])
def test_causal(spec):
    model = build_model(spec)
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    y = x.clone()
    y[:, 10:] = (y[:, 10:] + 1) % 64
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_rope_depends_on_relative_position_only():
    cos, sin = rope_tables(16, 8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def at(x, pos):  # x placed at position ``pos`` of a 16-long sequence
        seq = torch.zeros(1, 16, 1, 8)
        seq[0, pos] = x[0, 0]
        return apply_rope(seq, cos, sin)[0, pos, 0]

    assert torch.dot(at(q, 5), at(k, 2)).item() == pytest.approx(torch.dot(at(q, 9), at(k, 6)).item(), rel=1e-5)
    assert at(q, 7).norm().item() == pytest.approx(q.norm().item(), rel=1e-6)  # a rotation


def test_moe_with_one_expert_is_the_dense_mlp():
    spec = ModelSpec(name="m", layers=1, hidden=16, heads=2, kv_heads=2, ffn_hidden=32, vocab=8, seq_len=4,
                     experts=1, top_k=1)
    moe, dense = MoE(spec), FeedForward(16, 32, False)
    dense.load_state_dict(moe.experts["0"].state_dict())
    x = torch.randn(2, 4, 16)
    torch.testing.assert_close(moe(x), dense(x))


def test_moe_top_k_routing_matches_a_per_token_loop():
    spec = ModelSpec(name="m", layers=1, hidden=16, heads=2, kv_heads=2, ffn_hidden=32, vocab=8, seq_len=4,
                     experts=4, top_k=2, capacity_factor=2.0)  # capacity 3: nothing dropped
    moe = MoE(spec)
    x = torch.randn(3, 16)
    gates = torch.softmax(moe.router(x), dim=-1)
    expected = []
    for i in range(3):
        w, idx = torch.topk(gates[i], 2)
        w = w / w.sum()
        expected.append(sum(w[j] * moe.experts[str(int(idx[j]))](x[i:i + 1])[0] for j in range(2)))
    torch.testing.assert_close(moe(x[None])[0], torch.stack(expected), rtol=1e-5, atol=1e-6)


def test_model_flops_closed_form():
    # The executor reports MFU/HFU with the simulator's counting (simcore.model.workload), which
    # for this GPT is 6 P + 12 L T H per token (Narayanan et al. 2021), P the matrices that
    # multiply each token, the logits included
    from simcore.model import workload as wl
    from simcore.plan.spec import Recompute

    p = 2 * (4 * 32 * 32 + 2 * 32 * 128) + 32 * 64
    layers_p = p - 32 * 64
    tokens = 3 * GPT.seq_len
    assert wl.model_flops_per_step(GPT, 3) == tokens * (6 * p + 12 * 2 * 16 * 32)
    # full recomputation repeats the layers' forward (not the logits): 6 P + 2 P_layers + 16 L T H
    assert wl.hardware_flops_per_step(GPT, 3, Recompute.FULL) == tokens * (6 * p + 2 * layers_p + 16 * 2 * 16 * 32)

def test_the_run_says_where_the_plans_block_is_not_the_one_it_builds():
    """``trainplan run`` names the block fields the executor does not build (its block: RMSNorm or a
    shift-free LayerNorm, no linear biases, SwiGLU or GeLU); a Llama-style Plan matches it."""
    from dataclasses import replace

    from executors.support import block_note
    from simcore.plan.load import plan_from_dict
    from simcore.plan.model_props import QkNorm

    doc = {"model": {"name": "t", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 128,
                     "vocab": 256, "seq_len": 32, "gated_mlp": True, "position_embedding": "rope"},
           "cluster": {"node": "localhost"}, "parallel": {"tp": 1, "pp": 1, "dp": 1}, "training": {"global_batch": 1}}
    llama = plan_from_dict(doc)
    assert block_note(llama) == ""
    qwen3 = replace(llama, model=replace(llama.model, qk_norm=QkNorm.HEAD))
    assert "model.qk_norm=head" in block_note(qwen3)
    gpt = plan_from_dict({**doc, "model": {**doc["model"], "gated_mlp": False, "position_embedding": "learned"}})
    note = block_note(gpt)
    assert "model.bias=all" in note and "model.norm=layernorm" in note and "\n" not in note
