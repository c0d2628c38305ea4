"""Every export, loaded by the tool that consumes it (the pinned `interop` extra of
pyproject.toml: deepspeed, transformers, accelerate, torchtitan), with the intended layout
read back from the consumer's own parsed object. Each plan of tests/plan/layouts.py is either
written and accepted by the consumer's parser, or refused by trainplan in one sentence naming
the field (REFUSED in tests/plan/test_export_refusals.py): no share of plans that reach a consumer."""
import json
import math
from dataclasses import replace

import pytest
import torch.distributed as dist

from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.torchtitan_reader import _torchtitan_command
from simcore.plan.spec import Offload, ZeroImpl, ZeroStage
from simcore.plan.torchtitan_writer import stage_split
from simcore.plan.writers import export_plan
from tests.plan.layouts import ALL
from tests.plan.test_export_refusals import REFUSED, assert_one_sentence_naming

import tomllib


def _autotp() -> dict:
    """DeepSpeed AutoTP layouts (tensor_parallel.autotp_size), which no plan of layouts.py has:
    Llama 3 8B on 8 GPUs, tp 2 x dp 4, under DeepSpeed's ZeRO-1 and ZeRO-3 with optimizer offload;
    and with Megatron-style sequence parallel, which AutoTP does not have."""
    base = ALL["llama3-8b-fsdp-h100"]
    par = replace(base.parallel, tp=2, dp=4, zero_impl=ZeroImpl.DEEPSPEED)
    plans = {"ds-autotp-zero1": replace(base, parallel=replace(par, zero=ZeroStage.OPTIMIZER_STATES)),
             "ds-autotp-zero3-offload": replace(base, parallel=par,
                                                training=replace(base.training, offload=Offload.OPTIMIZER)),
             "ds-autotp-sp": replace(base, parallel=replace(par, sequence_parallel=True))}
    return {name: replace(plan, name=name) for name, plan in plans.items()}


AUTOTP = _autotp()
PLANS = ALL | AUTOTP
_TT = ("torchtitan", "torchtitan-0.2")
REFUSALS = REFUSED | {"ds-autotp-zero1": dict.fromkeys(_TT, "parallel.zero"),
                      "ds-autotp-zero3-offload": dict.fromkeys(_TT, "parallel.zero_impl"),
                      "ds-autotp-sp": {"deepspeed": "parallel.sequence_parallel"} | dict.fromkeys(_TT, "parallel.zero_impl")}

#: The plans each consumer is given (every other one is refused, naming its field): a change shows here.
GIVEN = {
    "deepspeed": ["ds-autotp-zero1", "ds-autotp-zero3-offload", "v-ds-zero2-offload", "v-ds-zero3-paramoffload"],
    "torchtitan": ["llama3-8b-fsdp-h100", "v-ddp-pp-even", "v-hsdp-zero3", "v-interleaved-tp", "v-pp-uneven",
                   "v-zero3-eager", "v-zero3-paramoffload"],
    "torchtitan-0.2": ["llama3-8b-fsdp-h100", "v-ddp-pp-even", "v-hsdp-zero3", "v-interleaved-tp", "v-pp-uneven",
                       "v-zero-bubble-cp", "v-zero3-eager", "v-zero3-optim-in-bwd", "v-zero3-paramoffload"],
}


def _given(target: str) -> list[str]:
    return sorted(n for n in PLANS if target not in REFUSALS.get(n, {}))


def test_each_consumer_is_given_the_listed_plans():
    assert {t: _given(t) for t in GIVEN} == GIVEN


@pytest.mark.parametrize("name, target", [(n, t) for t in GIVEN for n in sorted(PLANS) if n not in GIVEN[t]])
def test_the_others_are_refused_in_one_sentence_naming_the_field(name, target):
    with pytest.raises(ValueError) as refusal:
        export_plan(PLANS[name], target)
    assert_one_sentence_naming(str(refusal.value), REFUSALS[name][target])


DEEPSPEED = {n: export_plan(PLANS[n], "deepspeed") for n in GIVEN["deepspeed"]}
TORCHTITAN = {n: export_plan(PLANS[n], "torchtitan") for n in GIVEN["torchtitan"]}
TORCHTITAN_02 = {n: export_plan(PLANS[n], "torchtitan-0.2") for n in GIVEN["torchtitan-0.2"]}


