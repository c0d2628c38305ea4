"""Export a Plan as the training stacks' launch files: a torchrun script with Megatron-LM's
pretrain_gpt.py arguments, a DeepSpeed ds_config.json, a torchtitan job TOML, an sbatch
script; and a model's shape as a Hugging Face config.json. Pure functions: a Plan in, text
out. Every option name written is one the tool defines (``tool_options.yaml``, checked by
``tests/test_interop.py``); a value the target has no option for is refused with a
``ValueError`` naming the field. The mappings and the tools' semantics: ``simcore.plan.interop``.
"""
from __future__ import annotations

import json
import re
import shlex

from simcore.plan.readers import load_tool_options
from simcore.plan.spec import Plan

TARGETS = ("deepspeed", "megatron", "slurm", "torchtitan")

_MEGATRON_SRC = "NVIDIA/Megatron-LM megatron/training/arguments.py (commit 000c4ac2, 2025)"
_TORCHTITAN_SRC = "pytorch/torchtitan torchtitan/config/job_config.py (commit 6404b932, 2025)"
_DEEPSPEED_SRC = ("deepspeedai/DeepSpeed deepspeed/runtime/constants.py (088be892), "
                  "zero/config.py (1b88ac36), zero/offload_config.py (1978617c), 2025")
_RDZV_PORT = 29500
"""torchrun's conventional rendezvous port (torch/distributed/run.py examples)."""


def export_plan(plan: Plan, to: str) -> str:
    """The plan as the target tool's launch file: ``megatron`` (a torchrun script with
    the pretrain_gpt.py arguments), ``deepspeed`` (ds_config.json), ``torchtitan`` (a
    job TOML) or ``slurm`` (an sbatch script running torchrun on the plan's nodes)."""
    writers = {"megatron": _export_megatron, "deepspeed": _export_deepspeed,
               "torchtitan": _export_torchtitan, "slurm": _export_slurm}
    if to not in writers:
        raise ValueError(f"unknown export target '{to}' (known: {', '.join(TARGETS)})")
    return writers[to](plan)


def _refuse(field_: str, value, tool: str, why: str = "") -> ValueError:
    return ValueError(f"{field_}={value} has no {tool} option{': ' + why if why else ''}")


def megatron_args(plan: Plan) -> list[tuple[str, object]]:
    """The pretrain_gpt.py options for this plan, as (option, value or None for a flag)."""
    return _megatron_model_args(plan) + _megatron_parallel_args(plan) + _megatron_training_args(plan)


def _megatron_model_args(plan: Plan) -> list:
    m = plan.model
    args = [("--num-layers", m.layers), ("--hidden-size", m.hidden), ("--ffn-hidden-size", m.ffn_hidden),
            ("--num-attention-heads", m.heads)]
    if m.kv_heads != m.heads:
        args += [("--group-query-attention", None), ("--num-query-groups", m.kv_heads)]
    args += [("--seq-length", m.seq_len), ("--max-position-embeddings", m.seq_len), ("--vocab-size", m.vocab),
             ("--position-embedding-type", "rope" if m.position_embedding.value == "rope" else "learned_absolute")]
    if m.gated_mlp:
        args.append(("--swiglu", None))
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    if m.moe:
        args += [("--num-experts", m.experts), ("--moe-router-topk", m.top_k),
                 ("--moe-expert-capacity-factor", m.capacity_factor)]
    return args


