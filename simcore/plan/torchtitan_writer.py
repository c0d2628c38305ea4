"""Export a Plan to torchtitan, in the config form of each supported version.

- torchtitan 0.3.x (current on PyPI, 0.3.0): no TOML job file; a run is
  ``torchrun ... -m torchtitan.train --module llama3 --config llama3_8b`` (a Python
  ``config_registry`` function) with ``--section.option value`` overrides parsed by tyro
  (torchtitan/config/manager.py ``ConfigManager.parse_args``) and the activation
  checkpointing mode as the subcommand ``activation-checkpoint:{selective,full,none}``.
  A Qwen3 model is written as ``--module qwen3 --config qwen3_<name>`` where it is one of that
  module's named configs, its refusals those of the qwen3 module (``simcore.plan.torchtitan_qwen3``);
  a GPT-OSS one as ``--module gpt_oss --config gpt_oss_20b|120b`` (``simcore.plan.torchtitan_gpt_oss``).
  Target ``torchtitan``.
- torchtitan 0.2.x (0.2.0-0.2.2): the TOML job config (torchtitan/config/job_config.py,
  ``--job.config_file``). Target ``torchtitan-0.2``.

The pipeline stage rule is the same in both (torchtitan/distributed/pipeline_parallel.py,
0.2.2 ``generate_llm_fqn_per_model_part`` = 0.3.0 ``_generate_llm_fqn_per_model_part``,
identical but for the output module's name, ``output`` then ``lm_head``): the embedding
counts as ``pipeline_parallel_first_stage_less_layers`` layers and the output as
``..._last_stage_less_layers`` (1 each by default), the virtual stages are
ceil((layers + first + last) / layers_per_stage), and the extra layers go to the first
stages. ``stage_split`` mirrors that rule; the export sets the two weights and
layers_per_stage so that torchtitan's split is the plan's, or (0.2 TOML) lists the modules
of each stage, or refuses.
"""
from __future__ import annotations

import json
import math
import shlex

from simcore.plan.readers import load_tool_options
from simcore.plan.spec import EXPANDABLE_SEGMENTS_ENV, EXPANDABLE_SEGMENTS_MARGIN, Plan
from simcore.plan.torchtitan_gpt_oss import gpt_oss_config, gpt_oss_notes, gpt_oss_refusals, is_gpt_oss
from simcore.plan.torchtitan_qwen3 import is_qwen3, qwen3_config, qwen3_refusals
from simcore.plan.torchtitan_reader import load_torchtitan_configs

VERSIONS = {"torchtitan": "0.3.x (tested: 0.3.0)", "torchtitan-0.2": "0.2.x (0.2.0-0.2.2; rules: 0.2.2)"}
_SRC = "pytorch/torchtitan torchtitan/config (0.3.0: manager.py, configs.py; 0.2.2: job_config.py)"
_OUTPUT_MODULE = {"torchtitan": "lm_head", "torchtitan-0.2": "output"}


def torchtitan_autocasts(precision: str, zero: int, tp: int, pp: int, cp: int, ep: int = 1) -> bool:
    """Whether torchtitan runs a layout under torch.autocast over fp32 parameters: its bf16
    ``mixed_precision_param`` goes through torch.autocast under DDP or on one device with no other
    parallelism, through fully_shard's policy else (torchtitan/config/configs.py @b5bcd76c6). The
    one rule its import, its export and a search for it read."""
    return precision == "bf16" and zero == 0 and tp == pp == cp == ep == 1


def _ddp_autocast(plan) -> bool:
    par = plan.parallel
    return torchtitan_autocasts(plan.training.precision.value, int(par.zero), par.tp, par.pp, par.cp, par.ep)


def _refuse(field_: str, value, why: str = "") -> ValueError:
    return ValueError(f"{field_}={value} has no torchtitan option{': ' + why if why else ''}")


def stage_split(layers: int, stages: int, first_less: int, last_less: int) -> list[int] | None:
    """Transformer layers per stage as torchtitan's generator assigns them; None where it
    raises (more stages than effective layers, a weight above the layers per stage)."""
    if stages == 1:
        return [layers]
    effective = layers + first_less + last_less
    per, extra = divmod(effective, stages)
    if per == 0 or first_less > per or last_less > per:
        return None
    out, left = [], layers
    for i in range(stages):
        n = per + (i < extra) - (first_less if i == 0 else 0) - (last_less if i == stages - 1 else 0)
        n = min(max(n, 0), left)
        out.append(n)
        left -= n
    return out if left == 0 else None


