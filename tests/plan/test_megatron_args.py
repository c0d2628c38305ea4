"""Every Megatron-LM and Slurm export parses with Megatron-LM's own argument definitions
and passes the validate_args rules that matter (simcore/plan/megatron_args.yaml and
megatron_rules.yaml, each with the file and commit it was read from). Megatron-LM is not
installable from PyPI with its training arguments, so its parser is rebuilt from the data."""
import argparse
import math
import re
from pathlib import Path

import pytest
import yaml

from simcore.plan.interop import import_plan
from simcore.plan.megatron_reader import split_command
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan
from tests.plan.layouts import ALL, ROOT

DATA = ROOT / "simcore" / "plan"
ARGS = yaml.safe_load((DATA / "megatron_args.yaml").read_text())
RULES = yaml.safe_load((DATA / "megatron_rules.yaml").read_text())
_TYPES = {"int": int, "float": float}


def options_parser(*option_maps: dict) -> argparse.ArgumentParser:
    """argparse with a tool's option definitions as the data files hold them (``{option: {flag: true}
    | {type, nargs, choices}}``): flags, converters, nargs and choices, the maps in order."""
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False, add_help=False)
    for options in option_maps:
        for option, spec in options.items():
            if spec.get("flag"):
                parser.add_argument(option, action="store_true")
                continue
            kwargs = {"type": _TYPES.get(spec["type"], str)}
            if "nargs" in spec:
                kwargs["nargs"] = spec["nargs"]
            if "choices" in spec:
                kwargs["choices"] = [str(c) for c in spec["choices"]] if kwargs["type"] is str else spec["choices"]
            parser.add_argument(option, **kwargs)
    return parser


def megatron_parser() -> argparse.ArgumentParser:
    """argparse with Megatron's option definitions."""
    return options_parser(ARGS["options"])


PARSER = megatron_parser()


def parse_export(text: str) -> tuple[dict, dict, int]:
    """(arguments by dest, launch environment, world size) of a Megatron export."""
    pre, env, opts = split_command(text)
    tokens = [t for name, values in opts.items() for t in [name, *values]]
    try:
        namespace = PARSER.parse_args(tokens)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise AssertionError(f"Megatron's parser refuses the export: {exc}") from None
    args = {**RULES["defaults"], **{k: v for k, v in vars(namespace).items() if v not in (None, False)}}
    world = int(pre.get("--nnodes", 1)) * int(pre.get("--nproc-per-node", 1))
    return args, env, world


def broken_rules(text: str) -> list[str]:
    args, env, world = parse_export(text)
    scope = {**args, "env": env, "world_size": world}
    return [r["id"] for r in RULES["rules"] if eval(r["when"], {}, scope) and not eval(r["require"], {}, scope)]


EXPORTS = [(name, target) for name in sorted(ALL) for target in ("megatron", "slurm")]


def _export(name: str, target: str) -> str | None:
    try:
        return export_plan(ALL[name], target)
    except ValueError:
        return None


@pytest.mark.parametrize("name, target", EXPORTS)
def test_every_megatron_export_parses_and_passes_validate_args(name, target):
    text = _export(name, target)
    if text is None:  # refused with a sentence (test_interop checks the refusals)
        assert name in ("v-zero-bubble-cp", "v-zero3-paramoffload", "v-zero3-eager", "v-zero3-optim-in-bwd") \
            or name.startswith("v-ds-")   # DeepSpeed's own ZeRO: export it with --to deepspeed
        return
    assert broken_rules(text) == []
    args, _, world = parse_export(text)
    plan = ALL[name]
    assert world == plan.parallel.gpus
    assert (args["tensor_model_parallel_size"], args["pipeline_model_parallel_size"]) == (plan.parallel.tp,
                                                                                          plan.parallel.pp)
    assert args["sequence_parallel"] == plan.parallel.sequence_parallel


def test_the_data_names_its_source():
    for data in (ARGS, RULES):
        assert data["source"]["repo"] == "NVIDIA/Megatron-LM"
        assert re.fullmatch(r"[0-9a-f]{40}", data["source"]["commit"])
    assert len(ARGS["options"]) > 800 and all("file" in r and "line" in r for r in RULES["rules"])


def test_the_rules_catch_what_issue_27_found():
    plan = ALL["llama3-70b-h100"]  # tp 8
    text = export_plan(plan, "megatron")
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert broken_rules(text.replace("export CUDA_DEVICE_MAX_CONNECTIONS=1\n", "")) == ["cuda-device-max-connections"]
    fsdp = export_plan(ALL["llama3-8b-fsdp-h100"], "megatron")
    assert broken_rules(fsdp.replace("torchrun", "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun")) == ["fsdp-connections"]
    with pytest.raises(AssertionError, match="refuses"):
        parse_export(re.sub(r"--rotary-base (\d+)", r"--rotary-base \1.0", text))  # an int option
    with pytest.raises(AssertionError, match="refuses"):
        parse_export(text.replace("--tensor-model-parallel-size", "--tensor-model-paralel-size"))


