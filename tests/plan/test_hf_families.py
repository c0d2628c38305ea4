"""Real Hugging Face configs import to the model they mean (examples/hf/, sources and
published sizes in examples/hf/SOURCES.yaml): parameter counts within 1% of the published
size, MoE and multi-latent attention read field by field, head_dim honoured, the context
length never taken for the training sequence, and a README-style import that fits."""
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from simcore.model.step_costs import memory_report
from simcore.model.workload import active_params_per_token, forward_flops_per_layer, param_counts
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "examples" / "hf"
SOURCES = yaml.safe_load((HF / "SOURCES.yaml").read_text())
FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "gemma2", "deepseek_v3", "phi3", "gpt2")


def _import(name: str, **kw):
    doc, warnings = import_plan(hf=str(HF / name / "config.json"), cluster="dgx-h100", nodes=1, **kw)
    return plan_from_dict(doc), doc, warnings


def _published_precision(value: float) -> float:
    """Half a unit of the last digit a published figure gives (14e9 -> 0.5e9, 12.9e9 -> 0.05e9)."""
    digits = len(f"{value:.6g}".replace(".", "").split("e")[0].rstrip("0"))
    return 0.5 * 10 ** (math.floor(math.log10(value)) - digits + 1)


def test_every_family_the_issue_names_has_a_fixture():
    types = {json.loads((HF / n / "config.json").read_text())["model_type"] for n in SOURCES}
    assert set(FAMILIES) <= types
    assert sorted(SOURCES) == sorted(p.parent.name for p in HF.glob("*/config.json"))


@pytest.mark.parametrize("name", sorted(n for n in SOURCES if "params" in SOURCES[n]))
def test_imported_parameter_count_is_the_published_size(name):
    plan, _, _ = _import(name)
    published = float(SOURCES[name]["params"])
    assert param_counts(plan.model).total == pytest.approx(published, rel=0.01)
    if "active" in SOURCES[name]:   # less the vocabulary tables the publisher leaves out (gpt-oss, GLM, Kimi)
        active = float(SOURCES[name]["active"])
        ours = active_params_per_token(plan.model) - plan.model.vocab * plan.model.hidden * len(
            SOURCES[name].get("active_excludes", []))
        assert abs(ours - active) <= _published_precision(active) + 0.01 * active


def test_qwen2_moe_reads_expert_width_and_the_shared_expert():
    m, _, _ = _import("qwen2-57b-a14b")
    assert (m.model.experts, m.model.top_k, m.model.ffn_hidden, m.model.shared_ffn_hidden) == (64, 8, 2560, 20480)
    # ignoring moe_intermediate_size (18944-wide experts) and the shared expert gave ~367 B (issue 27)
    wrong = replace(m.model, ffn_hidden=18944, shared_ffn_hidden=0)
    assert param_counts(wrong).total > 6 * param_counts(m.model).total


def test_deepseek_v3_is_mla_with_shared_experts_and_first_dense_layers():
    m = _import("deepseek-v3")[0].model
    assert (m.kv_lora_rank, m.q_lora_rank, m.kv_channels, m.qk_rope_head_dim, m.v_head_dim) == (512, 1536, 128, 64, 128)
    assert (m.experts, m.top_k, m.dense_layers, m.shared_ffn_hidden, m.dense_ffn_hidden) == (256, 8, 3, 2048, 18432)
    # the first three layers are dense: an all-MoE count has 3 x (MoE MLP - dense MLP) too many
    h = 7168
    moe_mlp = 256 * 3 * h * 2048 + 256 * h + 3 * h * 2048   # routed experts, router, shared expert
    all_moe = replace(m, dense_layers=0)
    assert param_counts(all_moe).total - param_counts(m).total == 3 * (moe_mlp - 3 * h * 18432)


@pytest.mark.parametrize("name, width", [("gemma2-9b", 256), ("qwen3-32b", 128), ("llama3.2-1b", 64)])
def test_head_dim_sets_the_attention_width(name, width):
    m = _import(name)[0].model
    assert m.head_dim == width
    ignored = replace(m, kv_channels=0)  # hidden // heads, as before issue 27
    if ignored.head_dim != width:
        assert param_counts(ignored).total < 0.99 * param_counts(m).total
        assert forward_flops_per_layer(ignored, 1, 4096) < forward_flops_per_layer(m, 1, 4096)


