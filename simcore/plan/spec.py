"""The Plan: one immutable, validated value that every stage of trainplan consumes.

A Plan file (YAML, schema in DESIGN.md "The Plan file") has four sections: ``model``,
``cluster``, ``parallel`` and ``training``. ``load_plan`` is the only reader of Plan
YAML; everything downstream takes the ``Plan`` dataclass. Every wrong input raises
``PlanError`` with one sentence that names the field and the rule.
"""
from __future__ import annotations

import enum
import json
import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import yaml

from topologies.hardware import Catalog, CatalogError, Fabric, Node, Storage, load_catalog, scale_for_ranks


class PlanError(ValueError):
    """A Plan is malformed or breaks a rule; the message is one sentence naming the field."""


class _Choice(str, enum.Enum):
    @classmethod
    def parse(cls, value, where: str):
        for member in cls:
            if value == member.value:
                return member
        known = ", ".join(m.value for m in cls)
        raise PlanError(f"{where}={value!r} is not one of: {known}")

    def __str__(self) -> str:
        return self.value


class Schedule(_Choice):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZERO_BUBBLE = "zero-bubble"


class Precision(_Choice):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"


class Recompute(_Choice):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Offload(_Choice):
    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_PARAMS = "optimizer+params"


class GradCompression(_Choice):
    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"


class Optimizer(_Choice):
    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"


class ZeroStage(enum.IntEnum):
    """ZeRO stages are cumulative (DeepSpeed's convention): compare with >=."""

    NONE = 0
    OPTIMIZER_STATES = 1
    GRADIENTS = 2
    WEIGHTS = 3


class PositionEmbedding(_Choice):
    LEARNED = "learned"
    ROPE = "rope"


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer (plan key ``model``)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    """Key/value heads; fewer than ``heads`` means grouped-query attention."""
    ffn_hidden: int
    vocab: int
    seq_len: int
    """Tokens per sequence."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three matrices."""
    experts: int = 0
    """Experts per MoE layer (0: dense)."""
    top_k: int = 0
    capacity_factor: float = 1.0
    tied_embeddings: bool = True
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def moe(self) -> bool:
        return self.experts > 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """The hardware (plan key ``cluster``), resolved from the catalog."""

    node: Node
    nodes: int
    fabric: Fabric | None
    storage: Storage
    gpus_per_node: int
    price_per_gpu_hour: float | None = None
    """Overrides the catalog's on-demand price, $ per GPU-hour."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelSpec:
    """The parallel layout (plan key ``parallel``). GPUs used = tp * pp * dp * cp.

    Expert parallel does not multiply the GPUs: as in Megatron-Core and torchtitan,
    the ``ep`` ranks of an MoE layer are carved out of the data (x context) parallel ranks.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1
    """Virtual stages (model chunks) per pipeline rank, for the interleaved schedule."""
    stage_layers: tuple[int, ...] | None = None
    """Layers per virtual stage, in model order; None spreads them as evenly as possible."""
    zero: ZeroStage = ZeroStage.NONE
    sequence_parallel: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """How one optimizer step is run (plan key ``training``)."""

    global_batch: int
    """Sequences per optimizer step."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    precision: Precision = Precision.BF16
    recompute: Recompute = Recompute.NONE
    offload: Offload = Offload.NONE
    flash_attention: bool = False
    optimizer: Optimizer = Optimizer.ADAMW
    grad_compression: GradCompression = GradCompression.NONE


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    parallel: ParallelSpec
    training: TrainingSpec
    name: str = ""

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step (gradient accumulation steps without PP)."""
        return self.training.global_batch // (self.parallel.dp * self.training.micro_batch)

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Layers of each virtual stage (pp * vpp of them), in model order."""
        if self.parallel.stage_layers is not None:
            return self.parallel.stage_layers
        return even_split(self.model.layers, self.parallel.pp * self.parallel.vpp)


def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Spread ``layers`` over ``stages`` as evenly as possible; the extra layers go to
    the middle stages, since the first and last stages also hold the embedding and
    the logits (the choice Llama 3 405B made: 126 layers on 16 stages)."""
    base, extra = divmod(layers, stages)
    start = (stages - extra) // 2
    return tuple(base + (start <= i < start + extra) for i in range(stages))


# --------------------------------------------------------------------------- parsing

