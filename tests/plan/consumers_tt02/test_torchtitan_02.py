"""torchtitan 0.2.2's own ConfigManager (``--job.config_file``), ParallelDims and pipeline
stage generator load every ``torchtitan-0.2`` export with the plan's layout."""
import math

import pytest

from simcore.plan.writers import export_plan
from tests.plan.layouts import ALL
from tests.plan.test_export_refusals import REFUSED, assert_one_sentence_naming


#: The plans of tests/plan/layouts.py written for torchtitan 0.2.2; every other one is refused in
#: one sentence naming its field (REFUSED in tests/plan/test_export_refusals.py): a change shows here.
GIVEN = ["llama3-8b-fsdp-h100", "v-ddp-pp-even", "v-hsdp-zero3", "v-interleaved-tp", "v-pp-uneven",
         "v-zero-bubble-cp", "v-zero3-eager", "v-zero3-optim-in-bwd", "v-zero3-paramoffload"]
EXPORTS = {name: export_plan(ALL[name], "torchtitan-0.2") for name in GIVEN}


def test_the_installed_torchtitan_is_02():
    from importlib.metadata import version

    assert version("torchtitan").startswith("0.2.")


def test_the_listed_plans_are_written_and_the_others_refused_naming_the_field():
    assert sorted(n for n in ALL if "torchtitan-0.2" not in REFUSED.get(n, {})) == GIVEN
    for name in sorted(set(ALL) - set(GIVEN)):
        with pytest.raises(ValueError) as refusal:
            export_plan(ALL[name], "torchtitan-0.2")
        assert_one_sentence_naming(str(refusal.value), REFUSED[name]["torchtitan-0.2"])


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_torchtitan_02_loads_the_toml(name, tmp_path):
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

    plan, path = ALL[name], tmp_path / "job.toml"
    path.write_text(EXPORTS[name])
    cfg = ConfigManager().parse_args(["--job.config_file", str(path)])
    p = cfg.parallelism
    dims = ParallelDims(dp_replicate=p.data_parallel_replicate_degree, dp_shard=p.data_parallel_shard_degree,
                        cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                        ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                        world_size=plan.parallel.gpus)
    assert (dims.tp, dims.pp, dims.cp, dims.dp_replicate * dims.dp_shard) == (
        plan.parallel.tp, plan.parallel.pp, plan.parallel.cp, plan.parallel.dp)
    par = plan.parallel   # FSDP2 over each replica's shard ranks: HSDP where parallel.dp_replicate > 1
    assert dims.dp_shard == (par.dp // par.dp_replicate if par.zero >= 2 else 1)
    assert cfg.training.seq_len == plan.model.seq_len and cfg.activation_checkpoint.mode == plan.training.recompute.value
    assert cfg.compile.enable == (plan.training.kernels.value == "fused")   # compiled kernels are fused ones
    assert cfg.optimizer.early_step_in_backward == plan.training.optimizer_in_backward
    if plan.parallel.pp == 1:
        return
    layers = plan.model.layers
    if p.module_fqns_per_model_part:
        parts = p.module_fqns_per_model_part
    else:  # pipeline_parallel.py: ceil((layers + first + last) / layers_per_stage) stages, divisible by pp
        first, last = p.pipeline_parallel_first_stage_less_layers, p.pipeline_parallel_last_stage_less_layers
        stages = math.ceil((layers + first + last) / p.pipeline_parallel_layers_per_stage)
        assert stages % plan.parallel.pp == 0
        parts = generate_llm_fqn_per_model_part(stages, layers, first, last)
    assert [sum(m.startswith("layers.") for m in part) for part in parts] == list(plan.layers_per_stage)