def virtual_stages(layers: int, layers_per_stage: int, first_less: int, last_less: int) -> int:
    """pipeline_parallel.py: ceil((layers + first + last) / layers_per_stage)."""
    return math.ceil((layers + first_less + last_less) / layers_per_stage)


def stage_options(plan: Plan) -> dict | None:
    """layers_per_stage and the two less-layers weights that give the plan's split, or None."""
    layers, stages = plan.model.layers, plan.parallel.pp * plan.parallel.vpp
    want = list(plan.layers_per_stage)
    for first in (0, 1, 2):
        for last in (0, 1, 2):
            for per in range(1, layers + first + last + 1):
                if virtual_stages(layers, per, first, last) != stages:
                    continue
                if stage_split(layers, stages, first, last) == want:
                    return {"pipeline_parallel_layers_per_stage": per,
                            "pipeline_parallel_first_stage_less_layers": first,
                            "pipeline_parallel_last_stage_less_layers": last}
    return None


def _check(plan: Plan, module: str = "llama3") -> None:
    """The first thing torchtitan cannot run as the Plan says, in one sentence: the layout, then the model
    (torchtitan 0.3's ``module``: qwen3's ``simcore.plan.torchtitan_qwen3``, gpt_oss's ``.torchtitan_gpt_oss``)."""
    tr, par, m = plan.training, plan.parallel, plan.model
    refusals = [
        (par.zero == 1, "parallel.zero", 1, "it has DDP (zero 0) and FSDP2 (zero 2, 3)"),
        (par.zero_impl.value == "deepspeed", "parallel.zero_impl", "deepspeed", "it runs ZeRO as FSDP2 (zero_impl: fsdp2)"),
        (par.dp_replicate > 1 and par.dp == par.dp_replicate, "parallel.dp_replicate", par.dp_replicate,
         "data_parallel_shard_degree would be 1 (FSDP over the context-parallel ranks alone), which trainplan does "
         "not write"),
        (tr.autocast and not _ddp_autocast(plan), "training.autocast", "true",
         "it applies mixed_precision_param through torch.autocast only under DDP or one device with no other "
         "parallelism (torchtitan/config/configs.py), through fully_shard's policy else"),
        (par.tp > 1 and not par.sequence_parallel, "parallel.sequence_parallel", "false",
         "its tensor parallel plan always shards the sequence"),
        (tr.precision.value == "fp16", "training.precision", "fp16", "mixed_precision_param is bfloat16 or float32"),
        (tr.offload.value == "optimizer", "training.offload", "optimizer",
         "enable_cpu_offload moves parameters, gradients and optimizer states (optimizer+params)"),
        (tr.grad_compression.value != "none", "training.grad_compression", tr.grad_compression.value, ""),
        (tr.attention_unpad, "training.attention_unpad", "true", "its attention is SDPA on the whole batch"),
        (par.fsdp_root.value == "kept", "parallel.fsdp_root", "kept",
         "its FSDP2 wrapping since July 2025 keeps only [norm, output] (output_kept) or nothing (resharded)"),
        (tr.optimizer.value not in ("adamw", "adam"), "training.optimizer", tr.optimizer.value,
         "its optimizer.name is AdamW or Adam"),
        (not tr.grads_to_none, "training.grads_to_none", "false", "its optimizer frees the gradients (zero_grad)"),
        (tr.optimizer_state_dtype.value != "fp32", "training.optimizer_state_dtype", tr.optimizer_state_dtype.value,
         "torch's AdamW keeps its moments in the parameters' dtype"),
        (tr.fp8_param_gather and par.zero < 2, "training.fp8_param_gather", "true",
         "its float8 all-gather is FSDP's (parallel.zero 2-3): ZeRO-1 keeps 16-bit weights"),
        (par.microbatch_group not in (0, plan.num_microbatches // max(1, plan.num_microbatches // par.pp)),
         "parallel.microbatch_group", par.microbatch_group, "torch's interleaved schedule takes its rounds rule"),
        (tr.activation_offload > 0, "training.activation_offload", tr.activation_offload,
         "its job config has no activation offload"),
        (tr.optimizer_in_backward and par.ep > 1, "training.optimizer_in_backward", "true",
         "its optimizers in backward do not support expert parallel (components/optimizer.py)"),
        *({"qwen3": qwen3_refusals, "gpt_oss": gpt_oss_refusals}[module](plan) if module != "llama3"
          else _llama3_refusals(m)),
    ]
    for bad, name, value, why in refusals:
        if bad:
            raise _refuse(name, value, why)


def _llama3_refusals(m) -> list:
    """The model torchtitan 0.3's llama3 module builds (torchtitan/models/llama3/__init__.py: dense, untied, RoPE,
    RMSNorm, bias-free nn.Linear, SwiGLU FeedForward, no QK norm, plain softmax, full causal attention)."""
    dense = "its llama3 model is dense, SwiGLU, RoPE, untied"
    why = "its llama3 model is RMSNorm, bias-free, SwiGLU, without QK norm or sinks"
    return [(m.moe, "model.experts", m.experts, dense),
            (m.sliding_window > 0, "model.sliding_window", m.sliding_window, "its llama3 attention is full causal"),
            (not m.gated_mlp, "model.gated_mlp", "false", dense),
            (m.tied_embeddings, "model.tied_embeddings", "true", dense),
            (m.position_embedding.value != "rope", "model.position_embedding", m.position_embedding.value, dense),
            (m.norm.value != "rmsnorm", "model.norm", m.norm.value, why),
            (m.bias.value != "none", "model.bias", m.bias.value, why),
            (m.gated_mlp and m.activation.value != "swiglu", "model.activation", m.activation.value, why),
            (m.qk_norm.value != "none", "model.qk_norm", m.qk_norm.value, why),
            (m.attention_sinks, "model.attention_sinks", "true", why)]


def _flavor(plan: Plan) -> str | None:
    m = plan.model
    shape = {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
             "ffn_hidden": m.ffn_hidden, "vocab": m.vocab}
    flavors = load_tool_options()["torchtitan"]["llama3_flavors"]
    return next((name for name, f in flavors.items() if f == shape), None)


def _parallelism(plan: Plan, target: str) -> dict:
    par = plan.parallel
    # FSDP2 over each replica's shard ranks; replicate > 1 with shard > 1 is torchtitan's HSDP
    shard = par.dp // par.dp_replicate if par.zero >= 2 else 1
    out = {"data_parallel_replicate_degree": par.dp // shard, "data_parallel_shard_degree": shard}
    if shard > 1:
        out["fsdp_reshard_after_forward"] = ("never" if par.zero == 2 else   # "default" keeps [norm, output]
                                             "default" if par.fsdp_root.value == "output_kept" else "always")
    out.update(tensor_parallel_degree=par.tp, context_parallel_degree=par.cp, expert_parallel_degree=par.ep,
               pipeline_parallel_degree=par.pp)
    out.update(_cp_rotate(plan, target))
    if par.pp > 1:
        names = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                 "zero-bubble": "InterleavedZeroBubble", "dualpipev": "DualPipeV"}   # torch's get_schedule_class
        out["pipeline_parallel_schedule"] = names[par.schedule.value]
        out["pipeline_parallel_microbatch_size"] = plan.training.micro_batch
        split = stage_options(plan)
        if split is not None:
            out.update(split)
        elif target == "torchtitan-0.2":
            out["module_fqns_per_model_part"] = _llama_fqns(plan.layers_per_stage, _OUTPUT_MODULE[target])
        else:
            raise _refuse("parallel.stage_layers", list(plan.layers_per_stage),
                          "torchtitan's stage rule cannot give this split (extra layers go to the first stages)")
    return out


def _cp_rotate(plan: Plan, target: str) -> dict:
    """torch's context parallel SDPA gathers K/V by default (``set_rotate_method``: ``allgather``,
    ``parallel.cp_comm: all_gather``); torchtitan 0.2's ``context_parallel_rotate_method`` can ask
    for ``alltoall``, the ring's rotation (``p2p``); torchtitan since June 2026 (#3666) has only the
    all-gather ("CP all-gathers k/v", models/common/attention.py). Neither splits heads (``a2a``)."""
    par = plan.parallel
    if par.cp == 1 or par.cp_comm.value == "all_gather":
        return {}
    if par.cp_comm.value == "p2p" and target == "torchtitan-0.2":
        return {"context_parallel_rotate_method": "alltoall"}
    why = ("its context parallel shards the sequence, not the heads" if par.cp_comm.value == "a2a" else
           "its context parallel all-gathers K/V (parallel.cp_comm: all_gather)")
    raise _refuse("parallel.cp_comm", par.cp_comm.value, why)


def _llama_fqns(stages: tuple[int, ...], output: str) -> list[list[str]]:
    """torchtitan llama3 module names per model chunk (tok_embeddings, layers.N, norm, output)."""
    parts, start = [], 0
    for i, n in enumerate(stages):
        part = [f"layers.{j}" for j in range(start, start + n)]
        start += n
        parts.append((["tok_embeddings"] if i == 0 else []) + part + (["norm", output] if i == len(stages) - 1 else []))
    return parts


def torchtitan_config(plan: Plan, target: str = "torchtitan-0.2") -> tuple[dict, list[str]]:
    """The job config as {section: {option: value}}, and comment lines for the file (0.3: a Qwen3 or GPT-OSS
    model is checked against torchtitan's qwen3 or gpt_oss module, every other against llama3's; 0.2: llama3's)."""
    module = _module(plan.model) if target == "torchtitan" else "llama3"
    _check(plan, module)
    tr, par, m = plan.training, plan.parallel, plan.model
    flavor, notes = _flavor(plan), gpt_oss_notes(plan.model) if module == "gpt_oss" else []
    if flavor is None and module == "llama3":
        flavor = m.name
        notes.append(f"# No torchtitan llama3 flavor has this shape: register flavor '{m.name}' in "
                     f"torchtitan/models/llama3/__init__.py with dim={m.hidden}, n_layers={m.layers}, "
                     f"n_heads={m.heads}, n_kv_heads={m.kv_heads}, FFN hidden {m.ffn_hidden}, vocab {m.vocab}.")
    if not tr.flash_attention:   # the Plan prices the materialized scores; torchtitan never holds them
        notes.append("# The Plan's training.flash_attention is false, but torchtitan's attention is always a fused "
                     "kernel (SDPA with cuDNN's and flash's backends first, FlexAttention or varlen: 0.3's "
                     "torchtitan/models/common/attention.py, 0.2's models/attention.py): this run is faster and "
                     "lighter than the Plan predicts; set flash_attention: true to predict it.")
    if _ddp_autocast(plan) and not tr.autocast:
        notes.append("# torchtitan runs this layout under torch.autocast over fp32 parameters: the Plan's "
                     "training.autocast: true predicts that run.")
    model = {"name": "llama3", "flavor": flavor}
    if tr.precision.value in ("mxfp8", "nvfp4"):
        raise _refuse("training.precision", tr.precision.value, "trainplan writes torchtitan's float8 converter only")
    if tr.precision.value == "fp8":   # torchao's float8 training: tensorwise (its default) or rowwise scaling
        if tr.fp8_recipe.value not in ("tensorwise", "rowwise"):
            raise _refuse("training.fp8_recipe", tr.fp8_recipe.value, "its float8 converter (torchao) scales "
                          "tensorwise or rowwise; delayed and current are Transformer Engine's recipes")
        model["converters"] = ["float8"]
    local = tr.global_batch // par.dp if par.pp > 1 else tr.micro_batch
    training = {"local_batch_size": local, "global_batch_size": tr.global_batch, "seq_len": m.seq_len,
                "mixed_precision_param": "float32" if tr.precision.value == "fp32" else "bfloat16",
                "enable_cpu_offload": tr.offload.value == "optimizer+params"}
    doc = {"job": {"description": plan.name or m.name}, "model": model, "training": training,
           "optimizer": {"name": "AdamW" if tr.optimizer.value == "adamw" else "Adam",
                         **({"early_step_in_backward": True} if tr.optimizer_in_backward else {})},
           "parallelism": _parallelism(plan, target), "activation_checkpoint": {"mode": tr.recompute.value},
           # torch.compile (model and loss) is what fused element-wise kernels mean there; off, eager PyTorch
           "compile": {"enable": tr.kernels.value == "fused"}}
    if tr.precision.value == "fp8" and tr.fp8_recipe.value == "rowwise":
        doc["float8"] = {"recipe_name": "rowwise"}
    if tr.fp8_param_gather:   # torchao: FSDP2 gathers the float8 weights, their scales computed after the step
        doc["float8"] = {"enable_fsdp_float8_all_gather": True, "precompute_float8_dynamic_scale_for_fsdp": True}
    if tr.recompute.value in ("selective", "op"):  # op-level SAC (nearest to Korthikanti et al.'s selective)
        doc["activation_checkpoint"] = {"mode": "selective", "selective_ac_option": "op"}
    elif tr.recompute.value == "dots":
        raise ValueError("training.recompute=dots has no torchtitan option: it is MaxText's remat policy (JAX's "
                         "checkpoint_dots_with_no_batch_dims); give selective, op, full or layer:N")
    elif tr.recompute.value == "layer":   # every Nth layer
        doc["activation_checkpoint"] = {"mode": "selective", "selective_ac_option": str(tr.recompute_layers)}
    elif tr.recompute.value == "full" and (tr.recompute_layers, tr.recompute_method.value) != (1, "uniform"):
        raise ValueError(f"training.recompute={{layers: {tr.recompute_layers}, method: {tr.recompute_method.value}}} "
                         "has no torchtitan option: it checkpoints every layer or every Nth (layer:N)")
    return doc, notes


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    return "[" + ", ".join(_toml_value(x) for x in v) + "]"


def export_torchtitan_toml(plan: Plan) -> str:
    """torchtitan 0.2.x: the job TOML."""
    doc, notes = torchtitan_config(plan, "torchtitan-0.2")
    lines = [f"# torchtitan {VERSIONS['torchtitan-0.2']} job config for plan '{plan.name or plan.model.name}', "
             "written by trainplan.",
             "# Sections and options as spelt in pytorch/torchtitan torchtitan/config/job_config.py "
             "(commit 6404b932, 2025; the 0.2.2 wheel).",
             "# Add [training] dataset and steps, [optimizer] lr and [lr_scheduler] for your run.", *notes]
    for section, options in doc.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in options.items()]
    return "\n".join(lines) + "\n"


