"""Speak the training stacks' languages: import model configs and launch files into a
Plan document (here, with the readers in ``simcore.plan.readers``), and export a Plan to
Megatron-LM, DeepSpeed, torchtitan and Slurm (``simcore.plan.writers``).

Pure functions: text in, a Plan-document dict (for ``simcore.plan.load.plan_from_dict``) or
text out; nothing here writes files or imports torch. Every option name written is one
the tool defines: ``tool_options.yaml`` keeps the lists with the repository, file and
commit they were read from, and ``tests/test_interop.py`` checks each export against
them, so a misspelt option fails the build.

Import merges several inputs (``--hf`` + ``--megatron`` + ``--deepspeed`` + ...): a
field given by two inputs with two values is one clear ``PlanError``; a field an input
holds but the Plan has no place for is listed in one warning line. Export refuses
(``ValueError`` naming the field) a value the target tool has no option for, and leaves
out what the format never holds (DeepSpeed does not hold TP/PP degrees: Megatron-
DeepSpeed or the model code sets them).

The mappings, with the tools' own semantics:
- Megatron-LM: the world is ``torchrun --nnodes x --nproc-per-node``; data parallel =
  world / (TP*PP*CP) (``validate_args``). ZeRO-1 is ``--use-distributed-optimizer``;
  ZeRO-2/3 are Megatron-FSDP's ``--data-parallel-sharding-strategy optim_grads`` /
  ``optim_grads_params`` (docs/discussions/megatron-fsdp-user-guide); with either,
  ``--num-distributed-optimizer-instances N`` (N instances, each sharding over dp/N ranks)
  is ``parallel.dp_replicate`` N. ``--optimizer
  adam`` is AdamW (decoupled weight decay). Interleaving is
  ``--num-virtual-stages-per-pipeline-rank``; GPipe and zero-bubble have no option.
- DeepSpeed: train_batch_size = micro * gradient_accumulation_steps * dp
  (``deepspeed/runtime/config.py``); ZeRO stage and offload in ``zero_optimization``;
  ``communication_data_type`` is the gradient all-reduce dtype. DeepSpeed reads the
  file with hjson, so the ``//`` header comments are legal.
- torchtitan: dp = data_parallel_replicate_degree * data_parallel_shard_degree; shard
  > 1 is FSDP2 (ZeRO-3, or ZeRO-2 when ``fsdp_reshard_after_forward = "never"``), with
  replicate > 1 too HSDP (``parallel.dp_replicate`` = replicate; replicate alone is DDP);
  TP always shards the sequence (its TP plan uses SequenceParallel); with PP,
  ``local_batch_size / pipeline_parallel_microbatch_size`` micro-batches run per step.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from simcore.plan import maxtext_reader
from simcore.plan.megatron_log import read_megatron_log
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.megatron_writer import account_split
from simcore.plan.readers import Reading, read_deepspeed, read_hf, sdpa_attention_kernel
from simcore.plan.model_props import FIELDS
from simcore.plan.spec import PlanError, even_split
from simcore.plan.torchtitan_reader import read_torchtitan
from simcore.plan.torchtitan_writer import stage_split, torchtitan_autocasts, virtual_stages
from topologies.components import CatalogError
from topologies.hardware import load_catalog


def _merge(readings: list[Reading]) -> tuple[dict, dict]:
    """Merged fields (a field two inputs give differently is a PlanError) and hints."""
    values: dict = {}
    origin: dict = {}
    for r in readings:
        for key, value in {**r.fields, **r.hints}.items():
            if value is None:
                continue
            if key in values and values[key] != value:
                raise PlanError(f"{key} conflicts: {origin[key]} gives {values[key]!r} "
                                f"but {r.source} gives {value!r}")
            values.setdefault(key, value)
            origin.setdefault(key, r.source)
    for r in sorted(readings, key=lambda r: r.source.startswith("hf ")):  # HF's run defaults are the weakest
        for key, value in r.defaults.items():
            if value is not None:
                values.setdefault(key, value)
    hints = {k: values.pop(k) for k in list(values) if k.split(".")[0] not in
             ("model", "parallel", "training", "name")}
    return values, hints


_NAME_MAX = 255
"""The longest file name Linux takes (NAME_MAX, limits.h): a longer argument is text, not a path."""


def _read_input(value: str, base: Path, what: str) -> str:
    """A path to a file (relative to ``base``) or the text itself (a command line, a
    config): anything with a newline, or a name longer than a file name can be, is text."""
    looks_like_path = "\n" not in value and all(len(part.encode()) <= _NAME_MAX for part in value.split("/"))
    if looks_like_path:
        path = base / value
        try:
            if path.is_file():
                return path.read_text()
        except OSError as exc:
            raise PlanError(f"{what} file {path} cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise PlanError(f"{what} file {path} is not a text file") from None
        if re.fullmatch(r"[\w./~-]+\.(json|toml|sh|txt)", value.strip()):
            raise PlanError(f"{what} file {path} cannot be read: no such file")
    return value


def import_plan(*, hf=None, megatron=None, deepspeed=None, torchtitan=None, log=None, cluster=None,
                nodes=None, seq_len=None, base_dir=".", maxtext=None) -> tuple[dict, list[str]]:
    """A Plan document from the given inputs, and warning lines (fields not mapped,
    values assumed). ``cluster`` is a catalog node type; ``nodes`` the cluster size;
    ``seq_len`` the training sequence (else the inputs', or a default with a note)."""
    base = Path(base_dir)
    readings = []
    if hf is not None:
        readings.append(read_hf(base / hf))
    if megatron is not None:
        readings.append(read_megatron(_read_input(megatron, base, "megatron")))
    if deepspeed is not None:
        readings.append(read_deepspeed(_read_input(deepspeed, base, "deepspeed")))
    if torchtitan is not None:
        readings.append(read_torchtitan(_read_input(torchtitan, base, "torchtitan")))
    if log is not None:
        readings.append(read_megatron_log(_read_log(base / log)))
    if maxtext is not None:
        readings.append(_maxtext_reading(_read_input(maxtext, base, "maxtext"), cluster, nodes))
    if not readings:
        raise PlanError("import needs at least one input: hf, megatron, deepspeed, torchtitan, maxtext or log")
    values, hints = _merge(readings)
    notes: list[str] = [v for k, v in sorted(hints.items()) if k.startswith("note.")]
    if seq_len is not None:
        values["model.seq_len"] = seq_len
    elif "hf.seq_len" in hints and not any("model.seq_len" in r.fields for r in readings):
        notes.append(f"model.seq_len={hints['hf.seq_len']} (max_position_embeddings="
                     f"{hints.get('hf.max_positions')} is the model's context, not a training sequence; "
                     "pass --seq-len)")
    if hf is not None and not any(k.startswith(("parallel.", "training.")) for r in readings for k in r.fields):
        notes.append("the layout and training settings are defaults: flash attention, selective recompute, "
                     "FSDP (parallel.zero=3) over all GPUs")
    cluster_doc, world = _import_cluster(cluster, nodes, values, hints)
    notes += [hints["note.nodes"]] if "note.nodes" in hints else []
    # all but Megatron-LM and MaxText (TE's cuDNN kernel on a GPU, the catalog's own; Pallas on a TPU)
    fa2_stack = (megatron is None and log is None and maxtext is None) or deepspeed is not None
    if fa2_stack and values.get("training.flash_attention") and "training.attention_kernel" not in values:
        kernel = sdpa_attention_kernel(load_catalog().node(cluster).gpu)
        if kernel != "auto":
            values["training.attention_kernel"] = kernel
            why = "FlashAttention-2's figures for FlexAttention" if "note.attention" in hints else \
                "torch SDPA's flash backend, FlashAttention-2"
            notes.append(f"training.attention_kernel={kernel} ({why})")
    _resolve_layout(values, hints, world, notes)
    doc = _document(values, cluster_doc, hints)
    if "cluster.nvlink_domain_gpus" in hints:   # a MaxText launch's slices
        doc["cluster"]["nvlink_domain_gpus"] = hints["cluster.nvlink_domain_gpus"]
    ignored = "; ".join(f"{r.source}: {', '.join(r.ignored)}" for r in readings if r.ignored)
    warnings = [f"not mapped to the plan: {ignored}"] if ignored else []
    if notes:
        warnings.append("assumed: " + "; ".join(notes))
    return doc, warnings


def _maxtext_reading(text: str, cluster, nodes) -> Reading:
    """A MaxText launch (``maxtext_reader``) on ``nodes`` of ``cluster``: its slices are what its
    ``num_slices`` or explicit dcn axes say, else the node's NVLink domain (a TPU host's: its largest slice)."""
    if cluster is None or not nodes:
        raise PlanError("import of a MaxText launch needs cluster= and nodes= (its mesh axes fill those devices)")
    node = load_catalog().node(cluster)
    keys, cluster_keys, unread = maxtext_reader.read_maxtext(text, node.gpus_per_node * nodes, node.nvlink_domain_gpus)
    return Reading(source="maxtext", fields={"model.name": "maxtext", **keys},
                   hints={f"cluster.{k}": v for k, v in cluster_keys.items()}, ignored=tuple(unread))


def _read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        raise PlanError(f"log file {path} cannot be read: {exc.strerror or exc}") from None


def _world_hints(hints: dict, per_node: int) -> None:
    """A log's world size as torchrun's --nnodes / --nproc-per-node on nodes of ``per_node`` GPUs."""
    world = hints.get("world.size")
    if not world or "world.nnodes" in hints:
        return
    if world < per_node:
        hints["world.gpus_per_node"], hints["world.nnodes"] = world, 1
    elif world % per_node:
        raise PlanError(f"the log's world size {world} is not a whole number of {per_node}-GPU nodes")
    else:
        hints["world.nnodes"] = world // per_node


def _import_cluster(name, nodes, values: dict, hints: dict) -> tuple[dict, int]:
    if name is None:
        raise PlanError("import needs cluster= (a catalog node type such as dgx-h100): "
                        "none of the inputs names the hardware")
    cat = load_catalog()
    if name not in cat.nodes:
        raise PlanError(f"unknown node {name!r} for cluster (known: {', '.join(sorted(cat.nodes))})")
    try:
        per_node = cat.node(name).gpus_per_node
    except CatalogError as exc:
        raise PlanError(f"cluster={name}: {exc}") from None
    _world_hints(hints, per_node)
    gpn = hints.get("world.gpus_per_node", per_node)
    model_par = math.prod(values.get(f"parallel.{k}") or 1 for k in ("tp", "pp", "cp"))
    needed = model_par * values["parallel.dp"] if "parallel.dp" in values else gpn
    if nodes and hints.get("world.nnodes") not in (None, nodes):  # the user's size wins over the script's
        hints["note.nodes"] = f"cluster.nodes={nodes} (the launch says --nnodes {hints['world.nnodes']})"
    run_nodes = (nodes if gpn == per_node and nodes else None) or hints.get("world.nnodes")
    run_nodes = run_nodes or max(1, math.ceil(needed / gpn))
    doc = {"node": name, "nodes": nodes or run_nodes}
    if gpn != per_node:
        doc["gpus_per_node"] = gpn
    return doc, run_nodes * gpn


def _resolve_layout(values: dict, hints: dict, world: int, notes: list[str]) -> None:
    """Fill what the inputs leave to the world size: dp, ZeRO under torchtitan,
    virtual stages, the global batch."""
    g = lambda k, default=1: values.get(k) if values.get(k) is not None else default  # noqa: E731
    model_par = g("parallel.tp") * g("parallel.pp") * g("parallel.cp")
    if "parallel.dp" not in values:
        if world % model_par:
            raise PlanError(f"the world of {world} GPUs is not a multiple of tp*pp*cp={model_par}")
        values["parallel.dp"] = world // model_par
    if "torchtitan.dp" in hints:
        replicate, shard, reshard = hints["torchtitan.dp"]
        shard = values["parallel.dp"] // replicate if shard == -1 else shard
        values["parallel.dp"] = replicate * shard
        never = reshard == "never" or (reshard == "default" and g("parallel.pp") > 1)
        values["parallel.zero"] = 0 if shard == 1 else (2 if never else 3)
        if values["parallel.zero"] == 3 and reshard != "always":   # its [norm, output] group is not resharded
            values["parallel.fsdp_root"] = "output_kept"
        if hints.get("torchtitan.fp8_all_gather") and values["parallel.zero"] >= 2:   # float8 gathered (FSDP only)
            values["training.fp8_param_gather"] = True
        if torchtitan_autocasts(values.get("training.precision"), values["parallel.zero"], g("parallel.tp"),
                                g("parallel.pp"), g("parallel.cp"), g("parallel.ep")):
            values["training.autocast"] = True
        if replicate > 1 and shard > 1:   # HSDP: FSDP over each replica's shard ranks, the replicas all-reduce
            values["parallel.dp_replicate"] = replicate
    layers = values.get("model.layers")
    per_stage = hints.get("megatron.layers_per_virtual_stage")
    if per_stage and layers:
        values["parallel.vpp"] = layers // (g("parallel.pp") * per_stage)
    if "torchtitan.stage_rule" in hints and layers:
        _torchtitan_stages(values, layers, g("parallel.pp"), *hints["torchtitan.stage_rule"])
    if "megatron.first_last" in hints and layers:
        if "megatron.account" in hints:   # transformer_config.py@d98e8a64, 2229-2239: Megatron's ValueError
            raise PlanError("megatron --decoder-first/last-pipeline-num-layers cannot be set with "
                            "--account-for-embedding/loss-in-pipeline-split")
        values["parallel.stage_layers"] = _first_last_split(layers, g("parallel.pp"), *hints["megatron.first_last"])
    if "megatron.account" in hints and layers:
        values["parallel.stage_layers"] = account_split(layers, g("parallel.pp"), g("parallel.vpp"),
                                                        *hints["megatron.account"])
    if "megatron.layout" in hints:   # every virtual stage's layers; vpp = stages / pp (arguments.py)
        (stages, mtp), pp = hints["megatron.layout"], g("parallel.pp")
        if len(stages) % pp or (layers and sum(stages) != layers) or mtp != (values.get("model.mtp_layers") or 0):
            raise PlanError(f"megatron --pipeline-model-parallel-layout gives {len(stages)} stages of {sum(stages)} "
                            f"layers and {mtp} MTP modules, where Megatron needs a multiple of --pipeline-model-"
                            f"parallel-size ({pp}), --num-layers ({layers}) and --mtp-num-layers")
        values["parallel.vpp"], values["parallel.stage_layers"] = len(stages) // pp, stages
        if len(stages) > pp:   # several virtual stages a rank: Megatron interleaves them
            values["parallel.schedule"] = "interleaved-1f1b"
    stages = values.get("parallel.stage_layers")
    if stages and layers and list(stages) == list(even_split(layers, g("parallel.pp") * g("parallel.vpp"))):
        del values["parallel.stage_layers"]
    micro = values.setdefault("training.micro_batch", 1)
    if values.get("training.global_batch") is None:
        accum = hints.get("batch.accumulation") or 1
        per_rank = hints.get("batch.local", micro * accum)
        values["training.global_batch"] = per_rank * values["parallel.dp"]
        if "batch.accumulation" not in hints and "batch.local" not in hints:
            notes.append(f"training.global_batch={values['training.global_batch']} "
                         "(one micro-batch per data-parallel rank: no input gives the global batch)")


def _torchtitan_stages(values: dict, layers: int, pp: int, per_stage: int, first: int, last: int) -> None:
    """torchtitan's stage rule (simcore.plan.torchtitan_writer): the embedding and the output
    count as ``first`` and ``last`` layers; a stage count that is not a multiple of pp is the
    error torchtitan raises, said here in one sentence."""
    stages = virtual_stages(layers, per_stage, first, last)
    if stages % pp:
        raise PlanError(f"torchtitan parallelism.pipeline_parallel_layers_per_stage={per_stage} gives {stages} "
                        f"virtual stages ({layers} layers + {first} + {last} for the embedding and output), "
                        f"not a multiple of pipeline_parallel_degree={pp}")
    split = stage_split(layers, stages, first, last)
    if split is None:
        raise PlanError(f"torchtitan parallelism.pipeline_parallel_layers_per_stage={per_stage} leaves a stage "
                        "without layers")
    values["parallel.vpp"], values["parallel.stage_layers"] = stages // pp, split


def _first_last_split(layers: int, pp: int, first, last) -> list[int]:
    """Megatron's uneven split: given first/last stage sizes, the rest spread evenly."""
    middle_stages = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    if middle_stages <= 0 or rest % middle_stages:
        raise PlanError(f"megatron --decoder-first/last-pipeline-num-layers leave {rest} layers that do "
                        f"not split evenly over {max(middle_stages, 0)} middle stages")
    middle = [rest // middle_stages] * middle_stages
    return ([first] if first is not None else []) + middle + ([last] if last is not None else [])


_SECTION_ORDER = {
    "model": ("name", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len",
              "gated_mlp", "experts", "top_k", "capacity_factor", "tied_embeddings", "position_embedding",
              "kv_channels", "rope_base", "dropout", "dense_ffn_hidden", "dense_layers", "moe_layers", "shared_ffn_hidden",
              "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "sliding_window",
              "sliding_window_layers", "mtp_layers", "linear_attention", "sparse_attention", *FIELDS),
    "parallel": ("tp", "pp", "dp", "cp", "ep", "expert_tp", "vpp", "stage_layers", "zero", "zero_impl",
                 "dp_replicate", "zero_quantized_weights", "zero_hpz_partition_size", "zero_quantized_gradients", "sequence_parallel", "fsdp_root", "schedule", "microbatch_group", "cp_comm", "tp_comm_overlap", "overlap_param_gather",
                 "moe_dispatcher", "moe_a2a_overlap", "kv_replicator"),
    "training": ("global_batch", "micro_batch", "precision", "fp8_recipe", "attention_kernel", "attention_unpad", "recompute", "offload",
                 "activation_offload", "moe_routing",
                 "flash_attention", "optimizer", "grad_compression", "kernels", "optimizer_in_backward", "autocast",
                 "fp8_param_gather", "optimizer_state_dtype"),
}


def _document(values: dict, cluster_doc: dict, hints: dict) -> dict:
    model = {k: values[f"model.{k}"] for k in _SECTION_ORDER["model"] if values.get(f"model.{k}") is not None}
    if "layers" not in model:
        flavor = hints.get("torchtitan.flavor")
        why = f"torchtitan model {flavor} is not a llama3 flavor known here" if flavor else "no input gives it"
        raise PlanError(f"the model's shape is missing ({why}): pass hf= (a Hugging Face config.json)")
    for key in ("hidden", "heads", "vocab"):
        if key not in model:
            raise PlanError(f"model.{key} is not given by any input (pass hf= or the tool's option for it)")
    if "seq_len" not in model:
        raise PlanError("model.seq_len is not given by any input (a config.json without max_position_embeddings): "
                        "pass seq_len= (--seq-len)")
    doc = {"name": values["name"]} if values.get("name") else {}
    doc["model"] = model
    doc["cluster"] = cluster_doc
    for section in ("parallel", "training"):
        doc[section] = {k: values[f"{section}.{k}"] for k in _SECTION_ORDER[section]
                        if values.get(f"{section}.{k}") is not None}
    if "stage_layers" in doc["parallel"]:
        doc["parallel"]["stage_layers"] = list(doc["parallel"]["stage_layers"])
    return doc

