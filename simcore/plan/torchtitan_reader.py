"""A torchtitan run read as Plan keys: a 0.2 job TOML, or a 0.3 launch (``torchrun --nnodes N
--nproc-per-node G -m torchtitan.train --module M --config C --section.opt v ...
activation-checkpoint:MODE``).

torchtitan 0.3 has no job file: ``--config C`` calls the config registry's function ``C()``
(torchtitan/models/M/config_registry.py), whose values the command's options override.
``torchtitan_configs.yaml`` holds what each registry function sets, generated from the
registry source by ``bench/dump_torchtitan_configs.py`` with the file and commit it read;
the reader applies those values first, then the command's (gpt_oss's two configs, which that file
lacks: ``simcore.plan.torchtitan_gpt_oss.REGISTRY``). A llama3 flavor's shape is
``tool_options.yaml``'s, a qwen3 one's ``simcore.plan.torchtitan_qwen3``'s, a gpt_oss one's
``simcore.plan.torchtitan_gpt_oss``'s. A registry value
that changes the parameter count or the layout and has no Plan field (LoRA adapters, MTP
layers, all-bf16 training) refuses the import in one sentence; the harmless ones (attention
backend, GEMM backend) are listed as not mapped.
"""
from __future__ import annotations

import copy
import functools
import re
import shlex
import tomllib
from pathlib import Path

import yaml

from simcore.plan.readers import Reading, _flat, load_tool_options
from simcore.plan.spec import PlanError
from simcore.plan.torchtitan_gpt_oss import gpt_oss_fields, gpt_oss_registry
from simcore.plan.torchtitan_qwen3 import qwen3_fields

CONFIGS_PATH = Path(__file__).parent / "torchtitan_configs.yaml"
# newer torchtitan's TrainingConfig names (pytorch/torchtitan #4088) -> 0.3.0's
RENAMES = {"max_context_length": "seq_len", "num_tokens_per_microbatch_per_dp_rank": "local_batch_size"}
# registry model_registry() options that change neither the parameter count nor the layout
HARMLESS_MODEL_OPTIONS = ("attn_backend", "tp_gemm_backend", "moe_comm_backend", "non_blocking_capacity_factor")
#: model_registry's attn_backend where a config sets none (torchtitan 0.3.0 models/<module>/__init__.py;
#: gpt_oss's config functions set varlen, flash-attn's kernel)
REGISTRY_ATTENTION = {"llama3": "flex", "qwen3": "flex", "deepseek_v3": "flex"}
# converter -> training.precision (Float8LinearConverter.Config.recipe_name defaults to rowwise in 0.3.0)
CONVERTERS = {"Float8LinearConverter": "fp8", "Float8GroupedExpertsConverter": "fp8",
              "MXFP8LinearConverter": "mxfp8", "MXFP8GroupedExpertsConverter": "mxfp8",
              "NVFP4LinearConverter": "nvfp4"}


@functools.lru_cache(maxsize=1)
def load_torchtitan_configs() -> dict:
    """torchtitan 0.3's config registry as data (``torchtitan_configs.yaml``)."""
    with open(CONFIGS_PATH) as f:
        return yaml.safe_load(f)


def _torchtitan_command(text: str) -> dict:
    """torchtitan 0.3's launch (``-m torchtitan.train --module M --config C --section.opt v
    ... activation-checkpoint:MODE``, tyro's spelling) as the sections of a 0.2 job TOML;
    ``model.config`` is the registry name, applied by ``read_torchtitan``."""
    words = shlex.split(re.sub(r"\\\n", " ", text), comments=True)
    cfg: dict = {}
    i = words.index("torchtitan.train") + 1 if "torchtitan.train" in words else 0
    while i < len(words):
        word, value = words[i], words[i + 1] if i + 1 < len(words) else None
        i += 1
        if "=" in word and word.startswith("--"):
            (word, value), i = word.split("=", 1), i - 1
        if word.startswith("activation-checkpoint:"):
            cfg.setdefault("activation_checkpoint", {})["mode"] = word.split(":", 1)[1]
        elif word in ("--module", "--config") and value is not None:
            i += 1
            cfg.setdefault("model", {})["name" if word == "--module" else "config"] = value
        elif word.startswith("--") and "." in word:
            section, _, key = word[2:].partition(".")
            key = key.replace("-", "_")
            if value is None or value.startswith("--") or value.startswith("activation-checkpoint:"):
                negated = key.startswith("no_")
                cfg.setdefault(section.replace("-", "_"), {})[key[3:] if negated else key] = not negated
            else:
                i += 1
                cfg.setdefault(section.replace("-", "_"), {})[key] = int(value) if re.fullmatch(r"-?\d+", value) else value
    return cfg


