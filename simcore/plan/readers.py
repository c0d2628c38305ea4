"""The readers of ``simcore.plan.interop``'s import: what one input says, as a ``Reading`` of
Plan keys, weaker defaults, launch hints and the fields it ignored. A Hugging Face
config.json, a Megatron-LM launch script, a DeepSpeed config and a torchtitan job TOML.
Pure functions: text in, a ``Reading`` out. The option names each tool defines, with the
repository, file and commit they were read from, are ``tool_options.yaml``
(``load_tool_options``), which the exporters share.
"""
from __future__ import annotations

import functools
import json
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from simcore.plan.load import hf_config_fields
from simcore.plan.spec import PlanError

TOOL_OPTIONS_PATH = Path(__file__).parent / "tool_options.yaml"



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

