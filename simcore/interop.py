"""Speak the training stacks' languages: import model configs and launch files into a
Plan document, and export a Plan to Megatron-LM, DeepSpeed, torchtitan and Slurm.

Pure functions: text in, a Plan-document dict (for ``simcore.spec.plan_from_dict``) or
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
  ``optim_grads_params`` (docs/discussions/megatron-fsdp-user-guide). ``--optimizer
  adam`` is AdamW (decoupled weight decay). Interleaving is
  ``--num-virtual-stages-per-pipeline-rank``; GPipe and zero-bubble have no option.
- DeepSpeed: train_batch_size = micro * gradient_accumulation_steps * dp
  (``deepspeed/runtime/config.py``); ZeRO stage and offload in ``zero_optimization``;
  ``communication_data_type`` is the gradient all-reduce dtype. DeepSpeed reads the
  file with hjson, so the ``//`` header comments are legal.
- torchtitan: dp = data_parallel_replicate_degree * data_parallel_shard_degree; shard
  > 1 is FSDP2 (ZeRO-3, or ZeRO-2 when ``fsdp_reshard_after_forward = "never"``);
  TP always shards the sequence (its TP plan uses SequenceParallel); with PP,
  ``local_batch_size / pipeline_parallel_microbatch_size`` micro-batches run per step.
"""
from __future__ import annotations

import functools
import json
import math
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from simcore.spec import Plan, PlanError, hf_config_fields, even_split
from topologies.hardware import CatalogError, load_catalog

TOOL_OPTIONS_PATH = Path(__file__).parent / "tool_options.yaml"
TARGETS = ("deepspeed", "megatron", "slurm", "torchtitan")

_MEGATRON_SRC = "NVIDIA/Megatron-LM megatron/training/arguments.py (commit 000c4ac2, 2025)"
_TORCHTITAN_SRC = "pytorch/torchtitan torchtitan/config/job_config.py (commit 6404b932, 2025)"
_DEEPSPEED_SRC = ("deepspeedai/DeepSpeed deepspeed/runtime/constants.py (088be892), "
                  "zero/config.py (1b88ac36), zero/offload_config.py (1978617c), 2025")
_RDZV_PORT = 29500
"""torchrun's conventional rendezvous port (torch/distributed/run.py examples)."""


@functools.lru_cache(maxsize=1)
def load_tool_options() -> dict:
    """The option names of each tool, with their sources (``tool_options.yaml``)."""
    with open(TOOL_OPTIONS_PATH) as f:
        return yaml.safe_load(f)


@dataclass(frozen=True, slots=True, kw_only=True)
class Reading:
    """What one input says: Plan keys ("parallel.tp") it gives, weaker defaults
    (used when no input gives the key), launch hints, and the fields it ignored."""

    source: str
    fields: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    hints: dict = field(default_factory=dict)
    ignored: tuple[str, ...] = ()


# --------------------------------------------------------------------------- readers

_HF_USED = {"model_type", "_name_or_path", "num_hidden_layers", "n_layer", "hidden_size", "n_embd",
            "num_attention_heads", "n_head", "num_key_value_heads", "intermediate_size", "n_inner",
            "ffn_dim", "vocab_size", "max_position_embeddings", "n_positions", "n_ctx", "seq_length",
            "num_local_experts", "num_experts", "num_experts_per_tok", "tie_word_embeddings"}


def read_hf(path: Path) -> Reading:
    """A Hugging Face config.json (field names via ``spec.hf_config_fields``). Its
    max_position_embeddings is a capacity, so seq_len is only a default."""
    fields_ = hf_config_fields(path)
    cfg = json.loads(path.read_text())
    fields_.pop("source", None)
    defaults = {"model.name": fields_.pop("name"), "model.seq_len": fields_.pop("seq_len")}
    return Reading(source=f"hf {path.name}", fields={f"model.{k}": v for k, v in fields_.items()},
                   defaults=defaults, ignored=tuple(sorted(k for k in cfg if k not in _HF_USED)))


