"""Parameter and FLOP counts against the papers; activation memory against Korthikanti et al."""
import math

import pytest

from simcore.model import executor_acts as xa
from simcore.model import workload as wl
from simcore.plan.spec import ModelSpec, PositionEmbedding, Recompute


def gpt3(vocab=50257, **kw):
    return ModelSpec(name="gpt3", layers=96, hidden=12288, heads=96, kv_heads=96, ffn_hidden=4 * 12288,
                     vocab=vocab, seq_len=2048, **kw)


def llama3_70b():
    return ModelSpec(name="llama3-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
                     vocab=128256, seq_len=8192, gated_mlp=True, tied_embeddings=False,
                     position_embedding=PositionEmbedding.ROPE)


def test_gpt3_175b_parameters():
    # Brown et al. 2020: 175B; with biases, LayerNorms, 2048 learned positions: 174.6e9
    assert wl.param_counts(gpt3()).total == pytest.approx(174.6e9, rel=1e-3)


def test_llama3_70b_parameters():
    # Llama 3 paper / HF config: 70.6e9 parameters (GQA, SwiGLU, untied embeddings)
    assert wl.param_counts(llama3_70b()).total == pytest.approx(70.55e9, rel=2e-3)


def test_megatron_eq3_equals_full_recompute_total():
    m = gpt3(vocab=51200)
    b = 1536
    assert wl.hardware_flops_per_step(m, b, Recompute.FULL) == pytest.approx(wl.megatron_flops_per_step(m, b), rel=1e-12)


def test_model_flops_are_72_bslh2_form():
    # Megatron-Core num_floating_point_operations for MHA + 4h MLP: 72 B s L h^2 (1 + s/6h + V/12Lh)
    m = gpt3(vocab=51200)
    b, s, l, h, v = 8, 2048, 96, 12288, 51200
    expected = 72 * b * s * l * h * h * (1 + s / (6 * h) + v / (12 * l * h))
    assert wl.model_flops_per_step(m, b) == pytest.approx(expected, rel=1e-12)


def test_llama3_70b_flops_about_6n_per_token():
    m = llama3_70b()
    tokens = 1 * m.seq_len
    non_attn = 6 * (wl.param_counts(m).total - m.vocab * m.hidden)  # the input embedding is a lookup
    attn = 3 * m.layers * 4 * tokens * m.seq_len * m.hidden / tokens  # per token
    assert wl.model_flops_per_step(m, 1) / tokens == pytest.approx(non_attn + attn, rel=2e-3)


def test_layer_ops_split_by_tensor_parallel():
    m = gpt3()
    one = wl.flops_of(wl.layer_forward_ops(m, b=1, s=2048, tp=1))
    eight = wl.flops_of(wl.layer_forward_ops(m, b=1, s=2048, tp=8))
    assert one == pytest.approx(24 * 2048 * 12288**2 + 4 * 2048**2 * 12288, rel=1e-12)
    assert eight == pytest.approx(one / 8, rel=1e-12)


def test_moe_router_and_top_k():
    dense = ModelSpec(name="d", layers=1, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=1000, seq_len=128)
    moe = ModelSpec(name="m", layers=1, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=1000, seq_len=128,
                    experts=8, top_k=2)
    tokens = 128
    mlp_dense = 2 * tokens * 2 * 1024 * 4096
    diff = wl.forward_flops_per_layer(moe, tokens, 128) - wl.forward_flops_per_layer(dense, tokens, 128)
    assert diff == pytest.approx(mlp_dense + 2 * tokens * 1024 * 8)   # one more expert + router


def test_activation_memory_korthikanti():
    m = gpt3(vocab=51200)
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    sbh = s * b * h
    none = wl.activation_bytes_per_layer(m, b=b, s=s)
    assert none == pytest.approx(sbh * (34 + 5 * a * s / h))
    tp = wl.activation_bytes_per_layer(m, b=b, s=s, tp=t)
    assert tp == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    sp = wl.activation_bytes_per_layer(m, b=b, s=s, tp=t, sequence_parallel=True)
    assert sp == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    sel = wl.activation_bytes_per_layer(m, b=b, s=s, tp=t, sequence_parallel=True, recompute=Recompute.SELECTIVE)
    assert sel == pytest.approx(sbh / t * 34)
    full = wl.activation_bytes_per_layer(m, b=b, s=s, tp=t, sequence_parallel=True, recompute=Recompute.FULL)
    assert full == pytest.approx(2 * sbh / t)


def test_flash_attention_drops_the_s_squared_term():
    m = gpt3()
    flash = wl.activation_bytes_per_layer(m, b=1, s=2048, tp=8, flash=True)
    plain = wl.activation_bytes_per_layer(m, b=1, s=2048, tp=8)
    assert plain - flash == pytest.approx(5 * 96 * 2048**2 / 8 - 4 * 96 * 2048 / 8)


def test_selective_recompute_reruns_attention_core_only():
    m = gpt3()
    ops = wl.layer_forward_ops(m, b=1, s=2048)
    sel = wl.recompute_ops(ops, Recompute.SELECTIVE)
    assert wl.flops_of(sel) == pytest.approx(4 * 2048**2 * 12288)
    assert wl.recompute_ops(ops, Recompute.NONE) == []
    assert math.isclose(wl.flops_of(wl.recompute_ops(ops, Recompute.FULL)), wl.flops_of(ops))


def test_executor_activations_count_the_torch_models_saved_tensors():
    # hidden 64, 4 heads, ffn 256, seq 32, b 1, fp32: per layer 4 B * sb * (8h + 2f) tensors
    # (norm inputs/outputs, Q, K, V, attention output, GeLU input/output) + the fp32
    # log-sum-exp (b*a*s) + two LayerNorms' mean and rstd (2 * 2 * sb); measured with
    # executors.measure.SavedActivations: 132096 bytes per layer, 50180 outside the layers.
    from simcore.plan.spec import ModelSpec

    m = ModelSpec(name="t", layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=256, seq_len=32,
                  tied_embeddings=False)
    assert xa.layer_bytes(m, b=1, s=32) == 4 * 32 * (8 * 64 + 2 * 256) + 4 * 4 * 32 + 16 * 32
    assert xa.layer_bytes(m, b=1, s=32) == 132096
    outside = xa.embedding_bytes(m, b=1, s=32) + xa.logits_bytes(m, b=1, s=32)
    assert outside == 50180 - 4   # the scalar loss (4 B) is not modelled
    tp = xa.layer_bytes(m, b=1, s=32, tp=2)
    assert tp == 4 * 32 * (4 * 64 + (2 * 64 + 2 * 64 + 2 * 256) / 2) + 4 * 4 * 32 / 2 + 16 * 32
