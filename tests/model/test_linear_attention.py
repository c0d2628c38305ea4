"""A hybrid model cannot win for nothing (issue 55): a Gated DeltaNet layer's FLOPs, bytes and
time are never zero, grow linearly with the sequence (a softmax layer's quadratically), a model with
every layer full attention costs more at a long sequence than the hybrid, and the analytic path and
the event engine charge the same layer."""
from dataclasses import replace
from pathlib import Path

import pytest

from simcore.engine.predict import simulate
from simcore.model import compute as cmp
from simcore.model import gdn
from simcore.model import linear_attention as la
from simcore.model import workload as wl
from simcore.model.layer_times import layer_times
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import Recompute

HF = Path(__file__).resolve().parents[2] / "examples" / "hf"


def _plan(seq_len: int = 4096, **parallel):
    doc, _ = import_plan(hf=str(HF / "qwen3.5-27b" / "config.json"), cluster="dgx-h100", nodes=1, seq_len=seq_len)
    doc["parallel"] = {"tp": 4, "dp": 2, "zero": 1, **parallel}
    doc["training"].update(global_batch=8, recompute="full", flash_attention=True)
    return plan_from_dict(doc)


def _kinds(m):
    """(all softmax, all Gated DeltaNet) versions of hybrid model ``m``."""
    (_, full), (_, linear) = la.variants(m)
    return full, linear


def test_the_mean_layer_weighs_three_linear_in_four():
    m = _plan().model
    assert [w for w, _ in la.variants(m)] == [0.25, 0.75]
    full, linear = _kinds(m)
    assert not full.linear_attention.layers and len(linear.linear_attention.layers) == m.layers
    tokens, s = 4096.0, 4096
    mean = wl.forward_flops_per_layer(m, tokens, s)
    assert mean == pytest.approx(0.25 * wl.forward_flops_per_layer(full, tokens, s)
                                 + 0.75 * wl.forward_flops_per_layer(linear, tokens, s))


@pytest.mark.parametrize("tp", [1, 8])
def test_a_linear_layer_is_never_free_and_grows_linearly_with_the_sequence(tp):
    _, linear = _kinds(_plan().model)
    flops, acts = [], []
    for s in (4096, 8192, 65536):
        ops = la.layer_forward_ops(linear, b=1, s=s, tp=tp, flash=True)
        assert all(op.flops > 0 or op.bytes > 0 for op in ops)
        core = next(op for op in ops if op.name == "gdn_chunk_delta_rule")
        assert core.flops > 0 and core.bytes > 0
        flops.append(wl.flops_of(ops))
        acts.append(la.activation_bytes_per_layer(linear, b=1, s=s, tp=tp, flash=False))
    assert flops[1] / flops[0] == pytest.approx(2.0) and flops[2] / flops[0] == pytest.approx(16.0)
    assert acts[0] > 0 and acts[1] / acts[0] == pytest.approx(2.0) and acts[2] / acts[0] == pytest.approx(16.0)


def test_the_core_flops_are_the_chunked_kernels_count():
    """fla's chunked gated delta rule per token and value head: 6KV + 6CK + 4CV + 2C^2/3 (gdn docstring)."""
    m = _plan().model
    k = v = 128
    c = gdn.CHUNK
    assert c == 64
    assert gdn.core_flops_per_token(m) == pytest.approx(32 * (6 * k * v + 6 * c * k + 4 * c * v + 2 * c * c / 3))


def test_a_softmax_layer_grows_quadratically_and_the_all_full_model_costs_more_at_long_sequences():
    m = _plan().model
    full, linear = _kinds(m)
    s_short, s_long = 4096, 131072
    growth = {name: wl.forward_flops_per_layer(x, s_long, s_long) / wl.forward_flops_per_layer(x, s_short, s_short)
              for name, x in (("full", full), ("linear", linear))}
    ratio = s_long / s_short
    assert growth["linear"] == pytest.approx(ratio) and growth["full"] > 1.5 * ratio
    for s in (s_short, s_long):
        attn_full = wl.forward_flops_per_layer(full, s, s)
        assert wl.forward_flops_per_layer(m, s, s) < attn_full
    assert wl.model_flops_per_step(m, 8) < wl.model_flops_per_step(full, 8)


def test_the_layer_time_is_the_mean_of_its_kinds_and_below_all_full_attention_at_long_sequences():
    plan = _plan(seq_len=131072)
    dev = cmp.device_model(plan.cluster.node.gpu, plan.training.precision.value)
    m = plan.model
    full, linear = _kinds(m)
    args = (1, 131072, 8, 1, 1, False, True, Recompute.FULL, dev)
    t_mean, t_full, t_lin = layer_times(m, *args), layer_times(full, *args), layer_times(linear, *args)
    assert all(x > 0 for x in t_lin[:3])
    assert t_mean[0] == pytest.approx(0.25 * t_full[0] + 0.75 * t_lin[0])
    assert t_lin[0] < t_full[0] / 2 and t_mean[0] < t_full[0]


def test_both_engines_price_the_hybrid_below_all_full_attention_at_a_long_sequence():
    plan = _plan(seq_len=65536)
    full_plan = replace(plan, model=_kinds(plan.model)[0])
    for engine in ("analytic", "des"):
        hybrid, everything = simulate(plan, engine=engine), simulate(full_plan, engine=engine)
        assert 0 < hybrid.step_time_s < everything.step_time_s
        assert hybrid.compute_s == pytest.approx(simulate(plan, engine="analytic").compute_s, rel=0.1)


def test_selective_recompute_keeps_a_linear_layer_whole():
    _, linear = _kinds(_plan().model)
    kw = dict(b=1, s=8192, tp=8, flash=True)
    assert la.activation_bytes_per_layer(linear, recompute=Recompute.SELECTIVE, **kw) == \
        la.activation_bytes_per_layer(linear, recompute=Recompute.NONE, **kw)


def test_tensor_parallel_splits_the_linear_heads():
    _, linear = _kinds(_plan().model)
    one = {op.name: op.flops for op in la.layer_forward_ops(linear, b=1, s=4096, tp=1, flash=True)}
    eight = {op.name: op.flops for op in la.layer_forward_ops(linear, b=1, s=4096, tp=8, flash=True)}
    for name in ("qkv", "gdn_conv", "gdn_chunk_delta_rule", "attn_proj"):
        assert eight[name] == pytest.approx(one[name] / 8)


def test_the_recurrent_state_is_fixed_in_the_sequence():
    """What a served sequence would keep per Gated DeltaNet layer (serving refuses the model):
    32 x 128 x 128 fp32 state and 3 taps of 8192 channels."""
    m = _plan().model
    assert gdn.recurrent_state_bytes(m) == 32 * 128 * 128 * 4 + 8192 * 3 * 2