def _torchrun_world(text: str, hints: dict, ignored: list) -> None:
    """torchrun's ``--nnodes`` and ``--nproc-per-node`` (``--nproc_per_node``, ``=`` forms) before
    ``-m torchtitan.train``, as the world hints the Megatron import also gives."""
    words = shlex.split(re.sub(r"\\\n", " ", text), comments=True)
    words = words[:words.index("torchtitan.train")] if "torchtitan.train" in words else []
    opts: dict = {}
    for j, w in enumerate(words):
        name, eq, val = w.partition("=")
        if name in ("--nnodes", "--nproc-per-node", "--nproc_per_node"):
            opts[name.replace("_", "-")] = val if eq else (words[j + 1] if j + 1 < len(words) else "")
    nnodes, nproc = opts.get("--nnodes"), opts.get("--nproc-per-node")
    if nnodes is not None:
        if re.fullmatch(r"\d+(:\d+)?", nnodes):   # MIN:MAX for an elastic run: its largest size
            hints["world.nnodes"] = int(nnodes.split(":")[-1])
            if ":" in nnodes:
                hints["note.torchrun_nnodes"] = f"torchrun --nnodes {nnodes} taken as {hints['world.nnodes']} nodes"
        else:
            ignored.append(f"torchrun.nnodes={nnodes}")
    if nproc is not None:
        if nproc.isdigit():
            hints["world.gpus_per_node"] = int(nproc)
        elif nproc not in ("gpu", "auto"):   # torchrun's own: one process per GPU
            ignored.append(f"torchrun.nproc_per_node={nproc}")


def _registry(cfg: dict, f: dict, hints: dict, ignored: list) -> dict:
    """The command's sections over the values its ``--config`` sets (``torchtitan_configs.yaml``)."""
    model = cfg.get("model") or {}
    name, module = model.get("config"), model.get("name")
    if name is None:
        return cfg
    reg = load_torchtitan_configs()
    if module == "gpt_oss" or name.startswith("gpt_oss"):   # not in torchtitan_configs.yaml (its dump reads 3 modules)
        reg = {**reg, "configs": {**reg["configs"], **gpt_oss_registry(name)}}
    entry = reg["configs"].get(name)
    known = sorted(n for n, e in reg["configs"].items() if module in (None, e["module"]))
    if entry is None or module not in (None, entry["module"]):
        raise PlanError(f"torchtitan --config {name} is not a config of torchtitan {reg['version']}'s "
                        f"--module {module or 'llama3'} registry (known: {', '.join(known)})")
    where = f"torchtitan --config {name} ({entry['source'].split('@')[0]})"
    for conv in entry.get("converters", []):
        if conv["name"] not in CONVERTERS:
            raise PlanError(f"{where} applies {conv['name']}, which a Plan has no field for "
                            "(LoRA trains adapters over a frozen model)")
        f["training.precision"] = CONVERTERS[conv["name"]]
        if CONVERTERS[conv["name"]] == "fp8":
            f["training.fp8_recipe"] = "rowwise" if conv.get("recipe_name", "rowwise").startswith("rowwise") \
                else "tensorwise"
        if isinstance(conv.get("fqns"), str):   # a computed subset of the layers
            hints[f"note.{name}"] = f"{where} converts {conv['fqns']} only: taken as all layers"
    for key, value in (entry.get("model_options") or {}).items():
        if key not in HARMLESS_MODEL_OPTIONS:
            raise PlanError(f"{where} sets model_registry {key}={value}, which a Plan has no field for")
        ignored.append(f"{name}.model.{key}={value}")
    backend = (entry.get("model_options") or {}).get("attn_backend", REGISTRY_ATTENTION.get(entry["module"]))
    if backend in ("flex", "flex_flash"):
        hints["note.attention"] = (f"{where} attends through FlexAttention (attn_backend {backend}; model_registry's "
                                   f"default is flex, torchtitan/models/{entry['module']}/__init__.py): priced as the "
                                   "catalog's flash kernel, which has no FlexAttention figure")
    ignored += [f"{name}: {line}" for line in entry.get("unparsed", [])]
    out = copy.deepcopy(entry["sections"])
    for section, values in cfg.items():
        out.setdefault(section, {}).update(values)
    out["model"] = {**out.get("model", {}), "name": entry["module"], "flavor": entry["flavor"]}
    return out