def _megatron_parallel_args(plan: Plan) -> list:
    par = plan.parallel
    args = [("--tensor-model-parallel-size", par.tp), ("--pipeline-model-parallel-size", par.pp)]
    if par.cp > 1:
        args.append(("--context-parallel-size", par.cp))
    if par.ep > 1:
        args += [("--expert-model-parallel-size", par.ep), ("--moe-token-dispatcher-type", "alltoall")]
    schedule = par.schedule.value
    if par.pp > 1 and schedule in ("gpipe", "zero-bubble"):
        raise _refuse("parallel.schedule", schedule, "Megatron-LM", "it runs 1F1B or interleaved 1F1B")
    if par.pp > 1 and schedule == "interleaved-1f1b" and par.vpp == 1:
        raise _refuse("parallel.schedule", schedule, "Megatron-LM", "interleaving needs parallel.vpp > 1")
    if par.vpp > 1:
        args.append(("--num-virtual-stages-per-pipeline-rank", par.vpp))
    args += _megatron_stage_args(plan)
    if par.sequence_parallel:
        args.append(("--sequence-parallel", None))
    if par.zero == 1:
        args.append(("--use-distributed-optimizer", None))
    elif par.zero >= 2:  # Megatron-FSDP's required flags (its user guide)
        args += [("--use-megatron-fsdp", None),
                 ("--data-parallel-sharding-strategy", "optim_grads" if par.zero == 2 else "optim_grads_params"),
                 ("--no-gradient-accumulation-fusion", None), ("--use-distributed-optimizer", None),
                 ("--ckpt-format", "fsdp_dtensor")]
    return args


def _megatron_stage_args(plan: Plan) -> list:
    stages = plan.layers_per_stage
    if len(set(stages)) == 1:
        return []
    middle = stages[1:-1]
    if plan.parallel.vpp > 1 or len(set(middle)) > 1:
        raise _refuse("parallel.stage_layers", list(stages), "Megatron-LM",
                      "only the first and last stage may differ (--decoder-first/last-pipeline-num-layers)")
    return [("--decoder-first-pipeline-num-layers", stages[0]), ("--decoder-last-pipeline-num-layers", stages[-1])]


def _megatron_training_args(plan: Plan) -> list:
    tr = plan.training
    args = [("--micro-batch-size", tr.micro_batch), ("--global-batch-size", tr.global_batch)]
    precision = {"bf16": [("--bf16", None)], "fp16": [("--fp16", None)], "fp32": [],
                 "fp8": [("--bf16", None), ("--fp8-format", "hybrid")]}
    args += precision[tr.precision.value]
    if tr.recompute.value == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", tr.recompute_method.value),
                 ("--recompute-num-layers", tr.recompute_layers)]
    elif tr.recompute.value in ("op", "layer"):
        raise _refuse("training.recompute", tr.recompute.value, "Megatron-LM", "it is torchtitan's policy")
    elif tr.recompute.value == "selective":
        args.append(("--recompute-granularity", "selective"))
    if tr.offload.value == "optimizer+params":
        raise _refuse("training.offload", tr.offload.value, "Megatron-LM", "it offloads optimizer states only")
    if tr.offload.value == "optimizer":
        args += [("--optimizer-cpu-offload", None), ("--use-precision-aware-optimizer", None)]
    if tr.flash_attention:
        args.append(("--attention-backend", "flash"))
    if tr.optimizer.value == "adam":
        raise _refuse("training.optimizer", "adam", "Megatron-LM", "its --optimizer adam is AdamW")
    args.append(("--optimizer", "sgd" if tr.optimizer.value == "sgd" else "adam"))
    if tr.grad_compression.value == "bf16":
        args.append(("--grad-reduce-in-bf16", None))
    elif tr.grad_compression.value != "none":
        raise _refuse("training.grad_compression", tr.grad_compression.value, "Megatron-LM")
    return args


def _torchrun_shape(plan: Plan) -> tuple[int, int]:
    """(nodes, processes per node) that launch exactly the plan's tp*pp*dp*cp ranks."""
    world, gpn = plan.parallel.gpus, plan.cluster.gpus_per_node
    if world <= gpn:
        return 1, world
    if world % gpn:
        raise ValueError(f"the plan uses {world} GPUs, not a whole number of {gpn}-GPU nodes; "
                         "torchrun needs the same process count on every node")
    return world // gpn, gpn


def _continued(lines: list[str], indent: str = "    ") -> str:
    return " \\\n".join([lines[0]] + [indent + ln for ln in lines[1:]])


