"""torchtitan 0.3's qwen3 module as an export (issue 55: import what teams run in 2026): a Plan whose model
is one of its named configs is written ``--module qwen3 --config qwen3_<name>`` with the layout's options
as the llama3 path writes them, read back into the same Plan, and what the module cannot build or run is
refused in one sentence naming the field (simcore/plan/torchtitan_qwen3.py). The same commands are
parsed and their models built by torchtitan 0.3 itself in tests/plan/consumers/test_torchtitan_qwen3.py."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from simcore.model.params import param_counts
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.torchtitan_qwen3 import CONFIGS, is_qwen3, qwen3_config
from simcore.plan.torchtitan_reader import _torchtitan_command, read_torchtitan
from simcore.plan.writers import export_plan, hf_config_from_model
from tests.plan.layouts import ALL, EXAMPLES
from tests.plan.test_export_refusals import assert_one_sentence_naming

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
_QWEN3 = {"vocab": 151936, "gated_mlp": True, "position_embedding": "rope", "kv_channels": 128, "rope_base": 1e6,
          "qk_norm": "head", "dropout": 0.0}
#: The five configs' shapes as the Qwen3 model cards state them (Hugging Face config.json of Qwen/Qwen3-*).
MODELS = {
    "qwen3-0.6b": dict(layers=28, hidden=1024, heads=16, kv_heads=8, ffn_hidden=3072, tied_embeddings=True),
    "qwen3-1.7b": dict(layers=28, hidden=2048, heads=16, kv_heads=8, ffn_hidden=6144, tied_embeddings=True),
    "qwen3-14b": dict(layers=40, hidden=5120, heads=40, kv_heads=8, ffn_hidden=17408, tied_embeddings=False),
    "qwen3-30b-a3b": dict(layers=48, hidden=2048, heads=32, kv_heads=4, ffn_hidden=768, experts=128, top_k=8,
                          tied_embeddings=False),
}
#: The parameters torchtitan 0.3 builds for each config (its model on the meta device, counted by the
#: consumer test): trainplan's count of the same shape must be these.
TORCHTITAN_PARAMS = {"qwen3_0_6b": 596_049_920, "qwen3_1_7b": 1_720_574_976, "qwen3_14b": 14_768_307_200,
                     "qwen3_30b_a3b": 30_532_122_624, "qwen3_32b": 32_762_123_264}


def _plan(model: str, nodes: int, parallel: dict, seq_len: int = 4096, **training):
    spec = ({"hf_config": str(EXAMPLES / "hf" / "qwen3-32b" / "config.json")} if model == "qwen3-32b"
            else {"name": model, **_QWEN3, **MODELS[model]})
    return plan_from_dict({"model": {**spec, "seq_len": seq_len}, "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": parallel, "training": {"global_batch": 64, **training}})


def _plans() -> dict:
    plans = {
        "qwen3-0.6b-fsdp-cp": _plan("qwen3-0.6b", 1, {"dp": 4, "cp": 2, "cp_comm": "all_gather", "zero": 3},
                                    seq_len=8192),
        "qwen3-1.7b-hsdp-eager": _plan("qwen3-1.7b", 2, {"dp": 16, "dp_replicate": 2, "zero": 3}, kernels="eager"),
        "qwen3-14b-interleaved-tp": _plan("qwen3-14b", 2, {"tp": 2, "pp": 4, "dp": 2, "vpp": 2, "zero": 0,
                                                           "sequence_parallel": True, "schedule": "interleaved-1f1b"}),
        "qwen3-32b-fsdp-tp": _plan("qwen3-32b", 4, {"tp": 8, "dp": 4, "zero": 3, "sequence_parallel": True},
                                   recompute="full"),
        "qwen3-30b-a3b-ep-tp": _plan("qwen3-30b-a3b", 2, {"tp": 2, "dp": 8, "ep": 8, "expert_tp": 1, "zero": 3,
                                                          "sequence_parallel": True}, moe_routing="round_robin"),
        "qwen3-30b-a3b-ep-pp": _plan("qwen3-30b-a3b", 2, {"pp": 2, "dp": 8, "ep": 4, "zero": 2}),
    }
    return {name: replace(plan, name=name) for name, plan in plans.items()}


PLANS = _plans()
CONFIG_OF = {"qwen3-0.6b-fsdp-cp": "qwen3_0_6b", "qwen3-1.7b-hsdp-eager": "qwen3_1_7b",
             "qwen3-14b-interleaved-tp": "qwen3_14b", "qwen3-32b-fsdp-tp": "qwen3_32b",
             "qwen3-30b-a3b-ep-tp": "qwen3_30b_a3b", "qwen3-30b-a3b-ep-pp": "qwen3_30b_a3b"}
EXPORTS = {name: export_plan(plan, "torchtitan") for name, plan in PLANS.items()}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_each_plan_is_written_as_its_qwen3_config(name):
    command = _torchtitan_command(EXPORTS[name])
    assert command["model"] == {"name": "qwen3", "config": CONFIG_OF[name]}
    par, plan = command["parallelism"], PLANS[name].parallel
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"],
            par["expert_parallel_degree"]) == (plan.tp, plan.pp, plan.cp, plan.ep)
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == plan.dp
    assert command["training"]["seq_len"] == PLANS[name].model.seq_len
    assert command.get("debug", {}).get("moe_force_load_balance", False) == (name == "qwen3-30b-a3b-ep-tp")


def test_the_layout_options_are_the_llama3_path_s():
    """The same layout and training on Llama 3 8B and on Qwen3 32B: every option after --config is the same."""
    llama = ALL["llama3-8b-fsdp-h100"]
    qwen = replace(llama, model=replace(PLANS["qwen3-32b-fsdp-tp"].model, seq_len=llama.model.seq_len))
    tail = lambda text: text.split("--config ", 1)[1].split("\n", 1)[1]   # noqa: E731
    assert tail(export_plan(qwen, "torchtitan")) == tail(export_plan(llama, "torchtitan"))
    assert "--config qwen3_32b" in export_plan(qwen, "torchtitan")


@pytest.mark.parametrize("name", ["qwen3-32b-fsdp-tp", "qwen3-30b-a3b-ep-tp"])
def test_export_matches_golden_file(name):
    path = GOLDEN / f"{name}.torchtitan.sh"
    if os.environ.get("TRAINPLAN_UPDATE_GOLDEN"):
        path.write_text(EXPORTS[name])
    assert EXPORTS[name] == path.read_text()


def _held(plan) -> dict:
    """What the command holds: the model, the layout, the training but the attention kernel (which
    torchtitan's config does not name) and the cluster the user gives."""
    doc = plan_to_dict(plan)
    skip = ("flash_attention", "attention_kernel", "grad_compression")
    return {"model": doc["model"], "parallel": doc["parallel"],
            "training": {k: v for k, v in doc["training"].items() if k not in skip}}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_command_reads_back_into_the_same_model_and_layout(name):
    plan = PLANS[name]
    doc, _ = import_plan(torchtitan=EXPORTS[name], cluster="dgx-h100")
    again = plan_from_dict(doc)
    assert _held(again) == _held(plan) and again.cluster.nodes == plan.cluster.nodes


@pytest.mark.parametrize("name", ["qwen3-0.6b-fsdp-cp", "qwen3-30b-a3b-ep-tp"])
def test_a_config_json_beside_the_command_agrees_with_it(name, tmp_path):
    plan = PLANS[name]
    (tmp_path / "config.json").write_text(json.dumps(hf_config_from_model(plan.model)))
    doc, _ = import_plan(torchtitan=EXPORTS[name], hf=str(tmp_path / "config.json"), cluster="dgx-h100")
    assert _held(plan_from_dict(doc)) == _held(plan)


def test_the_registry_command_alone_gives_the_model():
    r = read_torchtitan("torchrun --nnodes 2 --nproc-per-node 8 -m torchtitan.train --module qwen3 "
                        "--config qwen3_30b_a3b")
    f = r.fields
    assert (f["model.layers"], f["model.experts"], f["model.top_k"], f["model.ffn_hidden"]) == (48, 128, 8, 768)
    assert (f["model.kv_channels"], f["model.qk_norm"], f["model.tied_embeddings"]) == (128, "head", False)
    assert (f["model.seq_len"], f["training.micro_batch"], f["training.recompute"]) == (4096, 2, "full")
    assert r.defaults["model.name"] == "qwen3-30b-a3b"


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_trainplan_counts_the_parameters_torchtitan_builds(config):
    fields = read_torchtitan(f"-m torchtitan.train --module qwen3 --config {config}").fields
    doc = {"model": {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith("model.")} | {"name": config},
           "cluster": {"node": "dgx-h100", "nodes": 1}, "training": {"global_batch": 8}}
    model = plan_from_dict(doc).model
    assert qwen3_config(model) == config and param_counts(model).total == TORCHTITAN_PARAMS[config]


def _refused(plan, **changes):
    """The plan with model/parallel/training fields changed."""
    doc = plan_to_dict(plan)
    for key, value in changes.items():
        section, field_ = key.split("__")
        doc[section] = {**doc[section], field_: value}
    return plan_from_dict(doc)


REFUSALS = [
    ("qwen3-32b-fsdp-tp", {"model__qk_norm": "none", "model__name": "qwen3-32b"}, "model.qk_norm"),
    ("qwen3-32b-fsdp-tp", {"model__bias": "qkv"}, "model.bias"),
    ("qwen3-32b-fsdp-tp", {"model__rope_base": 10000.0}, "model.rope_base"),
    ("qwen3-32b-fsdp-tp", {"model__dropout": 0.1}, "model.dropout"),
    ("qwen3-32b-fsdp-tp", {"model__layers": 60}, "model.layers"),
    ("qwen3-32b-fsdp-tp", {"model__kv_channels": 0}, "model.kv_channels"),
    ("qwen3-0.6b-fsdp-cp", {"model__tied_embeddings": False}, "model.tied_embeddings"),
    ("qwen3-0.6b-fsdp-cp", {"model__seq_len": 65536}, "model.seq_len"),
    ("qwen3-32b-fsdp-tp", {"training__precision": "fp8", "training__fp8_recipe": "rowwise"}, "training.precision"),
    ("qwen3-30b-a3b-ep-tp", {"parallel__expert_tp": 0}, "parallel.expert_tp"),
    ("qwen3-30b-a3b-ep-tp", {"model__capacity_factor": 1.25}, "model.capacity_factor"),
    ("qwen3-30b-a3b-ep-tp", {"model__shared_ffn_hidden": 768}, "model.shared_ffn_hidden"),
    ("qwen3-30b-a3b-ep-tp", {"parallel__moe_dispatcher": "deepep"}, "parallel.moe_dispatcher"),
    ("qwen3-30b-a3b-ep-tp", {"model__top_k": 2}, "model.top_k"),
    ("qwen3-30b-a3b-ep-tp", {"training__precision": "fp32"}, "training.precision"),   # its experts run bf16
    ("qwen3-30b-a3b-ep-pp", {"parallel__zero": 0}, "parallel.ep"),    # dp_shard 1: EP has 1 rank to borrow
    ("qwen3-30b-a3b-ep-tp", {"parallel__zero": 0, "parallel__ep": 2, "parallel__cp": 2, "parallel__dp": 4,
                             "parallel__cp_comm": "all_gather"}, "parallel.zero"),   # experts FSDP'd over 2 ranks
]


@pytest.mark.parametrize("name, changes, field", REFUSALS)
def test_what_the_qwen3_module_cannot_build_or_run_is_one_sentence(name, changes, field):
    with pytest.raises(ValueError) as refusal:
        export_plan(_refused(PLANS[name], **changes), "torchtitan")
    assert_one_sentence_naming(str(refusal.value), field)


def test_tying_under_a_pipeline_is_refused_citing_torchtitan():
    plan = _plan("qwen3-1.7b", 1, {"pp": 2, "dp": 4, "zero": 0})
    with pytest.raises(ValueError, match=r"^parallel\.pp=2 has no torchtitan option: qwen3_1_7b ties .*"
                                         r"torchtitan/models/common/decoder\.py\)$"):
        export_plan(plan, "torchtitan")


def test_a_qwen3_model_of_no_registered_config_names_the_nearest():
    """Qwen3-8B has no plain torchtitan 0.3 config (only sft_qwen3_8b_math's SFT run on varlen attention)."""
    plan = plan_from_dict({"model": {"hf_config": str(EXAMPLES / "hf" / "qwen3-8b" / "config.json")},
                           "cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"dp": 8, "zero": 3},
                           "training": {"global_batch": 64}})
    assert is_qwen3(plan.model) and qwen3_config(plan.model) is None
    with pytest.raises(ValueError, match=r"^model\.layers=36 has no torchtitan option: .*the nearest, qwen3_14b, "
                                         r"has layers 40 \(torchtitan/models/qwen3/__init__\.py\)$"):
        export_plan(plan, "torchtitan")


def test_torchtitan_0_2_still_writes_llama3_only():
    with pytest.raises(ValueError, match=r"^model\.qk_norm=head has no torchtitan option: its llama3 model"):
        export_plan(PLANS["qwen3-32b-fsdp-tp"], "torchtitan-0.2")
