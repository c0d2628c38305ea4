"""Every examples/hf config counted by transformers itself (the pinned 5.24.0, on the meta
device) beside trainplan's import of it: within 0.5%, or the import refuses in one sentence
naming the field (issue 55, items 1 and 6). A multimodal wrapper (Llama 4, Gemma 3, Gemma 4,
Qwen3.5) is counted as its language model: ``config.get_text_config()`` built by
``AutoModelForCausalLM``, the vision tower left out, as the import models it. The sources of
the configs are examples/hf/SOURCES.yaml."""
import json
import re
from pathlib import Path

import pytest
import yaml

from simcore.model.workload import param_counts
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError

HF = Path(__file__).resolve().parents[3] / "examples" / "hf"
MODELS = sorted(p.parent.name for p in HF.glob("*/config.json"))
SOURCES = yaml.safe_load((HF / "SOURCES.yaml").read_text())

#: transformers 5.24.0's count of each language model (parameters(), tied weights once).
TRANSFORMERS = {
    "deepseek-v2": 235_741_434_880, "deepseek-v3": 671_026_404_352, "gemma2-9b": 9_241_705_984,
    "gemma3-27b": 27_009_346_304, "gemma4-26b-a4b": 25_233_141_760, "gpt-neox-20b": 20_554_567_680,
    "gpt2": 124_439_808, "llama2-7b": 6_738_415_616, "llama3-70b": 70_553_706_496, "llama3-8b": 8_030_261_248,
    "llama3.1-8b": 8_030_261_248, "llama3.2-1b": 1_235_814_400, "llama4-maverick": 400_711_848_960,
    "llama4-scout": 107_769_861_120, "mistral-7b": 7_241_732_096, "mixtral-8x7b": 46_702_792_704,
    "phi3-mini": 3_821_079_552, "qwen2-57b-a14b": 57_408_658_944, "qwen2-7b": 7_615_616_512,
    "qwen2.5-7b": 7_615_616_512, "qwen3-32b": 32_762_123_264, "qwen3-8b": 8_190_735_360,
    "qwen3.5-27b": 25_377_789_952, "qwen3.5-35b-a3b": 34_660_610_688, "qwen3-next-80b-a3b": 79_674_391_296,
    # 2025-2026 families (issue 55)
    "deepseek-v3.2": 671_877_929_216, "glm-4.5-air": 106_852_245_504, "gpt-oss-20b": 20_914_757_184,
    "kimi-k2": 1_026_408_209_408, "mixtral-8x22b": 140_620_634_112, "olmo2-7b": 7_298_617_344,
    "phi-4": 14_659_507_200, "qwen3-30b-a3b": 30_532_122_624,
}

#: The field trainplan's import refuses a config over (transformers builds these models).
IMPORT_REFUSES: dict[str, str] = {}

#: Configs transformers 5.24.0 itself refuses as written, the field and why; the count is of
#: the config with that field set as transformers now types it (it holds no parameters). A third
#: element is what the refusal says where it does not name the field.
TRANSFORMERS_REFUSES = {
    # the fixture is transformers 4.51.0's printout, where Llama4TextConfig's attn_temperature_tuning
    # was an int (4); 5.x's strict config dataclass types it bool: "expected bool, got int (value: 4)"
    "llama4-scout": ("attn_temperature_tuning", True),
    # Kimi K2's model_type kimi_k2 names Moonshot's remote code (auto_map: configuration_deepseek.
    # DeepseekV3Config); transformers registers no kimi_k2 and asks for trust_remote_code. The model is
    # DeepSeek-V3's (kimi_k25/configuration_kimi_k25.py maps a kimi_k2 text_config to deepseek_v3 alike)
    "kimi-k2": ("model_type", "deepseek_v3", "trust_remote_code"),
}


def _transformers_count(model: str, tmp_path: Path) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    path = HF / model
    if model in TRANSFORMERS_REFUSES:
        field, value, *says = TRANSFORMERS_REFUSES[model]
        doc = json.loads((path / "config.json").read_text())
        with pytest.raises(Exception, match=says[0] if says else field):   # still refused as written
            AutoConfig.from_pretrained(str(path))
        doc.get("text_config", doc)[field] = value
        path = tmp_path / model
        path.mkdir()
        (path / "config.json").write_text(json.dumps(doc))
    cfg = AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(cfg.get_text_config())
    return sum(p.numel() for p in lm.parameters())


def test_every_config_has_a_row_and_a_source():
    assert sorted(TRANSFORMERS) == MODELS and sorted(SOURCES) == MODELS


@pytest.mark.parametrize("model", MODELS)
def test_import_counts_what_transformers_counts_or_refuses_naming_the_field(model, tmp_path):
    theirs = _transformers_count(model, tmp_path)
    assert theirs == TRANSFORMERS[model]
    try:
        doc, _ = import_plan(hf=str(HF / model / "config.json"), cluster="dgx-h100", nodes=1)
    except PlanError as exc:
        field = IMPORT_REFUSES.get(model)
        assert field and re.search(rf"\b{re.escape(field)}\b", str(exc)), str(exc)
        assert "\n" not in str(exc)
        return
    assert model not in IMPORT_REFUSES, f"{model} now imports: drop it from IMPORT_REFUSES"
    ours = param_counts(plan_from_dict(doc).model).total
    assert abs(ours - theirs) <= 0.005 * theirs, f"{model}: trainplan {ours:,} vs transformers {theirs:,}"
