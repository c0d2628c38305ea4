"""`trainplan import --log`: a Megatron-LM log's arguments block read back as the run's Plan (issue 52)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from simcore.plan.megatron_log import log_command
from simcore.plan.spec import PlanError
from trainplan.cli import main

FIX = Path(__file__).resolve().parents[1] / "runlogs" / "fixtures"
GPT345M = FIX / "megatron_gpt345m_arguments.log"
QWEN = FIX / "megatron_swift_qwen2_0.5b.log"


def _import(capsys, *args) -> tuple[int, str, str]:
    rc = main(["import", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_megatron_log_imports_as_the_model_megatron_built(capsys):
    """GPT-345M on one GPU (Megatron 2023, transformer_impl local): the vocabulary as the tokenizer
    padded it (50,257 -> 50,304), no flash attention (the local spec's DotProductAttention), fp16,
    one GPU; the parameters are the ones Megatron counted on its one rank."""
    rc, out, err = _import(capsys, "--log", str(GPT345M), "--cluster", "dgx-a100-80gb")
    assert rc == 0, err
    doc = yaml.safe_load(out)
    assert doc["model"]["vocab"] == 50304 and doc["model"]["tied_embeddings"] is True
    assert doc["training"]["flash_attention"] is False and doc["training"]["precision"] == "fp16"
    assert doc["cluster"] == {"node": "dgx-a100-80gb", "nodes": 1, "gpus_per_node": 1}
    counted = int(re.search(r"model parallel rank \(0, 0\): (\d+)", GPT345M.read_text()).group(1))
    assert f"built {counted:,} parameters" in err
    assert "--lr" in err and "not mapped" in err       # what it does not read, it lists


def test_the_arguments_block_becomes_megatrons_own_options():
    tokens, world = log_command(QWEN.read_text())
    assert world == 2
    assert "--disable-bias-linear" in tokens           # add_bias_linear False: its store_false option
    assert {"--add-qkv-bias", "--group-query-attention", "--swiglu", "--bf16",
            "--untie-embeddings-and-output-weights", "--use-distributed-optimizer"} <= set(tokens)
    assert tokens[tokens.index("--num-query-groups") + 1] == "2"
    assert tokens[tokens.index("--recompute-granularity") + 1] == "selective"
    assert not {"--use-flash-attn", "--fp16", "--add-position-embedding", "--no-position-embedding"} & set(tokens)


def test_a_log_that_does_not_name_the_model_is_refused(capsys, tmp_path):
    rc, _, err = _import(capsys, "--log", str(QWEN), "--cluster", "dgx-h100")
    assert rc == 2 and "model.vocab is not given" in err and "Traceback" not in err
    # the run untied its embeddings; a config that ties them is another model: refused
    hf = tmp_path / "config.json"
    hf.write_text('{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864, '
                  '"num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, '
                  '"vocab_size": 151936, "max_position_embeddings": 131072, "tie_word_embeddings": true}')
    rc, _, err = _import(capsys, "--log", str(QWEN), "--hf", str(hf), "--cluster", "dgx-h100")
    assert rc == 2 and "model.tied_embeddings conflicts" in err


def test_a_log_without_an_arguments_block(capsys):
    rc, _, err = _import(capsys, "--log", str(FIX / "torchtitan_pr1287.log"), "--cluster", "dgx-h100")
    assert rc == 2 and "no Megatron-LM arguments block" in err
    with pytest.raises(PlanError, match="arguments block"):
        log_command("")


def test_an_enum_printed_by_its_class_is_its_member():
    """Megatron of 2025 prints ``attention_backend ... AttnBackend.auto``; the option takes ``auto``."""
    block = ("------------------------ arguments ------------------------\n"
             "  attention_backend ............................... AttnBackend.auto\n"
             "-------------------- end of arguments ---------------------\n")
    assert log_command(block)[0] == ["--attention-backend", "auto"]