def read_torchtitan(text: str) -> Reading:
    """A torchtitan run: the 0.3 launch command, or a 0.2 job TOML."""
    f, d, hints, extra = {}, {}, {}, []
    if re.search(r"(^|\s)-m\s+torchtitan\.train\b|--module\s", text):
        command = _torchtitan_command(text)
        _torchrun_world(text, hints, extra)
        cfg = _registry(command, f, hints, extra)
    else:
        try:
            command = cfg = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PlanError(f"torchtitan config is not valid TOML: {exc}") from None
    training = cfg.get("training") or {}
    for new, old in RENAMES.items():   # a newer torchtitan's spelling
        if new in training:
            training[old] = training.pop(new)
    if "max_context_length" in (command.get("training") or {}) and "local_batch_size" in training:
        training["local_batch_size"] //= training["seq_len"]   # it counted tokens
    used: set[str] = {"model.config"}

    def get(section, key, default=None):
        used.add(f"{section}.{key}")
        return (cfg.get(section) or {}).get(key, default)

    f.update(_torchtitan_training(get, used, f, d, hints))
    f.update(_torchtitan_parallel(get, hints))
    d["training.flash_attention"] = True  # llama3's attention is SDPA, which runs the flash kernel
    ignored = tuple(k for k in _flat(command) if k not in used) + tuple(extra)
    return Reading(source="torchtitan", fields=f, defaults=d, hints=hints, ignored=ignored)


def _torchtitan_training(get, used: set, given: dict, d: dict, hints: dict) -> dict:
    f: dict = {}
    if get("job", "description") is not None:
        f["name"] = get("job", "description")
    f.update(_torchtitan_model(get("model", "name", "llama3"), get("model", "flavor", "debugmodel"), d, hints))
    f["model.seq_len"] = get("training", "seq_len", 2048)
    converters = get("model", "converters", []) or []
    param = get("training", "mixed_precision_param", "bfloat16")
    if get("training", "dtype", "float32") == "bfloat16":
        raise PlanError("torchtitan training.dtype=bfloat16 keeps parameters, gradients and optimizer states in "
                        "bf16 with no fp32 copy, which a Plan has no field for")
    if "training.precision" not in given:
        f["training.precision"] = "fp8" if "float8" in converters else {"float32": "fp32"}.get(param, "bf16")
    if "float8" in converters:   # torchao's float8: tensorwise unless float8.recipe_name says rowwise
        f["training.fp8_recipe"] = "rowwise" if str(get("float8", "recipe_name", "")).startswith("rowwise") \
            else "tensorwise"
        if get("float8", "enable_fsdp_float8_all_gather", False):   # FSDP2 gathers the float8 weights
            hints["torchtitan.fp8_all_gather"] = True
        get("float8", "precompute_float8_dynamic_scale_for_fsdp")
    mode = get("activation_checkpoint", "mode", "selective")
    if mode not in ("selective", "full", "none"):
        raise PlanError(f"torchtitan activation checkpointing {mode} has no training.recompute equivalent "
                        "(selective, full, none)")
    f["training.recompute"] = mode
    get("activation_checkpoint", "selective_ac_option")
    f["training.offload"] = "optimizer+params" if get("training", "enable_cpu_offload", False) else "none"
    compiled = get("compile", "enable")   # 0.2.2 on; 6404b932 and before: training.compile
    compiled = get("training", "compile", False) if compiled is None else compiled
    f["training.kernels"] = "fused" if compiled and "model" in get("compile", "components", ["model"]) else "eager"
    f["training.optimizer_in_backward"] = bool(get("optimizer", "early_step_in_backward", False))
    name = str(get("optimizer", "name", "AdamW")).lower()
    if name in ("adam", "adamw"):
        f["training.optimizer"] = name
    else:
        used.discard("optimizer.name")
    return f