def _logical_lines(text: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    return [ln for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def _options(tokens: list[str], where: str) -> dict[str, list[str]]:
    """``--name v1 v2`` / ``--name=v`` / ``--flag`` into {name: values}; last one wins."""
    opts: dict[str, list[str]] = {}
    name = None
    for tok in tokens:
        if tok.startswith("--"):
            name, _, value = tok.partition("=")
            opts[name] = [value] if value else []
        elif name is None:
            raise PlanError(f"{where}: unexpected argument {tok!r} before the first option")
        else:
            opts[name].append(tok)
    return opts


def _split_command(text: str) -> tuple[dict, dict]:
    """The launcher options and the training-script options of a command or script."""
    for line in _logical_lines(text):
        tokens = shlex.split(line, comments=True)
        script = next((i for i, t in enumerate(tokens) if t.endswith(".py")), None)
        if script is not None:
            pre = {}
            for i, tok in enumerate(tokens[:script]):
                key, _, val = tok.partition("=")
                if key.startswith("--"):
                    pre[key.replace("_", "-")] = val or (tokens[i + 1] if i + 1 < script else "")
            return pre, _options(tokens[script + 1:], "megatron")
    raise PlanError("megatron: no training script (a .py file such as pretrain_gpt.py) in the command")


class _Args:
    """Typed access to parsed options that records which ones were used."""

    def __init__(self, opts: dict, where: str):
        self.opts, self.where, self.used = opts, where, set()

    def flag(self, name: str) -> bool:
        self.used.add(name) if name in self.opts else None
        return name in self.opts

    def value(self, name: str, conv=int):
        if name not in self.opts:
            return None
        self.used.add(name)
        values = self.opts[name]
        if len(values) != 1:
            raise PlanError(f"{self.where} option {name} needs one value, got {len(values)}")
        try:
            return conv(values[0])
        except ValueError:
            raise PlanError(f"{self.where} option {name}={values[0]!r} is not a {conv.__name__}") from None


def read_megatron(text: str) -> Reading:
    """A Megatron-LM command line or launch script (pretrain_gpt.py arguments)."""
    pre, opts = _split_command(text)
    a = _Args(opts, "megatron")
    f: dict = {}
    d: dict = {"training.precision": "fp32", "parallel.zero": 0, "parallel.sequence_parallel": False,
               "training.recompute": "none"}
    _megatron_model(a, f)
    _megatron_parallel(a, f)
    _megatron_training(a, f)
    hints = {}
    if "--nnodes" in pre:
        hints["world.nnodes"] = _to_int(pre["--nnodes"], "torchrun --nnodes")
    if "--nproc-per-node" in pre:
        hints["world.gpus_per_node"] = _to_int(pre["--nproc-per-node"], "torchrun --nproc-per-node")
    if "--num-layers-per-virtual-pipeline-stage" in opts:
        hints["megatron.layers_per_virtual_stage"] = a.value("--num-layers-per-virtual-pipeline-stage")
    first = a.value("--decoder-first-pipeline-num-layers")
    last = a.value("--decoder-last-pipeline-num-layers")
    if first is not None or last is not None:
        hints["megatron.first_last"] = (first, last)
    ignored = tuple(o for o in opts if o not in a.used)
    return Reading(source="megatron", fields=f, defaults=d, hints=hints, ignored=ignored)


def _to_int(value: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise PlanError(f"{where}={value!r} is not an integer") from None


def _megatron_model(a: _Args, f: dict) -> None:
    if "--num-layers" not in a.opts:
        return
    f["model.layers"] = a.value("--num-layers")
    f["model.hidden"] = a.value("--hidden-size")
    f["model.heads"] = a.value("--num-attention-heads")
    f["model.ffn_hidden"] = a.value("--ffn-hidden-size")
    if a.flag("--group-query-attention"):
        f["model.kv_heads"] = a.value("--num-query-groups")
    elif f["model.heads"] is not None:
        f["model.kv_heads"] = f["model.heads"]
    f["model.vocab"] = a.value("--vocab-size")
    f["model.seq_len"] = a.value("--seq-length")
    a.value("--max-position-embeddings")  # a capacity; the run uses --seq-length
    f["model.gated_mlp"] = a.flag("--swiglu")
    f["model.tied_embeddings"] = not a.flag("--untie-embeddings-and-output-weights")
    pos = a.value("--position-embedding-type", str) or "learned_absolute"
    rope = pos == "rope" or a.flag("--use-rotary-position-embeddings")
    f["model.position_embedding"] = "rope" if rope else "learned"
    if "--num-experts" in a.opts:
        f["model.experts"] = a.value("--num-experts")
        f["model.top_k"] = a.value("--moe-router-topk") or 2  # Megatron's default top-k
        f["model.capacity_factor"] = a.value("--moe-expert-capacity-factor", float)


def _megatron_parallel(a: _Args, f: dict) -> None:
    f["parallel.tp"] = a.value("--tensor-model-parallel-size")
    f["parallel.pp"] = a.value("--pipeline-model-parallel-size")
    f["parallel.cp"] = a.value("--context-parallel-size")
    f["parallel.ep"] = a.value("--expert-model-parallel-size")
    f["parallel.vpp"] = a.value("--num-virtual-stages-per-pipeline-rank")
    if (f["parallel.ep"] or 1) > 1:
        a.value("--moe-token-dispatcher-type", str)
    if a.flag("--sequence-parallel"):
        f["parallel.sequence_parallel"] = True
    if (f["parallel.pp"] or 1) > 1:
        interleaved = (f["parallel.vpp"] or 1) > 1 or "--num-layers-per-virtual-pipeline-stage" in a.opts
        f["parallel.schedule"] = "interleaved-1f1b" if interleaved else "1f1b"
    strategies = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
    if a.flag("--use-megatron-fsdp"):
        strategy = a.value("--data-parallel-sharding-strategy", str) or "no_shard"
        if strategy not in strategies:
            raise PlanError(f"megatron --data-parallel-sharding-strategy={strategy!r} is not one of: "
                            f"{', '.join(strategies)}")
        f["parallel.zero"] = strategies[strategy]
        a.flag("--use-distributed-optimizer"), a.flag("--no-gradient-accumulation-fusion")
        a.value("--ckpt-format", str)  # fsdp_dtensor: part of the Megatron-FSDP recipe
    elif a.flag("--use-torch-fsdp2"):
        f["parallel.zero"] = 2 if a.flag("--torch-fsdp2-no-reshard-after-forward") else 3
    elif a.flag("--use-distributed-optimizer"):
        f["parallel.zero"] = 1


def _megatron_training(a: _Args, f: dict) -> None:
    f["training.micro_batch"] = a.value("--micro-batch-size")
    f["training.global_batch"] = a.value("--global-batch-size")
    fp16, bf16 = a.flag("--fp16"), a.flag("--bf16")
    if fp16 and bf16:
        raise PlanError("megatron gives both --fp16 and --bf16 for training.precision")
    if a.value("--fp8-format", str):
        f["training.precision"] = "fp8"
    elif fp16 or bf16:
        f["training.precision"] = "fp16" if fp16 else "bf16"
    granularity = a.value("--recompute-granularity", str)
    if granularity or a.flag("--recompute-activations"):
        f["training.recompute"] = granularity or "selective"
        a.value("--recompute-method", str), a.value("--recompute-num-layers")
    if a.flag("--optimizer-cpu-offload"):
        f["training.offload"] = "optimizer"
        a.flag("--use-precision-aware-optimizer"), a.value("--optimizer-offload-fraction", float)
    backend = a.value("--attention-backend", str)
    if backend is not None or a.flag("--use-flash-attn"):
        f["training.flash_attention"] = backend in (None, "flash")
    optimizer = a.value("--optimizer", str)
    if optimizer in ("adam", "sgd"):
        f["training.optimizer"] = "adamw" if optimizer == "adam" else "sgd"
    elif optimizer is not None:
        a.used.discard("--optimizer")
    if a.flag("--grad-reduce-in-bf16"):
        f["training.grad_compression"] = "bf16"


def _strip_comments(text: str) -> str:
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith(("//", "#")))


def _flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out


def read_deepspeed(text: str) -> Reading:
    """A DeepSpeed ds_config.json (whole-line // or # comments allowed, as hjson does)."""
    try:
        cfg = json.loads(_strip_comments(text))
    except json.JSONDecodeError as exc:
        raise PlanError(f"deepspeed config is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise PlanError("deepspeed config must hold a JSON object")
    used: set[str] = set()
    f, hints = _deepspeed_batch(cfg, used)
    d = {"training.precision": "fp32", "parallel.zero": 0, "training.offload": "none"}
    bf16 = (cfg.get("bf16") or cfg.get("bfloat16") or {}).get("enabled", False)
    fp16 = (cfg.get("fp16") or {}).get("enabled", False)
    used |= {"bf16.enabled", "bfloat16.enabled", "fp16.enabled"}
    if bf16 and fp16:
        raise PlanError("deepspeed config enables both bf16 and fp16 for training.precision")
    if bf16 or fp16:
        f["training.precision"] = "bf16" if bf16 else "fp16"
    _deepspeed_zero(cfg.get("zero_optimization"), f, used)
    comm = cfg.get("communication_data_type")
    if comm is not None:
        used.add("communication_data_type")
        f["training.grad_compression"] = {"fp32": "none", "fp16": "fp16", "bf16": "bf16"}.get(str(comm).lower())
    opt = cfg.get("optimizer") or {}
    kind = str(opt.get("type", "")).lower()
    if kind in ("adam", "adamw"):
        used |= {"optimizer.type", "optimizer.params.adam_w_mode"}
        w_mode = (opt.get("params") or {}).get("adam_w_mode", True)  # DeepSpeed's ADAM_W_MODE_DEFAULT
        f["training.optimizer"] = "adamw" if kind == "adamw" or w_mode else "adam"
    ignored = tuple(k for k in _flat(cfg) if k not in used)
    return Reading(source="deepspeed", fields=f, defaults=d, hints=hints, ignored=ignored)


def _deepspeed_batch(cfg: dict, used: set) -> tuple[dict, dict]:
    def num(key):
        v = cfg.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            used.add(key)
            return v
        return None  # absent, or "auto" (filled in by the HF Trainer): listed as ignored
    total, micro = num("train_batch_size"), num("train_micro_batch_size_per_gpu")
    accum = num("gradient_accumulation_steps")
    f = {"training.global_batch": total, "training.micro_batch": micro}
    hints = {"batch.accumulation": accum} if accum else {}
    if total and micro and accum:
        if total % (micro * accum):
            raise PlanError(f"deepspeed train_batch_size={total} is not a multiple of "
                            f"train_micro_batch_size_per_gpu*gradient_accumulation_steps={micro * accum}")
        f["parallel.dp"] = total // (micro * accum)
    return f, hints


def _deepspeed_zero(zero, f: dict, used: set) -> None:
    if zero is None:
        return
    if isinstance(zero, bool):  # the deprecated form: true means stage 1
        used.add("zero_optimization")
        f["parallel.zero"] = int(zero)
        return
    used |= {"zero_optimization.stage", "zero_optimization.offload_optimizer.device",
             "zero_optimization.offload_param.device"}
    f["parallel.zero"] = int(zero.get("stage", 0))
    opt_dev = (zero.get("offload_optimizer") or {}).get("device", "none")
    param_dev = (zero.get("offload_param") or {}).get("device", "none")
    if param_dev != "none" and opt_dev == "none":
        raise PlanError("deepspeed zero_optimization.offload_param without offload_optimizer has no "
                        "training.offload equivalent (none, optimizer, optimizer+params)")
    if opt_dev != "none":
        f["training.offload"] = "optimizer+params" if param_dev != "none" else "optimizer"
    elif "offload_optimizer" in zero:
        f["training.offload"] = "none"


def read_torchtitan(text: str) -> Reading:
    """A torchtitan job TOML."""
    try:
        cfg = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(f"torchtitan config is not valid TOML: {exc}") from None
    used: set[str] = set()

    def get(section, key, default=None):
        used.add(f"{section}.{key}")
        return (cfg.get(section) or {}).get(key, default)

    f, d, hints = {}, {}, {}
    if get("job", "description") is not None:
        f["name"] = get("job", "description")
    f.update(_torchtitan_model(get("model", "name", "llama3"), get("model", "flavor", "debugmodel"), d, hints))
    f["model.seq_len"] = get("training", "seq_len", 2048)
    converters = get("model", "converters", []) or []
    param = get("training", "mixed_precision_param", "bfloat16")
    f["training.precision"] = "fp8" if "float8" in converters else {"float32": "fp32"}.get(param, "bf16")
    f["training.recompute"] = get("activation_checkpoint", "mode", "selective")
    get("activation_checkpoint", "selective_ac_option")
    f["training.offload"] = "optimizer+params" if get("training", "enable_cpu_offload", False) else "none"
    name = str(get("optimizer", "name", "AdamW")).lower()
    if name in ("adam", "adamw"):
        f["training.optimizer"] = name
    else:
        used.discard("optimizer.name")
    f.update(_torchtitan_parallel(get, hints))
    d["training.flash_attention"] = True  # llama3's attention is SDPA, which runs the flash kernel
    ignored = tuple(k for k in _flat(cfg) if k not in used)
    return Reading(source="torchtitan", fields=f, defaults=d, hints=hints, ignored=ignored)


def _torchtitan_model(name: str, flavor: str, d: dict, hints: dict) -> dict:
    flavors = load_tool_options()["torchtitan"]["llama3_flavors"]
    if name != "llama3" or flavor not in flavors:
        hints["torchtitan.flavor"] = f"{name}/{flavor}"
        return {}
    d["model.name"] = f"llama3-{flavor.lower()}"
    shape = {f"model.{k}": v for k, v in flavors[flavor].items()}
    return {**shape, "model.gated_mlp": True, "model.tied_embeddings": False,
            "model.position_embedding": "rope"}


def _torchtitan_parallel(get, hints: dict) -> dict:
    tp, pp = get("parallelism", "tensor_parallel_degree", 1), get("parallelism", "pipeline_parallel_degree", 1)
    f = {"parallel.tp": tp, "parallel.pp": pp, "parallel.cp": get("parallelism", "context_parallel_degree", 1),
         "parallel.ep": get("parallelism", "expert_parallel_degree", 1), "parallel.sequence_parallel": tp > 1}
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
                     "zbvzerobubble": "zero-bubble"}
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
            hints["torchtitan.layers_per_stage"] = get("parallelism", "pipeline_parallel_layers_per_stage")
    else:
        f["training.micro_batch"] = local
    f["training.global_batch"] = total if total > 0 else None
    if total <= 0:
        hints["batch.local"] = local
    return f


# --------------------------------------------------------------------------- import

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
    for r in readings:
        for key, value in r.defaults.items():
            if value is not None:
                values.setdefault(key, value)
    hints = {k: values.pop(k) for k in list(values) if k.split(".")[0] not in
             ("model", "parallel", "training", "name")}
    return values, hints


def _read_input(value: str, base: Path, what: str) -> str:
    """A path to a file (relative to ``base``) or the text itself."""
    if "\n" not in value and len(value) < 4096:
        path = base / value
        if path.is_file():
            return path.read_text()
        if re.fullmatch(r"[\w./~-]+\.(json|toml|sh|txt)", value.strip()):
            raise PlanError(f"{what} file {path} cannot be read: no such file")
    return value


def import_plan(*, hf=None, megatron=None, deepspeed=None, torchtitan=None, cluster=None,
                nodes=None, base_dir=".") -> tuple[dict, list[str]]:
    """A Plan document from the given inputs, and warning lines (fields not mapped,
    values assumed). ``cluster`` is a catalog node type; ``nodes`` the cluster size."""
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
    if not readings:
        raise PlanError("import needs at least one input: hf, megatron, deepspeed or torchtitan")
    values, hints = _merge(readings)
    notes: list[str] = []
    cluster_doc, world = _import_cluster(cluster, nodes, values, hints)
    _resolve_layout(values, hints, world, notes)
    doc = _document(values, cluster_doc, hints)
    ignored = "; ".join(f"{r.source}: {', '.join(r.ignored)}" for r in readings if r.ignored)
    warnings = [f"not mapped to the plan: {ignored}"] if ignored else []
    if notes:
        warnings.append("assumed: " + "; ".join(notes))
    return doc, warnings


def _import_cluster(name, nodes, values: dict, hints: dict) -> tuple[dict, int]:
    if name is None:
        raise PlanError("import needs cluster= (a catalog node type such as dgx-h100): "
                        "none of the inputs names the hardware")
    cat = load_catalog()
    if name not in cat.nodes:
        raise PlanError(f"unknown node '{name}' for cluster (known: {', '.join(sorted(cat.nodes))})")
    try:
        per_node = cat.node(name).gpus_per_node
    except CatalogError as exc:
        raise PlanError(f"cluster={name}: {exc}") from None
    gpn = hints.get("world.gpus_per_node", per_node)
    model_par = math.prod(values.get(f"parallel.{k}") or 1 for k in ("tp", "pp", "cp"))
    needed = model_par * values["parallel.dp"] if "parallel.dp" in values else gpn
    run_nodes = hints.get("world.nnodes") or (nodes if gpn == per_node and nodes else None)
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
        if replicate > 1 and shard > 1:
            notes.append(f"torchtitan HSDP ({replicate} replicas x {shard} shards) taken as zero over all dp")
    layers = values.get("model.layers")
    per_stage = hints.get("torchtitan.layers_per_stage") or hints.get("megatron.layers_per_virtual_stage")
    if per_stage and layers:
        values["parallel.vpp"] = layers // (g("parallel.pp") * per_stage)
    if "megatron.first_last" in hints and layers:
        values["parallel.stage_layers"] = _first_last_split(layers, g("parallel.pp"), *hints["megatron.first_last"])
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
              "gated_mlp", "experts", "top_k", "capacity_factor", "tied_embeddings", "position_embedding"),
    "parallel": ("tp", "pp", "dp", "cp", "ep", "vpp", "stage_layers", "zero", "sequence_parallel", "schedule"),
    "training": ("global_batch", "micro_batch", "precision", "recompute", "offload", "flash_attention",
                 "optimizer", "grad_compression"),
}


