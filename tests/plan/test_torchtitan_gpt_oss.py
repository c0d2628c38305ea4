"""torchtitan 0.3's gpt_oss module as an export (issue 55: import what teams run in 2026): a Plan whose model
is GPT-OSS 20B or 120B is written ``--module gpt_oss --config gpt_oss_20b|gpt_oss_120b`` with the layout's
options as the llama3 path writes them, read back into the same Plan, and what the module cannot build or run
is refused in one sentence naming the field (simcore/plan/torchtitan_gpt_oss.py). The same commands are
parsed and their models built by torchtitan 0.3 itself in tests/plan/consumers/test_torchtitan_gpt_oss.py."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from simcore.model.params import param_counts
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError
from simcore.plan.torchtitan_gpt_oss import CONFIGS, gpt_oss_config, is_gpt_oss
from simcore.plan.torchtitan_reader import _torchtitan_command, read_torchtitan
from simcore.plan.writers import export_plan
from tests.plan.layouts import ALL
from tests.plan.test_export_refusals import assert_one_sentence_naming
from tests.plan.test_torchtitan_qwen3 import _held, _refused

#: GPT-OSS's block as the Plan states it (what trainplan's Hugging Face import reads from a gpt_oss config.json).
_GPT_OSS = {"hidden": 2880, "heads": 64, "kv_heads": 8, "kv_channels": 64, "ffn_hidden": 2880, "vocab": 201088,
            "top_k": 4, "gated_mlp": True, "tied_embeddings": False, "position_embedding": "rope",
            "rope_base": 150000.0, "dropout": 0.0, "sliding_window": 128, "sliding_window_layers": 0.5, "bias": "all",
            "activation": "oss_glu", "attention_sinks": True}
MODELS = {"gpt-oss-20b": dict(layers=24, experts=32), "gpt-oss-120b": dict(layers=36, experts=128)}
#: The parameters torchtitan 0.3 builds for each config (its model on the meta device, counted by the consumer
#: test; transformers 5.24's GptOssForCausalLM of the same config has as many): 20.9B and 116.8B, the model cards'.
TORCHTITAN_PARAMS = {"gpt_oss_20b": 20_914_757_184, "gpt_oss_120b": 116_829_156_672}
#: Of them, the routers' biases, one per expert a layer (torchtitan's gate ``Linear(bias=True)``, transformers'
#: ``GptOssTopKRouter.bias``), which simcore/model/params.py counts under ``model.bias: all``.
ROUTER_BIASES = {name: c["layers"] * c["experts"] for name, c in CONFIGS.items()}


def _plan(model: str, nodes: int, parallel: dict, seq_len: int = 8192, **training):
    spec = {"name": model, **_GPT_OSS, **MODELS[model], "seq_len": seq_len}
    return plan_from_dict({"model": spec, "cluster": {"node": "dgx-h100", "nodes": nodes}, "parallel": parallel,
                           "training": {"global_batch": 64, "flash_attention": True, **training}})


def _plans() -> dict:
    plans = {
        "gpt-oss-20b-fsdp": _plan("gpt-oss-20b", 1, {"dp": 8, "zero": 3}, recompute="full"),
        "gpt-oss-20b-ep-tp": _plan("gpt-oss-20b", 2, {"tp": 2, "dp": 8, "ep": 8, "expert_tp": 1, "zero": 3,
                                                      "sequence_parallel": True}, moe_routing="round_robin"),
        "gpt-oss-20b-interleaved-tp": _plan("gpt-oss-20b", 2, {"tp": 2, "pp": 4, "dp": 2, "vpp": 2, "zero": 0,
                                                               "sequence_parallel": True,
                                                               "schedule": "interleaved-1f1b"}),
        "gpt-oss-120b-ep-pp": _plan("gpt-oss-120b", 4, {"pp": 4, "dp": 8, "ep": 8, "zero": 2}, seq_len=4096),
        "gpt-oss-120b-hsdp-tp": _plan("gpt-oss-120b", 8, {"tp": 8, "dp": 8, "dp_replicate": 2, "zero": 3,
                                                          "sequence_parallel": True}, kernels="eager"),
    }
    return {name: replace(plan, name=name) for name, plan in plans.items()}


PLANS = _plans()
CONFIG_OF = {name: "gpt_oss_120b" if "120b" in name else "gpt_oss_20b" for name in PLANS}
EXPORTS = {name: export_plan(plan, "torchtitan") for name, plan in PLANS.items()}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_each_plan_is_written_as_its_gpt_oss_config(name):
    command = _torchtitan_command(EXPORTS[name])
    assert command["model"] == {"name": "gpt_oss", "config": CONFIG_OF[name]}
    par, plan = command["parallelism"], PLANS[name].parallel
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"], par["context_parallel_degree"],
            par["expert_parallel_degree"]) == (plan.tp, plan.pp, plan.cp, plan.ep)
    assert par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] == plan.dp
    assert command["training"]["seq_len"] == PLANS[name].model.seq_len
    assert command["training"].get("disable_cuda_graphs", False) == (plan.pp > 1 or plan.ep > 1)
    assert command.get("debug", {}).get("moe_force_load_balance", False) == (name == "gpt-oss-20b-ep-tp")


def test_the_script_says_what_the_config_builds_beside_the_plan():
    """YaRN and the expert-bias balancing have no Plan field: the script's comments name them."""
    text = EXPORTS["gpt-oss-120b-ep-pp"]
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert any("gpt_oss_120b builds what the Plan's model states" in line for line in comments)
    assert any("YaRN scaling (factor 32 over 4096 positions" in line for line in comments)
    assert any("expert bias (load_balance_coeff 1e-3)" in line for line in comments)


