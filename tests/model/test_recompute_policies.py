"""Recompute policies: the Plan's forms, what each keeps and re-runs, and the property that
more recomputation never takes less time and never holds more memory."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import recompute as rcp
from simcore.model import workload as wl
from simcore.model.step_costs import memory_report, step_costs
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError, Recompute, RecomputeMethod

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


def _plan(model="llama3-8b", *, recompute="none", tp=1, pp=1, vpp=1, dp=8, micro_batch=1, flash=True,
          schedule=None, seq_len=4096):
    par = {"tp": tp, "pp": pp, "dp": dp, "vpp": vpp, "sequence_parallel": tp > 1}
    if schedule:
        par["schedule"] = schedule
    return plan_from_dict({"model": {"name": model, "seq_len": seq_len}, "cluster": {"node": "dgx-h100", "nodes": 8},
                           "parallel": par,
                           "training": {"global_batch": 256, "micro_batch": micro_batch, "recompute": recompute,
                                        "flash_attention": flash}})


def test_plan_forms_of_recompute_parse_and_round_trip():
    layer = _plan(recompute="layer:2").training
    assert (layer.recompute, layer.recompute_layers) == (Recompute.LAYER, 2)
    block = _plan(recompute={"layers": 4, "method": "block"}).training
    assert (block.recompute, block.recompute_layers, block.recompute_method) == \
        (Recompute.FULL, 4, RecomputeMethod.BLOCK)
    for form in ("op", "dots", "layer:3", {"layers": 2, "method": "uniform"}, "full"):
        doc = plan_to_dict(_plan(recompute=form))
        assert doc["training"]["recompute"] == form
        assert plan_from_dict(doc).training == _plan(recompute=form).training


@pytest.mark.parametrize("form, words", [
    ("layer:0", "after 'layer:'"), ("layer:x", "after 'layer:'"), ("layer", "layer:N"),
    ({"layers": 2, "method": "blocks"}, "training.recompute.method"), ({"layer": 2}, "training.recompute"),
    ({"layers": 99}, "exceed model.layers"), ("sometimes", "training.recompute"),
])
def test_bad_recompute_is_one_sentence_naming_the_field(form, words):
    with pytest.raises(PlanError, match="training.recompute") as err:
        _plan(recompute=form)
    assert words in str(err.value)


def test_torchtitan_op_policy_keeps_the_odd_matmuls_and_sdpa():
    """Per Llama layer: the input, wq (h), wv (kv), SDPA's output (h) and log-sum-exp, w1 (f), w2 (h)."""
    m = _plan().model
    b, s = 1, 4096
    h, kv, f = m.hidden, wl.kv_width(m), m.ffn_hidden
    kept = rcp.op_sac_kept_bytes(m, b=b, s=s)
    assert kept == pytest.approx(2 * s * (h + h + kv + h + f + h) + 4 * m.heads * s)
    # re-run: wk, wo and w3 of the seven matmuls, never SDPA
    assert rcp.recompute_flops_per_layer(m, s, s, Recompute.OP) == pytest.approx(2 * s * h * (kv + h + f))
    ops = wl.layer_forward_ops(m, b=b, s=s, flash=True)
    names = {op.name for op in rcp.layer_recompute_ops(ops, m, Recompute.OP)}
    assert "flash_attention" not in names and {"qkv", "attn_proj", "mlp_in"} <= names and "mlp_out" not in names


def test_jax_dots_policy_keeps_the_projections_the_rerun_reads_and_reruns_the_rest():
    """MaxText's minimal (checkpoint_dots_with_no_batch_dims), per Llama layer and TP rank: the input and the
    attention's output projection (h each, split by SP), q (h), k and v (kv each), the gated MLP's two input
    halves (2f), split over tp; never the MLP's output projection, which only the layer's output reads. It
    re-runs the norms, the attention kernel and the activation, none of the projections, and counts the
    attention's FLOPs again as selective recompute does."""
    m = _plan().model
    b, s, tp = 1, 4096, 4
    h, kv, f = m.hidden, wl.kv_width(m), m.ffn_hidden
    kept = rcp.dots_kept_bytes(m, b=b, s=s, tp=tp, sequence_parallel=True)
    assert kept == pytest.approx(2 * s * ((h + h) / tp + (h + 2 * kv + 2 * f) / tp))
    assert rcp.dots_kept_bytes(m, b=b, s=s, tp=tp) == pytest.approx(2 * s * ((h + h) + (h + 2 * kv + 2 * f) / tp))
    ops = wl.layer_forward_ops(m, b=b, s=s, tp=tp, sequence_parallel=True, flash=True)
    names = {op.name for op in rcp.layer_recompute_ops(ops, m, Recompute.DOTS)}
    assert {"flash_attention", "layernorm_1", "layernorm_2", "activation", "dropout_add_1"} <= names
    assert not names & rcp.PROJECTIONS and "dropout_add_2" not in names
    assert rcp.recompute_flops_per_layer(m, s, s, Recompute.DOTS) == \
        rcp.recompute_flops_per_layer(m, s, s, Recompute.SELECTIVE) > 0
    # under SP the re-run norms' outputs are all-gathered again for the weight gradients; replicated, nothing
    assert rcp.tp_reruns(Recompute.DOTS, True) == {"all_gather": 2} and rcp.tp_reruns(Recompute.DOTS, False) == {}


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_dots_costs_time_for_the_memory_it_saves_on_both_engines(engine):
    """Between none and full on both engines: slower than keeping everything, faster than re-running
    whole layers; fewer activation bytes than none, more than full."""
    plans = [_plan(recompute=rc, tp=4, dp=16, micro_batch=2) for rc in ("none", "dots", "full")]
    times = [simulate(p, engine).step_time_s for p in plans]
    acts = [memory_report(p)["max_gpu_bytes"] for p in plans]
    assert times[0] < times[1] < times[2] and acts[0] > acts[1] > acts[2]