_SECTIONS = ("model", "cluster", "parallel", "training")
_TOP_KEYS = set(_SECTIONS) | {"name", "description"}
_MODEL_KEYS = {f.name for f in fields(ModelSpec)} | {"hf_config"}
_CLUSTER_KEYS = {"node", "nodes", "fabric", "gpus_per_node", "storage", "price_per_gpu_hour", "profile"}
_PARALLEL_KEYS = {f.name for f in fields(ParallelSpec)}
_TRAINING_KEYS = {f.name for f in fields(TrainingSpec)}


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
    if isinstance(value, str):
        value = {"hf_config": value} if value.endswith(".json") else {"name": value}
    doc = dict(_mapping(value, "model"))
    _check_keys(doc, _MODEL_KEYS, "model")
    fields_: dict = {}
    if "hf_config" in doc:
        hf = _str(doc, "hf_config", "model")
        doc.pop("hf_config")
        if hf is not None:
            fields_.update(hf_config_fields(_resolve(hf, base_dir)))
    name = _str(doc, "name", "model")
    if name is not None and name in cat.models:
        fields_ = {**dict(cat.models[name]), **fields_}
    elif name is not None and not fields_ and "layers" not in doc:
        raise PlanError(f"unknown model '{name}' (known: {', '.join(sorted(cat.models))}); "
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
    )


def _resolve(path: str, base_dir: Path) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else base_dir / p


