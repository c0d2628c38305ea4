"""Multimodal wrappers and uneven layers (issue 55): the language model is read from
``text_config`` as transformers reads it (class defaults for the fields left out), its
count is within 0.5% of the architecture's, worked out by hand below; a field the plan's
model cannot state is refused in one sentence naming it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simcore.model.workload import active_params_per_token, param_counts
from simcore.plan.hf_config import hf_import_notes
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "examples" / "hf"
SOURCES = yaml.safe_load((HF / "SOURCES.yaml").read_text())


def _model(name: str, path: Path | None = None):
    doc, _ = import_plan(hf=str(path or HF / name / "config.json"), cluster="dgx-h100", nodes=1)
    return plan_from_dict(doc).model


def _llama4_scout() -> int:
    """Llama 4 Scout (modeling_llama4.py): 48 layers, each GQA attention (40 x 128 query,
    8 x 128 key/value), 16 SwiGLU experts 8192 wide + a router + one shared expert 8192 wide,
    two RMSNorms; untied 202048-token embedding and head. The qk-norm is an L2 norm, no weights."""
    h, layers, vocab = 5120, 48, 202048
    attention = h * 40 * 128 * 2 + h * 8 * 128 * 2
    moe = 16 * 3 * h * 8192 + h * 16 + 3 * h * 8192
    return layers * (attention + moe + 2 * h) + 2 * vocab * h + h


def _llama4_maverick() -> int:
    """Llama 4 Maverick (modeling_llama4.py): Scout's attention and norms on 48 layers; the 24 odd
    layers (``moe_layers``) 128 SwiGLU experts 8192 wide + a router + one shared expert 8192 wide,
    the 24 even ones one SwiGLU MLP ``intermediate_size_mlp`` = 16384 wide."""
    h, vocab = 5120, 202048
    attention = h * 40 * 128 * 2 + h * 8 * 128 * 2
    moe = 128 * 3 * h * 8192 + h * 128 + 3 * h * 8192
    dense = 3 * h * 16384
    return 24 * (attention + moe + 2 * h) + 24 * (attention + dense + 2 * h) + 2 * vocab * h + h


def _gemma3_27b() -> int:
    """Gemma 3 27B (modeling_gemma3.py): 62 layers of attention (32 x 128 query, 16 x 128
    key/value, q/k RMSNorm of 128), a GeGLU MLP 21504 wide and four RMSNorms; the tied
    embedding is Gemma3TextConfig's default 262208 tokens."""
    h, layers, vocab = 5376, 62, 262_208
    attention = h * 32 * 128 * 2 + h * 16 * 128 * 2 + 2 * 128
    return layers * (attention + 3 * h * 21504 + 4 * h) + vocab * h + h


def _gemma4_26b_a4b() -> int:
    """Gemma 4 26B-A4B (modeling_gemma4.py): 30 layers, each a 2112-wide GeGLU MLP beside 128
    experts 704 wide and a router; 25 sliding layers attend with 16 x 256 query and 8 x 256
    key/value heads, the 5 full-attention ones with 16 x 512 query heads and 2 x 512 key heads
    whose keys are the values (attention_k_eq_v); the embedding is tied. Norms and router
    scales (under 0.01%) are left out."""
    h, vocab = 2816, 262_144
    mlp = 3 * h * 2112 + 128 * 3 * h * 704 + h * 128
    sliding = h * 16 * 256 * 2 + h * 8 * 256 * 2
    full = h * 16 * 512 * 2 + h * 2 * 512
    return 25 * (sliding + mlp) + 5 * (full + mlp) + vocab * h


@pytest.mark.parametrize("name, count", [("llama4-scout", _llama4_scout()), ("llama4-maverick", _llama4_maverick()),
                                         ("gemma3-27b", _gemma3_27b()),
                                         ("gemma4-26b-a4b", _gemma4_26b_a4b())])
def test_the_language_model_of_a_wrapper_is_imported_to_its_count(name, count):
    assert SOURCES[name]["lm_params"] == count
    assert param_counts(_model(name)).total == pytest.approx(count, rel=0.005)


def test_llama4_scout_has_its_shared_expert_and_all_moe_layers():
    m = _model("llama4-scout")
    assert (m.experts, m.top_k, m.ffn_hidden, m.shared_ffn_hidden, m.dense_layers) == (16, 1, 8192, 8192, 0)
    assert param_counts(m).total == _llama4_scout()   # exact: nothing of Scout's weights is dropped
    assert abs(active_params_per_token(m) - 17e9) < 0.5e9


def test_llama4_maverick_alternates_dense_and_moe_layers():
    """Its 24 MoE layers are the odd ones (transformers' ``moe_layers``): every per-layer figure
    prices the even ones as its dense MLP, and 17B parameters run per token (model card)."""
    m = _model("llama4-maverick")
    assert m.moe_layers == tuple(range(1, 48, 2)) and m.dense_count == 24 and m.dense_ffn_hidden == 16384
    assert [m.is_dense_layer(i) for i in range(4)] == [True, False, True, False]
    assert abs(active_params_per_token(m) - 17e9) < 0.5e9


def test_gemma_reads_transformers_defaults_and_its_moe_names():
    g3 = _model("gemma3-27b")
    assert (g3.vocab, g3.tied_embeddings, g3.gated_mlp, g3.kv_channels) == (262_208, True, True, 128)
    assert g3.sliding_window == 1024 and g3.sliding_window_layers == pytest.approx(5 / 6)
    g4 = _model("gemma4-26b-a4b")
    assert (g4.experts, g4.top_k, g4.ffn_hidden, g4.shared_ffn_hidden) == (128, 8, 704, 2112)