def _arg_lines(args: list) -> list[str]:
    return [opt if value is None else f"{opt} {shlex.quote(str(value))}" for opt, value in args]


def _export_megatron(plan: Plan) -> str:
    nnodes, nproc = _torchrun_shape(plan)
    head = [
        "#!/bin/bash",
        f"# Megatron-LM launch for plan '{plan.name or plan.model.name}', written by trainplan.",
        f"# Options as spelt in {_MEGATRON_SRC}.",
        "# Add the data, tokenizer and learning-rate options of your run (--data-path,",
        "# --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node",
        "# with --node-rank and --master-addr, or use `trainplan export PLAN --to slurm`.",
    ]
    cmd = [f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} pretrain_gpt.py"] + _arg_lines(megatron_args(plan))
    return "\n".join(head) + "\n" + _continued(cmd) + "\n"


def _export_slurm(plan: Plan) -> str:
    nnodes, nproc = _torchrun_shape(plan)
    args = megatron_args(plan)
    name = re.sub(r"[^\w.-]", "_", plan.name or plan.model.name)
    head = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={nproc}",
        "#SBATCH --exclusive",
        f"# Plan '{plan.name or plan.model.name}' on {nnodes} x {plan.cluster.node.name}, written by trainplan:",
        f"# one torchrun per node starts {nproc} ranks (tp={plan.parallel.tp} pp={plan.parallel.pp} "
        f"dp={plan.parallel.dp} cp={plan.parallel.cp}).",
        "# sbatch options: https://slurm.schedmd.com/sbatch.html; torchrun options:",
        f"# torch/distributed/run.py (torch 2.x); training options: {_MEGATRON_SRC}.",
        "# Add the data, tokenizer and learning-rate options of your run.",
        "set -euo pipefail",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
    ]
    cmd = [f"srun torchrun --nnodes {nnodes} --nproc-per-node {nproc}",
           f'--rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:{_RDZV_PORT}"',
           "pretrain_gpt.py"] + _arg_lines(args)
    return "\n".join(head) + "\n" + _continued(cmd) + "\n"


def deepspeed_config(plan: Plan) -> dict:
    """The ds_config.json object for this plan."""
    tr, par = plan.training, plan.parallel
    cfg: dict = {"train_batch_size": tr.global_batch, "train_micro_batch_size_per_gpu": tr.micro_batch,
                 "gradient_accumulation_steps": plan.num_microbatches}
    if tr.precision.value == "fp8":
        raise _refuse("training.precision", "fp8", "DeepSpeed config", "FP8 comes from Transformer Engine layers")
    if tr.precision.value in ("bf16", "fp16"):
        cfg[tr.precision.value] = {"enabled": True}
    zero: dict = {"stage": int(par.zero)}
    if tr.offload.value != "none":
        if par.zero == 0:
            raise ValueError(f"training.offload={tr.offload.value} needs parallel.zero >= 1 in DeepSpeed "
                             "(ZeRO-Offload)")
        zero["offload_optimizer"] = {"device": "cpu"}
        if tr.offload.value == "optimizer+params":
            zero["offload_param"] = {"device": "cpu"}
    cfg["zero_optimization"] = zero
    if tr.grad_compression.value in ("fp16", "bf16"):
        cfg["communication_data_type"] = tr.grad_compression.value
    elif tr.grad_compression.value != "none":
        raise _refuse("training.grad_compression", tr.grad_compression.value, "DeepSpeed config")
    if tr.optimizer.value == "sgd":
        raise _refuse("training.optimizer", "sgd", "DeepSpeed config", "pass torch.optim.SGD to deepspeed.initialize")
    cfg["optimizer"] = ({"type": "AdamW"} if tr.optimizer.value == "adamw"
                        else {"type": "Adam", "params": {"adam_w_mode": False}})
    return cfg


