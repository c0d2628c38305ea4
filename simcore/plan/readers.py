"""The readers of ``simcore.plan.interop``'s import: what one input says, as a ``Reading`` of
Plan keys, weaker defaults, launch hints and the fields it ignored. A Hugging Face
config.json and a DeepSpeed config (a Megatron-LM launch: ``megatron_reader``; torchtitan:
``torchtitan_reader``).
Pure functions: text in, a ``Reading`` out. The option names each tool defines, with the
repository, file and commit they were read from, are ``tool_options.yaml``
(``load_tool_options``), which the exporters share.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from simcore.plan.deepspeed_writer import ONEBIT_TYPES, ZEROPP_KEYS
from simcore.plan.hf_config import not_mapped
from simcore.plan.hf_config import hf_config_fields
from simcore.plan.spec import PlanError
from topologies.hardware import load_catalog

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



def read_hf(path: Path) -> Reading:
    """A Hugging Face config.json (field names via ``hf_config.hf_config_fields``). Its
    max_position_embeddings is a capacity, so seq_len is only a default. The training
    defaults are today's usual run (weaker than any other input's): SDPA/flash attention
    (torch's scaled_dot_product_attention, HF's default ``attn_implementation="sdpa"``),
    selective recompute (torchtitan's default ``activation_checkpoint.mode``) and FSDP
    (ZeRO-3: torchtitan's and accelerate's FSDP2 default layout)."""
    fields_ = hf_config_fields(path)
    cfg = json.loads(path.read_text())
    fields_.pop("source", None)
    max_pos = fields_.pop("max_positions", None)
    seq_len = fields_.pop("seq_len", None)   # none without a context length: --seq-len must give it
    defaults = {"model.name": fields_.pop("name"), **({"model.seq_len": seq_len} if seq_len else {}),
                "training.flash_attention": True, "training.recompute": "selective", "parallel.zero": 3}
    hints = {"hf.max_positions": max_pos, **({"hf.seq_len": seq_len} if seq_len else {})}
    if fields_.get("mtp_layers"):   # mapped, and said: transformers' parameter count leaves them out
        hints["note.mtp"] = (f"model.mtp_layers={fields_['mtp_layers']} (num_nextn_predict_layers: multi-token "
                             "prediction modules, which transformers does not build; their parameters are counted "
                             "apart from the main model's, and trained on the last pipeline stage)")
    return Reading(source=f"hf {path.name}", fields={f"model.{k}": v for k, v in fields_.items()},
                   defaults=defaults, hints=hints, ignored=tuple(not_mapped(cfg)))


_JSON_COMMENTS = re.compile(r'"(?:[^"\\]|\\.)*"|//[^\n]*|#[^\n]*|/\*.*?\*/', re.S)
_JSON_TRAILING = re.compile(r'"(?:[^"\\]|\\.)*"|,(?=\s*[}\]])', re.S)


def relaxed_json(text: str) -> str:
    """JSON with the comments (``//``, ``#``, ``/* */``) and trailing commas that DeepSpeed's
    hjson reader accepts (deepspeed/runtime/config.py: ``hjson.load``), made plain JSON;
    strings are left as they are."""
    keep = lambda m: m.group(0) if m.group(0).startswith('"') else ""  # noqa: E731
    return _JSON_TRAILING.sub(keep, _JSON_COMMENTS.sub(keep, text))


def _flat(d: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in d.items():
        out += _flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"]
    return out


#: A ds_config's 1-bit ``optimizer.type`` (lower-cased) -> (``training.optimizer``, its warm-up parameter).
_ONEBIT_KINDS = {kind.lower(): (name, step) for name, (kind, step) in ONEBIT_TYPES.items()}


def read_deepspeed(text: str) -> Reading:
    """A DeepSpeed ds_config.json (comments and trailing commas allowed, as DeepSpeed's hjson
    reader does; ``"auto"`` values, which the Hugging Face Trainer fills in, count as not given)."""
    try:
        cfg = json.loads(relaxed_json(text))
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
    if "auto" in (bf16, fp16):  # the HF Trainer sets it from TrainingArguments --bf16 / --fp16
        d["training.precision"] = "bf16"
        hints["note.deepspeed_auto"] = "precision 'auto' (set by the Trainer's --bf16/--fp16) taken as bf16"
        bf16, fp16 = bf16 is True, fp16 is True
    if bf16 and fp16:
        raise PlanError("deepspeed config enables both bf16 and fp16 for training.precision")
    if bf16 or fp16:
        f["training.precision"] = "bf16" if bf16 else "fp16"
    tp = (cfg.get("tensor_parallel") or {}).get("autotp_size")
    if isinstance(tp, int) and not isinstance(tp, bool):  # DeepSpeed AutoTP training (runtime/tensor_parallel)
        used.add("tensor_parallel.autotp_size")
        f["parallel.tp"] = tp
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
    elif kind in _ONEBIT_KINDS:   # DeepSpeed's 1-bit Adam, 1-bit LAMB, 0/1 Adam and their warm-up
        name, step = _ONEBIT_KINDS[kind]
        used |= {"optimizer.type", f"optimizer.params.{step}"}
        f["training.optimizer"] = name
        f["training.onebit_freeze_step"] = (opt.get("params") or {}).get(step)
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
    stage = zero.get("stage", 0)
    if not isinstance(stage, int) or isinstance(stage, bool) or not 0 <= stage <= 3:
        raise PlanError(f"deepspeed zero_optimization.stage={stage!r} is not one of 0, 1, 2, 3 (parallel.zero)")
    f["parallel.zero"] = stage
    if stage >= 1:   # the config runs ZeRO in DeepSpeed: priced as DeepSpeed's stage, not FSDP2's
        f["parallel.zero_impl"] = "deepspeed"
    opt_dev = (zero.get("offload_optimizer") or {}).get("device", "none")
    param_dev = (zero.get("offload_param") or {}).get("device", "none")
    if param_dev != "none" and opt_dev == "none":
        raise PlanError("deepspeed zero_optimization.offload_param without offload_optimizer has no "
                        "training.offload equivalent (none, optimizer, optimizer+params)")
    if opt_dev != "none":
        f["training.offload"] = "optimizer+params" if param_dev != "none" else "optimizer"
    elif "offload_optimizer" in zero:
        f["training.offload"] = "none"
    for key in ZEROPP_KEYS:   # ZeRO++
        if key in zero:
            used.add(f"zero_optimization.{key}")
            f[f"parallel.{key}"] = zero[key]


def sdpa_attention_kernel(gpu) -> str:
    """The flash kernel torch's ``scaled_dot_product_attention`` runs on ``gpu`` (torchtitan's attention,
    Hugging Face's default ``attn_implementation="sdpa"``): torch 2.5.1 to 2.10 try SDPA's flash
    backend, Dao's FlashAttention-2 kernels, before cuDNN's, which became opt-in (pytorch/pytorch#138522,
    cherry-picked into 2.5.1; pytorch/pytorch#142132 measures SDPA at 329 TFLOP/s against cuDNN's 631
    on an H100). Megatron-DeepSpeed's ``--use-flash-attn-v2`` runs the same kernels from the flash-attn
    package. ``flash2`` where the catalog has FA2's figures for the GPU, else the GPU's own entry
    (``auto``). The one rule the imports (all but a Megatron-LM command, whose Transformer Engine runs
    cuDNN's kernel) and a search for torchtitan or DeepSpeed read."""
    entry = json.loads(gpu.efficiency_json) if gpu.efficiency_json else load_catalog().efficiency.get(gpu.name, {})
    return "flash2" if "flash2" in entry.get("attention", {}).get("kernels", {}) else "auto"
