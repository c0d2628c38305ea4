"""The Plan file: loading, defaults, every cross-field rule, and random documents."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.plan.load import dump_plan, load_plan, plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError, Schedule, ZeroStage, even_split

ROOT = Path(__file__).resolve().parents[2]
BASE = {
    "model": {"name": "toy", "layers": 8, "hidden": 256, "heads": 8, "vocab": 1000, "seq_len": 128},
    "cluster": {"node": "dgx-a100-80gb", "nodes": 2},
    "parallel": {"tp": 2, "pp": 2, "dp": 4},
    "training": {"global_batch": 32, "micro_batch": 2},
}


def doc(**sections):
    d = copy.deepcopy(BASE)
    for section, fields in sections.items():
        if fields is None:
            d.pop(section)
        elif isinstance(fields, dict) and isinstance(d.get(section), dict):
            d[section].update(fields)
        else:
            d[section] = fields
    return d


def error_of(d) -> str:
    with pytest.raises(PlanError) as info:
        plan_from_dict(d)
    return str(info.value)


def test_defaults_and_derived_values():
    plan = plan_from_dict(doc())
    assert plan.model.kv_heads == 8 and plan.model.ffn_hidden == 1024
    assert plan.parallel.zero is ZeroStage.NONE and plan.parallel.schedule is Schedule.ONE_F_ONE_B
    assert plan.num_microbatches == 32 // (4 * 2)
    assert plan.layers_per_stage == (4, 4)
    assert plan.cluster.gpus == 16 and plan.parallel.gpus == 16


def test_catalog_model_with_override():
    d = doc(parallel={"tp": 8, "pp": 1, "dp": 2}, training={"global_batch": 16})
    d["model"] = {"name": "llama3-70b", "seq_len": 4096}
    plan = plan_from_dict(d)
    assert plan.model.layers == 80 and plan.model.kv_heads == 8 and plan.model.gated_mlp
    assert plan.model.seq_len == 4096


def test_dp_defaults_to_filling_the_cluster():
    d = doc()
    del d["parallel"]["dp"]
    assert plan_from_dict(d).parallel.dp == 16 // 4


def test_uneven_split_spreads_layers():
    assert even_split(126, 16) == (7,) + (8,) * 14 + (7,)  # the embedding stages get fewer
    assert even_split(70, 12).count(6) == 10 and sum(even_split(70, 12)) == 70


@pytest.mark.parametrize("sections, expected", [
    ({"parallel": {"tp": 3}}, "parallel.tp=3 does not divide model.heads=8"),
    ({"model": {"kv_heads": 2}, "parallel": {"tp": 4, "dp": 2}}, "parallel.tp=4 does not divide model.kv_heads=2"),
    ({"model": {"kv_heads": 3}}, "model.kv_heads=3 does not divide model.heads=8"),
    ({"training": {"global_batch": 30}}, "training.global_batch=30 is not a multiple of parallel.dp*training.micro_batch=8"),
    ({"parallel": {"dp": 8}}, "plan needs 32 GPUs (tp*pp*dp*cp) but cluster has 16"),
    ({"parallel": {"vpp": 2}}, "parallel.vpp=2 needs parallel.schedule interleaved-1f1b, zero-bubble or dualpipev, not 1f1b"),
    ({"model": {"experts": 4, "top_k": 2}, "parallel": {"ep": 3, "dp": 3, "tp": 1, "pp": 1},
      "training": {"global_batch": 6}}, "parallel.ep=3 does not divide model.experts=4"),
    ({"parallel": {"ep": 2}}, "parallel.ep=2 needs an MoE model (model.experts > 0)"),
    ({"model": {"seq_len": 130}, "parallel": {"cp": 4, "dp": 1}, "training": {"global_batch": 2}},
     "parallel.cp=4 does not divide model.seq_len=130"),
    ({"parallel": {"pp": 8, "vpp": 2, "dp": 1, "schedule": "interleaved-1f1b"}, "training": {"global_batch": 16}},
     "model.layers=8 gives fewer than one layer per virtual stage (pp*vpp=16)"),
    ({"parallel": {"vpp": 2, "schedule": "interleaved-1f1b"}, "training": {"global_batch": 24, "micro_batch": 2}},
     "the interleaved schedule needs the micro-batches per step (3) to be a multiple of parallel.pp=2"),
    ({"parallel": {"stage_layers": [3, 4]}}, "parallel.stage_layers adds up to 7, not model.layers=8"),
    ({"parallel": {"stage_layers": [8]}}, "parallel.stage_layers has 1 entries but pp*vpp=2"),
    ({"parallel": {"pp": 4, "dp": 1, "stage_layers": [2, 0, 3, 3]}},
     "parallel.stage_layers may be 0 only on the first and the last virtual stage"),
    ({"training": {"offload": "optimizer+params"}}, "training.offload=optimizer+params needs parallel.zero=3"),
    ({"training": {"grad_compression": "powersgd"}, "parallel": {"zero": 2}},
     "training.grad_compression=powersgd needs parallel.zero=0"),
    ({"parallel": {"tp": 1, "dp": 8, "sequence_parallel": True}}, "parallel.sequence_parallel needs parallel.tp > 1"),
    ({"training": {"precision": "fp8"}}, "training.precision=fp8 is not supported by a100-80gb"),
    ({"model": {"experts": 4, "top_k": 5}}, "model.top_k=5 exceeds model.experts=4"),
    ({"cluster": {"node": "localhost", "nodes": 2, "gpus_per_node": 8}},
     "cluster.nodes=2 needs a network: cluster.node=localhost has no fabric, set cluster.fabric"),
])
def test_every_rule_names_field_and_rule(sections, expected):
    assert expected in error_of(doc(**sections))


@pytest.mark.parametrize("sections, expected", [
    ({"parallel": {"tpp": 2}}, "unknown field 'parallel.tpp'"),
    ({"parallel": {"tp": "two"}}, "parallel.tp must be an integer, got 'two'"),
    ({"parallel": {"tp": 0}}, "parallel.tp=0 must be at least 1"),
    ({"parallel": {"zero": 4}}, "parallel.zero=4 is not one of: 0, 1, 2, 3"),
    ({"parallel": {"schedule": "2f2b"}}, "parallel.schedule='2f2b' is not one of: gpipe, 1f1b"),
    ({"training": {"precision": "int4"}}, "training.precision='int4' is not one of"),
    ({"training": {"flash_attention": "yes"}}, "training.flash_attention must be true or false"),
    ({"training": None}, "the plan needs a 'training' section"),
    ({"cluster": {"node": "dgx-z100"}}, "unknown node 'dgx-z100' for cluster.node (known:"),
    ({"cluster": {"fabric": "carrier-pigeon"}}, "unknown fabric 'carrier-pigeon' for cluster.fabric"),
    ({"cluster": {"fabric": "\n"}}, "unknown fabric '\\n' for cluster.fabric"),   # one line (hypothesis found it)
    ({"model": "gpt-9000"}, "unknown model 'gpt-9000'"),
    ({"cluster": [1, 2]}, "cluster must be a mapping of fields, got list"),
    ({"model": {"capacity_factor": -1.0}}, "model.capacity_factor=-1.0 must be positive"),
])
def test_bad_fields_get_one_sentence(sections, expected):
    assert expected in error_of(doc(**sections))


def test_missing_model_field():
    d = doc()
    d["model"] = {"name": "x", "layers": 2}
    assert "model.hidden is required" in error_of(d)


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(PlanError, match="cannot be read"):
        load_plan(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(PlanError, match=r"is not valid YAML \(line \d+\)"):
        load_plan(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(PlanError, match="is empty"):
        load_plan(empty)


def test_hf_config_model(tmp_path):
    cfg = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
           "max_position_embeddings": 8192, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    plan = plan_from_dict(doc(model="config.json", parallel={"tp": 8, "pp": 1, "dp": 2}), base_dir=tmp_path)
    assert (plan.model.layers, plan.model.kv_heads, plan.model.ffn_hidden) == (32, 8, 14336)
    assert plan.model.gated_mlp and not plan.model.tied_embeddings
    (tmp_path / "broken.json").write_text("{")
    assert "is not valid JSON" in error_of(doc(model={"hf_config": str(tmp_path / "broken.json")}))


def test_the_embedding_and_the_loss_may_have_stages_of_their_own():
    # Megatron's account_for_embedding/loss_in_pipeline_split: 8 layers + 2 on 10 stages
    from simcore.engine.predict import simulate
    plan = plan_from_dict(doc(parallel={"tp": 1, "pp": 10, "dp": 1, "stage_layers": [0] + [1] * 8 + [0]},
                              training={"global_batch": 20}))
    assert plan.layers_per_stage[0] == plan.layers_per_stage[-1] == 0
    ends, inner = simulate(plan), simulate(plan_from_dict(doc(parallel={"tp": 1, "pp": 8, "dp": 1},
                                                              training={"global_batch": 16})))
    assert ends.step_time_s > 0 and simulate(plan, engine="des").step_time_s == pytest.approx(ends.step_time_s, rel=0.1)
    assert inner.step_time_s > 0


def test_round_trip_through_yaml(tmp_path):
    plan = plan_from_dict({**doc(parallel={"stage_layers": [3, 5]}), "name": "plan"})
    path = tmp_path / "plan.yaml"
    path.write_text(dump_plan(plan))
    again = load_plan(path)
    assert plan_to_dict(again) == plan_to_dict(plan)
    assert again.layers_per_stage == (3, 5)


@pytest.mark.parametrize("path", sorted((ROOT / "plans").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_plans_are_valid(path):
    plan = load_plan(path)
    assert plan.parallel.gpus <= plan.cluster.gpus


# ---------------------------------------------------------------- property test

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=True),
                    st.text(max_size=6), st.sampled_from(["1f1b", "bf16", "full", "gpt3-175b", "dgx-h100"]))
_keys = st.sampled_from(["layers", "hidden", "heads", "kv_heads", "vocab", "seq_len", "tp", "pp", "dp", "cp",
                         "ep", "vpp", "zero", "schedule", "global_batch", "micro_batch", "precision",
                         "recompute", "offload", "node", "nodes", "fabric", "stage_layers", "experts", "bogus"])
_section = st.one_of(_scalar, st.lists(_scalar, max_size=3), st.dictionaries(_keys, _scalar, max_size=6))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_section, st.dictionaries(st.sampled_from(["model", "cluster", "parallel", "training", "x"]),
                                           _section, max_size=5)))
def test_random_documents_give_a_plan_or_plan_error(d):
    try:
        plan_from_dict(d)
    except PlanError as exc:
        assert str(exc) and "\n" not in str(exc)


@settings(max_examples=200, deadline=None)
@given(section=st.sampled_from(["model", "cluster", "parallel", "training"]), key=_keys, value=_scalar)
def test_mutated_valid_plan_gives_a_plan_or_plan_error(section, key, value):
    d = doc()
    if isinstance(d[section], dict):
        d[section][key] = value
    try:
        plan_from_dict(d)
    except PlanError as exc:
        assert str(exc) and "\n" not in str(exc)
