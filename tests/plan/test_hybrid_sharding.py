"""Hybrid sharding (``parallel.dp_replicate``) through the importers and exporters, as the tools
read it: torchtitan's ``data_parallel_replicate_degree`` x ``data_parallel_shard_degree`` (HSDP,
torchtitan/config/configs.py), Megatron-LM's ``--num-distributed-optimizer-instances N`` (the
distributed optimizer, or Megatron-FSDP, split into N instances that all-reduce their shards:
megatron/core/parallel_state.py, fsdp/mcore_fsdp_adapter.py @d98e8a64); DeepSpeed's hybrid is MiCS,
not modelled, so its export refuses."""
import re

import pytest

from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.megatron_log import read_megatron_log
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan
from tests.plan.layouts import ALL, EXAMPLES
from tests.plan.test_export_refusals import assert_one_sentence_naming
from tests.plan.test_megatron_args import broken_rules, parse_export

HSDP_TOML = (EXAMPLES / "torchtitan" / "llama3_70b.toml").read_text().replace(
    "data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 2", 1)
TT_LAUNCH = ("torchrun --nnodes 8 --nproc-per-node 8 -m torchtitan.train --module llama3 --config llama3_70b "
             "--parallelism.data-parallel-replicate-degree {r} --parallelism.data-parallel-shard-degree {s}")
CMD = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
       "--seq-length 1024 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16 ")


# --------------------------------------------------------------------------- torchtitan

@pytest.mark.parametrize("text", [HSDP_TOML, TT_LAUNCH.format(r=2, s=4), TT_LAUNCH.format(r=2, s=-1)])
def test_torchtitan_hsdp_imports_as_dp_replicate_without_a_note(text):
    """64 GPUs / tp 8 = dp 8: 2 replicas of 4-way FSDP (the 0.2 TOML, the 0.3 command, shard -1)."""
    doc, warnings = import_plan(torchtitan=text, cluster="dgx-h100", nodes=8)
    par = doc["parallel"]
    assert (par["dp"], par["dp_replicate"], par["zero"]) == (8, 2, 3)
    assert not any("HSDP" in w or "zero over all dp" in w for w in warnings), warnings
    assert plan_from_dict(doc).parallel.shard_ranks == 4


def test_torchtitan_replicate_alone_is_still_ddp():
    doc, _ = import_plan(torchtitan=TT_LAUNCH.format(r=8, s=1), cluster="dgx-h100", nodes=8)
    assert doc["parallel"]["zero"] == 0 and doc["parallel"]["dp"] == 8 and "dp_replicate" not in doc["parallel"]


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
def test_torchtitan_writes_replicate_and_shard_degrees_and_reads_them_back(target):
    plan = ALL["v-hsdp-zero3"]   # dp 8, dp_replicate 2, zero 3
    text = export_plan(plan, target)
    if target == "torchtitan":
        assert "--parallelism.data-parallel-replicate-degree 2" in text
        assert "--parallelism.data-parallel-shard-degree 4" in text
    else:
        assert "data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n" in text
    doc, warnings = import_plan(torchtitan=text, cluster="dgx-h100", nodes=1, hf="examples/hf/llama3-8b/config.json")
    assert (doc["parallel"]["dp"], doc["parallel"]["dp_replicate"], doc["parallel"]["zero"]) == (8, 2, 3)
    assert not any("HSDP" in w for w in warnings)


def test_torchtitan_refuses_hsdp_that_shards_over_the_context_ranks_alone():
    base = plan_to_dict(ALL["v-hsdp-zero3"])
    base["parallel"].update(dp=4, cp=2, dp_replicate=4)   # shard ranks: dp / 4 x cp 2
    with pytest.raises(ValueError) as refusal:
        export_plan(plan_from_dict(base), "torchtitan")
    assert_one_sentence_naming(str(refusal.value), "parallel.dp_replicate")


# --------------------------------------------------------------------------- Megatron-LM

@pytest.mark.parametrize("options, zero", [
    ("--use-distributed-optimizer", 1),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --use-distributed-optimizer", 3),
    ("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --outer-dp-sharding-strategy no_shard", 2),
])
def test_megatron_reads_distributed_optimizer_instances(options, zero):
    r = read_megatron(CMD + options + " --num-distributed-optimizer-instances 2")
    assert (r.fields["parallel.zero"], r.fields["parallel.dp_replicate"]) == (zero, 2)
    assert "--num-distributed-optimizer-instances" not in r.ignored and "--outer-dp-sharding-strategy" not in r.ignored


def test_megatron_instances_that_do_not_split_the_optimizer():
    one = read_megatron(CMD + "--use-distributed-optimizer --num-distributed-optimizer-instances 1")
    assert one.fields.get("parallel.dp_replicate") is None and "--num-distributed-optimizer-instances" not in one.ignored
    fsdp2 = read_megatron(CMD + "--use-torch-fsdp2 --num-distributed-optimizer-instances 2")   # shards over all dp
    assert fsdp2.fields.get("parallel.dp_replicate") is None and "--num-distributed-optimizer-instances" in fsdp2.ignored
    with pytest.raises(PlanError, match="--num-distributed-optimizer-instances 2 needs --use-distributed-optimizer"):
        read_megatron(CMD + "--num-distributed-optimizer-instances 2")
    with pytest.raises(PlanError, match="--outer-dp-sharding-strategy optim .* parallel.dp_replicate"):
        read_megatron(CMD + "--use-megatron-fsdp --num-distributed-optimizer-instances 2 "
                            "--outer-dp-sharding-strategy optim")