@pytest.mark.parametrize("kinds, sentence", [
    (["linear_attention", "sliding_attention"], r"layer_types mixes sliding_attention and linear_attention layers"),
    (["linear_attention", "mamba"], r"layer_types has mamba layers, which the plan's model cannot state"),
])
def test_a_wrapper_the_plan_cannot_state_is_refused_naming_the_field(tmp_path, kinds, sentence):
    cfg = json.loads((HF / "qwen3.5-27b" / "config.json").read_text())
    cfg["text_config"]["layer_types"] = (kinds * 32)[:64]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PlanError, match=sentence) as err:
        _model("", tmp_path / "config.json")
    assert "lacks the field" not in str(err.value) and str(err.value).count(". ") == 0


@pytest.mark.parametrize("field, value, words", [
    ("hidden_size_per_layer_input", 256, "hidden_size_per_layer_input=256"),
    ("global_head_dim", 2048, r"global_head_dim=2048 changes the parameters by \+"),
])
def test_gemma4_fields_that_change_the_count_are_refused(tmp_path, field, value, words):
    cfg = json.loads((HF / "gemma4-26b-a4b" / "config.json").read_text())
    cfg["text_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PlanError, match=words):
        _model("", tmp_path / "config.json")


def test_the_import_says_the_vision_tower_is_not_modelled_and_prints_the_count():
    notes = hf_import_notes(HF / "llama4-scout" / "config.json")
    assert notes[0].startswith("the vision tower (vision_config) is not modelled")
    assert any("text_config:" in n and "attention_chunk_size" in n for n in notes)
    run = subprocess.run([sys.executable, "-m", "trainplan", "import", "--hf", "examples/hf/gemma3-27b/config.json",
                          "--cluster", "dgx-h100"], capture_output=True, text=True, cwd=ROOT, check=True)
    assert yaml.safe_load(run.stdout)["model"]["layers"] == 62
    assert f"built {param_counts(_model('gemma3-27b')).total:,} parameters" in run.stderr
    assert "vision tower" in run.stderr


def test_gemma4_says_its_full_attention_layers_are_priced_with_the_sliding_shape():
    """Gemma 4's wider full-attention heads are within 0.5% of the parameters, so the import
    takes them, but it must say so (transformers' count is 0.29% above the plan's)."""
    from simcore.plan.hf_config import hf_import_notes

    notes = hf_import_notes(HF / "gemma4-26b-a4b" / "config.json")
    line = next(n for n in notes if n.startswith("priced with the sliding layers' attention shape"))
    assert "global_head_dim=512" in line and "0.29% more parameters than priced" in line


@pytest.mark.parametrize("model, transformers", [("gemma2-9b", 9_241_705_984), ("gemma3-27b", 27_009_346_304)])
def test_gemma_says_its_sandwich_norms_are_not_modelled_and_how_many_parameters_they_hold(model, transformers):
    """Gemma's layers have four RMSNorms, the plan's two: the import says so, and the parameters it names
    are what trainplan's count lacks against transformers 5.24.0's (tests/plan/consumers/test_hf_counts.py)."""
    notes = hf_import_notes(HF / model / "config.json")
    said = [n for n in notes if n.startswith("not modelled: the pre- and post-feedforward RMSNorms")]
    assert len(said) == 1
    assert f"({transformers - param_counts(_model(model)).total:,} parameters" in said[0]


def test_plan_with_a_config_json_says_what_the_import_says(capsys, tmp_path):
    """``trainplan plan --model config.json`` builds the model ``trainplan import`` builds, and says the same
    of what it leaves out (the vision tower, the fields no Plan field holds, Gemma's extra norms)."""
    from trainplan.cli import main

    assert main(["plan", "--model", str(HF / "gemma3-27b" / "config.json"), "--cluster", "dgx-h100", "--nodes", "1",
                 "--global-batch", "8", "--seq-len", "2048", "--jobs", "1", "--top-k", "0", "--rows", "1",
                 "--out", str(tmp_path / "best.yaml")]) == 0
    err = capsys.readouterr().err
    assert "the vision tower (vision_config) is not modelled" in err
    assert "not mapped to the plan:" in err and "pre- and post-feedforward RMSNorms" in err


def test_a_plan_file_naming_a_config_json_says_it_too(capsys, tmp_path):
    """``check`` and ``simulate`` of a Plan whose model is ``hf_config: cfg/config.json`` (relative to the
    file, as the loader reads it) say what that model leaves out; a catalog model says nothing."""
    import shutil

    from trainplan.cli import main

    (tmp_path / "cfg").mkdir()
    shutil.copy(HF / "gemma3-27b" / "config.json", tmp_path / "cfg" / "config.json")
    plan = tmp_path / "plan.yaml"
    plan.write_text("model: {hf_config: cfg/config.json, seq_len: 2048}\ncluster: {node: dgx-h100, nodes: 1}\n"
                    "parallel: {tp: 8}\ntraining: {global_batch: 8, flash_attention: true}\n")
    for command in ("check", "simulate"):
        assert main([command, str(plan)]) == 0
        err = capsys.readouterr().err
        assert "the vision tower (vision_config) is not modelled" in err and "not mapped to the plan:" in err
    assert main(["check", str(ROOT / "plans" / "llama3-70b-h100.yaml")]) == 0
    assert "not mapped" not in capsys.readouterr().err