def test_megatron_uniform_keeps_group_inputs_and_block_recomputes_n_layers_per_chunk():
    act = rcp.LayerActivations(whole=100.0, kept=100.0, boundary=1.0)
    uniform = _plan(recompute={"layers": 4, "method": "uniform"}).training
    assert rcp.chunk_stash_bytes(uniform, 8, act) == 2.0          # two groups' inputs
    assert rcp.working_bytes(uniform, 8, act) == 400.0 - 1.0      # a group of four rebuilt for its input
    block = _plan(recompute={"layers": 3, "method": "block"}).training
    assert rcp.chunk_stash_bytes(block, 8, act) == 3 * 1.0 + 5 * 100.0
    assert rcp.working_bytes(block, 8, act) == 0.0                 # the plain layers were freed first
    assert rcp.working_bytes(_plan(recompute={"layers": 8, "method": "block"}).training, 8, act) == 99.0
    assert rcp.recomputed_layers(block, 8) == 3 and rcp.recomputed_layers(block, 2) == 2
    every2 = _plan(recompute="layer:2").training
    assert rcp.recomputed_layers(every2, 8) == 4 and rcp.chunk_stash_bytes(every2, 8, act) == 4 + 400.0


def test_block_recompute_charges_its_layers_in_time_and_hardware_flops():
    none, full = step_costs(_plan()), step_costs(_plan(recompute="full"))
    half = step_costs(_plan(recompute={"layers": 16, "method": "block"}))
    assert half.recompute_s[0] == pytest.approx(full.recompute_s[0] / 2)
    extra = full.hardware_flops_per_step - none.hardware_flops_per_step
    assert half.hardware_flops_per_step - none.hardware_flops_per_step == pytest.approx(extra / 2)


#: Chains of policies, each re-running at least what the one before it re-runs.
CHAINS = (
    ("none", "selective", "full"),
    ("none", "op", "full"),
    ("none", "dots", "full"),
    ("none", "layer:4", "layer:2", "full"),
    ("none", {"layers": 1, "method": "block"}, {"layers": 2, "method": "block"}, {"layers": 99, "method": "block"}),
)


@SETTINGS
@given(model=st.sampled_from(("gpt-1.7b", "llama3-8b", "llama2-13b")), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([1, 2, 4]), micro_batch=st.sampled_from([1, 2]), flash=st.booleans(),
       chain=st.sampled_from(CHAINS), schedule=st.sampled_from(["1f1b", "gpipe", "zero-bubble"]))
def test_more_recompute_never_lowers_time_nor_raises_memory(model, tp, pp, micro_batch, flash, chain, schedule):
    results = []
    for form in chain:
        if isinstance(form, dict) and form["layers"] == 99:   # every layer of every chunk
            form = {"layers": _plan(model).model.layers, "method": "block"}
        try:
            plan = _plan(model, recompute=form, tp=tp, pp=pp, dp=64 // (tp * pp), micro_batch=micro_batch,
                         flash=flash, schedule=schedule)
        except PlanError:
            return
        results.append((simulate(plan).step_time_s, memory_report(plan)["max_gpu_bytes"]))
    for (t0, m0), (t1, m1) in zip(results, results[1:]):
        assert t1 >= t0 * (1 - 1e-9)
        assert m1 <= m0 * (1 + 1e-9)


def test_exports_speak_each_stacks_recompute_options():
    from simcore.plan.torchtitan_writer import torchtitan_config
    from simcore.plan.writers import megatron_args

    args = dict(megatron_args(_plan(recompute={"layers": 4, "method": "block"})))
    assert (args["--recompute-method"], args["--recompute-num-layers"]) == ("block", 4)
    assert torchtitan_config(_plan(recompute="layer:2"))[0]["activation_checkpoint"] == \
        {"mode": "selective", "selective_ac_option": "2"}
    assert torchtitan_config(_plan(recompute="op"))[0]["activation_checkpoint"]["selective_ac_option"] == "op"
    with pytest.raises(ValueError, match="training.recompute=op has no Megatron-LM option"):
        megatron_args(_plan(recompute="op"))


def test_dots_is_written_only_where_maxtext_runs_it():
    """MaxText writes it as remat_policy=minimal; Megatron-LM, torchtitan and the executor have no such
    policy: one sentence each, naming the field."""
    from simcore.plan.writers import export_plan

    plan = _plan(recompute="dots", tp=1, dp=64)
    for target in ("megatron", "torchtitan"):
        with pytest.raises(ValueError, match=rf"^training.recompute=dots has no \S+ option: it is MaxText's remat"):
            export_plan(plan, target)
    from executors.recompute import check_recompute
    with pytest.raises(ValueError, match="^training.recompute=dots is JAX's checkpoint_dots_with_no_batch_dims"):
        check_recompute(plan.training)
