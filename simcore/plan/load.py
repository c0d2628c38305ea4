"""Plan documents to and from ``Plan`` values.

``plan_from_dict`` parses a Plan document (YAML, schema in DESIGN.md "The Plan file")
section by section, resolving catalog names, Hugging Face ``config.json`` models and the
calibrated localhost profile, and checks it with ``check_plan``; ``load_plan`` is the only
reader of Plan YAML (``read_yaml_file`` reads any YAML file the user names).
``plan_to_dict`` and ``dump_plan`` write a Plan back as a document.
"""
from __future__ import annotations

import enum
import math
import os
from dataclasses import asdict, fields, replace
from pathlib import Path

import yaml

from simcore.plan.hf_config import hf_config_fields, model_section
from simcore.plan import linear_attention, model_props, sparse_attention
from simcore.plan.rules import check_plan
from simcore.plan.yaml_file import read_yaml_file
from simcore.plan.spec import (AttentionKernel, ClusterSpec, CpComm, Fp8Recipe, FsdpRoot, GradCompression, Kernels, Loss,
                               ModelSpec, MoeDispatcher, MoeRouting, Offload, Optimizer, ParallelSpec, Plan, PlanError,
                               PositionEmbedding, Precision, Recompute, RecomputeMethod, Schedule, StateDtype, TrainingSpec,
                               ZeroImpl, ZeroStage)
from topologies.components import CatalogError
from topologies.hardware import Catalog, load_catalog
from topologies.profile import scale_for_ranks

# --------------------------------------------------------------------------- parsing

_SECTIONS = ("model", "cluster", "parallel", "training")
_TOP_KEYS = set(_SECTIONS) | {"name", "description"}
_MODEL_KEYS = {f.name for f in fields(ModelSpec)} | {"hf_config"}
_CLUSTER_KEYS = {"node", "nodes", "fabric", "gpus_per_node", "nics_per_node", "storage", "price_per_gpu_hour",
                 "profile", "nvlink_domain_gpus"}
_PARALLEL_KEYS = {f.name for f in fields(ParallelSpec)}
# recompute's layer count and method are written inside ``training.recompute`` itself
_TRAINING_KEYS = {f.name for f in fields(TrainingSpec)} - {"recompute_layers", "recompute_method"}
_TRAINING_DEFAULTS = {f.name: getattr(f.default, "value", f.default) for f in fields(TrainingSpec)}


def _check_keys(doc: dict, known: set[str], where: str) -> None:
    for key in doc:
        if key not in known:
            raise PlanError(f"unknown field '{where}.{key}' (known: {', '.join(sorted(known))})")


def _int(doc: dict, key: str, where: str, default=None, minimum: int = 1) -> int:
    value = doc.get(key, default)
    if value is None:
        raise PlanError(f"{where}.{key} is required")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise PlanError(f"{where}.{key} must be an integer, got {value!r}")
    if value < minimum:
        raise PlanError(f"{where}.{key}={value} must be at least {minimum}")
    return value


def _float(doc: dict, key: str, where: str, default=None, positive: bool = True) -> float | None:
    value = doc.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PlanError(f"{where}.{key} must be a number, got {value!r}")
    if positive and value <= 0:
        raise PlanError(f"{where}.{key}={value} must be positive")
    return float(value)


def _bool(doc: dict, key: str, where: str, default: bool) -> bool:
    value = doc.get(key, default)
    if not isinstance(value, bool):
        raise PlanError(f"{where}.{key} must be true or false, got {value!r}")
    return value


def _str(doc: dict, key: str, where: str, default=None) -> str | None:
    value = doc.get(key, default)
    if value is not None and not isinstance(value, str):
        raise PlanError(f"{where}.{key} must be a string, got {value!r}")
    return value


def _mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise PlanError(f"{where} must be a mapping of fields, got {type(value).__name__}")
    return value


