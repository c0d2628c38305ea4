"""Key/value-head replication (``parallel.kv_replicator``, NeuronX Distributed's ``kv_size_multiplier``):
the field, its refusals, what a rank holds and computes, the kv shared group's all-reduce in every path,
and the property that replication never wins for nothing."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import comm_ledger
from simcore.model import kv_replication as kvr
from simcore.model import memory as mem
from simcore.model import workload as wl
from simcore.model.collective_plan import Call, expected_calls, format_collectives
from simcore.model.step_costs import memory_report, step_costs
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError

#: A small GQA model: 8 query heads of 8, 2 KV heads, SwiGLU, untied, RoPE (no biases).
SMALL = {"name": "small-gqa", "layers": 2, "hidden": 64, "heads": 8, "kv_heads": 2, "ffn_hidden": 128,
         "vocab": 256, "seq_len": 32, "gated_mlp": True, "tied_embeddings": False, "position_embedding": "rope"}


def _doc(model=None, *, tp=4, dp=2, pp=1, r=1, node="dgx-h100", nodes=1, global_batch=8, **training) -> dict:
    parallel = {"tp": tp, "pp": pp, "dp": dp, "zero": 1, "sequence_parallel": tp > 1}
    if r != 1:
        parallel["kv_replicator"] = r
    return {"model": model or SMALL, "cluster": {"node": node, "nodes": nodes}, "parallel": parallel,
            "training": {"global_batch": global_batch, "micro_batch": 1, "flash_attention": True, **training}}


def _error(doc: dict) -> str:
    with pytest.raises(PlanError) as e:
        plan_from_dict(doc)
    return str(e.value)


def test_the_field_is_read_written_and_off_by_default():
    plan = plan_from_dict(_doc(r=2))
    assert plan.parallel.kv_replicator == 2
    assert plan_to_dict(plan)["parallel"]["kv_replicator"] == 2
    assert plan_from_dict(plan_to_dict(plan)) == plan
    plain = plan_from_dict(_doc(tp=2, dp=4))
    assert plain.parallel.kv_replicator == 1 and "kv_replicator" not in plan_to_dict(plain)["parallel"]
    assert kvr.as_run(plain) is plain   # an existing Plan runs as it is


@pytest.mark.parametrize("changes, expected", [
    ({"tp": 4}, "parallel.tp=4 does not divide model.kv_heads=2 (parallel.kv_replicator copies the key/value "
                "heads across the TP ranks, as NeuronX Distributed does)"),
    ({"tp": 4, "r": 3}, "parallel.kv_replicator=3 does not divide parallel.tp=4"),
    ({"tp": 8, "dp": 1, "r": 2}, "parallel.tp=8 does not divide model.kv_heads x parallel.kv_replicator = 2 x 2 = 4"),
    ({"tp": 1, "dp": 8, "r": 2}, "parallel.kv_replicator=2 does not divide parallel.tp=1"),
    ({"tp": 8, "dp": 1, "r": 8}, "model.kv_heads x parallel.kv_replicator = 16 does not divide model.heads=8"),
    ({"r": 0}, "parallel.kv_replicator=0 must be at least 1"),
])
def test_bad_replication_gets_one_sentence(changes, expected):
    assert expected in _error(_doc(**changes))


def test_multi_latent_attention_has_no_heads_to_copy():
    mla = {**SMALL, "kv_heads": 8, "kv_lora_rank": 16, "q_lora_rank": 0, "kv_channels": 8, "qk_rope_head_dim": 4,
           "v_head_dim": 8}
    assert "parallel.kv_replicator=2 needs grouped-query attention" in _error(_doc(mla, r=2))


def test_a_rank_holds_one_kv_head_counted_by_hand():
    """tp 4 over 2 KV heads copied twice: a rank holds 8/4 = 2 query heads and 2*2/4 = 1 KV head of 8.
    Per layer and GPU: Q 64 x 16, K and V 64 x 8 each, O 16 x 64, SwiGLU 3 x 64 x 128 / 4, two norms
    of 64; the ends: embedding and output 256 x 64 / 4 each, the final norm whole."""
    plan = plan_from_dict(_doc(r=2))
    assert kvr.kv_heads_per_rank(plan) == 1
    layer = 64 * 16 + 2 * 64 * 8 + 16 * 64 + 3 * 64 * 128 // 4 + 2 * 64
    assert layer == 9344
    run = kvr.as_run(plan)
    assert mem.layer_params_per_gpu(run) == (layer, 0.0)
    total = 2 * layer + 2 * 256 * 64 // 4 + 64
    assert mem.stage_params(run)[0].total == total
    report = memory_report(plan)
    assert report["ranks"][0]["terms"]["weights"] == pytest.approx(total * mem.param_bytes(plan.training))
    # the model's own size is unchanged: 2 KV heads, not 4
    assert wl.param_counts(plan.model).attention == 64 * (64 + 2 * 16) + 64 * 64


def test_the_kv_group_all_reduce_is_listed_with_its_bytes():
    """One all-reduce per layer and micro-batch of the K and V output gradients: 2 x 32 tokens x one
    head of 8 x fp32 (qkv_linear_utils.py's reduce_dtype), over the group of the head's copies."""
    plan = plan_from_dict(_doc(r=2, pp=2, dp=1, global_batch=4))
    mbs = plan.num_microbatches
    per_call = 2 * 32 * 1 * 8 * 4
    assert kvr.sync_bytes(plan) == per_call
    for pp_rank, rank in ((0, 0), (1, 4)):
        calls = expected_calls(plan, rank)
        kv = {c: n for c, n in calls.items() if c.axis == "kv"}
        assert kv == {Call(kind="all_reduce", axis="kv", bytes=per_call, issuer="nxd"): 1 * mbs}
        assert comm_ledger.step_bytes(plan, pp_rank)["kv", "all_reduce"] == per_call * mbs
    assert "kv   all_reduce" in format_collectives(plan)
    plain = plan_from_dict(_doc(tp=2, dp=2, pp=2, global_batch=4))
    assert not any(c.axis == "kv" for c in expected_calls(plain, 0))
    assert ("kv", "all_reduce") not in comm_ledger.step_bytes(plain, 0)


def test_both_engines_charge_the_all_reduce_once_a_layer_backward():
    """Against the model NxD builds (4 KV heads, no copies) the step is longer by the kv group's
    all-reduce, layers x micro-batches of it, on the analytic path and the event engine alike."""
    plan = plan_from_dict(_doc(r=2, node="trn1-32xl", tp=16, dp=1, model={**SMALL, "heads": 16, "kv_heads": 8}))
    wide = plan_from_dict(_doc(node="trn1-32xl", tp=16, dp=1, model={**SMALL, "heads": 16, "kv_heads": 16}))
    costs = step_costs(plan)
    one = costs.time_detail_s["kv_sync_per_layer_s"]
    assert one > 0 and "kv_sync_per_layer_s" not in step_costs(wide).time_detail_s
    extra = one * plan.model.layers * plan.num_microbatches
    for engine in ("analytic", "des"):
        a, b = simulate(plan, engine), simulate(wide, engine)
        assert a.step_time_s - b.step_time_s == pytest.approx(extra, rel=1e-6)
        assert a.memory_per_gpu_gib == pytest.approx(b.memory_per_gpu_gib)
    assert simulate(plan, "des").step_time_s == pytest.approx(simulate(plan).step_time_s, rel=1e-3)
    assert costs.model_flops_per_step == wl.model_flops_per_step(plan.model, plan.training.global_batch)
    assert costs.hardware_flops_per_step == step_costs(wide).hardware_flops_per_step


MODELS = ("llama3-8b", "llama3-70b", "llama2-70b")
NODES = ("dgx-h100", "trn1-32xl")


def _per_gpu_states(plan) -> list[float]:
    return [r["weights"] + r["gradients"] + r["optimizer_states"] for r in memory_report(plan)["ranks"]]


def _ledger_total(plan) -> float:
    return sum(sum(comm_ledger.step_bytes(plan, r).values()) for r in range(plan.parallel.pp))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([4, 8, 16, 32]),
       r=st.sampled_from([2, 4, 8]), pp=st.sampled_from([1, 2]), recompute=st.sampled_from(["none", "selective"]))
def test_kv_replication_never_wins_for_nothing(model, node, tp, r, pp, recompute):
    """Copies cost what they hold. Three sound comparisons at the same layout:

    1. the model NxD builds (kv_heads * r heads, no copies, so nothing to keep in sync): the same
       per-GPU parameter, gradient and optimizer bytes and hardware FLOPs, collective bytes larger by
       exactly the kv group's all-reduce, a step no shorter, and the model FLOPs (MFU's) of the
       model's own, fewer, heads;
    2. an even split of the model's own parameters over tp (what a rank would hold if the heads
       divided, ``layer_params_per_gpu`` of the unreplicated model): never more than a rank holds;
    3. where tp already divides the KV heads, the same model unreplicated: no more bytes, FLOPs,
       collective bytes or step time than with copies it did not need.
    """
    dp = max(1, 64 // (tp * pp))
    base = {"model": {"name": model, "seq_len": 4096}, "cluster": {"node": node, "nodes": 8},
            "parallel": {"tp": tp, "pp": pp, "dp": dp, "zero": 1, "sequence_parallel": True, "kv_replicator": r},
            "training": {"global_batch": 8 * dp, "micro_batch": 1, "recompute": recompute, "flash_attention": True}}
    try:
        plan = plan_from_dict(base)
    except PlanError:
        return
    doc = plan_to_dict(plan)
    doc["model"]["kv_heads"] = plan.model.kv_heads * r
    doc["parallel"].pop("kv_replicator")
    wide = plan_from_dict(doc)
    rep_costs, wide_costs = step_costs(plan), step_costs(wide)
    assert _per_gpu_states(plan) == pytest.approx(_per_gpu_states(wide))
    assert rep_costs.hardware_flops_per_step == pytest.approx(wide_costs.hardware_flops_per_step)
    assert rep_costs.model_flops_per_step < wide_costs.model_flops_per_step
    kv = sum(kvr.sync_bytes(plan) * n * plan.num_microbatches for n in plan.layers_per_stage)
    assert _ledger_total(plan) == pytest.approx(_ledger_total(wide) + kv)
    assert simulate(plan).step_time_s >= simulate(wide).step_time_s
    assert mem.layer_params_per_gpu(kvr.as_run(plan))[0] >= mem.layer_params_per_gpu(plan)[0]
    if plan.model.kv_heads % tp == 0:
        doc["model"]["kv_heads"] = plan.model.kv_heads
        plain = plan_from_dict(doc)
        assert min(a - b for a, b in zip(_per_gpu_states(plan), _per_gpu_states(plain))) >= 0
        assert step_costs(plain).hardware_flops_per_step <= rep_costs.hardware_flops_per_step
        assert _ledger_total(plain) < _ledger_total(plan)
        assert simulate(plain).step_time_s <= simulate(plan).step_time_s


@pytest.mark.parametrize("target, expected", [
    ("megatron", "parallel.kv_replicator=2 has no Megatron-LM option: Megatron-Core runs tp above num_query_groups "
                 "by all-gathering the QKV activations over TP, not by copying the K/V weights"),
    ("slurm", "has no Megatron-LM option"),
    ("deepspeed", "parallel.kv_replicator=2 has no DeepSpeed config option: no ds_config option copies key/value heads"),
    ("torchtitan", "parallel.kv_replicator=2 has no torchtitan option: tensor_parallel_degree must divide n_kv_heads"),
    ("torchtitan-0.2", "parallel.kv_replicator=2 has no torchtitan 0.2 option"),
    ("slurm-trainplan", "parallel.kv_replicator=2 has no trainplan executor option"),
])
def test_no_exporter_writes_copied_heads(target, expected):
    from simcore.plan.writers import export_plan

    with pytest.raises(ValueError) as e:
        export_plan(plan_from_dict(_doc(r=2)), target)
    assert expected in str(e.value) and str(e.value).count(". ") == 0


def test_the_executor_refuses_copied_heads():
    from executors.support import check_executable

    with pytest.raises(ValueError, match=r"parallel.kv_replicator=2 is priced, not run"):
        check_executable(plan_from_dict(_doc(r=2)), "cpu")


def test_the_commands_run_on_a_replicated_plan(tmp_path, capsys):
    import yaml

    from trainplan.cli import main

    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(_doc(r=2)))
    for command in ("simulate", "memory", "collectives", "check"):
        main([command, str(path)])
    out = capsys.readouterr().out
    assert "kv   all_reduce" in out and "axis kv: each key/value head copied 2 times" in out
    assert "kv_heads_per_rank: 1 (2 heads x 2 copies over tp 4)" in out