def test_the_layout_options_are_the_llama3_path_s():
    """The same layout and training on Llama 3 8B and on GPT-OSS 20B: every option after --config is the same."""
    llama = ALL["llama3-8b-fsdp-h100"]
    oss = replace(llama, model=replace(PLANS["gpt-oss-20b-fsdp"].model, seq_len=llama.model.seq_len))
    tail = lambda text: text.split("--config ", 1)[1].split("\n", 1)[1]   # noqa: E731
    assert tail(export_plan(oss, "torchtitan")) == tail(export_plan(llama, "torchtitan"))
    assert "--module gpt_oss \\\n    --config gpt_oss_20b" in export_plan(oss, "torchtitan")


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_command_reads_back_into_the_same_model_and_layout(name):
    plan = PLANS[name]
    doc, _ = import_plan(torchtitan=EXPORTS[name], cluster="dgx-h100")
    again = plan_from_dict(doc)
    assert _held(again) == _held(plan) and again.cluster.nodes == plan.cluster.nodes


#: openai/gpt-oss-20b's config.json (Hugging Face), the fields that shape the model, as published: 24 layers
#: alternating sliding_attention and full_attention, 32 experts, top-4, rope_theta 150000 with YaRN scaling.
GPT_OSS_20B_CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
    "num_local_experts": 32, "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": 201088,
    "max_position_embeddings": 131072, "initial_context_length": 4096, "attention_bias": True,
    "attention_dropout": 0.0, "hidden_act": "silu", "swiglu_limit": 7.0, "rms_norm_eps": 1e-05,
    "rope_theta": 150000, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                           "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                           "truncate": False},
    "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12, "router_aux_loss_coef": 0.9,
    "tie_word_embeddings": False,
}