def _model(value, cat: Catalog, base_dir: Path) -> ModelSpec:
    doc = dict(_mapping(model_section(value) if isinstance(value, str) else value, "model"))
    _check_keys(doc, _MODEL_KEYS, "model")
    fields_: dict = {}
    if "hf_config" in doc:
        hf = _str(doc, "hf_config", "model")
        doc.pop("hf_config")
        if hf is not None:
            fields_.update(hf_config_fields(_resolve(hf, base_dir), seq_len_given="seq_len" in doc))
            fields_.pop("max_positions", None)
    name = _str(doc, "name", "model")
    if name is not None and name in cat.models:
        fields_ = {**dict(cat.models[name]), **fields_}
    elif name is not None and not fields_ and "layers" not in doc:
        raise PlanError(f"unknown model {name!r} (known: {', '.join(sorted(cat.models))}); "
                        "give a catalog name, a config.json path or the model's fields")
    fields_.update(doc)
    where = "model"
    hidden, heads = _int(fields_, "hidden", where), _int(fields_, "heads", where)
    experts = _int(fields_, "experts", where, 0, minimum=0)
    pos = PositionEmbedding.parse(_str(fields_, "position_embedding", where, "learned"),
                                  "model.position_embedding")
    return ModelSpec(
        name=name or fields_.get("name") or "custom",
        layers=_int(fields_, "layers", where),
        hidden=hidden,
        heads=heads,
        kv_heads=_int(fields_, "kv_heads", where, heads),
        ffn_hidden=_int(fields_, "ffn_hidden", where, 4 * hidden),
        vocab=_int(fields_, "vocab", where),
        seq_len=_int(fields_, "seq_len", where),
        gated_mlp=_bool(fields_, "gated_mlp", where, False),
        experts=experts,
        top_k=_int(fields_, "top_k", where, 2 if experts else 0, minimum=0),
        capacity_factor=_float(fields_, "capacity_factor", where, 1.0),
        tied_embeddings=_bool(fields_, "tied_embeddings", where, True),
        position_embedding=pos,
        source=str(fields_.get("source", "")),
        moe_layers=_layer_indices(fields_.get("moe_layers"), "model.moe_layers"),
        linear_attention=linear_attention.parse(fields_.get("linear_attention")),
        sparse_attention=sparse_attention.parse(fields_.get("sparse_attention")),
        **_model_extras(fields_), **model_props.parse(fields_),
    )


#: ModelSpec fields beyond the basic shape (head width, rotary base, MoE and MLA detail):
#: written by plan_to_dict only where they differ from these defaults.
_EXTRA_DEFAULTS = {f.name: f.default for f in fields(ModelSpec)
                   if f.name in ("kv_channels", "rope_base", "dropout", "dense_ffn_hidden", "dense_layers",
                                 "shared_ffn_hidden", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim",
                                 "sliding_window", "sliding_window_layers", "mtp_layers")}


