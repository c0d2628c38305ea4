"""A MaxText launch read as Plan keys: the key=value overrides after its base.yml, as MaxText's
``pyconfig`` reads them (``OmegaConf.from_cli`` over base.yml: each value a YAML scalar or flow list;
AI-Hypercomputer/maxtext @e591f30c), the inverse of ``simcore.plan.maxtext_writer`` (its module
docstring has the mapping). base.yml's defaults fill what the launch leaves out (ici_fsdp_parallelism
-1, dcn_data_parallelism -1: the axis MaxText sizes to the devices left; the llama2 block, remat full,
bfloat16 over float32 weights, adamw). Refused in one sentence naming the key: another decoder block, a
model_name (its models/*.yml is not read), the pipeline, expert and other axes the writer does not
write (the context axis is read inside a slice, with its all_gather or ring strategy), remat policies
and optimizers it has no field for, a per-device batch that is no whole micro-batch of a data-parallel
rank.
"""
from __future__ import annotations

import math
import shlex

import yaml

from simcore.plan.choices import PlanError
from simcore.plan.maxtext_writer import ACTIVATIONS, CP_STRATEGY, OPTIMIZERS

#: base.yml's values of the keys the import reads (@e591f30c), where the launch leaves them out.
DEFAULTS = {"decoder_block": "llama2", "model_name": "default", "mlp_activations": ["silu", "linear"],
            "logits_via_embedding": False, "enable_dropout": True, "dropout_rate": 0.0, "dtype": "bfloat16",
            "weight_dtype": "float32", "remat_policy": "full", "attention": "autoselected", "opt_type": "adamw",
            "per_device_batch_size": 12.0, "gradient_accumulation_steps": 1, "shard_optimizer_over_data": False,
            "optimizer_memory_host_offload": False, "parameter_memory_host_offload": False,
            "ici_fsdp_parallelism": -1, "dcn_data_parallelism": -1, "rope_max_timescale": 10_000,
            "context_parallel_strategy": "all_gather", "hardware": "tpu", "use_tokamax_splash": False,
            "context_parallel_load_balance": True}
MODEL = {"base_emb_dim": "hidden", "base_num_query_heads": "heads", "base_num_kv_heads": "kv_heads",
         "head_dim": "kv_channels", "base_mlp_dim": "ffn_hidden", "base_num_decoder_layers": "layers",
         "vocab_size": "vocab", "max_target_length": "seq_len"}
#: The mesh axes the import reads; any other ici_/dcn_ axis above 1 is refused.
AXES = ("tensor", "context", "fsdp", "data")
REMAT = {"full": "full", "minimal": "dots", "minimal_with_context": "none"}
LAUNCH_WORDS = ("python", "python3", "-m")


def overrides(text: str) -> dict:
    """The key=value words of a MaxText launch, values as YAML reads them."""
    out = {}
    for word in shlex.split(text, comments=True):
        if "=" in word and not word.startswith("-"):
            key, value = word.split("=", 1)
            out[key] = yaml.safe_load(value) if value else ""
    return out


def _axis(cfg: dict, level: str, name: str) -> int:
    return int(cfg.get(f"{level}_{name}_parallelism", DEFAULTS.get(f"{level}_{name}_parallelism", 1)))