def hf_config_fields(path: Path) -> dict:
    """Map a Hugging Face ``config.json`` onto ModelSpec fields.

    Covers the field names of Llama 2/3, Mistral, Mixtral, Qwen2 (``num_hidden_layers``,
    ``num_key_value_heads``, ``num_local_experts``, ...), GPT-2 (``n_layer``, ``n_embd``)
    and GPT-NeoX.
    """
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as exc:
        raise PlanError(f"model config {path} cannot be read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"model config {path} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
    if not isinstance(cfg, dict):
        raise PlanError(f"model config {path} must hold a JSON object")
    mtype = str(cfg.get("model_type", "")).lower()

    def pick(*keys):
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        return None

    out = {
        "name": cfg.get("_name_or_path") or path.parent.name or mtype or "hf-model",
        "layers": pick("num_hidden_layers", "n_layer"),
        "hidden": pick("hidden_size", "n_embd"),
        "heads": pick("num_attention_heads", "n_head"),
        "kv_heads": pick("num_key_value_heads", "num_attention_heads", "n_head"),
        "ffn_hidden": pick("intermediate_size", "n_inner", "ffn_dim"),
        "vocab": pick("vocab_size"),
        "seq_len": pick("max_position_embeddings", "n_positions", "n_ctx", "seq_length"),
        "experts": pick("num_local_experts", "num_experts") or 0,
        "top_k": pick("num_experts_per_tok") or 0,
        "source": f"Hugging Face config {path}",
    }
    if mtype == "gpt2":
        out.update(gated_mlp=False, tied_embeddings=cfg.get("tie_word_embeddings", True),
                   position_embedding="learned")
    else:  # Llama, Mistral, Mixtral, Qwen2 use SwiGLU and rotary; NeoX is ungated
        out.update(gated_mlp=mtype != "gpt_neox",
                   tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   position_embedding="rope")
    missing = [k for k in ("layers", "hidden", "heads", "vocab", "seq_len") if out[k] is None]
    if missing:
        raise PlanError(f"model config {path} lacks the field for model.{missing[0]}")
    return {k: v for k, v in out.items() if v is not None}


def _cluster(value, cat: Catalog, base_dir: Path) -> ClusterSpec:
    doc = _mapping(value, "cluster")
    _check_keys(doc, _CLUSTER_KEYS, "cluster")
    node_name = _str(doc, "node", "cluster")
    if node_name is None:
        raise PlanError("cluster.node is required (a catalog node type, or localhost)")
    if node_name not in cat.nodes:
        raise PlanError(f"unknown node '{node_name}' for cluster.node (known: {', '.join(sorted(cat.nodes))})")
    profile = _str(doc, "profile", "cluster")
    try:
        node = cat.node(node_name, _resolve(profile, base_dir) if profile else None)
    except CatalogError as exc:
        raise PlanError(f"cluster.node={node_name}: {exc}") from None
    fabric_name = _str(doc, "fabric", "cluster", node.fabric)
    if fabric_name is not None and fabric_name not in cat.fabrics:
        raise PlanError(f"unknown fabric '{fabric_name}' for cluster.fabric (known: {', '.join(sorted(cat.fabrics))})")
    storage_name = _str(doc, "storage", "cluster", node.storage)
    if storage_name not in cat.storage:
        raise PlanError(f"unknown storage '{storage_name}' for cluster.storage (known: {', '.join(sorted(cat.storage))})")
    return ClusterSpec(
        node=node,
        nodes=_int(doc, "nodes", "cluster", 1),
        fabric=cat.fabrics[fabric_name] if fabric_name else None,
        storage=cat.storage[storage_name],
        gpus_per_node=_int(doc, "gpus_per_node", "cluster", node.gpus_per_node),
        price_per_gpu_hour=_float(doc, "price_per_gpu_hour", "cluster"),
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
        stage_layers = tuple(_int({"v": v}, "v", "parallel.stage_layers[]") for v in stage_layers)
    zero = _int(doc, "zero", w, 0, minimum=0)
    if zero > 3:
        raise PlanError(f"parallel.zero={zero} is not one of: 0, 1, 2, 3")
    return ParallelSpec(
        tp=tp, pp=pp, dp=_int({"dp": dp}, "dp", w), cp=cp,
        ep=_int(doc, "ep", w, 1), vpp=_int(doc, "vpp", w, 1),
        stage_layers=stage_layers,
        zero=ZeroStage(zero),
        sequence_parallel=_bool(doc, "sequence_parallel", w, False),
        schedule=Schedule.parse(doc.get("schedule", "1f1b"), "parallel.schedule"),
    )


def _training(value) -> TrainingSpec:
    doc = _mapping(value, "training")
    _check_keys(doc, _TRAINING_KEYS, "training")
    w = "training"
    return TrainingSpec(
        global_batch=_int(doc, "global_batch", w),
        micro_batch=_int(doc, "micro_batch", w, 1),
        precision=Precision.parse(doc.get("precision", "bf16"), "training.precision"),
        recompute=Recompute.parse(doc.get("recompute", "none"), "training.recompute"),
        offload=Offload.parse(doc.get("offload", "none"), "training.offload"),
        flash_attention=_bool(doc, "flash_attention", w, False),
        optimizer=Optimizer.parse(doc.get("optimizer", "adamw"), "training.optimizer"),
        grad_compression=GradCompression.parse(doc.get("grad_compression", "none"),
                                               "training.grad_compression"),
    )


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
    plan = Plan(
        model=_model(doc["model"], cat, base),
        cluster=cluster,
        parallel=parallel,
        training=_training(doc["training"]),
        name=str(doc.get("name", "")),
    )
    check_plan(plan)
    return plan


def read_yaml_file(path: str | os.PathLike, what: str):
    """The parsed document of a YAML file the user names (``what``: "plan file", "sweep
    file", ...); PlanError with one sentence if it cannot be read, parsed, or is empty."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PlanError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PlanError(f"{what} {path} is not a text file") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise PlanError(f"{what} {path} is not valid YAML{line}: {problem}") from None
    if doc is None:
        raise PlanError(f"{what} {path} is empty")
    return doc


def load_plan(path: str | os.PathLike, catalog: Catalog | None = None) -> Plan:
    """Read a Plan YAML file; raise PlanError with one sentence on any problem."""
    path = Path(path)
    plan = plan_from_dict(read_yaml_file(path, "plan file"), path.parent, catalog)
    return plan if plan.name else replace(plan, name=path.stem)


# --------------------------------------------------------------------------- rules

def check_plan(plan: Plan) -> None:
    """Every cross-field rule of a Plan; raises PlanError naming the first one broken."""
    m, par, tr, cl = plan.model, plan.parallel, plan.training, plan.cluster
    rules = [
        (m.heads % m.kv_heads == 0, f"model.kv_heads={m.kv_heads} does not divide model.heads={m.heads}"),
        (m.hidden % m.heads == 0, f"model.heads={m.heads} does not divide model.hidden={m.hidden}"),
        (m.heads % par.tp == 0, f"parallel.tp={par.tp} does not divide model.heads={m.heads}"),
        (m.kv_heads % par.tp == 0, f"parallel.tp={par.tp} does not divide model.kv_heads={m.kv_heads}"),
        (m.ffn_hidden % par.tp == 0, f"parallel.tp={par.tp} does not divide model.ffn_hidden={m.ffn_hidden}"),
        (m.top_k <= m.experts, f"model.top_k={m.top_k} exceeds model.experts={m.experts}"),
        (not m.experts or m.top_k >= 1, f"model.top_k must be at least 1 when model.experts={m.experts}"),
        (par.gpus <= cl.gpus, f"plan needs {par.gpus} GPUs (tp*pp*dp*cp) but cluster has {cl.gpus}"),
        (cl.nodes == 1 or cl.fabric is not None,
         f"cluster.nodes={cl.nodes} needs a network: cluster.node={cl.node.name} has no fabric, set cluster.fabric"),
        (tr.global_batch % (par.dp * tr.micro_batch) == 0,
         f"training.global_batch={tr.global_batch} is not a multiple of parallel.dp*training.micro_batch"
         f"={par.dp * tr.micro_batch}"),
        (m.seq_len % par.cp == 0, f"parallel.cp={par.cp} does not divide model.seq_len={m.seq_len}"),
        (not par.sequence_parallel or par.tp > 1, "parallel.sequence_parallel needs parallel.tp > 1"),
        (not par.sequence_parallel or (m.seq_len // par.cp) % par.tp == 0,
         f"parallel.tp={par.tp} does not divide the sequence per context rank ({m.seq_len // par.cp}) "
         "as sequence_parallel needs"),
        (par.ep == 1 or m.experts > 0, f"parallel.ep={par.ep} needs an MoE model (model.experts > 0)"),
        (par.ep == 1 or m.experts % par.ep == 0,
         f"parallel.ep={par.ep} does not divide model.experts={m.experts}"),
        (par.ep == 1 or (par.dp * par.cp) % par.ep == 0,
         f"parallel.ep={par.ep} does not divide parallel.dp*cp={par.dp * par.cp} (expert ranks come from them)"),
        (par.vpp == 1 or par.schedule in (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE),
         f"parallel.vpp={par.vpp} needs parallel.schedule interleaved-1f1b or zero-bubble, "
         f"not {par.schedule.value}"),
        (par.vpp == 1 or par.pp > 1, "parallel.vpp > 1 needs parallel.pp > 1"),
        (m.layers >= par.pp * par.vpp,
         f"model.layers={m.layers} gives fewer than one layer per virtual stage (pp*vpp={par.pp * par.vpp})"),
        (par.schedule != Schedule.INTERLEAVED_1F1B or par.pp == 1 or plan.num_microbatches % par.pp == 0,
         f"the interleaved schedule needs the micro-batches per step ({plan.num_microbatches}) "
         f"to be a multiple of parallel.pp={par.pp}"),
        (tr.offload != Offload.OPTIMIZER_PARAMS or par.zero == ZeroStage.WEIGHTS,
         "training.offload=optimizer+params needs parallel.zero=3 (FSDP2 offloads sharded parameters)"),
        (tr.grad_compression == GradCompression.NONE or par.zero == ZeroStage.NONE,
         f"training.grad_compression={tr.grad_compression.value} needs parallel.zero=0 "
         "(it is a DDP communication hook)"),
    ]
    for ok, message in rules:
        if not ok:
            raise PlanError(message)
    if par.stage_layers is not None:
        stages = par.pp * par.vpp
        if len(par.stage_layers) != stages:
            raise PlanError(f"parallel.stage_layers has {len(par.stage_layers)} entries but pp*vpp={stages}")
        if sum(par.stage_layers) != m.layers:
            raise PlanError(f"parallel.stage_layers adds up to {sum(par.stage_layers)}, "
                            f"not model.layers={m.layers}")
    gpu = cl.node.gpu
    if gpu.name != "uncalibrated-host" and gpu.peak(tr.precision.value) is None:
        raise PlanError(f"training.precision={tr.precision.value} is not supported by {gpu.name}")


# --------------------------------------------------------------------------- output

def plan_to_dict(plan: Plan) -> dict:
    """The Plan as a Plan-file document (catalog names for hardware, fields for the model)."""
    model = {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(plan.model).items()}
    model.pop("source", None)
    par = plan.parallel
    parallel = {
        "tp": par.tp, "pp": par.pp, "dp": par.dp, "cp": par.cp, "ep": par.ep, "vpp": par.vpp,
        "zero": int(par.zero), "sequence_parallel": par.sequence_parallel, "schedule": par.schedule.value,
    }
    if par.stage_layers is not None:
        parallel["stage_layers"] = list(par.stage_layers)
    cluster = {"node": plan.cluster.node.name, "nodes": plan.cluster.nodes,
               "gpus_per_node": plan.cluster.gpus_per_node, "storage": plan.cluster.storage.name}
    if plan.cluster.fabric is not None:
        cluster["fabric"] = plan.cluster.fabric.name
    if plan.cluster.price_per_gpu_hour is not None:
        cluster["price_per_gpu_hour"] = plan.cluster.price_per_gpu_hour
    training = {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(plan.training).items()}
    doc = {"model": model, "cluster": cluster, "parallel": parallel, "training": training}
    if plan.name:
        doc = {"name": plan.name, **doc}
    return doc


def dump_plan(plan: Plan) -> str:
    return yaml.safe_dump(plan_to_dict(plan), sort_keys=False)