def _layer_indices(value, where: str) -> tuple[int, ...]:
    """A list of layer indices (``model.moe_layers``), () where absent."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise PlanError(f"{where} must be a list of layer indices (integers), got {value!r}")
    return tuple(value)


def _model_extras(doc: dict) -> dict:
    """The ``_EXTRA_DEFAULTS`` fields (a dropout of 0 is none: check_plan bounds it)."""
    return {key: _float(doc, key, "model", default, positive=key != "dropout") if isinstance(default, float)
            else _int(doc, key, "model", default, minimum=0) for key, default in _EXTRA_DEFAULTS.items()}


def _resolve(path: str, base_dir: Path) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else base_dir / p


def _cluster(value, cat: Catalog, base_dir: Path) -> ClusterSpec:
    doc = _mapping(value, "cluster")
    _check_keys(doc, _CLUSTER_KEYS, "cluster")
    node_name = _str(doc, "node", "cluster")
    if node_name is None:
        raise PlanError("cluster.node is required (a catalog node type, or localhost)")
    if node_name not in cat.nodes:
        raise PlanError(f"unknown node {node_name!r} for cluster.node (known: {', '.join(sorted(cat.nodes))})")
    profile = _str(doc, "profile", "cluster")
    try:
        node = cat.node(node_name, _resolve(profile, base_dir) if profile else None)
    except CatalogError as exc:
        raise PlanError(f"cluster.node={node_name}: {exc}") from None
    if "nics_per_node" in doc:
        # e.g. 4 rails of 400 Gb/s for 8 GPUs where the catalog's node has 8
        nics = _int(doc, "nics_per_node", "cluster")
        if node.nics_per_node == 0:
            raise PlanError(f"cluster.nics_per_node applies to a networked node; cluster.node={node_name} has no NICs")
        node = replace(node, nics_per_node=nics)
    fabric_name = _str(doc, "fabric", "cluster", node.fabric)
    if fabric_name is not None and fabric_name not in cat.fabrics:
        raise PlanError(f"unknown fabric {fabric_name!r} for cluster.fabric (known: {', '.join(sorted(cat.fabrics))})")
    storage_name = _str(doc, "storage", "cluster", node.storage)
    if storage_name not in cat.storage:
        raise PlanError(f"unknown storage {storage_name!r} for cluster.storage (known: {', '.join(sorted(cat.storage))})")
    return ClusterSpec(
        node=node,
        nodes=_int(doc, "nodes", "cluster", 1),
        fabric=cat.fabrics[fabric_name] if fabric_name else None,
        storage=cat.storage[storage_name],
        gpus_per_node=_int(doc, "gpus_per_node", "cluster", node.gpus_per_node),
        price_per_gpu_hour=_float(doc, "price_per_gpu_hour", "cluster"),
        nvlink_domain_gpus=_int(doc, "nvlink_domain_gpus", "cluster", 0, minimum=0) or None,
    )


def _parallel(value, cluster_gpus: int) -> ParallelSpec:
    doc = _mapping(value or {}, "parallel")
    _check_keys(doc, _PARALLEL_KEYS, "parallel")
    w = "parallel"
    tp, pp, cp = _int(doc, "tp", w, 1), _int(doc, "pp", w, 1), _int(doc, "cp", w, 1)
    dp = doc.get("dp")
    if dp is None:  # fill the cluster with data parallel ranks
        dp = max(1, cluster_gpus // (tp * pp * cp))
    stage_layers = doc.get("stage_layers")
    if stage_layers is not None:
        if not isinstance(stage_layers, list) or not stage_layers:
            raise PlanError("parallel.stage_layers must be a non-empty list of layer counts")
        stage_layers = tuple(_int({"v": v}, "v", "parallel.stage_layers[]", minimum=0) for v in stage_layers)
    zero = _int(doc, "zero", w, 0, minimum=0)
    if zero > 3:
        raise PlanError(f"parallel.zero={zero} is not one of: 0, 1, 2, 3")
    return ParallelSpec(
        tp=tp, pp=pp, dp=_int({"dp": dp}, "dp", w), cp=cp,
        ep=_int(doc, "ep", w, 1), expert_tp=_int(doc, "expert_tp", w, 0, minimum=0), vpp=_int(doc, "vpp", w, 1),
        stage_layers=stage_layers,
        zero=ZeroStage(zero),
        zero_impl=ZeroImpl.parse(doc.get("zero_impl", "fsdp2"), "parallel.zero_impl"), dp_replicate=_int(doc, "dp_replicate", w, 1),
        zero_quantized_weights=_bool(doc, "zero_quantized_weights", w, False),
        zero_hpz_partition_size=_int(doc, "zero_hpz_partition_size", w, 1),
        zero_quantized_gradients=_bool(doc, "zero_quantized_gradients", w, False),
        sequence_parallel=_bool(doc, "sequence_parallel", w, False),
        schedule=Schedule.parse(doc.get("schedule", "1f1b"), "parallel.schedule"),
        cp_comm=CpComm.parse(doc.get("cp_comm", "p2p"), "parallel.cp_comm"),
        fsdp_root=FsdpRoot.parse(doc.get("fsdp_root", "resharded"), "parallel.fsdp_root"),
        tp_comm_overlap=_bool(doc, "tp_comm_overlap", w, False),
        overlap_param_gather=_bool(doc, "overlap_param_gather", w, False),
        moe_a2a_overlap=_bool(doc, "moe_a2a_overlap", w, False),
        moe_dispatcher=MoeDispatcher.parse(doc.get("moe_dispatcher", "alltoall"), "parallel.moe_dispatcher"),
        microbatch_group=_int(doc, "microbatch_group", w, 0, minimum=0),
        kv_replicator=_int(doc, "kv_replicator", w, 1),
    )


def _training(value, layers: int) -> TrainingSpec:
    doc = _mapping(value, "training")
    _check_keys(doc, _TRAINING_KEYS, "training")
    w = "training"
    return TrainingSpec(
        global_batch=_int(doc, "global_batch", w),
        micro_batch=_int(doc, "micro_batch", w, 1),
        precision=Precision.parse(doc.get("precision", "bf16"), "training.precision"),
        fp8_recipe=Fp8Recipe.parse(doc.get("fp8_recipe", "delayed"), "training.fp8_recipe"),
        attention_kernel=AttentionKernel.parse(doc.get("attention_kernel", "auto"), "training.attention_kernel"),
        attention_unpad=_bool(doc, "attention_unpad", w, False),
        **_recompute(doc.get("recompute", "none")),
        offload=Offload.parse(doc.get("offload", "none"), "training.offload"),
        activation_offload=_offloaded_layers(doc.get("activation_offload", 0), layers),
        flash_attention=_bool(doc, "flash_attention", w, False),
        optimizer=Optimizer.parse(doc.get("optimizer", "adamw"), "training.optimizer"),
        onebit_freeze_step=_int(doc, "onebit_freeze_step", w, _TRAINING_DEFAULTS["onebit_freeze_step"], minimum=0),
        grad_compression=GradCompression.parse(doc.get("grad_compression", "none"),
                                               "training.grad_compression"),
        master_weights=_bool(doc, "master_weights", w, True),
        autocast=_bool(doc, "autocast", w, False),
        loss=Loss.parse(doc.get("loss", "fused"), "training.loss"),
        kernels=Kernels.parse(doc.get("kernels", "fused"), "training.kernels"),
        moe_routing=MoeRouting.parse(doc.get("moe_routing", "balanced"), "training.moe_routing"),
        optimizer_in_backward=_bool(doc, "optimizer_in_backward", w, False),
        grads_to_none=_bool(doc, "grads_to_none", w, True),
        fp8_param_gather=_bool(doc, "fp8_param_gather", w, False),
        optimizer_state_dtype=StateDtype.parse(doc.get("optimizer_state_dtype", "fp32"), f"{w}.optimizer_state_dtype"),
        allocator_margin=_margin(doc),
    )


def _offloaded_layers(value, layers: int) -> int:
    """``training.activation_offload``: a number of layers per model chunk, or ``all`` (the
    model's layers: every layer of any chunk)."""
    if value == "all":
        return layers
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlanError(f"training.activation_offload={value!r} must be a number of layers (0 or more) or 'all'")
    return value


def _margin(doc: dict) -> float | None:
    value = _float(doc, "allocator_margin", "training", positive=False)
    if value is not None and not 0 <= value < 1:
        raise PlanError(f"training.allocator_margin={value} must be at least 0 and below 1")
    return value


def _recompute(value) -> dict:
    """``training.recompute``: none | selective | full | op (torchtitan per-op SAC) | dots (JAX's
    dots saved, MaxText's ``minimal``) | ``layer:N`` (torchtitan: every Nth layer) |
    ``{layers: N, method: uniform|block}`` (Megatron's full recompute, ``--recompute-num-layers N
    --recompute-method``)."""
    w = "training.recompute"
    if isinstance(value, dict):
        _check_keys(value, {"layers", "method"}, w)
        return {"recompute": Recompute.FULL, "recompute_layers": _int(value, "layers", w),
                "recompute_method": RecomputeMethod.parse(value.get("method", "uniform"), f"{w}.method")}
    if isinstance(value, str) and value.startswith("layer:"):
        n = value.split(":", 1)[1]
        if not n.isdigit() or int(n) < 1:
            raise PlanError(f"{w}={value!r} needs a whole number of layers of at least 1 after 'layer:'")
        return {"recompute": Recompute.LAYER, "recompute_layers": int(n)}
    kind = Recompute.parse(value, w)
    if kind == Recompute.LAYER:
        raise PlanError(f"{w}=layer needs its frequency, as layer:N (checkpoint every Nth layer)")
    return {"recompute": kind}


def recompute_doc(tr: TrainingSpec):
    """``training.recompute`` as a Plan document writes it (the inverse of ``_recompute``)."""
    if tr.recompute == Recompute.LAYER:
        return f"layer:{tr.recompute_layers}"
    if tr.recompute == Recompute.FULL and (tr.recompute_layers, tr.recompute_method) != (1, RecomputeMethod.UNIFORM):
        return {"layers": tr.recompute_layers, "method": tr.recompute_method.value}
    return tr.recompute.value


def plan_from_dict(doc, base_dir: str | os.PathLike = ".", catalog: Catalog | None = None) -> Plan:
    """Build and check a Plan from a parsed Plan document."""
    cat = catalog or load_catalog()
    doc = _mapping(doc, "the plan")
    _check_keys(doc, _TOP_KEYS, "plan")
    for section in ("model", "cluster", "training"):
        if section not in doc:
            raise PlanError(f"the plan needs a '{section}' section")
    base = Path(base_dir)
    cluster = _cluster(doc["cluster"], cat, base)
    parallel = _parallel(doc.get("parallel"), cluster.gpus)
    if cluster.node.calibrated:  # ranks sharing this host's cores see less of it each
        ranks_per_node = min(parallel.gpus, cluster.gpus_per_node)
        cluster = replace(cluster, node=scale_for_ranks(cluster.node, ranks_per_node))
    model = _model(doc["model"], cat, base)
    plan = Plan(model=model, cluster=cluster, parallel=parallel, training=_training(doc["training"], model.layers),
                name=str(doc.get("name", "")))
    check_plan(plan)
    return plan


def load_plan(path: str | os.PathLike, catalog: Catalog | None = None) -> Plan:
    """Read a Plan YAML file; raise PlanError with one sentence on any problem."""
    path = Path(path)
    plan = plan_from_dict(read_yaml_file(path, "plan file"), path.parent, catalog)
    return plan if plan.name else replace(plan, name=path.stem)


# --------------------------------------------------------------------------- output

def plan_to_dict(plan: Plan) -> dict:
    """The Plan as a Plan-file document (catalog names for hardware, fields for the model)."""
    model = {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(plan.model).items()}
    model.pop("source", None)
    for key, default in (_EXTRA_DEFAULTS | model_props.defaults(plan.model) | {"sparse_attention": None}).items():
        if model.get(key) == default:
            del model[key]
    linear_attention.tidy_model_doc(model)
    par = plan.parallel
    parallel = {
        "tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": par.cp, "ep": par.ep, "vpp": par.vpp,
        "zero": int(par.zero), "sequence_parallel": par.sequence_parallel, "schedule": par.schedule.value,
        "zero_impl": par.zero_impl.value, "cp_comm": par.cp_comm.value, "tp_comm_overlap": par.tp_comm_overlap,
    }
    optional = {"overlap_param_gather": par.overlap_param_gather or None, "expert_tp": par.expert_tp or None,
                "moe_dispatcher": par.moe_dispatcher.value if par.moe_dispatcher != MoeDispatcher.ALLTOALL else None,
                "moe_a2a_overlap": par.moe_a2a_overlap or None,
                "fsdp_root": par.fsdp_root.value if par.fsdp_root != FsdpRoot.RESHARDED else None,
                "microbatch_group": par.microbatch_group or None, "dp_replicate": par.dp_replicate if par.dp_replicate != 1 else None,
                "zero_quantized_weights": par.zero_quantized_weights or None,
                "zero_hpz_partition_size": par.zero_hpz_partition_size if par.zero_hpz_partition_size != 1 else None,
                "zero_quantized_gradients": par.zero_quantized_gradients or None,
                "kv_replicator": par.kv_replicator if par.kv_replicator != 1 else None,
                "stage_layers": list(par.stage_layers) if par.stage_layers is not None else None}
    parallel.update({k: v for k, v in optional.items() if v is not None})
    cluster = {"node": plan.cluster.node.name, "nodes": plan.cluster.nodes,
               "gpus_per_node": plan.cluster.gpus_per_node, "storage": plan.cluster.storage.name}
    if plan.cluster.node.nics_per_node:
        cluster["nics_per_node"] = plan.cluster.node.nics_per_node
    if plan.cluster.fabric is not None:
        cluster["fabric"] = plan.cluster.fabric.name
    if plan.cluster.nvlink_domain_gpus:
        cluster["nvlink_domain_gpus"] = plan.cluster.nvlink_domain_gpus
    if plan.cluster.price_per_gpu_hour is not None:
        cluster["price_per_gpu_hour"] = plan.cluster.price_per_gpu_hour
    training = {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(plan.training).items()
                if k not in ("recompute_layers", "recompute_method")}
    training["recompute"] = recompute_doc(plan.training)
    for key in ("allocator_margin", "loss", "master_weights", "autocast", "attention_kernel", "attention_unpad", "moe_routing",
                "kernels", "grads_to_none", "optimizer_in_backward", "activation_offload", "fp8_param_gather",
                "optimizer_state_dtype", "onebit_freeze_step"):
        if training[key] == _TRAINING_DEFAULTS[key]:   # written only where the Plan sets it
            del training[key]
    doc = {"model": model, "cluster": cluster, "parallel": parallel, "training": training}
    return {"name": plan.name, **doc} if plan.name else doc


def dump_plan(plan: Plan) -> str:
    return yaml.safe_dump(plan_to_dict(plan), sort_keys=False)