def test_the_context_length_is_not_the_training_sequence():
    plan, doc, warnings = _import("llama3.1-8b")
    assert plan.model.seq_len == 8192 and doc["model"]["seq_len"] == 8192
    assert any("max_position_embeddings=131072" in w and "--seq-len" in w for w in warnings)
    plan, _, warnings = _import("llama3.1-8b", seq_len=4096)
    assert plan.model.seq_len == 4096 and not any("max_position_embeddings" in w for w in warnings)
    assert _import("gpt2")[0].model.seq_len == 1024  # learned positions: the table's size


def test_a_config_without_a_context_length_takes_the_sequence_the_user_gives(tmp_path):
    cfg = json.loads((HF / "llama3.1-8b" / "config.json").read_text())
    del cfg["max_position_embeddings"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    doc, _ = import_plan(hf=str(path), cluster="dgx-h100", nodes=1, seq_len=4096)
    assert plan_from_dict(doc).model.seq_len == 4096
    with pytest.raises(PlanError, match=r"^model.seq_len is not given by any input .*pass seq_len= \(--seq-len\)$"):
        import_plan(hf=str(path), cluster="dgx-h100", nodes=1)
    base = {"cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"dp": 8}, "training": {"global_batch": 8}}
    assert plan_from_dict({**base, "model": {"hf_config": str(path), "seq_len": 2048}}).model.seq_len == 2048
    with pytest.raises(PlanError, match=r"gives no context length \(max_position_embeddings\): give model.seq_len$"):
        plan_from_dict({**base, "model": {"hf_config": str(path)}})


def test_an_hf_import_defaults_to_a_run_that_fits():
    plan, doc, warnings = _import("llama3.1-8b")
    assert doc["training"]["flash_attention"] is True and doc["training"]["recompute"] == "selective"
    assert doc["parallel"]["zero"] == 3 and any("defaults" in w for w in warnings)
    report = memory_report(plan)
    assert report["fits"] and report["memory_per_gpu_gib"] < 80


def test_other_inputs_override_the_hf_run_defaults():
    cmd = ("pretrain_gpt.py --tensor-model-parallel-size 2 --recompute-granularity full --recompute-method uniform "
           "--recompute-num-layers 1 --attention-backend unfused")
    doc, _ = import_plan(hf=str(HF / "llama3-8b" / "config.json"), megatron=cmd, cluster="dgx-h100", nodes=1)
    assert doc["parallel"]["zero"] == 0 and doc["training"]["recompute"] == "full"
    assert doc["training"]["flash_attention"] is False


def test_sparse_layers_that_are_not_a_dense_prefix_are_the_moe_layers(tmp_path):
    """Qwen2-MoE's ``decoder_sparse_step`` 2 (modeling_qwen2_moe.py: layer i sparse when (i + 1) % 2
    == 0): the odd layers are MoE, the even ones a dense MLP ``intermediate_size`` wide, each priced so."""
    cfg = json.loads((HF / "qwen2-57b-a14b" / "config.json").read_text())
    cfg["decoder_sparse_step"] = 2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc, _ = import_plan(hf=str(tmp_path / "config.json"), cluster="dgx-h100")
    m = plan_from_dict(doc).model
    assert m.moe_layers == tuple(range(1, cfg["num_hidden_layers"], 2)) and "dense_layers" not in doc["model"]
    full = plan_from_dict(import_plan(hf=str(HF / "qwen2-57b-a14b" / "config.json"), cluster="dgx-h100")[0]).model
    pc = param_counts(m)
    assert pc.dense_layers == cfg["num_hidden_layers"] // 2 and pc.dense_mlp == 3 * m.hidden * cfg["intermediate_size"]
    assert param_counts(full).total - pc.total == pytest.approx(
        pc.dense_layers * (pc.per_layer - pc.attention - pc.norms - pc.dense_mlp))


def test_check_and_simulate_json_show_the_parameter_counts(tmp_path):
    doc, _ = import_plan(hf=str(HF / "mixtral-8x7b" / "config.json"), cluster="dgx-h100", nodes=1)
    path = tmp_path / "mixtral.yaml"
    path.write_text(yaml.safe_dump(doc))
    run = lambda *a: subprocess.run([sys.executable, "-m", "trainplan", *a, str(path), "--json"],  # noqa: E731
                                    capture_output=True, text=True, cwd=ROOT, check=True).stdout
    derived = json.loads(run("check"))["derived"]
    assert round(derived["params_total"] / 1e9, 1) == 46.7 and round(derived["params_active"] / 1e9, 1) == 12.9
    sim = json.loads(run("simulate"))
    assert sim["params_total"] == derived["params_total"] and sim["params_active"] == derived["params_active"]