def torchtitan_args(plan: Plan) -> tuple[list[str], list[str]]:
    """torchtitan 0.3.x: the arguments after ``-m torchtitan.train``, and comment lines for the script."""
    doc, notes = torchtitan_config(plan, "torchtitan")
    module, name = _module_config(plan)
    entry = load_torchtitan_configs()["configs"].get(name, {})
    _registry_precision(plan, name, entry)
    if plan.training.optimizer_in_backward:   # 0.2.2's optimizer.early_step_in_backward is gone from 0.3.0
        raise _refuse("training.optimizer_in_backward", "true", "in 0.3 (0.2.2 had optimizer.early_step_in_backward)")
    args = ["--module", module, "--config", name]
    if plan.training.moe_routing.value == "round_robin":   # Router._debug_force_load_balance_routing: token t's
        doc["debug"] = {"moe_force_load_balance": True}   # k experts are t*k .. t*k+k-1 mod E (models/common/moe.py)
    async_tp = entry.get("sections", {}).get("compile", {}).get("enable_async_tensor_parallel")
    if async_tp and not plan.parallel.tp_comm_overlap:
        doc["compile"]["enable_async_tensor_parallel"] = False   # llama3_405b turns it on
    elif plan.parallel.tp_comm_overlap and plan.parallel.tp > 1:
        doc["compile"]["enable_async_tensor_parallel"] = True
    # torchtitan/trainer.py (0.3.0) _validate_cuda_graphs: "CUDA graphs do not support pipeline parallelism yet",
    # nor expert parallel's all-to-all dispatcher (it synchronises with the host: qwen3's standard backend)
    if plan.parallel.pp > 1 or plan.parallel.ep > 1:
        doc["training"]["disable_cuda_graphs"] = True
    for section in ("training", "parallelism", "compile", "debug"):
        for key, value in doc.get(section, {}).items():
            flag = f"--{section}.{key.replace('_', '-')}"
            if isinstance(value, bool):
                args.append(flag if value else f"--{section}.no-{key.replace('_', '-')}")
            else:
                args += [flag, str(value)]
    return args + [f"activation-checkpoint:{plan.training.recompute.value}"], notes