def test_a_megatron_log_gives_the_instances():
    block = ("------------------------ arguments ------------------------\n"
             "  num_layers ...................................... 4\n"
             "  use_distributed_optimizer ....................... True\n"
             "  num_distributed_optimizer_instances ............. {n}\n"
             "-------------------- end of arguments ---------------------\n")
    assert read_megatron_log(block.format(n=4)).fields["parallel.dp_replicate"] == 4
    one = read_megatron_log(block.format(n=1))
    assert one.fields.get("parallel.dp_replicate") is None and "--num-distributed-optimizer-instances" not in one.ignored


@pytest.mark.parametrize("name, flags", [
    ("v-hsdp-zero1", ["--use-distributed-optimizer", "--num-distributed-optimizer-instances 4"]),
    ("v-hsdp-zero3", ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
                      "--num-distributed-optimizer-instances 2"]),
])
@pytest.mark.parametrize("target", ["megatron", "slurm"])
def test_megatron_writes_the_instances_and_reads_them_back(name, flags, target):
    plan = ALL[name]
    text = export_plan(plan, target)
    assert all(re.search(rf"^\s+{re.escape(f)} \\$", text, re.M) for f in flags), text
    args, _, _ = parse_export(text)   # Megatron's own option definitions (megatron_args.yaml)
    assert args["num_distributed_optimizer_instances"] == plan.parallel.dp_replicate
    assert broken_rules(text) == []
    doc, _ = import_plan(megatron=text, cluster=plan.cluster.node.name, nodes=plan.cluster.nodes)
    back = plan_from_dict(doc).parallel
    assert (back.dp, back.zero, back.dp_replicate) == (plan.parallel.dp, plan.parallel.zero, plan.parallel.dp_replicate)


def test_the_megatron_rules_catch_instances_without_the_distributed_optimizer():
    text = export_plan(ALL["v-hsdp-zero1"], "megatron")
    assert broken_rules(text.replace("    --use-distributed-optimizer \\\n", "")) == ["partial-distopt-needs-distopt"]
    assert broken_rules(text.replace("instances 4", "instances 3")) == ["partial-distopt-divides-dp"]


def test_plans_without_dp_replicate_write_no_instances():
    for name in ("llama3-8b-fsdp-h100", "llama3-70b-h100"):
        assert "--num-distributed-optimizer-instances" not in export_plan(ALL[name], "megatron")


# --------------------------------------------------------------------------- DeepSpeed

@pytest.mark.parametrize("name", ["v-hsdp-zero1", "v-hsdp-zero3"])
def test_deepspeed_refuses_hybrid_sharding_in_one_sentence(name):
    with pytest.raises(ValueError) as refusal:
        export_plan(ALL[name], "deepspeed")
    message = str(refusal.value)
    assert_one_sentence_naming(message, "parallel.dp_replicate")
    assert message == (f"parallel.dp_replicate={ALL[name].parallel.dp_replicate} has no DeepSpeed config option: "
                       "DeepSpeed's hybrid sharding is MiCS (zero_optimization.mics_shard_size), which the Plan "
                       "does not model")


def test_the_trainplan_sbatch_carries_the_plan_file():
    """slurm-trainplan runs the executor on the Plan file itself, dp_replicate included (the
    executor refuses what it cannot run, naming the field, executors/support.py)."""
    text = export_plan(ALL["v-hsdp-zero3"], "slurm-trainplan", plan_path="hsdp.yaml")
    assert "-m executors.launch hsdp.yaml" in text


def test_a_torchtitan_0_3_import_says_its_attention_is_flex_attention():
    """torchtitan 0.3's llama3 and qwen3 model_registry attend through FlexAttention unless the config sets another
    attn_backend (models/llama3/__init__.py, models/qwen3/__init__.py: ``attn_backend: str = "flex"``); the
    import prices the catalog's flash kernel and says so. The 0.2 TOML (SDPA) and gpt_oss (varlen: flash-attn)
    say nothing."""
    _, warnings = import_plan(torchtitan=TT_LAUNCH.format(r=1, s=8), cluster="dgx-h100", nodes=8)
    assert any("attends through FlexAttention (attn_backend flex" in w for w in warnings), warnings
    _, warnings = import_plan(torchtitan=HSDP_TOML, cluster="dgx-h100", nodes=8)
    assert not any("FlexAttention" in w for w in warnings)
    _, warnings = import_plan(torchtitan="torchrun --nnodes 4 --nproc-per-node 8 -m torchtitan.train --module gpt_oss "
                              "--config gpt_oss_20b --parallelism.expert-parallel-degree 8", cluster="dgx-h100", nodes=4)
    assert not any("FlexAttention" in w for w in warnings)