def _export_deepspeed(plan: Plan) -> str:
    par = plan.parallel
    head = [
        f"// DeepSpeed config for plan '{plan.name or plan.model.name}', written by trainplan.",
        f"// Keys as spelt in {_DEEPSPEED_SRC}.",
        "// DeepSpeed reads this file with hjson, which allows these comment lines.",
        f"// Not held here: the model and tp={par.tp} pp={par.pp} cp={par.cp} (set by Megatron-DeepSpeed or the",
        "// model code), recompute and flash attention; the optimizer's lr goes in optimizer.params.",
    ]
    return "\n".join(head) + "\n" + json.dumps(deepspeed_config(plan), indent=2) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def torchtitan_config(plan: Plan) -> tuple[dict, list[str]]:
    """The job TOML as {section: {option: value}}, and comment lines for the file."""
    tr, par = plan.training, plan.parallel
    refusals = [
        (par.zero == 1, "parallel.zero", 1, "it has DDP (zero 0) and FSDP2 (zero 2, 3)"),
        (par.tp > 1 and not par.sequence_parallel, "parallel.sequence_parallel", "false",
         "its tensor parallel plan always shards the sequence"),
        (tr.precision.value == "fp16", "training.precision", "fp16", "mixed_precision_param is bfloat16 or float32"),
        (tr.offload.value == "optimizer", "training.offload", "optimizer",
         "enable_cpu_offload moves parameters, gradients and optimizer states (optimizer+params)"),
        (tr.grad_compression.value != "none", "training.grad_compression", tr.grad_compression.value, ""),
        (tr.optimizer.value == "sgd", "training.optimizer", "sgd", ""),
    ]
    for bad, name, value, why in refusals:
        if bad:
            raise _refuse(name, value, "torchtitan", why)
    model, notes = _torchtitan_model_section(plan)
    if tr.precision.value == "fp8":
        model["converters"] = ["float8"]
    local = tr.global_batch // par.dp if par.pp > 1 else tr.micro_batch
    training = {"local_batch_size": local, "global_batch_size": tr.global_batch, "seq_len": plan.model.seq_len,
                "mixed_precision_param": "float32" if tr.precision.value == "fp32" else "bfloat16",
                "enable_cpu_offload": tr.offload.value == "optimizer+params"}
    doc = {"job": {"description": plan.name or plan.model.name}, "model": model, "training": training,
           "optimizer": {"name": "AdamW" if tr.optimizer.value == "adamw" else "Adam"},
           "parallelism": _torchtitan_parallelism(plan),
           "activation_checkpoint": {"mode": tr.recompute.value}}
    if tr.recompute.value in ("selective", "op"):  # op-level SAC (nearest to Korthikanti et al.'s selective)
        doc["activation_checkpoint"] = {"mode": "selective", "selective_ac_option": "op"}
    elif tr.recompute.value == "layer":   # every Nth layer
        doc["activation_checkpoint"] = {"mode": "selective", "selective_ac_option": str(tr.recompute_layers)}
    elif tr.recompute.value == "full" and (tr.recompute_layers, tr.recompute_method.value) != (1, "uniform"):
        raise _refuse("training.recompute", f"{{layers: {tr.recompute_layers}, method: {tr.recompute_method.value}}}",
                      "torchtitan", "it checkpoints every layer or every Nth (layer:N)")
    return doc, notes


def _torchtitan_model_section(plan: Plan) -> tuple[dict, list[str]]:
    m = plan.model
    unlike_llama = [(m.moe, "model.experts", m.experts), (not m.gated_mlp, "model.gated_mlp", "false"),
                    (m.tied_embeddings, "model.tied_embeddings", "true"),
                    (m.position_embedding.value != "rope", "model.position_embedding", m.position_embedding.value)]
    for bad, name, value in unlike_llama:
        if bad:
            raise _refuse(name, value, "torchtitan", "its llama3 model is dense, SwiGLU, RoPE, untied")
    shape = {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
             "ffn_hidden": m.ffn_hidden, "vocab": m.vocab}
    flavors = load_tool_options()["torchtitan"]["llama3_flavors"]
    flavor = next((name for name, f in flavors.items() if f == shape), None)
    if flavor is not None:
        return {"name": "llama3", "flavor": flavor}, []
    note = (f"# No torchtitan llama3 flavor has this shape: register flavor '{m.name}' in "
            f"torchtitan/models/llama3/__init__.py with dim={m.hidden}, n_layers={m.layers}, "
            f"n_heads={m.heads}, n_kv_heads={m.kv_heads}, FFN hidden {m.ffn_hidden}, vocab {m.vocab}.")
    return {"name": "llama3", "flavor": m.name}, [note]


