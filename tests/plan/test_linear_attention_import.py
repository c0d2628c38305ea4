"""Qwen3-Next and Qwen3.5 (issue 55): their Gated DeltaNet layers are imported, not refused, to
transformers' own parameter count; the YAML section is checked field by field in one sentence;
what no stack runs (cp over the recurrence, torchtitan's op SAC, serving, the exports, the executor)
is refused in one sentence.

The reference counts are transformers 5.24.0's (the .venv-interop venv), each model built from
the fixture on the meta device and counted: ``sum(p.numel() for p in Model(Config(**cfg)).parameters())``
with Qwen3NextForCausalLM / Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM (the text config of a wrapper);
the active count is the total less the routed experts' tensors plus top_k / experts of them."""
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from executors.support import check_executable
from simcore.model.workload import active_params_per_token, param_counts
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.rules import check_plan
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "examples" / "hf"
SOURCES = yaml.safe_load((HF / "SOURCES.yaml").read_text())

#: (fixture, transformers' total, transformers' active per token), from SOURCES.yaml.
TRANSFORMERS = [("qwen3-next-80b-a3b", 79_674_391_296, 3_874_929_408),
                ("qwen3.5-35b-a3b", 34_660_610_688, 3_454_988_928),
                ("qwen3.5-27b", 25_377_789_952, 25_377_789_952)]


def _plan(name: str, **kw):
    doc, _ = import_plan(hf=str(HF / name / "config.json"), cluster="dgx-h100", nodes=1, **kw)
    return plan_from_dict(doc), doc


@pytest.mark.parametrize("name, total, active", TRANSFORMERS)
def test_the_import_counts_what_transformers_builds(name, total, active):
    assert SOURCES[name].get("hf_params", SOURCES[name].get("lm_params")) == total
    m = _plan(name)[0].model
    assert param_counts(m).total == pytest.approx(total, rel=2e-4)   # q/k norms and the shared-expert gate left out
    assert active_params_per_token(m) == pytest.approx(active, rel=2e-4)


def test_the_linear_layers_are_three_in_four_with_their_widths():
    m = _plan("qwen3-next-80b-a3b")[0].model
    la = m.linear_attention
    assert la.layers == tuple(i for i in range(48) if (i + 1) % 4)   # full_attention_interval 4
    assert (la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim, la.conv_kernel_dim) == \
        (16, 32, 128, 128, 4)
    assert la.attn_output_gate and (m.experts, m.top_k, m.shared_ffn_hidden) == (512, 10, 512)
    moe = _plan("qwen3.5-35b-a3b")[0].model   # from layer_types
    assert len(moe.linear_attention.layers) == 30 and 3 not in moe.linear_attention.layers


def test_without_the_hybrid_layers_the_count_is_off_by_more_than_the_tolerance():
    """Pricing Qwen3-Next as 48 gated-attention layers misses its Gated DeltaNet mixers: 36 x (the
    mixer's 11,616,384 less the gated attention's 6,291,456 + 2 x 2048 x 512 + ... = 5,373,952)."""
    m = _plan("qwen3-next-80b-a3b")[0].model
    plain = replace(m, linear_attention=replace(m.linear_attention, layers=()))
    h = 2048
    mixer = h * (2 * 2048 + 2 * 4096 + 2 * 32) + (2 * 2048 + 4096) * 4 + 2 * 32 + 128 + 4096 * h
    attention = h * (16 * 256 * 2 + 2 * 2 * 256) + 16 * 256 * h + 2 * 256   # and its q_norm/k_norm (qk_norm: head)
    assert param_counts(m).total - param_counts(plain).total == 36 * (mixer - attention)
    assert (param_counts(m).total - param_counts(plain).total) / 79_674_391_296 > 2e-3


def test_the_plan_round_trips_through_yaml():
    plan, _ = _plan("qwen3-next-80b-a3b")
    doc = plan_to_dict(plan)
    assert doc["model"]["linear_attention"]["layers"][:3] == [0, 1, 2]
    again = plan_from_dict(yaml.safe_load(yaml.safe_dump(doc)))
    assert again.model == plan.model


