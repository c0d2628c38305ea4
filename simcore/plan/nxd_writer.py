"""Export a Plan on Trainium as a NeuronX Distributed launch: torchrun over every NeuronCore with one of
aws-neuron/neuronx-distributed's Llama pretraining examples (@fbac349, Release 2.29), its options as
``nxd_args.yaml`` lists them, and the model's config.json written beside it (each builds
``LlamaConfig.from_pretrained`` of the directory given): with a pipeline,
examples/training/llama/tp_pp_llama_hf_pretrain/run_llama_nxd.py; without one,
examples/training/llama/tp_zero1_llama_hf_pretrain/tp_zero1_llama_hf_pretrain.py.

- Units (the catalog's trn1 entry): a chip is two NeuronCores, one rank each, and the two ranks of a
  chip sit in one tensor-parallel group: ``--tensor_parallel_size`` is 2 x ``parallel.tp``, the
  pipeline, context and data-parallel degrees are the Plan's; 32 ranks a trn1.32xlarge.
- Batch: run_llama_nxd.py's ``--train_batch_size`` is a data-parallel rank's sequences a step (its
  dataloader takes it per rank), ``--num_microbatches`` that over ``training.micro_batch``;
  tp_zero1's ``--batch_size`` is the micro-batch and ``--grad_accum_usteps`` the micro-batches a step
  (as its tp_zero1_llama3_8B_hf_pretrain.sh computes ACC_STEPS = GBS / MBS / DP).
- ``--use_zero1_optimizer`` for ``parallel.zero`` 1; ``--use_sequence_parallel``; ``--kv_replicator``
  (NxD's copies of each KV head); ``--use_flash_attention``; ``--virtual_pipeline_size``;
  ``--context_parallel_size``, whose attention is the ring (modeling_llama_nxd.py turns
  ``use_ring_attention`` on with CP): ``parallel.cp_comm`` p2p only.
- Recompute: both check-point the selected modules (``--use_selective_checkpoint 1``,
  ``--selective_checkpoint_enabled``) and every layer in full otherwise (``activation_checkpoint_config=
  ... else "full"``): ``selective`` and ``full`` (one layer at a time) are written, others refused.
- tp_zero1's switches are flags: ``--use_zero_1``, ``--sequence_parallel_enabled``, ``--use_mix_precision``
  (bf16 with fp32 master weights, as its launch adds it).
- The launch environment of the examples' own scripts (EFA, the Neuron compiler's transformer model
  type).

Refused in one sentence: another chip, a model run_llama_nxd.py does not build (it builds Llama:
RMSNorm, SwiGLU, RoPE, no biases, no experts), ZeRO-2/3, no recompute, fp8/fp16, schedules other than
1F1B (interleaved with vpp), context parallel other than the ring, and a TP group wider than a node's 32
NeuronCores.
"""
from __future__ import annotations

import functools
import json
import shlex
from pathlib import Path

import yaml

from simcore.plan.hf_writer import hf_config_from_model
from simcore.plan.model_props import Activation, Bias, Norm
from simcore.plan.rules import kv_copies
from simcore.plan.spec import Plan, TrainingSpec

ARGS_FILE = Path(__file__).with_name("nxd_args.yaml")
#: NeuronCores a Trainium chip holds (the catalog's trn1 ``unit``): one rank each.
CORES_PER_CHIP = 2
SCRIPT, ZERO1_SCRIPT = "run_llama_nxd.py", "tp_zero1_llama_hf_pretrain.py"
SOURCE = "aws-neuron/neuronx-distributed @fbac349 examples/training/llama"
#: run_llama2_70B_tp_pp.sh's environment (@fbac349), as its launch sets it.
ENV = {"FI_EFA_USE_DEVICE_RDMA": "1", "FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", "XLA_DISABLE_FUNCTIONALIZATION": "0",
       "NEURON_FUSE_SOFTMAX": "1", "NEURON_RT_ASYNC_EXEC_MAX_INFLIGHT_REQUESTS": "7", "MALLOC_ARENA_MAX": "128",
       "NEURON_CC_FLAGS": '"--model-type=transformer"'}


@functools.cache
def accepted(script: str) -> frozenset[str]:
    """The options ``script`` defines (``nxd_args.yaml``)."""
    return frozenset(yaml.safe_load(ARGS_FILE.read_text())["scripts"][script]["options"])


def recompute_doc_value(tr: TrainingSpec) -> str:
    """``training.recompute`` as a sentence names it (full with its method and layers where not plain)."""
    if tr.recompute.value == "full" and (tr.recompute_method.value != "uniform" or tr.recompute_layers != 1):
        return f"full ({tr.recompute_method.value}, {tr.recompute_layers} layers)"
    return tr.recompute.value


def _refuse(field: str, value, why: str) -> ValueError:
    return ValueError(f"{field}={value} has no NeuronX Distributed option: {why}")


def llama_model(m) -> bool:
    """Whether NxD's Llama examples build model ``m``: RMSNorm, SwiGLU, RoPE, no biases, no experts, no MLA."""
    return m.norm == Norm.RMSNORM and m.activation == Activation.SWIGLU and m.bias == Bias.NONE \
        and m.position_embedding.value == "rope" and not m.moe and not m.mla


