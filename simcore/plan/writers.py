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

from simcore.plan.deepspeed_writer import deepspeed_notes, export_deepspeed
from simcore.plan.hf_writer import hf_config_from_model  # noqa: F401 (re-exported)
from simcore.plan.maxtext_writer import export_maxtext
from simcore.plan.megatron_writer import account_split, megatron_model_args, megatron_model_note
from simcore.plan import mindspeed_writer as msw
from simcore.plan.nxd_writer import export_nxd
from simcore.plan.spec import EXPANDABLE_SEGMENTS_ENV, EXPANDABLE_SEGMENTS_MARGIN, Plan, PlanError
from simcore.plan.torchtitan_writer import export_torchtitan_command, export_torchtitan_toml

TARGETS = ("deepspeed", "maxtext", "megatron", "mindspeed", "nxd", "slurm", "slurm-trainplan", "torchtitan",
           "torchtitan-0.2")

_MEGATRON_SRC = ("NVIDIA/Megatron-LM megatron/training/arguments.py (commit d98e8a64, 2026; every option "
                 "parsed by its own parser's definitions, simcore/plan/megatron_args.yaml)")
_RDZV_PORT = 29500   # torchrun's conventional rendezvous port (torch/distributed/run.py examples)
_MASTER_COPY = "its bf16/fp16 keep 16-bit parameters with an fp32 master copy in the optimizer"


def export_plan(plan: Plan, to: str, plan_path: str = "PLAN.yaml") -> str:
    """The plan as the target tool's launch file: ``megatron`` (a torchrun script with the pretrain_gpt.py
    arguments), ``deepspeed`` (ds_config.json, plain JSON), ``torchtitan`` (torchtitan 0.3's torchrun
    launch), ``torchtitan-0.2`` (the 0.2.x job TOML), ``slurm`` (an sbatch script running Megatron-LM
    on the plan's nodes) or ``slurm-trainplan`` (an sbatch script running trainplan's executor on ``plan_path``)."""
    return export_with_notes(plan, to, plan_path)[0]


def export_with_notes(plan: Plan, to: str, plan_path: str = "PLAN.yaml") -> tuple[str, list[str]]:
    """The export and the notes that do not belong in the file (for stderr)."""
    writers = {"megatron": _export_megatron, "mindspeed": _export_mindspeed, "nxd": lambda p: export_nxd(p, _torchrun_shape(p)),
               "deepspeed": export_deepspeed,
               "maxtext": export_maxtext,
               "torchtitan": lambda p: export_torchtitan_command(p, *_torchrun_shape(p)),
               "torchtitan-0.2": export_torchtitan_toml, "slurm": _export_slurm,
               "slurm-trainplan": lambda p: _export_slurm_trainplan(p, plan_path)}
    if to not in writers:
        raise ValueError(f"unknown export target {to!r} (known: {', '.join(TARGETS)})")
    if plan.training.autocast and to in ("megatron", "slurm", "deepspeed"):   # torch.autocast over fp32 parameters
        raise _refuse("training.autocast", "true", "DeepSpeed config" if to == "deepspeed" else "Megatron-LM", _MASTER_COPY)
    if plan.training.attention_unpad and to in ("megatron", "slurm"):   # TE/flash on the padded batch
        raise _refuse("training.attention_unpad", "true", "Megatron-LM", "its attention runs on the whole batch")
    if plan.model.mtp_layers and to not in ("megatron", "slurm", "mindspeed"):   # only Megatron-Core builds MTP modules
        raise _refuse("model.mtp_layers", plan.model.mtp_layers, _MTP_LESS[to],
                      "it builds no multi-token-prediction modules")
    if plan.parallel.kv_replicator > 1 and to != "nxd":   # NeuronX Distributed's copied K/V heads: only it copies them
        raise _refuse("parallel.kv_replicator", plan.parallel.kv_replicator, *_KV_COPIES[to])
    for field, what, options in _ATTENTION_VARIANTS:   # Gated DeltaNet, gated attention, DSA: not written unverified
        if getattr(plan.model, field) is not None:
            raise _refuse(f"model.{field}", what, _KV_COPIES[to][0],
                          f"trainplan writes no option for them (Megatron-LM's {options} are not yet checked against "
                          "its model code)" if to in ("megatron", "slurm") else "a ds_config drives a model it does "
                          "not build" if to == "deepspeed" else "its model code builds no such layer")
    text = writers[to](plan)
    return text, (deepspeed_notes(plan) if to == "deepspeed" else [])