def _torchtitan_model(name: str, flavor: str, d: dict, hints: dict) -> dict:
    named = {"qwen3": qwen3_fields, "gpt_oss": gpt_oss_fields}.get(name)   # torchtitan 0.3's qwen3, gpt_oss configs
    fields = named(flavor) if named else None
    if fields is not None:
        d["model.name"] = f"{name.replace('_', '-')}-{flavor.lower()}"
        return fields
    flavors = load_tool_options()["torchtitan"]["llama3_flavors"]
    if name != "llama3" or flavor not in flavors:
        hints["torchtitan.flavor"] = f"{name}/{flavor}"
        return {}
    d["model.name"] = f"llama3-{flavor.lower()}"
    shape = {f"model.{k}": v for k, v in flavors[flavor].items()}
    return {**shape, "model.gated_mlp": True, "model.tied_embeddings": False,
            "model.position_embedding": "rope", "model.dropout": 0.0}   # torchtitan's Llama has no dropout


def _torchtitan_parallel(get, hints: dict) -> dict:
    tp, pp = get("parallelism", "tensor_parallel_degree", 1), get("parallelism", "pipeline_parallel_degree", 1)
    f = {"parallel.tp": tp, "parallel.pp": pp, "parallel.cp": get("parallelism", "context_parallel_degree", 1),
         "parallel.ep": get("parallelism", "expert_parallel_degree", 1),
         "parallel.sequence_parallel": tp > 1 and get("parallelism", "enable_sequence_parallel", True)}
    if tp > 1 and get("compile", "enable", False) and get("compile", "enable_async_tensor_parallel", False):
        f["parallel.tp_comm_overlap"] = True   # async TP: the TP collectives overlap their GEMMs
    if f["parallel.ep"] > 1 and tp > 1:   # EP borrows the TP ranks: an expert is whole (torchtitan/config/configs.py)
        f["parallel.expert_tp"] = 1
    if get("debug", "moe_force_load_balance", False):   # round-robin experts (models/common/moe.py)
        f["training.moe_routing"] = "round_robin"
    if f["parallel.cp"] > 1:   # torch's rotate method: allgather by default, alltoall the ring (torchtitan 0.2)
        rotate = get("parallelism", "context_parallel_rotate_method", "allgather")
        f["parallel.cp_comm"] = "p2p" if rotate == "alltoall" else "all_gather"
    hints["torchtitan.dp"] = (get("parallelism", "data_parallel_replicate_degree", 1),
                              get("parallelism", "data_parallel_shard_degree", -1),
                              get("parallelism", "fsdp_reshard_after_forward", "default"))
    local = get("training", "local_batch_size", 8)
    total = get("training", "global_batch_size", -1)
    if pp > 1:
        f["training.micro_batch"] = get("parallelism", "pipeline_parallel_microbatch_size", 1)
        schedule = str(get("parallelism", "pipeline_parallel_schedule", "1F1B")).lower()
        schedules = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved1f1b": "interleaved-1f1b",
                     "loopedbfs": "interleaved-1f1b", "interleavedzerobubble": "zero-bubble",
                     "zbvzerobubble": "zero-bubble", "dualpipev": "dualpipev"}
        if schedule not in schedules:
            raise PlanError(f"torchtitan parallelism.pipeline_parallel_schedule={schedule!r} has no "
                            f"parallel.schedule equivalent (known: {', '.join(schedules)})")
        f["parallel.schedule"] = schedules[schedule]
        parts = get("parallelism", "module_fqns_per_model_part")
        if parts:
            counts = [sum(1 for m in part if re.fullmatch(r"layers\.\d+", m)) for part in parts]
            f["parallel.stage_layers"] = counts
            f["parallel.vpp"] = len(parts) // pp
        elif get("parallelism", "pipeline_parallel_layers_per_stage") is not None:
            hints["torchtitan.stage_rule"] = (get("parallelism", "pipeline_parallel_layers_per_stage"),
                                              get("parallelism", "pipeline_parallel_first_stage_less_layers", 1),
                                              get("parallelism", "pipeline_parallel_last_stage_less_layers", 1))
    else:
        f["training.micro_batch"] = local
    f["training.global_batch"] = total if total > 0 else None
    if total <= 0:
        hints["batch.local"] = local
    return f