def _slices(cfg: dict, devices: int, largest_slice: int) -> int:
    """The launch's slices: its ``num_slices``, else its dcn axes where none is auto (-1), else as many
    as ``devices`` fill at ``largest_slice`` devices a slice (the node's ICI / NVLink domain)."""
    dcn = [_axis(cfg, "dcn", a) for a in AXES]
    if int(cfg.get("num_slices", -1)) > 0:
        return int(cfg["num_slices"])
    return math.prod(dcn) if -1 not in dcn else max(1, devices // largest_slice)


def _mesh(cfg: dict, devices: int, slice_devices: int) -> dict[str, int]:
    """Each of ``AXES`` across ici x dcn, a -1 axis (MaxText's auto) sized to the devices left."""
    for key, value in cfg.items():
        if key.startswith(("ici_", "dcn_")) and key.endswith("_parallelism") \
                and key.split("_", 1)[1].rsplit("_", 1)[0] not in AXES and int(value) != 1:
            raise PlanError(f"{key}={value}: the import reads MaxText's tensor, context, fsdp and data axes only")
    slices = devices // slice_devices
    out = {}
    for level, total in (("ici", slice_devices), ("dcn", slices)):
        sizes = {a: _axis(cfg, level, a) for a in AXES}
        auto = [a for a, v in sizes.items() if v == -1]
        known = math.prod(v for v in sizes.values() if v != -1)
        if len(auto) > 1 or total % known:
            raise PlanError(f"the {level}_*_parallelism axes {sizes} do not tile the {total} "
                            f"{'devices of a slice' if level == 'ici' else 'slices'}")
        if auto:
            sizes[auto[0]] = total // known
        elif known != total:
            raise PlanError(f"the {level}_*_parallelism axes {sizes} multiply to {known}, not the {total} "
                            f"{'devices of a slice' if level == 'ici' else 'slices'}")
        out |= {f"{level}_{a}": v for a, v in sizes.items()}
    return out


def read_maxtext(text: str, devices: int, largest_slice: int) -> tuple[dict, dict, list[str]]:
    """(Plan keys, cluster keys, the launch's keys not read) of a MaxText launch on ``devices`` devices,
    a slice at most ``largest_slice`` of them (``_slices``); PlanError naming the key the Plan cannot hold."""
    given = overrides(text)
    cfg = {**DEFAULTS, **given}
    slice_devices = devices // _slices(cfg, devices, largest_slice)
    for key, want in (("decoder_block", "llama2"), ("model_name", "default")):
        if cfg[key] != want:
            raise PlanError(f"{key}={cfg[key]}: the import reads the llama2 block from its base_* keys "
                            "(MaxText's models/*.yml is not read)")
    acts = {tuple(v): k for k, v in ACTIVATIONS.items()}.get(tuple(cfg["mlp_activations"]))
    if acts is None:
        raise PlanError(f"mlp_activations={cfg['mlp_activations']}: the import reads {list(ACTIVATIONS.values())}")
    for key, table in (("remat_policy", REMAT), ("opt_type", OPTIMIZERS), ("dtype", {"bfloat16": 1, "float32": 1})):
        if cfg[key] not in table:
            raise PlanError(f"{key}={cfg[key]}: the import reads {', '.join(table)}")
    m = _mesh(cfg, devices, slice_devices)
    tp, fsdp, data = m["ici_tensor"] * m["dcn_tensor"], m["ici_fsdp"] * m["dcn_fsdp"], m["ici_data"] * m["dcn_data"]
    cp = m["ici_context"]
    if m["dcn_context"] > 1:
        raise PlanError(f"dcn_context_parallelism={m['dcn_context']}: the import reads the context axis inside a slice")
    strategies = {v: k.value for k, v in CP_STRATEGY.items()}
    if cp > 1 and cfg["context_parallel_strategy"] not in strategies:
        raise PlanError(f"context_parallel_strategy={cfg['context_parallel_strategy']}: the import reads "
                        f"{', '.join(strategies)}")
    micro = float(cfg["per_device_batch_size"]) * tp * cp
    if micro < 1 or micro != int(micro):
        raise PlanError(f"per_device_batch_size={cfg['per_device_batch_size']}: a data-parallel rank's micro-batch, "
                        f"it x ici_tensor_parallelism={tp} x ici_context_parallelism={cp}, must be a whole number "
                        "of sequences")
    model = {v: int(cfg[k]) for k, v in MODEL.items() if k in cfg}
    model |= {"gated_mlp": len(cfg["mlp_activations"]) == 2, "activation": acts, "position_embedding": "rope",
              "norm": "rmsnorm", "bias": "none", "tied_embeddings": bool(cfg["logits_via_embedding"]),
              "rope_base": float(cfg["rope_max_timescale"]),
              "dropout": float(cfg["dropout_rate"]) if cfg["enable_dropout"] else 0.0}
    offload = ("optimizer+params" if cfg["parameter_memory_host_offload"] else "optimizer") \
        if cfg["optimizer_memory_host_offload"] else "none"
    keys = {**{f"model.{k}": v for k, v in model.items()}, "parallel.tp": tp, "parallel.dp": fsdp * data,
            **({"parallel.cp": cp, "parallel.cp_comm": strategies[cfg["context_parallel_strategy"]]} if cp > 1 else {}),
            "parallel.zero": 3 if fsdp > 1 else (1 if cfg["shard_optimizer_over_data"] else 0),
            "parallel.sequence_parallel": tp > 1, "training.micro_batch": int(micro),
            "training.global_batch": round(devices * float(cfg["per_device_batch_size"])
                                           * int(cfg["gradient_accumulation_steps"])),
            "training.precision": "bf16" if cfg["dtype"] == "bfloat16" else "fp32",
            "training.master_weights": cfg["weight_dtype"] == "float32",
            "training.recompute": REMAT[cfg["remat_policy"]], "training.optimizer": cfg["opt_type"],
            "training.flash_attention": cfg["attention"] in ("flash", "autoselected", "cudnn_flash_te"),
            "training.offload": offload}
    if fsdp > 1 and data > 1:
        keys["parallel.dp_replicate"] = data
    read = set(DEFAULTS) | set(MODEL) | {k for k in given if k.startswith(("ici_", "dcn_"))}
    return keys, ({"nvlink_domain_gpus": slice_devices} if devices > slice_devices else {}), \
        sorted(k for k in given if k not in read)
