"""Real DeepSpeed and torchtitan configs (examples/deepspeed/SOURCES.md, examples/torchtitan)
import to the Plan they mean, or are refused in one sentence naming the field."""
from pathlib import Path

import pytest

from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError

ROOT = Path(__file__).resolve().parents[2]
LLAMA = "examples/hf/llama3-8b/config.json"


def _import(**kw):
    return import_plan(cluster="dgx-h100", base_dir=ROOT, **kw)


def test_the_hugging_face_auto_template_imports():
    doc, warnings = _import(deepspeed="examples/deepspeed/hf_zero3_auto.json", hf=LLAMA, nodes=1)
    assert doc["parallel"]["zero"] == 3 and doc["training"]["offload"] == "optimizer+params"
    assert doc["training"]["precision"] == "bf16" and any("'auto'" in w for w in warnings)
    plan_from_dict(doc)


def test_megatron_deepspeed_config_with_its_megatron_layout():
    cmd = "pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2"
    doc, _ = _import(deepspeed="examples/deepspeed/megatron_deepspeed_ucp.json", megatron=cmd, hf=LLAMA, nodes=1)
    assert (doc["parallel"]["dp"], doc["parallel"]["zero"], doc["training"]["global_batch"]) == (2, 3, 16)
    # DeepSpeed's pipeline engine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
    with pytest.raises(PlanError, match="DeepSpeed's pipeline engine runs ZeRO-1 at most"):
        plan_from_dict(doc)
    doc, _ = _import(deepspeed="examples/deepspeed/megatron_deepspeed_ucp.json", hf=LLAMA, nodes=1,
                     megatron="pretrain_gpt.py --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1")
    assert (doc["parallel"]["dp"], doc["parallel"]["zero"], doc["parallel"]["zero_impl"]) == (4, 3, "deepspeed")
    plan_from_dict(doc)
    alone, _ = _import(deepspeed="examples/deepspeed/megatron_deepspeed_ucp.json", hf=LLAMA, nodes=1)
    with pytest.raises(PlanError, match=r"^training\.global_batch=16 is not a multiple of parallel\.dp\*"):
        plan_from_dict(alone)  # 8 data-parallel ranks x micro 4: as DeepSpeed's own batch assertion


def test_comments_trailing_commas_and_autotp():
    doc, _ = _import(deepspeed="examples/deepspeed/commented.hjson.json", hf=LLAMA, nodes=4)
    assert doc["parallel"] == {"tp": 2, "dp": 16, "zero": 2, "zero_impl": "deepspeed"}
    plan_from_dict(doc)


def test_torchtitan_preset_imports():
    doc, _ = _import(torchtitan="examples/torchtitan/llama3_8b.toml", nodes=8)
    assert doc["parallel"]["dp"] == 64 and doc["parallel"]["zero"] == 3
    assert doc["model"]["layers"] == 32 and doc["training"]["recompute"] == "selective"
    plan_from_dict(doc)


def test_torchtitan_stage_rule_is_torchtitans():
    with pytest.raises(PlanError, match=r"gives 5 virtual stages .* not a multiple of pipeline_parallel_degree=4"):
        _import(torchtitan="examples/torchtitan/llama3_70b_pp4.toml", nodes=4)
    text = (ROOT / "examples/torchtitan/llama3_70b_pp4.toml").read_text()
    doc, _ = _import(torchtitan=text.replace("layers_per_stage = 20", "layers_per_stage = 7"), nodes=4)
    # ceil(82 / 7) = 12 stages, 3 per rank; the extra layers go to the first stages
    # (82 = 12 x 6 + 10: the first ten stages take 7, less 1 on the first and the last for the
    # embedding and the output)
    assert doc["parallel"]["vpp"] == 3 and doc["parallel"]["stage_layers"] == [6] + [7] * 9 + [6, 5]


def _readme_imports() -> list[list[str]]:
    """The `trainplan import` commands of the README's import section, as argv."""
    import re
    import shlex

    text = (ROOT / "README.md").read_text()
    block = text.split("## Import and export", 1)[1].split("```", 2)[1]
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    return [shlex.split(ln.split(">")[0])[1:] for ln in lines if ln.startswith("trainplan import") and "$(" not in ln]


@pytest.mark.parametrize("argv", _readme_imports(), ids=lambda a: " ".join(a[:2]))
def test_the_readme_imports_work_as_written_and_fit(argv, capsys, monkeypatch):
    import yaml

    from simcore.model.step_costs import memory_report
    from trainplan.cli import main

    monkeypatch.chdir(ROOT)
    assert main(argv) == 0
    plan = plan_from_dict(yaml.safe_load(capsys.readouterr().out))
    assert memory_report(plan)["fits"]


@pytest.mark.parametrize("toml, nodes", [("llama3_8b.toml", 8), ("llama3_70b.toml", 8)])
@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
def test_every_torchtitan_example_round_trips(toml, nodes, target, tmp_path):
    """Import, export to torchtitan 0.3 (its torchrun command) or 0.2 (a job TOML), import again:
    the same Plan (issue 55); the HF config carries the model, as a user gives it beside the file."""
    import json

    from simcore.plan.load import plan_to_dict
    from simcore.plan.writers import export_plan, hf_config_from_model
    from tests.plan.test_interop import _held

    plan = plan_from_dict(_import(torchtitan=f"examples/torchtitan/{toml}", nodes=nodes)[0])
    (tmp_path / "config.json").write_text(json.dumps(hf_config_from_model(plan.model)))
    doc, _ = _import(torchtitan=export_plan(plan, target), hf=str(tmp_path / "config.json"), nodes=nodes)
    assert _held(plan_to_dict(plan_from_dict(doc)), target) == _held(plan_to_dict(plan), target)