@pytest.mark.parametrize("section, words", [
    ({"layers": [0, 0]}, "model.linear_attention.layers must be increasing layer indices from 0 to model.layers-1=47"),
    ({"layers": [0, 48]}, "model.linear_attention.layers must be increasing"),
    ({"layers": "0,1"}, "model.linear_attention.layers must be a list of layer indices"),
    ({"layers": [0], "num_key_heads": 0}, "model.linear_attention needs num_key_heads, num_value_heads"),
    ({"layers": [0], "num_key_heads": -1}, "model.linear_attention.num_key_heads must be a whole number"),
    ({"layers": [0], "attn_output_gate": "yes"}, "model.linear_attention.attn_output_gate must be true or false"),
    ({"layers": [0], "heads": 4}, "unknown field 'model.linear_attention.heads'"),
    ([0, 1], "model.linear_attention must be a mapping"),
])
def test_a_bad_section_is_one_sentence_naming_the_field(section, words):
    _, doc = _plan("qwen3-next-80b-a3b")
    full = {"num_key_heads": 16, "num_value_heads": 32, "key_head_dim": 128, "value_head_dim": 128,
            "conv_kernel_dim": 4}
    doc["model"]["linear_attention"] = {**full, **section} if isinstance(section, dict) else section
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace("[", r"\[")) as err:
        plan_from_dict(doc)
    assert str(err.value).count(". ") == 0


@pytest.mark.parametrize("change, words", [
    ({"parallel": {"cp": 2, "dp": 4}}, "parallel.cp=2 is refused for a model with Gated DeltaNet layers"),
    ({"parallel": {"tp": 2, "dp": 4}}, r"parallel.tp=2 does not divide model.linear_attention's heads \(1 key"),
    ({"training": {"recompute": "op"}}, "training.recompute=op is torchtitan's per-op SAC"),
])
def test_what_no_stack_runs_is_refused(change, words):
    _, doc = _plan("qwen3-next-80b-a3b")
    doc["model"]["linear_attention"]["num_key_heads"] = 1 if "tp" in change.get("parallel", {}) else 16
    for section, fields in change.items():
        doc[section].update(fields)
    with pytest.raises(PlanError, match=words):
        plan_from_dict(doc)


@pytest.mark.parametrize("target", ["megatron", "slurm", "torchtitan", "torchtitan-0.2", "deepspeed", "slurm-trainplan"])
def test_no_export_writes_another_model(target):
    plan, _ = _plan("qwen3.5-27b")
    with pytest.raises(ValueError, match=r"model.linear_attention=\(Gated DeltaNet layers, gated attention\) has no"):
        export_plan(plan, target)


def test_the_executor_and_serving_refuse_the_hybrid_model(tmp_path):
    plan, _ = _plan("qwen3.5-27b")
    with pytest.raises(ValueError, match="model.linear_attention is priced, not run"):
        check_executable(plan, "cpu")
    serving = tmp_path / "serve.yaml"
    serving.write_text(yaml.safe_dump({"model": {"hf_config": str(HF / "qwen3.5-27b" / "config.json"), "seq_len": 4096},
                                       "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 8, "replicas": 1},
                                       "traffic": {"arrival": "offline", "num_requests": 10, "prompt_len": 100,
                                                   "output_len": 100}}))
    run = subprocess.run([sys.executable, "-m", "trainplan", "serve", str(serving)], capture_output=True, text=True,
                         cwd=ROOT)
    assert run.returncode == 2 and "model.linear_attention is refused for serving" in run.stderr, run.stderr


def test_the_commands_run_on_an_imported_qwen3_next(tmp_path):
    plan_file = tmp_path / "qn.yaml"
    run = subprocess.run([sys.executable, "-m", "trainplan", "import", "--hf", str(HF / "qwen3-next-80b-a3b" / "config.json"),
                          "--cluster", "dgx-h100", "--nodes", "2", "--seq-len", "4096"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    doc = yaml.safe_load(run.stdout)
    doc["parallel"] = {"dp": 16, "ep": 8, "zero": 1}
    doc["training"].update(global_batch=128, recompute="selective")
    plan_file.write_text(yaml.safe_dump(doc))
    check_plan(plan_from_dict(doc))
    for args in (["simulate", "--json"], ["simulate", "--engine", "des", "--json"], ["memory"], ["collectives"]):
        out = subprocess.run([sys.executable, "-m", "trainplan", args[0], str(plan_file), *args[1:]],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, (args, out.stderr)
    result = json.loads(subprocess.run([sys.executable, "-m", "trainplan", "simulate", str(plan_file), "--json"],
                                       capture_output=True, text=True, cwd=ROOT, check=True).stdout)
    assert result["step_time_s"] > 0 and 0 < result["mfu"] < 1