def test_a_gpt_oss_config_json_imports_into_the_model_the_export_names(tmp_path):
    """trainplan's Hugging Face import of GPT-OSS 20B gives the Plan model that exports as gpt_oss_20b."""
    path = tmp_path / "gpt-oss-20b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(GPT_OSS_20B_CONFIG))
    doc, _ = import_plan(hf=str(path), cluster="dgx-h100", nodes=1)
    plan = replace(plan_from_dict(doc), name="gpt-oss-20b-fsdp")
    assert is_gpt_oss(plan.model) and gpt_oss_config(plan.model) == "gpt_oss_20b"
    ours = {k: v for k, v in plan_to_dict(plan)["model"].items() if k != "source"}
    assert ours == plan_to_dict(PLANS["gpt-oss-20b-fsdp"])["model"]
    assert "--module gpt_oss \\\n    --config gpt_oss_20b" in export_plan(plan, "torchtitan")


def test_the_registry_command_alone_gives_the_model():
    r = read_torchtitan("torchrun --nnodes 2 --nproc-per-node 8 -m torchtitan.train --module gpt_oss "
                        "--config gpt_oss_120b")
    f = r.fields
    assert (f["model.layers"], f["model.experts"], f["model.top_k"], f["model.ffn_hidden"]) == (36, 128, 4, 2880)
    assert (f["model.kv_channels"], f["model.sliding_window"], f["model.sliding_window_layers"]) == (64, 128, 0.5)
    assert (f["model.bias"], f["model.activation"], f["model.attention_sinks"]) == ("all", "oss_glu", True)
    assert (f["model.seq_len"], f["training.micro_batch"], f["training.recompute"]) == (8192, 1, "full")
    assert r.defaults["model.name"] == "gpt-oss-120b"


def test_a_gpt_oss_config_other_than_the_two_is_refused_in_one_sentence():
    with pytest.raises(PlanError, match=r"^torchtitan --config gpt_oss_debugmodel: trainplan reads the gpt_oss "
                                        r"module's gpt_oss_20b and gpt_oss_120b only, [^.]*\.py \([^.]*\)$"):
        read_torchtitan("-m torchtitan.train --module gpt_oss --config gpt_oss_debugmodel")


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_trainplan_counts_the_parameters_torchtitan_builds(config):
    fields = read_torchtitan(f"-m torchtitan.train --module gpt_oss --config {config}").fields
    doc = {"model": {k.split(".", 1)[1]: v for k, v in fields.items() if k.startswith("model.")} | {"name": config},
           "cluster": {"node": "dgx-h100", "nodes": 1}, "training": {"global_batch": 8}}
    model = plan_from_dict(doc).model
    assert gpt_oss_config(model) == config
    assert param_counts(model).total == TORCHTITAN_PARAMS[config]


