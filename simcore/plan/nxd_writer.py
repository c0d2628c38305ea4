"""Export a Plan on Trainium as a NeuronX Distributed launch: torchrun over every NeuronCore with
aws-neuron/neuronx-distributed's Llama pretraining script
(examples/training/llama/tp_pp_llama_hf_pretrain/run_llama_nxd.py @fbac349, Release 2.29), its
options as ``nxd_args.yaml`` lists them, and the model's config.json written beside it (the script
builds ``LlamaConfig.from_pretrained(--training_config)``).

- Units (the catalog's trn1 entry): a chip is two NeuronCores, one rank each, and the two ranks of a
  chip sit in one tensor-parallel group: ``--tensor_parallel_size`` is 2 x ``parallel.tp``, the
  pipeline, context and data-parallel degrees are the Plan's; 32 ranks a trn1.32xlarge.
- Batch: ``--train_batch_size`` is a data-parallel rank's sequences a step (the script's dataloader
  takes it per rank), ``--num_microbatches`` that over ``training.micro_batch``.
- ``--use_zero1_optimizer`` for ``parallel.zero`` 1; ``--use_sequence_parallel``; ``--kv_replicator``
  (NxD's copies of each KV head); ``--use_flash_attention``; ``--virtual_pipeline_size``;
  ``--context_parallel_size``, whose attention is the ring (modeling_llama_nxd.py turns
  ``use_ring_attention`` on with CP): ``parallel.cp_comm`` p2p only.
- Recompute: the script checkpoints the selected modules under ``--use_selective_checkpoint 1`` and
  every layer in full otherwise (``activation_checkpoint_config=... else "full"``): ``selective`` and
  ``full`` are written, ``none`` refused.
- The launch environment of its own run_llama2_70B_tp_pp.sh (EFA, the Neuron compiler's transformer
  model type).

Refused in one sentence: another chip, a model run_llama_nxd.py does not build (it builds Llama:
RMSNorm, SwiGLU, RoPE, no biases, no experts), no pipeline (the example steps through NxD's pipeline
runtime; its tp_zero1 example is not written), ZeRO-2/3, no recompute, fp8/fp16, schedules other than
1F1B (interleaved with vpp), and a TP group wider than a node's 32 NeuronCores.
"""
from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path

import yaml

from simcore.plan.hf_writer import hf_config_from_model
from simcore.plan.model_props import Activation, Bias, Norm
from simcore.plan.spec import Plan, TrainingSpec

ARGS_FILE = Path(__file__).with_name("nxd_args.yaml")
#: NeuronCores a Trainium chip holds (the catalog's trn1 ``unit``): one rank each.
CORES_PER_CHIP = 2
SCRIPT = "run_llama_nxd.py"
SOURCE = "aws-neuron/neuronx-distributed @fbac349 examples/training/llama/tp_pp_llama_hf_pretrain/run_llama_nxd.py"
#: run_llama2_70B_tp_pp.sh's environment (@fbac349), as its launch sets it.
ENV = {"FI_EFA_USE_DEVICE_RDMA": "1", "FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", "XLA_DISABLE_FUNCTIONALIZATION": "0",
       "NEURON_FUSE_SOFTMAX": "1", "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": "7", "MALLOC_ARENA_MAX": "128",
       "NEURON_CC_FLAGS": '"--model-type=transformer"'}


@functools.cache
def accepted() -> frozenset[str]:
    return frozenset(yaml.safe_load(ARGS_FILE.read_text())["options"])


def recompute_doc_value(tr: TrainingSpec) -> str:
    """``training.recompute`` as a sentence names it (full with its method and layers where not plain)."""
    if tr.recompute.value == "full" and (tr.recompute_method.value != "uniform" or tr.recompute_layers != 1):
        return f"full ({tr.recompute_method.value}, {tr.recompute_layers} layers)"
    return tr.recompute.value


def _refuse(field: str, value, why: str) -> ValueError:
    return ValueError(f"{field}={value} has no NeuronX Distributed option: {why}")


