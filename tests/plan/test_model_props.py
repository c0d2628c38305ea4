"""Issue 55: the block's properties (model.norm, bias, activation, qk_norm, attention_sinks) read from
the configs, counted, written back by the Megatron export and read again, or refused in one sentence."""
import dataclasses
import json
import re

import pytest
import yaml

from simcore.model.params import param_counts
from simcore.plan.interop import import_plan
from simcore.plan.load import dump_plan, plan_from_dict
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan
from tests.plan.layouts import ROOT

HF = ROOT / "examples" / "hf"
BLOCK = ("norm", "bias", "activation", "qk_norm", "attention_sinks")


def _hf(model: str, nodes: int = 1):
    doc, _ = import_plan(hf=str(HF / model / "config.json"), cluster="dgx-h100", nodes=nodes)
    return plan_from_dict(doc)


def _block(plan) -> tuple:
    return tuple(getattr(getattr(plan.model, k), "value", getattr(plan.model, k)) for k in BLOCK)


@pytest.mark.parametrize("model, block", [
    ("gpt2", ("layernorm", "all", "gelu", "none", False)),          # GPT2Block: ln_1, Conv1D biases, gelu_new
    ("gpt-neox-20b", ("layernorm", "all", "gelu", "none", False)),  # rotary, yet LayerNorm and biases
    ("llama3-8b", ("rmsnorm", "none", "swiglu", "none", False)),
    ("qwen2-7b", ("rmsnorm", "qkv", "swiglu", "none", False)),      # Qwen2Attention: q, k, v biased, o not
    ("qwen3-8b", ("rmsnorm", "none", "swiglu", "head", False)),     # q_norm/k_norm over head_dim
    ("gemma2-9b", ("rmsnorm", "none", "geglu", "none", False)),     # hidden_activation gelu_pytorch_tanh
    ("gemma3-27b", ("rmsnorm", "none", "geglu", "head", False)),    # the text config's class default
    ("llama4-scout", ("rmsnorm", "none", "swiglu", "l2", False)),   # Llama4TextL2Norm: no parameters
    ("llama4-maverick", ("rmsnorm", "none", "swiglu", "none", False)),
])
def test_hf_configs_import_their_block(model, block):
    assert _block(_hf(model)) == block


def test_gpt_oss_imports_its_biases_sinks_and_clamped_glu(tmp_path):
    """GptOssConfig's defaults (transformers 5.24.0 configuration_gpt_oss.py): attention_bias, the experts'
    biases, ``sinks`` one per head, GptOssExperts' clamped GLU (alpha 1.702, limit 7)."""
    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 32,
           "num_experts_per_tok": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
           "attention_bias": True, "hidden_act": "silu", "swiglu_limit": 7.0, "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc, _ = import_plan(hf=str(tmp_path / "config.json"), cluster="dgx-h100", nodes=1)
    plan = plan_from_dict(doc)
    assert _block(plan) == ("rmsnorm", "all", "oss_glu", "none", True)
    plain = dataclasses.replace(plan.model, bias=plan.model.bias.NONE, attention_sinks=False)
    h, q, kv, f, e = 2880, 64 * 64, 8 * 64, 2880, 32
    # per layer: q/k/v and output biases, 64 sinks, each expert's fc1 and fc2 biases, the router's bias
    per_layer = q + 2 * kv + h + 64 + e * (2 * f + h) + e
    assert param_counts(plan.model).total - param_counts(plain).total == 24 * per_layer
    text = export_plan(plan, "megatron")
    for option in ("--quick-geglu", "--glu-linear-offset 1.0", "--activation-func-clamp-value 7.0",
                   "--softmax-type learnable"):
        assert option in text
    assert "--disable-bias-linear" not in text and "--swiglu" not in text


