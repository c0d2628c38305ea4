"""Dropout keeps masks only when it drops: ``model.dropout`` 0 (the Llama family, MPT,
torchtitan) saves no mask and no attention-dropout output; Megatron's default 0.1 keeps
Korthikanti et al.'s sbh(34 + 5as/h). The readers and the Megatron export carry the field."""
from __future__ import annotations

import dataclasses
import json

import pytest

from simcore.model import workload as wl
from simcore.plan.load import plan_from_dict
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.spec import PlanError, Recompute
from simcore.plan.writers import megatron_args

GPT = dict(name="gpt", layers=2, hidden=1024, heads=16, kv_heads=16, ffn_hidden=4096, vocab=50304, seq_len=2048)


def _spec(dropout: float):
    doc = {"model": {**GPT, "dropout": dropout}, "cluster": {"node": "dgx-h100", "nodes": 1},
           "parallel": {"dp": 8}, "training": {"global_batch": 8}}
    return plan_from_dict(doc)


@pytest.mark.parametrize("flash", [True, False])
def test_no_dropout_keeps_no_masks(flash):
    m1, m0 = _spec(0.1).model, _spec(0.0).model
    s, b, h, a = 2048, 2, 1024, 16
    with_masks = wl.activation_bytes_per_layer(m1, b=b, s=s, flash=flash)
    without = wl.activation_bytes_per_layer(m0, b=b, s=s, flash=flash)
    attention_dropout = 0 if flash else 3 * a * s * s * b   # its 1-byte mask and 2-byte output
    assert with_masks - without == pytest.approx(2 * s * b * h + attention_dropout)
    if not flash:   # Korthikanti et al. Eq. 2 at dropout 0.1: sbh(34 + 5as/h)
        assert with_masks == pytest.approx(s * b * h * (34 + 5 * a * s / h))
    assert wl.embedding_activation_bytes(m1, b=b, s=s) == s * b * h
    assert wl.embedding_activation_bytes(m0, b=b, s=s) == 0.0
    # full recompute keeps the layer input alone either way
    assert wl.activation_bytes_per_layer(m0, b=b, s=s, recompute=Recompute.FULL) == \
        wl.activation_bytes_per_layer(m1, b=b, s=s, recompute=Recompute.FULL)


def test_dropout_is_a_probability():
    for bad in (1.0, -0.1):
        with pytest.raises(PlanError, match=r"model.dropout=.* must be at least 0 and below 1"):
            _spec(bad)


def test_the_catalogs_llama_trains_without_dropout_and_gpt_with_megatrons_default():
    def model(name):
        return plan_from_dict({"model": name, "cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"dp": 8},
                               "training": {"global_batch": 8}}).model
    assert model("llama3-8b").dropout == 0.0 and model("mixtral-8x7b").dropout == 0.0
    assert model("gpt3-175b").dropout == 0.1


def test_hugging_face_and_megatron_carry_the_dropout(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_embd": 256, "n_head": 4, "vocab_size": 1000,
                               "n_positions": 512, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}))
    doc = {"model": {"hf_config": str(cfg)}, "cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"dp": 8},
           "training": {"global_batch": 8}}
    assert plan_from_dict(doc).model.dropout == 0.0
    cfg.write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
                               "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 512,
                               "intermediate_size": 688, "attention_dropout": 0.0}))
    assert plan_from_dict(doc).model.dropout == 0.0
    # the Megatron export writes a dropout other than its default, and reads it back
    plan = _spec(0.0)
    args = megatron_args(plan)
    assert ("--hidden-dropout", 0.0) in args and ("--attention-dropout", 0.0) in args
    line = " ".join(f"{o} {v}" if v is not None else o for o, v in args)
    assert read_megatron(f"torchrun pretrain_gpt.py {line}").fields["model.dropout"] == 0.0
    assert not any(o == "--hidden-dropout" for o, _ in megatron_args(dataclasses.replace(plan, model=_spec(0.1).model)))


@pytest.mark.parametrize("model", ["gpt3-175b", "llama3-8b", "mixtral-8x7b"])
def test_the_hugging_face_export_reads_back_its_dropout(model, tmp_path):
    from simcore.plan.writers import hf_config_from_model

    spec = plan_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"dp": 8},
                           "training": {"global_batch": 8}}).model
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(hf_config_from_model(spec)))
    back = plan_from_dict({"model": {"hf_config": str(cfg)}, "cluster": {"node": "dgx-h100", "nodes": 1},
                           "parallel": {"dp": 8}, "training": {"global_batch": 8}}).model
    assert back.dropout == spec.dropout
