"""The upstream config fixture simcore/plan/torchtitan_configs.yaml (torchtitan 0.3.0's config
registry, dumped with its source file and commit) against the installed torchtitan 0.3.0: its
own ``ConfigManager`` parses ``--module M --config NAME`` to the values the fixture lists, and
trainplan's import of the same torchrun command reads the layout torchtitan does, or refuses in
one line (issue 55, items 3 and 6)."""
import re
from importlib.metadata import version

import pytest

from simcore.plan.interop import import_plan
from simcore.plan.spec import PlanError
from simcore.plan.torchtitan_reader import load_torchtitan_configs

FIXTURE = load_torchtitan_configs()
CONFIGS = FIXTURE["configs"]

#: Registry configs torchtitan 0.3.0 cannot build on this CPU-only venv, and why (its own error).
NOT_BUILT_HERE = {
    **dict.fromkeys(["llama3_debugmodel_float8", "llama3_debugmodel_nvfp4", "llama3_debugmodel_first_85_pct_layers_nvfp4",
                     "llama3_debugmodel_float8_emulate_lora", "llama3_8b_first_85_pct_layers_nvfp4", "llama3_8b_mxfp8",
                     "llama3_405b", "deepseek_v3_debugmodel_mxfp8", "deepseek_v3_671b_float8", "qwen3_debugmodel_nvfp4",
                     "qwen3_debugmodel_first_85_pct_layers_nvfp4", "qwen3_8b_first_85_pct_layers_nvfp4"],
                    "torchao is not installed"),   # its float8/MXFP8/NVFP4 converters import torchao
    "qwen3_debugmodel_flex_flash": "only supported on Hopper or Blackwell",   # FlexAttention's flash backend
}


def _parse(name: str):
    from torchtitan.config.manager import ConfigManager

    return ConfigManager().parse_args(["--module", CONFIGS[name]["module"], "--config", name])


def test_the_fixture_is_of_the_installed_torchtitan_at_a_commit():
    assert FIXTURE["version"] == version("torchtitan") == "0.3.0"
    assert re.fullmatch(r"[0-9a-f]{40}", FIXTURE["commit"]) and FIXTURE["repo"] == "pytorch/torchtitan"
    assert all(c["source"].endswith("@" + FIXTURE["commit"]) for c in CONFIGS.values())
    assert set(NOT_BUILT_HERE) <= set(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_torchtitan_parses_each_config_to_the_fixture_values(name):
    if name in NOT_BUILT_HERE:
        with pytest.raises((ImportError, ValueError), match=NOT_BUILT_HERE[name]):
            _parse(name)
        return
    cfg = _parse(name)
    for section, options in CONFIGS[name].get("sections", {}).items():
        for key, value in options.items():
            if (section, key) == ("activation_checkpoint", "mode"):   # 0.3 names the mode by class
                got = type(cfg.activation_checkpoint).__qualname__.split("AC.")[0].lower()
            else:
                got = getattr(getattr(cfg, section), key)
            assert got == value, f"{name}: {section}.{key} is {got!r} in torchtitan, {value!r} in the fixture"


@pytest.mark.parametrize("name", sorted(set(CONFIGS) - set(NOT_BUILT_HERE)))
def test_the_import_reads_the_layout_torchtitan_parses(name):
    command = f"torchrun --nnodes 8 --nproc-per-node 8 -m torchtitan.train --module {CONFIGS[name]['module']} --config {name}"
    try:
        doc, _ = import_plan(torchtitan=command, cluster="dgx-h100")
    except PlanError as exc:   # a model the import has no shape for without hf=, or a field a Plan cannot hold
        assert "\n" not in str(exc) and (name in str(exc) or "hf=" in str(exc)), str(exc)
        return
    cfg, par = _parse(name), doc["parallel"]
    p = cfg.parallelism
    assert (par.get("tp", 1), par.get("pp", 1), par.get("cp", 1), par.get("ep", 1)) == (
        p.tensor_parallel_degree, p.pipeline_parallel_degree, p.context_parallel_degree, p.expert_parallel_degree)
    assert doc["model"]["seq_len"] == cfg.training.seq_len and doc["model"]["layers"] == len(cfg.model_spec.model.layers)
    assert doc["training"]["micro_batch"] == cfg.training.local_batch_size and doc["cluster"]["nodes"] == 8
    assert type(cfg.activation_checkpoint).__qualname__.lower().startswith(doc["training"]["recompute"])
