"""torchtitan 0.3's ``--config NAME`` read from its config registry (simcore/plan/torchtitan_configs.yaml,
dumped by bench/dump_torchtitan_configs.py), the command's overrides on top, torchrun's node count read
(issue 55, item 3)."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from simcore.plan.interop import import_plan
from simcore.plan.spec import PlanError
from simcore.plan.torchtitan_reader import load_torchtitan_configs, read_torchtitan

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = "torchrun --nnodes 2 --nproc-per-node 8 -m torchtitan.train --module llama3 --config "


def _dump_script():
    spec = importlib.util.spec_from_file_location("dump_tt", ROOT / "bench" / "dump_torchtitan_configs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_llama3_70b_takes_the_registry_values_and_the_torchrun_nodes():
    """torchtitan's own parser gives TP 8, sequence 8192, full recompute, local batch 8 for llama3_70b."""
    doc, _ = import_plan(torchtitan=LAUNCH + "llama3_70b", cluster="dgx-h100")
    assert doc["model"]["seq_len"] == 8192 and doc["model"]["layers"] == 80
    assert (doc["parallel"]["tp"], doc["parallel"]["dp"], doc["parallel"]["sequence_parallel"]) == (8, 2, True)
    assert doc["training"]["recompute"] == "full" and doc["training"]["micro_batch"] == 8
    assert doc["cluster"]["nodes"] == 2 and doc["training"]["global_batch"] == 16


def test_the_command_overrides_the_registry():
    text = LAUNCH + ("llama3_70b --parallelism.tensor-parallel-degree 4 --training.seq-len=4096 "
                     "--training.local-batch-size 2 activation-checkpoint:selective")
    doc, _ = import_plan(torchtitan=text, cluster="dgx-h100")
    assert (doc["parallel"]["tp"], doc["parallel"]["dp"], doc["model"]["seq_len"]) == (4, 4, 4096)
    assert (doc["training"]["recompute"], doc["training"]["micro_batch"]) == ("selective", 2)


def test_405b_runs_torchtitan_s_float8_rowwise_and_async_tp():
    f = read_torchtitan(LAUNCH + "llama3_405b").fields
    assert (f["training.precision"], f["training.fp8_recipe"]) == ("fp8", "rowwise")   # 0.3.0's default recipe
    assert f["parallel.tp_comm_overlap"] and f["training.kernels"] == "fused" and f["parallel.tp"] == 8


@pytest.mark.parametrize("launch, nodes, per_node", [
    ("torchrun --nnodes=4 --nproc_per_node=8 -m torchtitan.train", 4, 8),
    ("torchrun --nnodes 1:3 --nproc-per-node=4 -m torchtitan.train", 3, 4),
    ("torchrun --nproc_per_node=${NGPU} -m torchtitan.train", None, None),
])
def test_torchrun_world_forms(launch, nodes, per_node):
    r = read_torchtitan(launch + " --module llama3 --config llama3_8b")
    assert (r.hints.get("world.nnodes"), r.hints.get("world.gpus_per_node")) == (nodes, per_node)
    assert per_node or any("nproc_per_node" in k for k in r.ignored)


@pytest.mark.parametrize("text, words", [
    ("llama3_71b", r"^torchtitan --config llama3_71b is not a config of .*known: llama3_405b, llama3_70b, llama3_8b"),
    ("deepseek_v3_16b", r"^torchtitan --config deepseek_v3_16b is not a config of .*--module llama3"),
    ("llama3_debugmodel_float8_emulate_lora", r"^torchtitan --config \S+ \(.*\) applies LoRAConverter"),
    ("llama3_8b --training.dtype bfloat16", r"^torchtitan training.dtype=bfloat16 keeps .* no field for$"),
    ("llama3_8b activation-checkpoint:memory-budget", r"^torchtitan activation checkpointing memory-budget has no"),
])
def test_what_has_no_plan_field_is_refused_in_one_sentence(text, words):
    with pytest.raises(PlanError, match=words) as exc:
        read_torchtitan(LAUNCH + text)
    assert str(exc.value).count(". ") == 0


def test_mtp_layers_change_the_parameter_count_and_are_refused():
    with pytest.raises(PlanError, match=r"num_mtp_layers=1, which a Plan has no field for$"):
        read_torchtitan("-m torchtitan.train --module deepseek_v3 --config deepseek_v3_debugmodel_mtp")


