"""``trainplan export --to nxd``: a plan on Trainium as NeuronX Distributed's Llama pretraining examples
(@fbac349: run_llama_nxd.py with a pipeline, tp_zero1_llama_hf_pretrain.py without). Every export parses with
its script's own options (simcore/plan/nxd_args.yaml, read from their add_argument calls; NxD is not
installable here, so the parsers are rebuilt from the data), counts NeuronCores as the scripts do (two a chip,
in one tensor-parallel group) and carries the model's config.json; what they cannot run is one sentence."""
import argparse
import json
import re

import pytest
import yaml

from simcore.plan.hf_writer import hf_config_from_model
from simcore.plan.load import plan_from_dict
from simcore.plan.megatron_reader import split_command
from simcore.plan.nxd_writer import ARGS_FILE
from simcore.plan.writers import export_plan
from tests.plan.test_megatron_args import options_parser

DATA = yaml.safe_load(ARGS_FILE.read_text())
PARSERS = {script: options_parser(spec["options"]) for script, spec in DATA["scripts"].items()}


def _plan(parallel: dict, training: dict | None = None, model: str = "llama3-8b", nodes: int = 2):
    return plan_from_dict({"name": "trn", "model": {"name": model}, "cluster": {"node": "trn1-32xl", "nodes": nodes},
                           "parallel": parallel,
                           "training": {"global_batch": 64, "recompute": "selective", **(training or {})}})


PLANS = {
    "tp16-pp2-kv4": _plan({"tp": 16, "pp": 2, "dp": 1, "zero": 1, "sequence_parallel": True, "kv_replicator": 4}),
    "tp16-dp2-zero1-kv4": _plan({"tp": 16, "dp": 2, "zero": 1, "sequence_parallel": True, "kv_replicator": 4}),
    "tp4-dp4-cp2-full": _plan({"tp": 4, "dp": 4, "cp": 2, "cp_comm": "p2p"}, {"recompute": "full", "micro_batch": 2}),
    "tp2-pp2-cp2-ring": _plan({"tp": 2, "pp": 2, "cp": 2, "dp": 4, "cp_comm": "p2p"}, {"recompute": "full"}),
    "tp4-pp4-dp2-interleaved": _plan({"tp": 4, "pp": 4, "dp": 2, "vpp": 2, "schedule": "interleaved-1f1b"},
                                     {"recompute": "full", "micro_batch": 2}),
    # 8 chips, 16 NeuronCores over Llama 3 70B's 8 KV heads: each copied twice (NxD's own --kv_replicator)
    "llama3-70b-tp8-pp8-dp4": _plan({"tp": 8, "pp": 8, "dp": 4, "zero": 1, "sequence_parallel": True,
                                     "kv_replicator": 2}, {"flash_attention": True}, model="llama3-70b", nodes=16),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_every_export_parses_with_the_scripts_options_and_counts_neuroncores(name):
    plan = PLANS[name]
    text = export_plan(plan, "nxd")
    pre, env, opts = split_command(text)
    script = pre["script"].rsplit("/", 1)[-1]
    tokens = [t for k, values in opts.items() for t in [k, *values]]
    try:
        args = PARSERS[script].parse_args(tokens)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise AssertionError(f"{script}'s parser refuses the export: {exc}") from None
    par, tr = plan.parallel, plan.training
    assert int(pre["--nnodes"]) * int(pre["--nproc-per-node"]) == 2 * par.gpus   # one rank a NeuronCore
    assert args.tensor_parallel_size == 2 * par.tp
    assert (args.context_parallel_size, args.kv_replicator) == (par.cp, par.kv_replicator)
    assert args.use_flash_attention == int(tr.flash_attention)
    selective = tr.recompute.value == "selective"
    if par.pp > 1:   # run_llama_nxd.py: the pipeline's per-rank batch and micro-batches
        assert script == "run_llama_nxd.py" and args.training_config == "."
        assert (args.pipeline_parallel_size, args.virtual_pipeline_size) == (par.pp, par.vpp)
        assert args.train_batch_size * par.dp == tr.global_batch
        assert args.train_batch_size == args.num_microbatches * tr.micro_batch
        assert (args.use_zero1_optimizer, args.use_sequence_parallel) == (int(par.zero == 1), int(par.sequence_parallel))
        assert args.use_selective_checkpoint == int(selective)
    else:   # tp_zero1: the micro-batch and its accumulation steps, switches as flags
        assert script == "tp_zero1_llama_hf_pretrain.py" and args.model_path == "."
        assert args.batch_size * args.grad_accum_usteps * par.dp == tr.global_batch and args.batch_size == tr.micro_batch
        assert (args.use_zero_1, args.sequence_parallel_enabled) == (par.zero == 1, par.sequence_parallel)
        assert args.selective_checkpoint_enabled == selective and args.use_mix_precision
    config = json.loads(re.search(r"<<'EOF'\n(.*?)\nEOF\n", text, re.S).group(1))
    assert config == json.loads(json.dumps(hf_config_from_model(plan.model)))
    assert env["FI_PROVIDER"] == "efa"


@pytest.mark.parametrize("parallel, training, model, match", [
    ({"tp": 4, "pp": 2, "dp": 4, "zero": 3}, {}, "llama3-8b", r"^parallel.zero=3 has no NeuronX Distributed option"),
    ({"tp": 4, "pp": 2, "dp": 4}, {"recompute": "none"}, "llama3-8b", r"^training.recompute=none has no NeuronX "
                                                                      r"Distributed option"),
    ({"tp": 4, "pp": 2, "dp": 2, "cp": 2, "cp_comm": "all_gather"}, {}, "llama3-8b",
     r"^parallel.cp_comm=all_gather has no NeuronX Distributed option: its context parallel is ring attention"),
    ({"tp": 4, "pp": 2, "dp": 4}, {"recompute": {"method": "block", "layers": 2}}, "llama3-8b",
     r"^training.recompute=full \(block, 2 layers\) has no NeuronX Distributed option"),
    ({"tp": 4, "pp": 2, "dp": 4}, {}, "mixtral-8x7b", r"^model=mixtral-8x7b has no NeuronX Distributed option: "
                                                      r"its examples build Llama"),
    # 8 chips hold 8 KV heads, one a chip, but NxD's 16 NeuronCores need whole heads each (modeling_llama_nxd.py)
    ({"tp": 8, "pp": 2, "dp": 2}, {}, "llama3-8b", r"^parallel.kv_replicator=1 has no NeuronX Distributed option: "
                                                   r"each of the 16 NeuronCores .* \(2\)$"),
])
def test_what_the_example_cannot_run_is_one_sentence(parallel, training, model, match):
    with pytest.raises(ValueError, match=match):
        export_plan(_plan(parallel, training, model), "nxd")


def test_a_gpu_plan_is_one_sentence():
    gpu = plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                          "parallel": {"dp": 4, "pp": 2}, "training": {"global_batch": 32, "recompute": "full"}})
    with pytest.raises(ValueError, match=r"^cluster.node=dgx-h100 is not a Trainium host: NeuronX Distributed runs on "
                                         r"Trainium \(export --to megatron for GPUs\)$"):
        export_plan(gpu, "nxd")