REFUSALS = [
    ("gpt-oss-20b-fsdp", {"model__bias": "none"}, "model.bias"),
    ("gpt-oss-20b-fsdp", {"model__activation": "swiglu"}, "model.activation"),
    ("gpt-oss-20b-fsdp", {"model__attention_sinks": False}, "model.attention_sinks"),
    ("gpt-oss-20b-fsdp", {"model__qk_norm": "head"}, "model.qk_norm"),
    ("gpt-oss-20b-fsdp", {"model__norm": "layernorm"}, "model.norm"),
    ("gpt-oss-20b-fsdp", {"model__rope_base": 10000.0}, "model.rope_base"),
    ("gpt-oss-20b-fsdp", {"model__sliding_window": 4096}, "model.sliding_window"),
    ("gpt-oss-20b-fsdp", {"model__sliding_window": 0}, "model.sliding_window"),
    ("gpt-oss-20b-fsdp", {"model__sliding_window_layers": 1.0}, "model.sliding_window_layers"),
    ("gpt-oss-20b-fsdp", {"model__mtp_layers": 1}, "model.mtp_layers"),   # writers.py: every torchtitan export
    ("gpt-oss-20b-fsdp", {"model__dropout": 0.1}, "model.dropout"),
    ("gpt-oss-20b-fsdp", {"model__layers": 30}, "model.layers"),
    ("gpt-oss-20b-fsdp", {"model__experts": 64}, "model.experts"),
    ("gpt-oss-20b-fsdp", {"model__top_k": 2}, "model.top_k"),
    ("gpt-oss-20b-fsdp", {"model__kv_channels": 0}, "model.kv_channels"),
    ("gpt-oss-20b-fsdp", {"model__tied_embeddings": True}, "model.tied_embeddings"),
    ("gpt-oss-20b-fsdp", {"model__capacity_factor": 1.25}, "model.capacity_factor"),
    ("gpt-oss-20b-fsdp", {"model__shared_ffn_hidden": 2880}, "model.shared_ffn_hidden"),
    ("gpt-oss-20b-fsdp", {"model__dense_layers": 1, "model__dense_ffn_hidden": 2880}, "model.dense_layers"),
    ("gpt-oss-20b-fsdp", {"model__seq_len": 262144}, "model.seq_len"),
    ("gpt-oss-20b-fsdp", {"training__precision": "fp32"}, "training.precision"),
    ("gpt-oss-20b-fsdp", {"training__flash_attention": False}, "training.flash_attention"),
    ("gpt-oss-20b-fsdp", {"training__precision": "fp8", "training__fp8_recipe": "rowwise"}, "training.precision"),
    ("gpt-oss-20b-fsdp", {"parallel__cp": 2, "parallel__dp": 4, "parallel__cp_comm": "all_gather"}, "parallel.cp"),
    ("gpt-oss-20b-ep-tp", {"parallel__kv_replicator": 2}, "parallel.kv_replicator"),   # writers.py: every torchtitan
    ("gpt-oss-20b-ep-tp", {"parallel__expert_tp": 0}, "parallel.expert_tp"),
    ("gpt-oss-20b-ep-tp", {"parallel__moe_dispatcher": "deepep"}, "parallel.moe_dispatcher"),
    ("gpt-oss-120b-hsdp-tp", {"parallel__expert_tp": 1}, "parallel.expert_tp"),
    ("gpt-oss-120b-ep-pp", {"parallel__zero": 0}, "parallel.ep"),    # dp_shard 1: EP has 1 rank to borrow
    ("gpt-oss-20b-ep-tp", {"parallel__moe_a2a_overlap": True}, "parallel.moe_a2a_overlap"),
    ("gpt-oss-20b-ep-tp", {"parallel__zero": 0, "parallel__tp": 4, "parallel__dp": 4, "parallel__ep": 2},
     "parallel.zero"),   # the experts FSDP'd over efsdp = tp / ep = 2 ranks
]


@pytest.mark.parametrize("name, changes, field", REFUSALS)
def test_what_the_gpt_oss_module_cannot_build_or_run_is_one_sentence(name, changes, field):
    with pytest.raises(ValueError) as refusal:
        export_plan(_refused(PLANS[name], **changes), "torchtitan")
    assert_one_sentence_naming(str(refusal.value), field)


def test_context_parallel_is_refused_citing_torchtitan():
    plan = _plan("gpt-oss-20b", 1, {"dp": 4, "cp": 2, "cp_comm": "all_gather", "zero": 3})
    with pytest.raises(ValueError, match=r"^parallel\.cp=2 has no torchtitan option: gpt_oss_20b attends through "
                                         r"varlen .*context_parallel/api\.py apply_cp_to_forward\)$"):
        export_plan(plan, "torchtitan")


def test_a_gpt_oss_model_of_no_registered_config_names_the_nearest():
    plan = _refused(PLANS["gpt-oss-20b-fsdp"], model__layers=32)
    assert is_gpt_oss(plan.model) and gpt_oss_config(plan.model) is None
    with pytest.raises(ValueError, match=r"^model\.layers=32 has no torchtitan option: .*the nearest, gpt_oss_20b, "
                                         r"has layers 24 \(torchtitan/models/gpt_oss/__init__\.py\)$"):
        export_plan(plan, "torchtitan")


def test_torchtitan_0_2_still_writes_llama3_only():
    with pytest.raises(ValueError, match=r"^model\.experts=32 has no torchtitan option: its llama3 model"):
        export_plan(PLANS["gpt-oss-20b-fsdp"], "torchtitan-0.2")