def test_llama_and_moe_exports_are_what_megatron_needs():
    llama = parse_export(export_plan(ALL["v-interleaved-tp"], "megatron"))[0]
    assert llama["normalization"] == "RMSNorm" and llama["disable_bias_linear"] and llama["swiglu"]
    moe = parse_export(export_plan(ALL["v-qwen2-moe"], "megatron"))[0]
    assert moe["moe_expert_capacity_factor"] is None  # dropless, as the plan's balanced routing means
    assert (moe["moe_ffn_hidden_size"], moe["moe_shared_expert_intermediate_size"]) == (2560, 20480)
    assert moe["rotary_base"] == 1000000


# --------------------------------------------------------------------------- Megatron-LM's example scripts

SCRIPTS = ROOT / "examples" / "megatron"


@pytest.mark.parametrize("script, layout", [
    ("train_gpt3_175b_distributed.sh", {"tp": 8, "pp": 16, "dp": 1, "zero": 0}),
    ("train_llama3_8b_h100_fp8.sh", {"tp": 1, "pp": 1, "dp": 8, "zero": 1}),
    ("train_mixtral_8x7b_distributed.sh", {"tp": 1, "pp": 1, "dp": 2, "ep": 2, "zero": 1}),
])
def test_megatron_example_scripts_import(script, layout):
    nodes = 16 if "gpt3" in script else None  # the published script launches one node of its 128 GPUs
    doc, warnings = import_plan(megatron=str(SCRIPTS / script), cluster="dgx-h100", nodes=nodes)
    assert {k: doc["parallel"].get(k, 0 if k == "zero" else 1) for k in layout} == layout
    assert doc["parallel"].get("sequence_parallel") is not True  # --sequence-parallel at TP 1: off
    assert doc["training"]["flash_attention"] is True  # --attention-backend auto / fused
    assert any("sequence-parallel" in w for w in warnings) == ("gpt3" not in script)


def test_the_llama_example_is_the_model_and_precision_it_says():
    doc, _ = import_plan(megatron=str(SCRIPTS / "train_llama3_8b_h100_fp8.sh"), cluster="dgx-h100")
    m, tr = doc["model"], doc["training"]
    assert (m["layers"], m["hidden"], m["kv_heads"], m["ffn_hidden"], m["seq_len"], m["vocab"]) == (
        32, 4096, 8, 14336, 8192, 128256)
    assert m["kv_channels"] == 128 and m["rope_base"] == 1000000
    assert tr["precision"] == "fp8" and tr["global_batch"] == 128
    assert tr["grad_compression"] == "bf16"  # --grad-reduce-in-bf16: the distributed optimizer's wire dtype


def test_a_one_line_command_longer_than_a_file_name_is_text():
    text = " ".join(ln.strip(" \\") for ln in export_plan(ALL["gpt3-175b-a100"], "megatron").splitlines()
                    if not ln.startswith(("#", "export")))
    assert len(text.encode()) > 255 and "\n" not in text
    doc, _ = import_plan(megatron=text, cluster="dgx-a100-80gb")
    assert doc["parallel"]["tp"] == 8 and math.prod([doc["parallel"][k] for k in ("tp", "pp", "dp")]) == 1536
    with pytest.raises(PlanError, match="cannot be read: no such file"):
        import_plan(megatron="missing/pretrain.sh", cluster="dgx-a100-80gb")
    assert Path(SCRIPTS / "README.md").read_text().count("commit") >= 3


def test_a_layout_export_passes_validate_args_and_reads_back_stage_for_stage():
    """A split Megatron has no first/last option for is written as --pipeline-model-parallel-layout,
    without --num-virtual-stages-per-pipeline-rank (arguments.py @d98e8a64: at most one of them)."""
    from simcore.plan.load import plan_from_dict

    stages = (2,) + (4,) * 31
    plan = plan_from_dict({"model": {"name": "llama3-405b", "seq_len": 8192},
                           "cluster": {"node": "dgx-h100", "nodes": 64},
                           "parallel": {"tp": 8, "pp": 16, "dp": 4, "vpp": 2, "zero": 1, "sequence_parallel": True,
                                        "schedule": "interleaved-1f1b", "stage_layers": list(stages)},
                           "training": {"global_batch": 64, "micro_batch": 1, "flash_attention": True}})
    text = export_plan(plan, "megatron")
    assert broken_rules(text) == []
    args, _, _ = parse_export(text)
    assert args["pipeline_model_parallel_layout"].startswith("Et*2|t*4|")
    assert args["num_virtual_stages_per_pipeline_rank"] is None
    doc, _ = import_plan(megatron=text, cluster="dgx-h100", nodes=64)
    back = plan_from_dict(doc)
    assert back.layers_per_stage == stages and back.parallel.vpp == 2
