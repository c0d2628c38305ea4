"""Sliding-window attention (``model.sliding_window``, ``sliding_window_layers``): the flash
kernel computes the key tiles of the window, so a windowed model's step costs less than full
attention and never more; the configs and launchers that name a window read and write it."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model.attention_window import CAUSAL_FLASH_FRACTION, FLASH_KEY_TILE, attention_fraction
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan, hf_config_from_model
from tests.plan.layouts import EXAMPLES


def _plan(seq_len: int, window: int = 0, share: float = 1.0, **parallel):
    model = {"name": "llama3-8b", "seq_len": seq_len, "sliding_window": window, "sliding_window_layers": share}
    return plan_from_dict({"model": model, "cluster": {"node": "dgx-h100", "nodes": 1},
                           "parallel": {"dp": 8, **parallel}, "training": {"global_batch": 8, "flash_attention": True}})


def test_a_window_computes_its_tiles_and_at_most_the_causal_half():
    full = _plan(32768).model
    assert attention_fraction(full, 32768) == CAUSAL_FLASH_FRACTION
    assert attention_fraction(_plan(32768, 4096).model, 32768) == pytest.approx((4096 + FLASH_KEY_TILE) / 32768)
    half = attention_fraction(_plan(32768, 4096, 0.5).model, 32768)
    assert half == pytest.approx(0.5 * (4096 + FLASH_KEY_TILE) / 32768 + 0.5 * CAUSAL_FLASH_FRACTION)
    assert attention_fraction(_plan(8192, 8192).model, 8192) == CAUSAL_FLASH_FRACTION   # the window holds it all


@settings(max_examples=25, deadline=None)
@given(seq=st.sampled_from([2048, 8192, 32768, 131072]), window=st.sampled_from([128, 1024, 4096, 65536]),
       share=st.sampled_from([1.0, 5 / 6, 0.5]), cp=st.sampled_from([1, 2, 4]))
def test_a_window_never_costs_more_than_full_attention(seq, window, share, cp):
    full = simulate(_plan(seq, cp=cp, dp=8 // cp))
    windowed = simulate(_plan(seq, window, share, cp=cp, dp=8 // cp))
    assert windowed.step_time_s <= full.step_time_s
    if window + FLASH_KEY_TILE < seq / 2:
        assert windowed.step_time_s < full.step_time_s
    assert windowed.memory_per_gpu_gib == full.memory_per_gpu_gib   # flash keeps O(s) either way


def test_hugging_face_configs_name_their_windows(tmp_path):
    def model(name, **change):
        cfg = json.loads((EXAMPLES / "hf" / name / "config.json").read_text()) | change
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(cfg))
        return plan_from_dict({"model": {"hf_config": str(path), "seq_len": 8192}, "cluster": {"node": "dgx-h100"},
                               "parallel": {"dp": 8}, "training": {"global_batch": 8}}).model
    assert (model("gemma2-9b").sliding_window, model("gemma2-9b").sliding_window_layers) == (4096, 0.5)
    assert (model("mistral-7b").sliding_window, model("mistral-7b").sliding_window_layers) == (4096, 1.0)
    assert model("qwen2-7b").sliding_window == 0   # use_sliding_window: false
    oss = model("llama3-8b", sliding_window=128, layer_types=["sliding_attention", "full_attention"] * 16)
    assert (oss.sliding_window, oss.sliding_window_layers) == (128, 0.5)
    assert model("gemma2-9b", model_type="gemma3_text", sliding_window_pattern=6).sliding_window_layers == 5 / 6


def test_megatron_and_hugging_face_write_and_read_the_window_and_torchtitan_refuses_it():
    plan = _plan(32768, 4096, 0.5)
    text = export_plan(plan, "megatron")
    assert "--window-size 4095,0" in text and "--window-attn-skip-freq 2" in text
    doc, _ = import_plan(megatron=text, cluster="dgx-h100", nodes=1)
    assert (doc["model"]["sliding_window"], doc["model"]["sliding_window_layers"]) == (4096, 0.5)
    with pytest.raises(ValueError, match=r"^model.sliding_window_layers=0.4 has no Megatron-LM option"):
        export_plan(_plan(32768, 4096, 0.4), "megatron")
    with pytest.raises(ValueError, match=r"^model.sliding_window=4096 has no torchtitan option"):
        export_plan(plan, "torchtitan")
    every = _plan(32768, 4096)
    assert hf_config_from_model(every.model)["model_type"] == "mistral"
    with pytest.raises(ValueError, match="Mistral and Mixtral window every layer"):
        hf_config_from_model(plan.model)
    assert plan_from_dict(plan_to_dict(plan)).model == plan.model
    with pytest.raises(PlanError, match=r"^model.sliding_window_layers=1.5 must be a share of the layers in \(0, 1\]$"):
        _plan(32768, 4096, 1.5)
    with pytest.raises(PlanError, match=r"^model.sliding_window_layers=0.0 must be positive"):
        _plan(32768, 4096, 0.0)