def _module(m) -> str:
    """torchtitan 0.3's module for the Plan's model: gpt_oss (GPT-OSS's GLU, or sinks beside experts), qwen3
    (QK norm per head), else llama3."""
    return "gpt_oss" if is_gpt_oss(m) else "qwen3" if is_qwen3(m) else "llama3"


def _module_config(plan: Plan) -> tuple[str, str]:
    """torchtitan 0.3's ``--module`` and ``--config`` for the Plan's model (a qwen3 or gpt_oss model that
    matches no config was refused by ``torchtitan_config``)."""
    module = _module(plan.model)
    if module != "llama3":
        return module, {"qwen3": qwen3_config, "gpt_oss": gpt_oss_config}[module](plan.model)
    flavor = _flavor(plan)
    if flavor is None:
        raise ValueError(f"model {plan.model.name} is not a torchtitan llama3 config (llama3_debugmodel, llama3_8b, "
                         "llama3_70b, llama3_405b): torchtitan 0.3 takes the shape from a config_registry function")
    return "llama3", f"llama3_{flavor.lower()}"


def _registry_precision(plan: Plan, name: str, entry: dict) -> None:
    """torchtitan 0.3 sets float8 in the config_registry function, not on the command line: a
    named config with ``Float8LinearConverter`` (llama3_405b, rowwise by 0.3.0's default) trains
    FP8 whatever the command says, one without it cannot (``entry``: its ``torchtitan_configs.yaml``)."""
    float8 = any(c.get("name") == "Float8LinearConverter" for c in entry.get("converters", []))
    tr = plan.training
    if tr.precision.value == "fp8" and not float8:
        raise _refuse("training.precision", "fp8", f"torchtitan 0.3 sets float8 in the config_registry function, "
                      f"and {name} does not")
    if tr.precision.value == "fp8" and tr.fp8_recipe.value != "rowwise":
        raise _refuse("training.fp8_recipe", tr.fp8_recipe.value, f"torchtitan 0.3's {name} converts to float8 "
                      "rowwise (Float8LinearConverter's default recipe)")
    if float8 and tr.precision.value != "fp8":
        raise _refuse("training.precision", tr.precision.value, f"torchtitan 0.3's {name} turns on float8 "
                      f"(Float8LinearConverter, {entry.get('source', 'its config_registry.py')}) and its command "
                      "line cannot turn it off")