def nxd_args(plan: Plan) -> tuple[str, list[tuple[str, object]]]:
    """(the example script, its options) for ``plan`` (the module docstring's rules)."""
    m, par, tr, node = plan.model, plan.parallel, plan.training, plan.cluster.node
    if node.gpu.vendor != "aws":
        raise ValueError(f"cluster.node={node.name} is not a Trainium host: NeuronX Distributed runs on Trainium "
                         "(export --to megatron for GPUs)")
    if not llama_model(m):
        raise _refuse("model", m.name, "its examples build Llama (RMSNorm, SwiGLU, RoPE, no biases, no experts)")
    if par.zero > 1:
        raise _refuse("parallel.zero", int(par.zero), "its optimizer shards states only (--use_zero1_optimizer)")
    whole = tr.recompute.value == "full" and tr.recompute_method.value == "uniform" and tr.recompute_layers == 1
    if tr.recompute.value != "selective" and not whole:
        raise _refuse("training.recompute", recompute_doc_value(tr), "its examples checkpoint the selected modules "
                      "or every layer in full, one at a time")
    if tr.precision.value != "bf16":
        raise _refuse("training.precision", tr.precision.value, "its examples train bf16 with fp32 master weights")
    if par.cp > 1 and par.cp_comm.value != "p2p":   # modeling_llama_nxd.py: context parallel is ring attention
        raise _refuse("parallel.cp_comm", par.cp_comm.value, "its context parallel is ring attention "
                      "(examples/training/llama/modeling_llama_nxd.py: use_ring_attention where the CP size > 1)")
    if par.pp > 1 and par.schedule.value not in ("1f1b", "interleaved-1f1b"):
        raise _refuse("parallel.schedule", par.schedule.value, "its pipeline runs 1F1B, interleaved with vpp")
    tp = CORES_PER_CHIP * par.tp
    if tp > CORES_PER_CHIP * plan.cluster.gpus_per_node:
        raise _refuse("parallel.tp", par.tp, f"a tensor-parallel group spans one node's "
                      f"{CORES_PER_CHIP * plan.cluster.gpus_per_node} NeuronCores at most")
    # modeling_llama_nxd.py @fbac349b: divide(num_key_value_heads * kv_shared_group_size, tp_size), which asserts it
    if (m.kv_heads * par.kv_replicator) % tp:
        raise _refuse("parallel.kv_replicator", par.kv_replicator,
                      f"each of the {tp} NeuronCores of the TP group holds whole key/value heads, so {m.kv_heads} "
                      f"heads need a kv_replicator that makes them a multiple of {tp} ({kv_copies(tp, m.kv_heads)})")
    per_rank, selective = tr.global_batch // par.dp, tr.recompute.value == "selective"
    if par.pp == 1:   # tp_zero1: flags, the micro-batch and its accumulation steps
        flags = (("--use_mix_precision", True), ("--use_zero_1", par.zero == 1),
                 ("--sequence_parallel_enabled", par.sequence_parallel), ("--selective_checkpoint_enabled", selective))
        return ZERO1_SCRIPT, [("--model_path", "."), ("--seq_len", m.seq_len), ("--tensor_parallel_size", tp),
                              ("--context_parallel_size", par.cp), ("--kv_replicator", par.kv_replicator),
                              ("--batch_size", tr.micro_batch), ("--grad_accum_usteps", per_rank // tr.micro_batch),
                              ("--use_flash_attention", int(tr.flash_attention))] + [(k, None) for k, on in flags if on]
    return SCRIPT, [("--training_config", "."), ("--seq_len", m.seq_len), ("--tensor_parallel_size", tp),
                    ("--pipeline_parallel_size", par.pp), ("--virtual_pipeline_size", par.vpp),
                    ("--context_parallel_size", par.cp), ("--kv_replicator", par.kv_replicator),
                    ("--train_batch_size", per_rank), ("--num_microbatches", per_rank // tr.micro_batch),
                    ("--use_zero1_optimizer", int(par.zero == 1)), ("--use_sequence_parallel", int(par.sequence_parallel)),
                    ("--use_selective_checkpoint", int(selective)), ("--use_flash_attention", int(tr.flash_attention))]


def export_nxd(plan: Plan, shape: tuple[int, int]) -> str:
    """The launch script: the environment, the model's config.json written by a heredoc, torchrun over
    ``shape`` (nodes, chips a node) with two ranks a chip."""
    script, args = nxd_args(plan)
    unknown = [k for k, _ in args if k not in accepted(script)]
    if unknown:   # a guard on this module: every option written is one the script defines
        raise ValueError(f"{unknown[0]} is not a {script} option ({SOURCE})")
    nnodes, chips = shape
    config = json.dumps(hf_config_from_model(plan.model), indent=2, sort_keys=True)
    lines = ["#!/bin/bash", f"# NeuronX Distributed launch for plan '{plan.name or plan.model.name}', written by trainplan.",
             f"# Options as spelt in {SOURCE}/.../{script} (simcore/plan/nxd_args.yaml).",
             "# Run from that example's directory with --training_dir pointing at your tokenized data; on several",
             "# nodes run this on each with --node_rank and --master_addr (torchrun).",
             *[f"export {k}={v}" for k, v in ENV.items()],
             "cat > config.json <<'EOF'", config, "EOF"]
    cmd = [f"torchrun --nnodes {nnodes} --nproc-per-node {CORES_PER_CHIP * chips} {script}"] + \
        [k if v is None else f"{k} {shlex.quote(str(v))}" for k, v in args]
    return "\n".join(lines) + "\n" + " \\\n    ".join(cmd) + "\n"