#: Attention variants no export writes: (model field, its value in words, Megatron-LM's options for it).
_ATTENTION_VARIANTS = (("linear_attention", "(Gated DeltaNet layers, gated attention)",
                        "--experimental-attention-variant gated_delta_net and --linear-attention-freq"),
                       ("sparse_attention", "(DeepSeek Sparse Attention)",
                        "--experimental-attention-variant dsa and --dsa-indexer-*"))
#: Why each target refuses copied key/value heads (``parallel.kv_replicator``, NeuronX Distributed's).
_MEGATRON_KV = ("Megatron-LM", "Megatron-Core runs tp above num_query_groups by all-gathering the QKV activations "
                "over TP, not by copying the K/V weights (megatron/core/transformer/attention.py @d98e8a64)")
_KV_COPIES = {"megatron": _MEGATRON_KV, "slurm": _MEGATRON_KV,
              "deepspeed": ("DeepSpeed config", "no ds_config option copies key/value heads"),
              "torchtitan": ("torchtitan", "tensor_parallel_degree must divide n_kv_heads "
                                           "(torchtitan/models/common/decoder.py @b5bcd76c)"),
              "torchtitan-0.2": ("torchtitan 0.2", "its wk and wv are n_kv_heads x head_dim wide, split over TP "
                                                   "(torchtitan/models/llama3/model/model.py @v0.2.2)"),
              "slurm-trainplan": ("trainplan executor", "its attention splits the key/value heads it has"),
              "maxtext": ("MaxText", "MaxText copies no key/value heads"), "mindspeed": _MEGATRON_KV,
              "nxd": ("NeuronX Distributed", "")}


#: The targets that build no MTP modules (``model.mtp_layers``): DeepSpeed's config drives a model it does
#: not build; torchtitan 0.3's option (deepseek_v3 ``num_mtp_layers``) the torchtitan import refuses too.
_MTP_LESS = {"deepspeed": "DeepSpeed config", "torchtitan": "torchtitan", "torchtitan-0.2": "torchtitan 0.2",
             "slurm-trainplan": "trainplan executor", "maxtext": "MaxText", "nxd": "NeuronX Distributed"}


def _refuse(field_: str, value, tool: str, why: str = "") -> ValueError:
    return ValueError(f"{field_}={value} has no {tool} option{': ' + why if why else ''}")


def megatron_args(plan: Plan) -> list[tuple[str, object]]:
    """The pretrain_gpt.py options for this plan, as (option, value or None for a flag)."""
    return megatron_model_args(plan) + _megatron_parallel_args(plan) + _megatron_training_args(plan)


def _megatron_parallel_args(plan: Plan) -> list:
    par = plan.parallel
    args = [("--tensor-model-parallel-size", par.tp), ("--pipeline-model-parallel-size", par.pp)]
    if par.cp > 1:
        args.append(("--context-parallel-size", par.cp))
    if par.ep > 1 and par.moe_dispatcher.value == "deepep":   # the flex dispatcher over DeepEP
        args += [("--expert-model-parallel-size", par.ep), ("--moe-token-dispatcher-type", "flex"),
                 ("--moe-enable-deepep", None)]
    elif par.ep > 1:
        args += [("--expert-model-parallel-size", par.ep), ("--moe-token-dispatcher-type", "alltoall")]
    if par.etp != par.tp:   # Megatron's default expert TP is the dense TP
        args.append(("--expert-tensor-parallel-size", par.etp))
    if par.moe_a2a_overlap:   # the combined 1F1B schedule (megatron/core/pipeline_parallel/combined_1f1b.py)
        args.append(("--overlap-moe-expert-parallel-comm", None))
    if plan.training.moe_routing.value != "balanced":
        raise _refuse("training.moe_routing", plan.training.moe_routing.value, "Megatron-LM",
                      "its benchmark routing draws random experts (--moe-router-force-load-balancing)")
    schedule = par.schedule.value
    if par.pp > 1 and schedule in ("gpipe", "zero-bubble", "dualpipev"):
        raise _refuse("parallel.schedule", schedule, "Megatron-LM", "it runs 1F1B or interleaved 1F1B")
    if par.pp > 1 and schedule == "interleaved-1f1b" and par.vpp == 1:
        raise _refuse("parallel.schedule", schedule, "Megatron-LM", "interleaving needs parallel.vpp > 1")
    stage_args = _megatron_stage_args(plan)
    if par.vpp > 1 and not any(k == "--pipeline-model-parallel-layout" for k, _ in stage_args):
        args.append(("--num-virtual-stages-per-pipeline-rank", par.vpp))   # the layout sets it (arguments.py)
    if par.microbatch_group:
        args.append(("--microbatch-group-size-per-virtual-pipeline-stage", par.microbatch_group))
    args += stage_args
    if par.sequence_parallel:
        args.append(("--sequence-parallel", None))
    if par.tp_comm_overlap:
        args.append(("--tp-comm-overlap", None))
    if par.cp > 1 and par.cp_comm.value != "p2p":
        args.append(("--cp-comm-type", {"all_gather": "allgather", "a2a": "a2a"}[par.cp_comm.value]))
    if par.zero_impl.value == "deepspeed":
        raise _refuse("parallel.zero_impl", "deepspeed", "Megatron-LM", "export it with --to deepspeed")
    if par.zero <= 1 and par.dp * par.cp > 1:
        # the model overlaps the gradient reduction with the last backward (analytic and event
        # engine alike); Megatron does so only when asked (--overlap-grad-reduce, default off)
        args.append(("--overlap-grad-reduce", None))
    if par.zero == 1:
        args.append(("--use-distributed-optimizer", None))
        if par.overlap_param_gather:
            args.append(("--overlap-param-gather", None))
    elif par.zero >= 2:  # Megatron-FSDP's required flags (its user guide)
        args += [("--use-megatron-fsdp", None),
                 ("--data-parallel-sharding-strategy", "optim_grads" if par.zero == 2 else "optim_grads_params"),
                 ("--no-gradient-accumulation-fusion", None), ("--use-distributed-optimizer", None),
                 ("--ckpt-format", "fsdp_dtensor")]
    if par.dp_replicate > 1:   # N instances of the distributed optimizer (Megatron-FSDP: HSDP), each over dp/N
        args.append(("--num-distributed-optimizer-instances", par.dp_replicate))
    return args