@pytest.fixture(scope="module")
def one_rank_group():
    """DeepSpeedConfig asks deepspeed.comm for the rank (else it takes a world of 1 and
    ignores the mpu); a 1-rank gloo group through deepspeed.init_distributed answers."""
    import socket

    import deepspeed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        yield
    dist.destroy_process_group()


class _DataParallel:
    """The ``mpu`` DeepSpeedConfig reads the data-parallel world size from."""

    def __init__(self, dp: int):
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp


@pytest.mark.parametrize("name", sorted(DEEPSPEED))
def test_deepspeed_reads_the_layout(name, tmp_path, one_rank_group):
    from deepspeed.runtime.config import DeepSpeedConfig

    plan, path = PLANS[name], tmp_path / "ds_config.json"
    path.write_text(DEEPSPEED[name])
    json.loads(path.read_text())  # json.load, as Megatron-DeepSpeed and accelerate read it
    cfg = DeepSpeedConfig(str(path), mpu=_DataParallel(plan.parallel.dp))
    # AutoTP: TPTrainingConfig (runtime/tensor_parallel/config.py); 0 is off, as the engine reads it
    assert cfg.tensor_parallel_config.autotp_size == (plan.parallel.tp if plan.parallel.tp > 1 else 0)
    tr = plan.training
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        tr.global_batch, tr.micro_batch, plan.num_microbatches)
    assert cfg.zero_optimization_stage == int(plan.parallel.zero)
    assert cfg.bfloat16_config.enabled == (tr.precision.value == "bf16")
    assert cfg.float16_config.enabled == (tr.precision.value == "fp16")
    offload = cfg.zero_config.offload_optimizer
    assert (offload is not None and offload.device == "cpu") == (tr.offload.value != "none")


@pytest.mark.parametrize("name", sorted(DEEPSPEED))
def test_hugging_face_and_accelerate_take_the_file(name, tmp_path):
    from accelerate.utils import DeepSpeedPlugin
    from transformers import TrainingArguments

    plan, path = PLANS[name], tmp_path / "ds_config.json"
    path.write_text(DEEPSPEED[name])
    precision = plan.training.precision.value
    args = TrainingArguments(output_dir=str(tmp_path), deepspeed=str(path), use_cpu=True,
                             bf16=precision == "bf16", per_device_train_batch_size=plan.training.micro_batch,
                             gradient_accumulation_steps=plan.num_microbatches)
    hf = args.hf_deepspeed_config
    assert hf.is_zero3() == (plan.parallel.zero == 3) and hf.is_offload() == (plan.training.offload.value != "none")
    plugin = DeepSpeedPlugin(hf_ds_config=str(path))
    assert plugin.zero_stage == int(plan.parallel.zero)
    assert plugin.deepspeed_config["train_micro_batch_size_per_gpu"] == plan.training.micro_batch
    assert plugin.deepspeed_config.get("tensor_parallel", {}).get("autotp_size", 1) == plan.parallel.tp


def _torchtitan_parse(text: str):
    from torchtitan.config.manager import ConfigManager

    words = text.replace("\\\n", " ").split("-m torchtitan.train", 1)[1].split()
    return ConfigManager().parse_args(words)