def export_torchtitan_command(plan: Plan, nnodes: int, nproc: int) -> str:
    """torchtitan 0.3.x: a torchrun launch of ``torchtitan.train`` with the plan's overrides."""
    lines = ["#!/bin/bash",
             f"# torchtitan {VERSIONS['torchtitan']} launch for plan '{plan.name or plan.model.name}', "
             "written by trainplan.",
             f"# Options as {_SRC} parse them (tyro); on several nodes add --node-rank and --rdzv-endpoint.",
             "# Add --dataloader.dataset, --training.steps and --optimizer.lr for your run."]
    # torchtitan's own run_train.sh sets the allocator this way; a Plan that assumes it says so here
    env = "=".join(EXPANDABLE_SEGMENTS_ENV) + " " if plan.training.allocator_margin == EXPANDABLE_SEGMENTS_MARGIN \
        else ""
    cmd = [f"{env}torchrun --nnodes {nnodes} --nproc-per-node {nproc} -m torchtitan.train"]
    args, notes = torchtitan_args(plan)
    lines += [n for n in notes if "register flavor" not in n]   # 0.3 refuses an unknown flavor itself
    cmd += [" ".join(shlex.quote(a) for a in args[i:i + 2]) if args[i].startswith("--") and i + 1 < len(args)
            and not args[i + 1].startswith(("--", "activation-")) else shlex.quote(args[i])
            for i in _arg_starts(args)]
    return "\n".join(lines) + "\n" + " \\\n    ".join(cmd) + "\n"


def _arg_starts(args: list[str]) -> list[int]:
    """Indices where an option (or the subcommand) starts, for one option per line."""
    return [i for i, a in enumerate(args) if a.startswith("--") or a.startswith("activation-")]