def test_a_transformers_5_config_gives_its_rope_base_and_says_what_it_leaves(tmp_path):
    """transformers 5 writes the RoPE base inside ``rope_parameters`` (``LlamaConfig(rope_theta=5e5).to_dict()``:
    ``{"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}``): the import reads it there, and
    lists ``rope_parameters`` as not mapped only where it scales the RoPE (GPT-OSS's YaRN), which no field states."""
    base = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192}
    yarn = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
            "original_max_position_embeddings": 4096, "rope_theta": 150000.0}
    plain = {"rope_theta": 500000.0, "rope_type": "default"}
    for rope, base_, listed in ((plain, 500000.0, False), (yarn, 150000.0, True)):
        (tmp_path / "config.json").write_text(json.dumps({**base, "rope_parameters": rope}))
        doc, warnings = import_plan(hf=str(tmp_path / "config.json"), cluster="dgx-h100", nodes=1)
        assert plan_from_dict(doc).model.rope_base == base_
        assert any("rope_parameters" in w for w in warnings) == listed


def test_counts_biases_and_norms_where_they_are():
    """Qwen2's q/k/v biases, Qwen3's q_norm/k_norm, GPT-NeoX's LayerNorm shifts and linear biases, each
    the count transformers 5.24.0 builds (tests/plan/consumers/test_hf_counts.py: now exact)."""
    assert param_counts(_hf("qwen2-7b").model).total == 7_615_616_512
    assert param_counts(_hf("qwen3-8b").model).total == 8_190_735_360
    assert param_counts(_hf("gpt-neox-20b").model).total == 20_554_567_680
    assert param_counts(_hf("gpt2").model).total == 124_439_808


@pytest.mark.parametrize("model, options", [
    ("qwen3-8b", ["--normalization RMSNorm", "--disable-bias-linear", "--qk-layernorm", "--swiglu"]),
    ("qwen2-7b", ["--normalization RMSNorm", "--disable-bias-linear", "--add-qkv-bias", "--swiglu"]),
    ("llama4-scout", ["--qk-l2-norm"]),
    ("gpt-neox-20b", []),   # Megatron's defaults: LayerNorm, biases, GeLU
])
def test_megatron_writes_the_block_and_reads_it_back(model, options):
    plan = _hf(model)
    text = export_plan(plan, "megatron")
    for option in options:
        assert option in text
    if model == "gpt-neox-20b":
        assert not re.search(r"--(normalization|disable-bias-linear|swiglu|qk-layernorm)\b", text)
    doc, _ = import_plan(megatron=text, cluster="dgx-h100", nodes=1)
    assert _block(plan_from_dict(doc)) == _block(plan)


