"""Exports that keep the Plan's model and layout (issue 55, item 5): the DeepSpeed ds_config
writes tensor parallel as AutoTP and refuses, in one sentence naming the field, the splits a
ds_config cannot state; the Megatron script's head names the model properties the Plan has
no field for and the convention written for them."""
import json
import re

import pytest

from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.readers import load_tool_options
from simcore.plan.writers import export_plan, export_with_notes, hf_config_from_model, megatron_args
from simcore.plan.megatron_writer import megatron_model_args


def _plan(parallel: dict, model: str = "llama3-8b", nodes: int = 1, **training):
    return plan_from_dict({"model": {"name": model}, "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": parallel, "training": {"global_batch": 64, **training}})


AUTOTP = {"tp": 2, "dp": 4, "zero": 1, "zero_impl": "deepspeed"}


def test_tensor_parallel_is_written_as_autotp():
    cfg = json.loads(export_plan(_plan(AUTOTP), "deepspeed"))
    assert cfg["tensor_parallel"] == {"autotp_size": 2}
    assert cfg["train_batch_size"] == 64 and cfg["zero_optimization"] == {"stage": 1}
    ds = load_tool_options()["deepspeed"]   # DeepSpeed v0.19.5 TPTrainingConfig's keys
    assert "tensor_parallel" in ds["top"] and set(cfg["tensor_parallel"]) <= set(ds["tensor_parallel"])
    assert any(f["file"] == "deepspeed/runtime/tensor_parallel/config.py" for f in ds["source"]["files"])


def test_data_parallel_plans_write_no_tensor_parallel_section():
    assert "tensor_parallel" not in json.loads(export_plan(_plan({"dp": 8}), "deepspeed"))


def test_the_import_reads_autotp_back_as_the_plan_s_tp(tmp_path):
    plan = _plan(AUTOTP)
    (tmp_path / "config.json").write_text(json.dumps(hf_config_from_model(plan.model)))
    doc, _ = import_plan(deepspeed=export_plan(plan, "deepspeed"), hf=str(tmp_path / "config.json"),
                         cluster="dgx-h100", nodes=1)
    got = plan_to_dict(plan_from_dict(doc))["parallel"]
    want = plan_to_dict(plan)["parallel"]
    assert {k: got[k] for k in ("tp", "dp", "pp", "cp", "zero", "zero_impl")} == \
        {k: want[k] for k in ("tp", "dp", "pp", "cp", "zero", "zero_impl")}


def test_autotp_notes_name_the_deepspeed_version():
    notes = export_with_notes(_plan(AUTOTP), "deepspeed")[1]
    assert any("AutoTP" in n and ">= 0.16.4" in n for n in notes)
    zero3 = export_with_notes(_plan({"tp": 2, "dp": 4, "zero": 3, "zero_impl": "deepspeed"}), "deepspeed")[1]
    assert any(">= 0.19.5 under ZeRO-3" in n for n in zero3)   # eec237ee lifted the stage <= 2 assert


@pytest.mark.parametrize("parallel, model, nodes, field", [
    ({"pp": 2, "dp": 4}, "llama3-8b", 1, "parallel.pp=2"),
    ({"cp": 2, "dp": 4, "cp_comm": "a2a", "zero": 1, "zero_impl": "deepspeed"}, "llama3-8b", 1, "parallel.cp=2"),
    ({"ep": 4, "dp": 8, "zero": 1, "zero_impl": "deepspeed"}, "mixtral-8x7b", 1, "parallel.ep=4"),
    ({"tp": 2, "dp": 4, "sequence_parallel": True}, "llama3-8b", 1, "parallel.sequence_parallel=true"),
])
def test_what_a_ds_config_cannot_state_is_refused_in_one_sentence(parallel, model, nodes, field):
    plan = _plan(parallel, model=model, nodes=nodes)
    with pytest.raises(ValueError) as exc:
        export_plan(plan, "deepspeed")
    message = str(exc.value)
    assert message.startswith(f"{field} has no DeepSpeed config option: ")
    assert "\n" not in message and not re.search(r"\.\s+[A-Z]", message)   # one sentence


def test_megatron_names_the_block_it_writes_and_what_the_plan_cannot_state():
    rope = export_plan(_plan({"tp": 2, "dp": 4}), "megatron")
    assert "# The block: rmsnorm, linear biases none, swiglu MLP, QK norm none, no attention sinks" in rope
    assert all(o in rope for o in ("--normalization RMSNorm", "--disable-bias-linear", "--swiglu"))
    assert "--qk-layernorm" not in rope and "residual layout" in rope.split("torchrun")[0]
    gpt3 = plan_from_dict({"model": {"name": "gpt3-175b"}, "cluster": {"node": "dgx-a100-80gb", "nodes": 16},
                           "parallel": {"tp": 8, "pp": 16}, "training": {"global_batch": 64}})
    text = export_plan(gpt3, "megatron")
    assert "# The block: layernorm, linear biases all, gelu MLP" in text   # Megatron's defaults
    assert "--normalization" not in text.split("torchrun")[1] and "--swiglu" not in text.split("torchrun")[1]
    assert "# The block: layernorm" in export_plan(gpt3, "slurm")


def test_the_model_options_come_first_in_megatron_args():
    plan = _plan({"tp": 2, "dp": 4})
    model = megatron_model_args(plan)
    assert megatron_args(plan)[:len(model)] == model