def nxd_args(plan: Plan) -> list[tuple[str, object]]:
    """run_llama_nxd.py's options for ``plan`` (the module docstring's rules)."""
    m, par, tr, node = plan.model, plan.parallel, plan.training, plan.cluster.node
    if node.gpu.vendor != "aws":
        raise ValueError(f"cluster.node={node.name} is not a Trainium host: NeuronX Distributed runs on Trainium "
                         "(export --to megatron for GPUs)")
    llama = m.norm == Norm.RMSNORM and m.activation == Activation.SWIGLU and m.bias == Bias.NONE \
        and m.position_embedding.value == "rope" and not m.moe and not m.mla
    if not llama:
        raise _refuse("model", m.name, f"{SCRIPT} builds Llama (RMSNorm, SwiGLU, RoPE, no biases, no experts)")
    if par.zero > 1:
        raise _refuse("parallel.zero", int(par.zero), "its optimizer shards states only (--use_zero1_optimizer)")
    whole = tr.recompute.value == "full" and tr.recompute_method.value == "uniform" and tr.recompute_layers == 1
    if tr.recompute.value != "selective" and not whole:
        raise _refuse("training.recompute", recompute_doc_value(tr), f"{SCRIPT} checkpoints the selected modules or "
                      "every layer in full, one at a time")
    if tr.precision.value != "bf16":
        raise _refuse("training.precision", tr.precision.value, f"{SCRIPT} trains bf16 with fp32 master weights")
    if par.cp > 1 and par.cp_comm.value != "p2p":   # modeling_llama_nxd.py: context parallel is ring attention
        raise _refuse("parallel.cp_comm", par.cp_comm.value, "its context parallel is ring attention "
                      "(examples/training/llama/modeling_llama_nxd.py: use_ring_attention where the CP size > 1)")
    if par.pp == 1:   # the example runs its steps through NxD's pipeline runtime (model.run_train)
        raise _refuse("parallel.pp", 1, f"{SCRIPT} is NxD's pipeline example (its tp_zero1 example, not written "
                      "here, trains without a pipeline)")
    if par.schedule.value not in ("1f1b", "interleaved-1f1b"):
        raise _refuse("parallel.schedule", par.schedule.value, "its pipeline runs 1F1B, interleaved with vpp")
    tp = CORES_PER_CHIP * par.tp
    if tp > CORES_PER_CHIP * plan.cluster.gpus_per_node:
        raise _refuse("parallel.tp", par.tp, f"a tensor-parallel group spans one node's "
                      f"{CORES_PER_CHIP * plan.cluster.gpus_per_node} NeuronCores at most")
    per_rank = tr.global_batch // par.dp
    return [("--training_config", "."), ("--seq_len", m.seq_len), ("--tensor_parallel_size", tp),
            ("--pipeline_parallel_size", par.pp), ("--virtual_pipeline_size", par.vpp),
            ("--context_parallel_size", par.cp), ("--kv_replicator", par.kv_replicator),
            ("--train_batch_size", per_rank), ("--num_microbatches", per_rank // tr.micro_batch),
            ("--use_zero1_optimizer", int(par.zero == 1)), ("--use_sequence_parallel", int(par.sequence_parallel)),
            ("--use_selective_checkpoint", int(tr.recompute.value == "selective")),
            ("--use_flash_attention", int(tr.flash_attention))]


def export_nxd(plan: Plan, shape: tuple[int, int]) -> str:
    """The launch script: the environment, the model's config.json written by a heredoc, torchrun over
    ``shape`` (nodes, chips a node) with two ranks a chip."""
    args = nxd_args(plan)
    unknown = [k for k, _ in args if k not in accepted()]
    if unknown:   # a guard on this module: every option written is one run_llama_nxd.py defines
        raise ValueError(f"{unknown[0]} is not a {SCRIPT} option ({SOURCE})")
    nnodes, chips = shape
    config = json.dumps(hf_config_from_model(plan.model), indent=2, sort_keys=True)
    lines = ["#!/bin/bash", f"# NeuronX Distributed launch for plan '{plan.name or plan.model.name}', written by trainplan.",
             f"# Options as spelt in {SOURCE} (simcore/plan/nxd_args.yaml).",
             "# Run from that example's directory with --training_dir pointing at your tokenized data; on several",
             "# nodes run this on each with --node_rank and --master_addr (torchrun).",
             *[f"export {k}={v}" for k, v in ENV.items()],
             "cat > config.json <<'EOF'", config, "EOF"]
    cmd = [f"torchrun --nnodes {nnodes} --nproc-per-node {CORES_PER_CHIP * chips} {SCRIPT}"] + \
        [f"{k} {shlex.quote(str(v))}" for k, v in args]
    return "\n".join(lines) + "\n" + " \\\n    ".join(cmd) + "\n"
