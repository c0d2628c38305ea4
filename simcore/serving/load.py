"""Serving plan documents (YAML) to ``ServingPlan`` values; bad input is one sentence naming
the field (``PlanError``).

    name: llama3-8b-h100-tp1
    model: llama3-8b                 # as a training Plan's: a catalog name, fields, or hf_config
    hardware: {node: dgx-h100}       # a catalog node; nodes: enough for tp x replicas by default
    parallel: {tp: 1, replicas: 1}
    precision: {weights: bf16, activations: bf16, kv_cache: bf16}   # weights int8/int4: weight-only
    scheduler: {max_num_seqs: 256, max_num_batched_tokens: 8192, chunked_prefill: true,
                capacity_policy: on_demand}   # or guaranteed_no_evict, static_batch (TensorRT-LLM's);
                                              # static_batch with batch_window_s: dynamic batching
    kv_cache: {block_size: 16, gpu_memory_utilization: 0.9}   # or free_memory_fraction (TensorRT-LLM's)
    traffic: {arrival: poisson, rate: 10, num_requests: 1000, prompt_len: 1024, output_len: 128, seed: 0}
                                     # or dataset: FILE in place of the lengths (simcore.serving.dataset);
                                     # arrival: trace replays a timed dataset (rate: scales it);
                                     # arrival: concurrency with concurrency: N, a closed loop of N clients
    router: round_robin              # or least_outstanding
    slo: {ttft_ms: 500, tpot_ms: 50, percentile: 99}   # optional; either target may be left out
    disaggregation: {prefill_tp: 2, prefill_replicas: 1}   # optional: prefill instances; parallel's then decode
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from simcore.plan.load import _bool, _check_keys, _cluster, _float, _int, _mapping, _model, _str
from simcore.plan.yaml_file import read_yaml_file
from simcore.serving.dataset import read_requests
from simcore.serving.spec import (Arrival, CapacityPolicy, DisaggSpec, Dtype, KvCacheSpec, PlanError, PrecisionSpec, Router, SchedulerSpec,
                                  ServingPlan, SloSpec, TrafficSpec, check_serving)
from topologies.hardware import Catalog, load_catalog

_TOP = {"name", "description", "model", "hardware", "parallel", "precision", "scheduler", "kv_cache", "traffic",
        "router", "slo", "disaggregation"}


def _section(doc: dict, key: str, known: set[str]) -> dict:
    value = _mapping(doc.get(key) or {}, key)
    _check_keys(value, known, key)
    return value


def _model_doc(value, longest: int) -> object:
    """The model section, with a sequence length where the file gives none (a catalog model
    has its own): prompt plus output, the longest context a request reaches."""
    if isinstance(value, dict) and "seq_len" not in value and "layers" in value:
        value = {**value, "seq_len": longest}
    return value


def _precision(doc: dict) -> PrecisionSpec:
    d = _section(doc, "precision", {"weights", "activations", "kv_cache", "group_size"})
    weights = Dtype.parse(_str(d, "weights", "precision", "bf16"), "precision.weights")
    unquantized = (Dtype.BF16, Dtype.FP16, Dtype.FP32)      # activations default to the weights' format
    acts = Dtype.parse(_str(d, "activations", "precision", weights.value if weights in unquantized else "bf16"),
                       "precision.activations")
    kv = Dtype.parse(_str(d, "kv_cache", "precision", "bf16"), "precision.kv_cache")
    return PrecisionSpec(weights=weights, activations=acts, kv_cache=kv,
                         group_size=_int(d, "group_size", "precision", 128))


def _traffic(doc: dict, base: Path) -> TrafficSpec:
    d = _section(doc, "traffic", {"arrival", "rate", "num_requests", "duration_s", "prompt_len", "output_len", "seed",
                                  "dataset", "concurrency"})
    arrival = Arrival.parse(_str(d, "arrival", "traffic", "poisson"), "traffic.arrival")
    rate = _float(d, "rate", "traffic") or 0.0
    pairs = times = None
    if d.get("dataset") is not None:
        if "prompt_len" in d or "output_len" in d:
            raise PlanError("traffic takes prompt_len and output_len, or a dataset file of both, not both")
        path = Path(_str(d, "dataset", "traffic"))
        pairs, times = read_requests(path if path.is_absolute() else base / path)
    if "num_requests" in d:
        n = _int(d, "num_requests", "traffic")
    elif "duration_s" in d and arrival == Arrival.POISSON and rate > 0:
        n = max(1, math.ceil(_float(d, "duration_s", "traffic") * rate))
    elif arrival == Arrival.TRACE and times is not None:
        n = len(times)
    else:
        raise PlanError("traffic.num_requests is required (or traffic.duration_s with a Poisson rate; a trace "
                        "has its own count)")
    seed = _int(d, "seed", "traffic", 0, minimum=0)
    extra = {"concurrency": _int(d, "concurrency", "traffic", 0, minimum=0)}
    if pairs is not None:
        if arrival == Arrival.TRACE:      # the trace's own requests, in order
            pairs = pairs[:n]
        return TrafficSpec(arrival=arrival, rate=rate, num_requests=n, seed=seed, dataset=pairs, dataset_path=str(path),
                           times=times, **extra,
                           prompt_len=max(1, round(sum(p for p, _ in pairs) / len(pairs))),
                           output_len=max(1, round(sum(o for _, o in pairs) / len(pairs))))
    return TrafficSpec(arrival=arrival, rate=rate, num_requests=n,
                       prompt_len=_int(d, "prompt_len", "traffic"), output_len=_int(d, "output_len", "traffic"),
                       seed=seed, **extra)


def slo_from_dict(value) -> SloSpec | None:
    """The ``slo`` section: targets in milliseconds, each positive, the percentile in (0, 100]."""
    if value is None:
        return None
    d = _mapping(value, "slo")
    _check_keys(d, {"ttft_ms", "tpot_ms", "percentile"}, "slo")
    if "ttft_ms" not in d and "tpot_ms" not in d:
        raise PlanError("slo needs slo.ttft_ms or slo.tpot_ms (milliseconds)")
    ms = {}
    for key in ("ttft_ms", "tpot_ms"):
        if key in d:
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise PlanError(f"slo.{key}={v!r} must be a positive number of milliseconds")
            ms[key] = float(v) / 1e3
    p = d.get("percentile", 99)
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 100:
        raise PlanError(f"slo.percentile={p!r} must be a number in (0, 100]")
    return SloSpec(ttft_s=ms.get("ttft_ms", math.inf), tpot_s=ms.get("tpot_ms", math.inf), percentile=float(p))


def serving_from_dict(doc, base_dir: str | os.PathLike = ".", catalog: Catalog | None = None) -> ServingPlan:
    """A serving plan document (module docstring) as a checked ``ServingPlan``."""
    doc = _mapping(doc, "serving plan")
    _check_keys(doc, _TOP, "plan")
    cat, base = catalog or load_catalog(), Path(base_dir)
    if doc.get("model") is None:
        raise PlanError("model is required (a catalog model name, its fields, or hf_config)")
    traffic = _traffic(doc, base)
    par = _section(doc, "parallel", {"tp", "replicas"})
    tp, replicas = _int(par, "tp", "parallel", 1), _int(par, "replicas", "parallel", 1)
    hw = dict(_section(doc, "hardware", {"node", "nodes", "fabric", "profile", "gpus_per_node"}))
    if hw.get("node") is None:
        raise PlanError("hardware.node is required (a catalog node type, e.g. dgx-h100)")
    dis = _section(doc, "disaggregation", {"prefill_tp", "prefill_replicas"}) if doc.get("disaggregation") else None
    disagg = DisaggSpec(prefill_tp=_int(dis, "prefill_tp", "disaggregation", 1),
                        prefill_replicas=_int(dis, "prefill_replicas", "disaggregation", 1)) if dis is not None else None
    gpus = tp * replicas + (disagg.prefill_tp * disagg.prefill_replicas if disagg else 0)
    if "nodes" not in hw and hw["node"] in cat.nodes:
        per_node = cat.nodes[hw["node"]].get("gpus_per_node", 8)    # None: localhost, sized by its profile
        hw["nodes"] = max(1, math.ceil(gpus / int(per_node))) if per_node else 1
    try:
        cluster = _cluster(hw, cat, base)
    except PlanError as exc:
        raise PlanError(str(exc).replace("cluster.", "hardware.")) from None
    if cluster.gpus < gpus:
        raise PlanError(f"the plan's {gpus} GPUs (parallel.tp x parallel.replicas"
                        f"{' + the prefill instances' if disagg else ''}) exceed hardware's {cluster.gpus}")
    sch = _section(doc, "scheduler", {"max_num_seqs", "max_num_batched_tokens", "chunked_prefill",
                                           "capacity_policy", "batch_window_s"})
    kv = _section(doc, "kv_cache", {"block_size", "gpu_memory_utilization", "free_memory_fraction"})
    if "gpu_memory_utilization" in kv and "free_memory_fraction" in kv:
        raise PlanError("kv_cache takes gpu_memory_utilization (vLLM's) or free_memory_fraction (TensorRT-LLM's), "
                        "not both")
    plan = ServingPlan(
        name=_str(doc, "name", "plan", "serving"),
        model=_model(_model_doc(doc["model"], traffic.max_total), cat, base),
        cluster=cluster, tp=tp, replicas=replicas, precision=_precision(doc),
        scheduler=SchedulerSpec(max_num_seqs=_int(sch, "max_num_seqs", "scheduler", 256),
                                max_num_batched_tokens=_int(sch, "max_num_batched_tokens", "scheduler", 8192),
                                chunked_prefill=_bool(sch, "chunked_prefill", "scheduler", True),
                                capacity_policy=CapacityPolicy.parse(_str(sch, "capacity_policy", "scheduler", "on_demand"),
                                                                     "scheduler.capacity_policy"),
                                batch_window_s=_float(sch, "batch_window_s", "scheduler", 0.0, positive=False)),
        kv_cache=KvCacheSpec(block_size=_int(kv, "block_size", "kv_cache", 16),
                             gpu_memory_utilization=_float(kv, "gpu_memory_utilization", "kv_cache", 0.9),
                             free_memory_fraction=_float(kv, "free_memory_fraction", "kv_cache")),
        traffic=traffic,
        router=Router.parse(doc.get("router", "round_robin"), "router"),
        slo=slo_from_dict(doc.get("slo")), disaggregation=disagg,
    )
    check_serving(plan)
    return plan


def load_serving_plan(path: str | os.PathLike, catalog: Catalog | None = None) -> ServingPlan:
    """Read and check a serving plan file."""
    path = Path(path)
    return serving_from_dict(read_yaml_file(path, "serving plan"), base_dir=path.parent, catalog=catalog)