def test_harmless_registry_options_are_listed_as_not_mapped():
    r = read_torchtitan(LAUNCH.replace("llama3 ", "llama3 ") + "llama3_debugmodel_varlen_attn")
    assert "llama3_debugmodel_varlen_attn.model.attn_backend=varlen" in r.ignored
    assert "model.config" not in r.ignored and not any(k.startswith("training.steps") for k in r.ignored)


def test_newer_torchtitan_spellings_read_as_0_3_s():
    text = LAUNCH + ("llama3_8b --training.max-context-length 4096 "
                     "--training.num-tokens-per-microbatch-per-dp-rank 16384")
    f = read_torchtitan(text).fields
    assert (f["model.seq_len"], f["training.micro_batch"]) == (4096, 4)


def test_every_registry_entry_names_its_file_and_commit():
    reg = load_torchtitan_configs()
    assert reg["version"] == "0.3.0" and re.fullmatch(r"[0-9a-f]{40}", reg["commit"])
    for name, entry in reg["configs"].items():
        path, _, commit = entry["source"].partition("@")
        assert path == f"torchtitan/models/{entry['module']}/config_registry.py" and commit == reg["commit"], name
    assert {"llama3_8b", "llama3_70b", "llama3_405b", "deepseek_v3_671b", "qwen3_32b"} <= set(reg["configs"])


REGISTRY = '''
def llama3_big() -> Trainer.Config:
    config = llama3_base()
    config.parallelism.pipeline_parallel_degree = 4
    config.model_spec = model_registry("70B", converters=[Float8LinearConverter.Config(filter_fqns=["lm_head"])])
    return config


def llama3_base() -> Trainer.Config:
    model_spec = model_registry("8B", attn_backend="flex")
    return Trainer.Config(
        model_spec=model_spec,
        training=TrainingConfig(num_tokens_per_microbatch_per_dp_rank=2 * 8192, max_context_length=8192),
        parallelism=ParallelismConfig(tensor_parallel_degree=8),
        activation_checkpoint=FullAC.Config(),
        compile=CompileConfig(enable=True),
    )
'''


def test_the_dump_reads_registry_functions_bases_and_renamed_keys():
    got = _dump_script().read_registry(REGISTRY)
    base, big = got["llama3_base"], got["llama3_big"]
    assert base["training"] == {"local_batch_size": 2, "seq_len": 8192}
    assert base["model_spec"] == {"flavor": "8B", "converters": [], "model_options": {"attn_backend": "flex"}}
    assert big["parallelism"] == {"tensor_parallel_degree": 8, "pipeline_parallel_degree": 4}
    assert big["model_spec"]["converters"] == [{"name": "Float8LinearConverter", "filter_fqns": ["lm_head"]}]
    assert big["activation_checkpoint"] == {"mode": "full"} and big["compile"] == {"enable": True}


def _plan_of(config: str, **training):
    from simcore.plan.load import plan_from_dict

    doc, _ = import_plan(torchtitan=LAUNCH + config, cluster="dgx-h100")
    doc["training"].update(training)
    if doc["training"].get("precision") != "fp8":
        doc["training"].pop("fp8_recipe", None)
    return plan_from_dict(doc)


def test_the_export_says_what_the_named_config_trains():
    """llama3_405b turns on float8 (rowwise) and async TP in its registry function, which the
    command line cannot undo for float8: a bf16 405B plan is refused in one sentence, its fp8
    rowwise twin exports and reads back the same; async TP is written off where the Plan has no
    TP overlap; an fp8 70B plan is refused (llama3_70b has no converter)."""
    from simcore.plan.load import plan_from_dict
    from simcore.plan.writers import export_plan

    fp8 = _plan_of("llama3_405b")
    text = export_plan(fp8, "torchtitan")
    assert "--config llama3_405b" in text and "no-enable-async" not in text
    doc, _ = import_plan(torchtitan=text, cluster="dgx-h100")
    again = plan_from_dict(doc)
    assert (again.training.precision, again.parallel.tp_comm_overlap) == (fp8.training.precision, True)
    bf16 = _plan_of("llama3_405b", precision="bf16")
    with pytest.raises(ValueError, match="training.precision=bf16 .*llama3_405b turns on float8"):
        export_plan(bf16, "torchtitan")
    no_overlap = plan_from_dict({**doc, "parallel": {**doc["parallel"], "tp_comm_overlap": False}})
    assert "--compile.no-enable-async-tensor-parallel" in export_plan(no_overlap, "torchtitan")
    with pytest.raises(ValueError, match="llama3_70b does not"):
        export_plan(_plan_of("llama3_70b", precision="fp8", fp8_recipe="rowwise"), "torchtitan")