def _torchtitan_parallelism(plan: Plan) -> dict:
    par = plan.parallel
    shard = par.dp if par.zero >= 2 else 1
    out = {"data_parallel_replicate_degree": par.dp // shard, "data_parallel_shard_degree": shard}
    if shard > 1:
        out["fsdp_reshard_after_forward"] = "never" if par.zero == 2 else "always"
    out.update(tensor_parallel_degree=par.tp, context_parallel_degree=par.cp, expert_parallel_degree=par.ep,
               pipeline_parallel_degree=par.pp)
    if par.pp > 1:
        names = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                 "zero-bubble": "InterleavedZeroBubble"}
        out["pipeline_parallel_schedule"] = names[par.schedule.value]
        out["pipeline_parallel_microbatch_size"] = plan.training.micro_batch
        stages = plan.layers_per_stage
        if len(set(stages)) == 1:
            out["pipeline_parallel_layers_per_stage"] = stages[0]
        else:
            out["module_fqns_per_model_part"] = _llama_fqns(stages)
    return out


def _llama_fqns(stages: tuple[int, ...]) -> list[list[str]]:
    """torchtitan llama3 module names per model chunk (tok_embeddings, layers.N, norm, output)."""
    parts, start = [], 0
    for i, n in enumerate(stages):
        part = [f"layers.{j}" for j in range(start, start + n)]
        start += n
        parts.append((["tok_embeddings"] if i == 0 else []) + part +
                     (["norm", "output"] if i == len(stages) - 1 else []))
    return parts


def _export_torchtitan(plan: Plan) -> str:
    doc, notes = torchtitan_config(plan)
    lines = [f"# torchtitan job config for plan '{plan.name or plan.model.name}', written by trainplan.",
             f"# Sections and options as spelt in {_TORCHTITAN_SRC}.",
             "# Add [training] dataset and steps, [optimizer] lr and [lr_scheduler] for your run.", *notes]
    for section, options in doc.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in options.items()]
    return "\n".join(lines) + "\n"


def hf_config_from_model(model) -> dict:
    """A Hugging Face config.json object with ``model``'s shape (a ModelSpec): Llama
    field names for dense RoPE models, Mixtral's for MoE, GPT-2's for learned positions,
    GPT-NeoX's for ungated RoPE models."""
    m = model
    rope = m.position_embedding.value == "rope"
    if not rope:
        if m.gated_mlp or m.kv_heads != m.heads or m.moe:
            raise ValueError(f"model {m.name}: no Hugging Face family here has learned positions with "
                             "gated MLP, grouped-query attention or experts")
        return {"model_type": "gpt2", "n_layer": m.layers, "n_embd": m.hidden, "n_head": m.heads,
                "n_inner": m.ffn_hidden, "vocab_size": m.vocab, "n_positions": m.seq_len,
                "tie_word_embeddings": m.tied_embeddings}
    cfg = {"model_type": "llama" if m.gated_mlp else "gpt_neox", "num_hidden_layers": m.layers,
           "hidden_size": m.hidden, "num_attention_heads": m.heads, "num_key_value_heads": m.kv_heads,
           "intermediate_size": m.ffn_hidden, "vocab_size": m.vocab, "max_position_embeddings": m.seq_len,
           "tie_word_embeddings": m.tied_embeddings}
    if m.moe:
        if not m.gated_mlp:
            raise ValueError(f"model {m.name}: an ungated MoE model has no Hugging Face family here")
        cfg.update(model_type="mixtral", num_local_experts=m.experts, num_experts_per_tok=m.top_k)
    return cfg