def _document(values: dict, cluster_doc: dict, hints: dict) -> dict:
    model = {k: values[f"model.{k}"] for k in _SECTION_ORDER["model"] if values.get(f"model.{k}") is not None}
    if "layers" not in model:
        flavor = hints.get("torchtitan.flavor")
        why = f"torchtitan model {flavor} is not a llama3 flavor known here" if flavor else "no input gives it"
        raise PlanError(f"the model's shape is missing ({why}): pass hf= (a Hugging Face config.json)")
    for key in ("hidden", "heads", "vocab", "seq_len"):
        if key not in model:
            raise PlanError(f"model.{key} is not given by any input (pass hf= or the tool's option for it)")
    doc = {"name": values["name"]} if values.get("name") else {}
    doc["model"] = model
    doc["cluster"] = cluster_doc
    for section in ("parallel", "training"):
        doc[section] = {k: values[f"{section}.{k}"] for k in _SECTION_ORDER[section]
                        if values.get(f"{section}.{k}") is not None}
    if "stage_layers" in doc["parallel"]:
        doc["parallel"]["stage_layers"] = list(doc["parallel"]["stage_layers"])
    return doc


# --------------------------------------------------------------------------- export

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
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
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
    if tr.recompute.value == "selective":  # op-level SAC: the Korthikanti et al. selective recompute
        doc["activation_checkpoint"]["selective_ac_option"] = "op"
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