@pytest.mark.parametrize("field, value", [
    ("norm", "layernorm"), ("norm", "rmsnorm"), ("bias", "none"), ("bias", "qkv"), ("bias", "all"),
    ("activation", "squared_relu"), ("activation", "gelu"), ("qk_norm", "head"), ("qk_norm", "l2"),
    ("attention_sinks", True),
])
def test_each_value_round_trips_through_megatron(field, value):
    doc = {"model": {"name": "t", "layers": 4, "hidden": 512, "heads": 8, "vocab": 32000, "seq_len": 1024,
                     "position_embedding": "rope", field: value},
           "cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"tp": 1}, "training": {"global_batch": 8}}
    plan = plan_from_dict(doc)
    back, _ = import_plan(megatron=export_plan(plan, "megatron"), cluster="dgx-h100", nodes=1)
    assert _block(plan_from_dict(back)) == _block(plan)
    written = yaml.safe_load(dump_plan(plan))
    assert plan_from_dict(written).model == plan.model   # plan_to_dict writes it where not the convention
    assert ("norm" in written["model"]) == (value == "layernorm") or field != "norm"


@pytest.mark.parametrize("model, field", [
    ({"name": "gemma2", "hf": "gemma2-9b"}, "model.activation=geglu"),
    ({"bias": "attention"}, "model.bias=attention"),
    ({"qk_norm": "projection"}, "model.qk_norm=projection"),
    ({"activation": "relu", "gated_mlp": False}, "model.activation=relu"),
])
def test_megatron_refuses_what_it_has_no_option_for_in_one_sentence(model, field):
    if "hf" in model:
        plan = _hf(model["hf"])
    else:
        base = {"name": "t", "layers": 4, "hidden": 512, "heads": 8, "vocab": 32000, "seq_len": 1024,
                "position_embedding": "rope", "gated_mlp": True}
        plan = plan_from_dict({"model": {**base, **model}, "cluster": {"node": "dgx-h100", "nodes": 1},
                               "parallel": {"tp": 1}, "training": {"global_batch": 8}})
    with pytest.raises(ValueError) as exc:
        export_plan(plan, "megatron")
    message = str(exc.value)
    assert message.startswith(f"{field} has no Megatron-LM option: ")
    assert "\n" not in message and not re.search(r"\.\s+[A-Z]", message)


@pytest.mark.parametrize("model, field", [
    ({"qk_norm": "projection"}, "model.qk_norm=projection"), ({"norm": "layernorm"}, "model.norm=layernorm"),
    ("qwen2-7b", "model.bias=qkv"),   # a Qwen3 model (QK norm per head) is the qwen3 module's: test_torchtitan_qwen3.py
    ({"activation": "geglu"}, "model.activation=geglu"), ({"attention_sinks": True}, "model.attention_sinks=true"),
])
def test_torchtitan_refuses_a_block_its_llama3_model_cannot_build(model, field):
    if isinstance(model, str):
        plan = _hf(model)
    else:
        base = {"name": "t", "layers": 4, "hidden": 512, "heads": 8, "vocab": 32000, "seq_len": 1024,
                "position_embedding": "rope", "gated_mlp": True, "tied_embeddings": False}
        plan = plan_from_dict({"model": {**base, **model}, "cluster": {"node": "dgx-h100", "nodes": 1},
                               "parallel": {"tp": 1}, "training": {"global_batch": 8}})
    with pytest.raises(ValueError, match=re.escape(field) + " has no torchtitan option: its llama3 model"):
        export_plan(plan, "torchtitan")


@pytest.mark.parametrize("model, message", [
    ({"norm": "batchnorm"}, "model.norm='batchnorm' is not one of: rmsnorm, layernorm"),
    ({"activation": "swiglu"}, "model.activation=swiglu is a gated activation but model.gated_mlp=false"),
    ({"activation": "gelu", "gated_mlp": True}, "model.activation=gelu is not a gated activation"),
    ({"attention_sinks": "yes"}, "model.attention_sinks must be true or false"),
])
def test_bad_values_are_one_sentence(model, message):
    doc = {"model": {"name": "t", "layers": 4, "hidden": 512, "heads": 8, "vocab": 32000, "seq_len": 1024, **model},
           "cluster": {"node": "dgx-h100", "nodes": 1}, "training": {"global_batch": 8}}
    with pytest.raises(PlanError, match=re.escape(message)):
        plan_from_dict(doc)


def test_megatron_reads_the_options_it_used_to_drop():
    cmd = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 2 --hidden-size 256 --num-attention-heads 4 "
           "--seq-length 128 --padded-vocab-size 1024 --position-embedding-type rope ")
    f = read_megatron(cmd + "--normalization LayerNorm --squared-relu --qk-layernorm --softmax-type learnable").fields
    assert (f["model.norm"], f["model.bias"], f["model.activation"], f["model.qk_norm"], f["model.attention_sinks"]) \
        == ("layernorm", "all", "squared_relu", "head", True)
    assert "--softmax-type" in read_megatron(cmd + "--softmax-type off-by-one").ignored   # listed as not mapped
    with pytest.raises(PlanError, match="--glu-linear-offset"):
        read_megatron(cmd + "--quick-geglu --glu-linear-offset 0.5")