@pytest.mark.parametrize("name", sorted(TORCHTITAN))
def test_torchtitan_03_parses_the_command_and_accepts_the_layout(name):
    from torchtitan.distributed.parallel_dims import ParallelDims

    plan = PLANS[name]
    cfg = _torchtitan_parse(TORCHTITAN[name])
    dims = ParallelDims.from_config(cfg.parallelism, world_size=plan.parallel.gpus)  # validates the product
    par = plan.parallel
    assert (dims.tp, dims.pp, dims.cp, dims.ep) == (par.tp, par.pp, par.cp, par.ep)
    assert dims.dp_replicate * dims.dp_shard == par.dp
    # FSDP2 over each replica's shard ranks: HSDP (replicate x shard) where parallel.dp_replicate > 1
    assert dims.dp_shard == (par.dp // par.dp_replicate if par.zero >= 2 else 1)
    assert cfg.training.seq_len == plan.model.seq_len and cfg.training.global_batch_size == plan.training.global_batch
    assert len(cfg.model_spec.model.layers) == plan.model.layers
    assert cfg.compile.enable == (plan.training.kernels.value == "fused")   # compiled kernels are fused ones
    ac = type(cfg.activation_checkpoint).__qualname__.lower()
    assert plan.training.recompute.value.split("-")[0] in ac
    if par.pp > 1:
        assert _torchtitan_stages(cfg, plan) == list(plan.layers_per_stage)


def _torchtitan_stages(cfg, plan) -> list[int]:
    """The layers per stage torchtitan's own pipeline code gives (stage count and split)."""
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part, _get_pipeline_metadata

    dims = ParallelDims.from_config(cfg.parallelism, world_size=plan.parallel.gpus)
    stages, layers, first, last = _get_pipeline_metadata(dims, cfg.parallelism, cfg.model_spec.model)[:4]
    parts = _generate_llm_fqn_per_model_part(stages, layers, first, last)
    return [sum(m.startswith("layers.") for m in part) for part in parts]


@pytest.mark.parametrize("name", sorted(TORCHTITAN_02))
def test_torchtitan_02_toml_follows_the_same_stage_rule(name):
    """0.2.2's generate_llm_fqn_per_model_part is 0.3.0's but for the output's name, so
    torchtitan 0.3's function checks the 0.2 TOML's stage options."""
    from torchtitan.distributed.pipeline_parallel import _generate_llm_fqn_per_model_part

    plan, doc = PLANS[name], tomllib.loads(TORCHTITAN_02[name])
    par = doc["parallelism"]
    if plan.parallel.pp == 1:
        assert "pipeline_parallel_layers_per_stage" not in par
        return
    if "module_fqns_per_model_part" in par:
        parts = par["module_fqns_per_model_part"]
        assert parts[-1][-1] == "output"  # 0.2.x's name of the output module
    else:
        per, first, last = (par[f"pipeline_parallel_{k}"] for k in
                            ("layers_per_stage", "first_stage_less_layers", "last_stage_less_layers"))
        stages = math.ceil((plan.model.layers + first + last) / per)
        assert stages % plan.parallel.pp == 0  # "Number of virtual stages must be divisible by pp"
        parts = _generate_llm_fqn_per_model_part(stages, plan.model.layers, first, last)
        assert stage_split(plan.model.layers, stages, first, last) == [
            sum(m.startswith("layers.") for m in p) for p in parts]
    assert [sum(m.startswith("layers.") for m in p) for p in parts] == list(plan.layers_per_stage)


def test_the_reader_of_the_03_command_agrees_with_torchtitan():
    text = TORCHTITAN["v-interleaved-tp"]
    ours, theirs = _torchtitan_command(text)["parallelism"], _torchtitan_parse(text).parallelism
    assert all(getattr(theirs, k) == v for k, v in ours.items())


@pytest.mark.parametrize("optimizer, kind, step_key", [("onebit_adam", "onebitadam", "freeze_step"),
                                                       ("onebit_lamb", "onebitlamb", "freeze_step"),
                                                       ("zero_one_adam", "zerooneadam", "var_freeze_step")])
def test_deepspeed_0_19_8_has_no_1_bit_optimizers_and_the_export_says_so(optimizer, kind, step_key, tmp_path,
                                                                           one_rank_group):
    """The export writes each 1-bit optimizer as DeepSpeed 0.19.6 dispatches on it (engine.py
    ONEBIT_ADAM_OPTIMIZER ...: the type lower-cased, the warm-up under the key its optimizer reads), and
    says on stderr that the pinned DeepSpeed 0.19.8 has none: its parser keeps the type as written,
    outside DEEPSPEED_OPTIMIZERS, and its engine would look it up in torch.optim."""
    import torch

    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS, DeepSpeedConfig
    from simcore.plan.writers import export_with_notes

    doc = plan_to_dict(PLANS["v-ds-zero2-offload"])
    doc["parallel"] = {"dp": doc["parallel"]["dp"], "zero": 0}
    doc["training"] = {**doc["training"], "offload": "none", "precision": "fp16", "optimizer": optimizer,
                       "onebit_freeze_step": 400}
    path = tmp_path / "ds_config.json"
    text, notes = export_with_notes(plan_from_dict(doc), "deepspeed")
    path.write_text(text)
    cfg = DeepSpeedConfig(str(path), mpu=_DataParallel(doc["parallel"]["dp"]))
    assert cfg.optimizer_name.lower() == kind and cfg.optimizer_params[step_key] == 400
    assert kind not in DEEPSPEED_OPTIMIZERS and not hasattr(torch.optim, cfg.optimizer_name)
    assert any("needs DeepSpeed 0.19.6 or earlier" in n for n in notes)