def _megatron_stage_args(plan: Plan) -> list:
    """The split of the layers: the embedding and the loss counted as layers where that is the
    split (``account_split``: the search's "ends" split, Bridge's Llama 3.1 405B recipes), else
    first and last stage sizes, else the layout of every virtual stage (``megatron_layout``)."""
    stages, par = list(plan.model_layers_per_stage), plan.parallel
    if len(set(stages)) == 1:
        return []
    for embedding, loss in ((True, True), (True, False), (False, True)):
        try:
            if account_split(plan.model.layers, par.pp, par.vpp, embedding, loss) == stages:
                return [(flag, None) for flag, on in (("--account-for-embedding-in-pipeline-split", embedding),
                                                      ("--account-for-loss-in-pipeline-split", loss)) if on]
        except PlanError:
            continue
    if plan.parallel.vpp > 1 or len(set(stages[1:-1])) > 1:
        return [("--pipeline-model-parallel-layout", megatron_layout(stages, plan.model.mtp_layers))]
    return [("--decoder-first-pipeline-num-layers", stages[0]), ("--decoder-last-pipeline-num-layers", stages[-1])]


def megatron_layout(stages, mtp: int = 0) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` of ``stages`` (the model's layers per
    virtual stage, in model order): stages split by '|', ``E`` the embedding first, ``t*n`` n
    decoder layers, the ``m`` MTP modules and ``L`` the loss last (megatron/core/transformer/
    pipeline_parallel_layer_layout.py @d98e8a64 ``parse_str_to_list``; Megatron-Bridge's DeepSeek-V3
    recipes write 'Et*4|(t*4|)*14tmL')."""
    last = len(stages) - 1
    return "|".join(("E" if i == 0 else "") + ("t" if n == 1 else f"t*{n}" if n else "")
                    + ("m" * mtp + "L" if i == last else "") for i, n in enumerate(stages))


def _megatron_training_args(plan: Plan) -> list:
    tr = plan.training
    args = [("--micro-batch-size", tr.micro_batch), ("--global-batch-size", tr.global_batch)]
    precision = {"bf16": [("--bf16", None)], "fp16": [("--fp16", None)], "fp32": [],
                 "fp8": [("--bf16", None), ("--fp8-format", "hybrid")],
                 # Megatron-Core's block-scaled recipes (Transformer Engine MXFP8BlockScaling, NVFP4BlockScaling)
                 "mxfp8": [("--bf16", None), ("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")],
                 "nvfp4": [("--bf16", None), ("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")]}
    args += precision[tr.precision.value]
    if tr.precision.value == "fp8":   # Megatron's tensorwise recipe is Transformer Engine's current scaling
        recipe = {"delayed": "delayed", "current": "tensorwise"}.get(tr.fp8_recipe.value)
        if recipe is None:
            raise _refuse("training.fp8_recipe", tr.fp8_recipe.value, "Megatron-LM", "it scales FP8 per tensor")
        args.append(("--fp8-recipe", recipe))
    if tr.recompute.value == "full":
        args += [("--recompute-granularity", "full"), ("--recompute-method", tr.recompute_method.value),
                 ("--recompute-num-layers", tr.recompute_layers)]
    elif tr.recompute.value in ("op", "layer", "dots"):
        raise _refuse("training.recompute", tr.recompute.value, "Megatron-LM",
                      "it is MaxText's remat policy" if tr.recompute.value == "dots" else "it is torchtitan's policy")
    elif tr.recompute.value == "selective":
        args.append(("--recompute-granularity", "selective"))
    if tr.offload.value == "optimizer+params":
        raise _refuse("training.offload", tr.offload.value, "Megatron-LM", "it offloads optimizer states only")
    if tr.activation_offload:   # --cpu-offloading-num-layers N > 0 turns on cpu_offloading (arguments.py)
        if tr.recompute.value != "none":
            raise ValueError(f"training.activation_offload={tr.activation_offload} with training.recompute="
                             f"{tr.recompute.value} has no Megatron-LM equivalent: Megatron-Core's CPU offloading "
                             "does not work when activation recomputation is enabled (transformer_config.py)")
        if tr.activation_offload >= plan.model.layers:
            raise ValueError(f"training.activation_offload={tr.activation_offload} has no Megatron-LM equivalent: "
                             f"--cpu-offloading-num-layers must be below model.layers={plan.model.layers}")
        args.append(("--cpu-offloading-num-layers", tr.activation_offload))
    if tr.fp8_param_gather:
        args.append(("--fp8-param-gather", None))
    if tr.offload.value == "optimizer" or tr.optimizer_state_dtype.value != "fp32":
        args += [("--optimizer-cpu-offload", None)] if tr.offload.value == "optimizer" else []
        args.append(("--use-precision-aware-optimizer", None))
    if tr.optimizer_state_dtype.value != "fp32":   # TE's FusedAdam keeps both moments in that dtype
        if plan.parallel.zero == 0:
            raise _refuse("training.optimizer_state_dtype", tr.optimizer_state_dtype.value, "Megatron-LM",
                          "its precision-aware optimizer needs the distributed optimizer (parallel.zero=1)")
        args += [("--exp-avg-dtype", tr.optimizer_state_dtype.value),
                 ("--exp-avg-sq-dtype", tr.optimizer_state_dtype.value)]
    # Megatron's default is auto (Transformer Engine's flash or fused kernel): say which
    args.append(("--attention-backend", "flash" if tr.flash_attention else "unfused"))
    if tr.optimizer.value not in ("adamw", "sgd"):   # Megatron's adam is AdamW; no 8-bit, factored or 1-bit one
        raise _refuse("training.optimizer", tr.optimizer.value, "Megatron-LM",
                      "its --optimizer is adam (AdamW) or sgd")
    if tr.kernels.value == "eager":
        raise _refuse("training.kernels", "eager", "Megatron-LM", "its layers run fused kernels")
    if tr.optimizer_in_backward:
        raise _refuse("training.optimizer_in_backward", "true", "Megatron-LM")
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


def megatron_env(plan: Plan) -> dict[str, str]:
    """The launch environment Megatron-LM's validate_args needs: CUDA_DEVICE_MAX_CONNECTIONS=1
    with tensor or context parallel (megatron/training/arguments.py, commit d98e8a64, line
    1453: asserted before Blackwell), but never with Megatron-FSDP (line 1166: it must be > 1);
    and the allocator setting the Plan's memory assumes (``allocator_env``)."""
    par = plan.parallel
    env = allocator_env(plan)
    if (par.tp > 1 or par.cp > 1) and par.zero < 2:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return env


def allocator_env(plan: Plan) -> dict[str, str]:
    """PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True where the Plan's memory assumes it
    (``training.allocator_margin`` = ``EXPANDABLE_SEGMENTS_MARGIN``), so the run reserves what the
    prediction says."""
    if plan.training.allocator_margin == EXPANDABLE_SEGMENTS_MARGIN:
        return dict([EXPANDABLE_SEGMENTS_ENV])
    return {}


def _env_lines(plan: Plan) -> list[str]:
    return [f"export {k}={v}" for k, v in megatron_env(plan).items()]


def _export_megatron(plan: Plan) -> str:
    nnodes, nproc = _torchrun_shape(plan)
    head = [
        "#!/bin/bash",
        f"# Megatron-LM launch for plan '{plan.name or plan.model.name}', written by trainplan.",
        f"# Options as spelt in {_MEGATRON_SRC}.",
        "# Add the data, tokenizer and learning-rate options of your run (--data-path,",
        "# --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node",
        "# with --node-rank and --master-addr, or use `trainplan export PLAN --to slurm`.",
        *megatron_model_note(plan),
        *_env_lines(plan),
    ]
    cmd = [f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} pretrain_gpt.py"] + _arg_lines(megatron_args(plan))
    return "\n".join(head) + "\n" + _continued(cmd) + "\n"


def _export_mindspeed(plan: Plan) -> str:
    """MindSpeed-LLM's launch on Ascend NPUs (``simcore.plan.mindspeed_writer``)."""
    args = msw.mindspeed_args(plan, megatron_args(plan))
    nnodes, nproc = _torchrun_shape(plan)
    head = ["#!/bin/bash", f"# MindSpeed-LLM launch for plan '{plan.name or plan.model.name}', written by trainplan.",
            f"# Options as spelt in {msw.SOURCE}.",
            "# Run from a MindSpeed-LLM checkout; add the data, tokenizer and learning-rate options of your run",
            "# (--data-path, --tokenizer-type, --lr, --train-iters, ...). On several nodes run this on each node",
            "# with --node-rank and --master-addr.", *megatron_model_note(plan),
            *([msw.MC2_NOTE] if plan.parallel.tp_comm_overlap else []),
            *[f"export {k}={v}" for k, v in msw.mindspeed_env(plan).items()]]
    cmd = [f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} pretrain_gpt.py"] + _arg_lines(args)
    return "\n".join(head) + "\n" + _continued(cmd) + "\n"


def _sbatch_head(plan: Plan, what: str) -> list[str]:
    """#SBATCH lines, the comments, strict mode and the rendezvous host. The first host is
    taken with ``sed -n 1p``, which reads all of scontrol's output: ``head -n 1`` closes the
    pipe early, scontrol dies of SIGPIPE and ``set -o pipefail`` ends the job with 141."""
    nnodes, nproc = _torchrun_shape(plan)
    name = re.sub(r"[^\w.-]", "_", plan.name or plan.model.name)
    return [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={nproc}",
        "#SBATCH --exclusive",
        f"# Plan '{plan.name or plan.model.name}' on {nnodes} x {plan.cluster.node.name}, written by trainplan:",
        f"# one torchrun per node starts {nproc} ranks (tp={plan.parallel.tp} pp={plan.parallel.pp} "
        f"dp={plan.parallel.dp} cp={plan.parallel.cp}) of {what}.",
        "# sbatch options: https://slurm.schedmd.com/sbatch.html; torchrun options:",
        "# torch/distributed/run.py (torch 2.x).",
        "set -euo pipefail",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
    ]


def _srun_torchrun(plan: Plan) -> str:
    nnodes, nproc = _torchrun_shape(plan)
    return (f"srun torchrun --nnodes {nnodes} --nproc-per-node {nproc} "
            f'--rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:{_RDZV_PORT}"')


def _export_slurm(plan: Plan) -> str:
    head = _sbatch_head(plan, "Megatron-LM's pretrain_gpt.py") + [
        f"# Training options: {_MEGATRON_SRC}.", "# Add the data, tokenizer and learning-rate options of your run.",
        *megatron_model_note(plan),
        *_env_lines(plan)]
    cmd = [_srun_torchrun(plan), "pretrain_gpt.py"] + _arg_lines(megatron_args(plan))
    return "\n".join(head) + "\n" + _continued(cmd) + "\n"


def _export_slurm_trainplan(plan: Plan, plan_path: str) -> str:
    """The plan run by trainplan's own executor (executors/launch.py under torchrun), to
    validate a prediction on the cluster: rank 0 prints the measured StepResult as JSON."""
    head = _sbatch_head(plan, "trainplan's executor (python -m executors.launch)") + [
        "# Run from a checkout of trainplan (or with it installed); compare the JSON it prints",
        "# with `trainplan simulate PLAN --json`."]
    cmd = [_srun_torchrun(plan), f"-m executors.launch {shlex.quote(plan_path)}", "--steps 20 --warmup 5"]
    return "\n".join(head) + "\n" + _continued(cmd) + "\n"
