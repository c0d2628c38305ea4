"""Measure a training step in the simulator's schema (``simcore.results``).

The spans and collective counts come from ``executors.record``; this module adds the
rank's memory and summarises every rank's records into one ``StepResult``, and says which
plan a measurement (or a checkpoint) came from: ``plan_identity``.

Memory (CPU): the exact bytes of this rank's local parameter, gradient and optimizer
state tensors (DTensor local shards), and the peak bytes of tensors saved for backward
(``torch.autograd.graph.saved_tensors_hooks``; parameters excluded, storages counted
once), counted on the last warm-up step, since the hooks cost a Python call per saved
tensor. On CUDA the total is ``torch.cuda.max_memory_allocated``.
"""
from __future__ import annotations

import hashlib
import json
import statistics
from collections import Counter

import torch
from torch.distributed.tensor import DTensor

from executors.record import tensor_bytes
from simcore.plan.load import plan_to_dict
from simcore.results import DP_STREAMS, GIB, MEMORY_KINDS, StepResult, rate_fields, split_step


# --------------------------------------------------------------------------- memory

class SavedActivations:
    """Peak bytes of tensors autograd saves for backward (parameters excluded).

    FSDP2 computes with unsharded parameters (``nn.Parameter`` objects it all-gathers and
    registers on the module; a linear saves the transposed view of one): they are
    parameters, not activations. Their live bytes are tracked apart, with their own peak
    ``unsharded_peak``, which the caller counts as weights where FSDP2 holds them from
    forward to backward (``reshard_after_forward=False``, ZeRO-2) and not where it frees
    each layer's after its forward (ZeRO-3)."""

    def __init__(self, params):
        self.param_ptrs = {_storage_ptr(p) for p in params}
        self.live: Counter = Counter()
        self.sizes: dict = {}
        self.current = Counter()
        self.peaks = Counter()

    @property
    def peak(self) -> float:
        return float(self.peaks["activations"])

    @property
    def unsharded_peak(self) -> float:
        return float(self.peaks["unsharded"])

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t):
        key = _storage_ptr(t)
        if key is None or key in self.param_ptrs:
            return t
        param = isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)
        local = t._local_tensor if isinstance(t, DTensor) else t
        if self.live[key] == 0:
            kind = "unsharded" if param else "activations"
            self.sizes[key] = (kind, local.untyped_storage().nbytes())
            self.current[kind] += self.sizes[key][1]
            self.peaks[kind] = max(self.peaks[kind], self.current[kind])
        self.live[key] += 1
        return (t, _Release(self, key))

    @staticmethod
    def _unpack(obj):
        return obj[0] if isinstance(obj, tuple) else obj

    def release(self, key) -> None:
        self.live[key] -= 1
        if self.live[key] == 0:
            kind, size = self.sizes.pop(key)
            self.current[kind] -= size
            del self.live[key]


class _Release:
    __slots__ = ("owner", "key")

    def __init__(self, owner, key):
        self.owner, self.key = owner, key

    def __del__(self):
        self.owner.release(self.key)


def _storage_ptr(t):
    try:
        local = t._local_tensor if isinstance(t, DTensor) else t
        return local.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def state_bytes(parts, optimizer, device_type: str | None = None) -> dict[str, float]:
    """Weights, gradients and optimizer states held by this rank, in bytes (with
    ``device_type``: those on that device alone; CPU offload keeps them on the host)."""
    def nbytes(t) -> int:
        local = getattr(t, "_local_tensor", t)
        if device_type and isinstance(local, torch.Tensor) and local.device.type != device_type:
            return 0
        return tensor_bytes(t)
    params = [p for part in parts for p in part.parameters()]
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard in .optim
    opt = sum(nbytes(v) for state in inner.state.values() for v in state.values())
    return {"weights": float(sum(map(nbytes, params))),
            "gradients": float(sum(nbytes(p.grad) for p in params)),
            "optimizer_states": float(opt)}


# --------------------------------------------------------------------------- summary

def dp_sync_wait_s(rank_spans: list[list]) -> float:
    """One step's wait for the last rank at the data-parallel gradient sync: each rank's
    dp-axis collective spans run from its own launch to the common end, so the mean rank
    waits its span less the shortest (the last rank's) one; 0 without dp collectives."""
    per_rank = [sum(s.duration_s for s in spans if s.stream in DP_STREAMS) for spans in rank_spans]
    if len(per_rank) < 2 or not any(per_rank):
        return 0.0
    return sum(per_rank) / len(per_rank) - min(per_rank)


def summarise(plan, records: list[dict], warmup: int) -> StepResult:
    """Per-rank records of ``executors.launch.run_rank`` -> one Measurement. The step time
    is the slowest rank's, averaged over the measured bare steps (the recorder's hooks cost
    host time of their own, 0-10% of a step on a CPU host); its breakdown is that rank's
    ``split_step`` on the recorded steps, scaled to the bare step time; spans are those of
    the median recorded step on every rank. Without bare steps the recorded ones give both."""
    from simcore.model import workload as wl

    n = len(records[0]["steps"])
    measured = range(min(warmup, n - 1), n)
    recorded = [i for i in measured if records[0]["steps"][i].get("instrumented", True)] or list(measured)
    bare = [i for i in measured if i not in recorded]

    def slowest(i: int) -> int:
        return max(range(len(records)), key=lambda r: records[r]["steps"][i]["duration_s"])

    parts, times, durations = Counter(), Counter(), []
    for i in recorded:
        crit = records[slowest(i)]
        step = crit["steps"][i]
        durations.append(step["duration_s"])
        parts.update(split_step(step["spans"], crit["rank"], 0.0, step["duration_s"]))
        for s in step["spans"]:
            times[s.kind if s.stream == "compute" else f"{s.stream}_comm"] += s.duration_s
    k = len(durations)
    recorded_time = sum(durations) / k
    step_time = statistics.mean(records[slowest(i)]["steps"][i]["duration_s"] for i in bare) if bare else recorded_time
    scale = step_time / recorded_time if recorded_time > 0 else 1.0
    waits = [dp_sync_wait_s([r["steps"][i]["spans"] for r in records]) for i in recorded]
    rep = recorded[sorted(range(k), key=durations.__getitem__)[k // 2]]
    spans = tuple(s for r in records for s in r["steps"][rep]["spans"])
    totals = [sum(r["memory_bytes"].values()) for r in records]
    top = records[max(range(len(records)), key=totals.__getitem__)]["memory_bytes"]
    world = len(records)
    peak = plan.cluster.node.gpu.peak(plan.training.precision.value) or 0.0
    model_flops = wl.model_flops_per_step(plan.model, plan.training.global_batch)
    hardware_flops = wl.hardware_flops_per_step(plan.model, plan.training.global_batch, plan.training.recompute)
    calls = Counter()
    for r in records:
        calls.update(r["steps"][rep]["counts"])
    notes = [f"measured on {records[0]['host']} ({records[0]['device']}), {world} ranks, "
             f"{len(measured)} measured steps after {len(measured) and list(measured)[0]} warm-up"
             + (f" ({len(bare)} bare give the step time, {k} recorded the phases, scaled to it: the "
                f"recorder cost {recorded_time / step_time - 1:+.1%})" if bare else ""),
             "collectives per step (all ranks): " + ", ".join(f"{kind}/{axis}={c}" for (kind, axis), c in sorted(calls.items()))]
    if not peak:
        notes.append("mfu and hfu are 0: the device has no calibrated peak (run `trainplan calibrate`)")
    return StepResult(
        source="measured", plan_name=plan.name, step_time_s=step_time,
        **rate_fields(plan, step_time, model_flops, hardware_flops),   # the simulator's FLOP counting
        compute_s=parts["compute_s"] / k * scale, exposed_comm_s=parts["exposed_comm_s"] / k * scale,
        bubble_s=parts["bubble_s"] / k * scale, offload_s=parts["offload_s"] / k * scale,
        memory_per_gpu_gib=max(totals) / GIB, fits=True,
        memory_bytes={kind: float(top.get(kind, 0.0)) for kind in MEMORY_KINDS},
        time_s={key: v / k for key, v in sorted(times.items())},
        memory_per_rank_gib=tuple(t / GIB for t in totals), spans=spans, notes=tuple(notes),
        extra={"loss_first": records[0]["losses"][0], "loss_last": records[0]["losses"][-1],
               "loss_tail_mean": _tail_mean(records[0]["losses"]),
               **({"dp_sync_wait_s": sum(waits) / k} if any(waits) else {}),
               **({"recorder_overhead": recorded_time / step_time - 1} if bare else {}),
               **({"activation_offload.host_peak": float(max(r.get("offload_host_bytes", 0) for r in records))}
                  if any("offload_host_bytes" in r for r in records) else {}),
               **{f"cuda_memory.{k}": float(max(r["cuda_memory"][k] for r in records))
                  for k in (records[0].get("cuda_memory") or {})},
               **{f"calls.{kind}.{axis}": float(c) for (kind, axis), c in sorted(calls.items())}})


def _tail_mean(losses: list[float]) -> float:
    """The mean loss of the run's last tenth of steps (at least one): a final loss that one step's
    noise does not decide, for comparing runs (``bench/compression_loss.py``)."""
    tail = losses[-max(1, len(losses) // 10):]
    return float(sum(tail) / len(tail))


# --------------------------------------------------------------------------- the plan measured

#: The cluster fields a measurement depends on (storage and prices do not change a step).
IDENTITY_CLUSTER = ("node", "nodes", "gpus_per_node")


def plan_identity(plan) -> dict:
    """What a measured run or a checkpoint records of the plan it ran: its name, the fields a
    step depends on (the model's shape, the layout, the training section with batch and
    precision, the cluster's node and size; flat ``section.key`` names) and their SHA-256."""
    doc = plan_to_dict(plan)
    fields = {f"model.{k}": v for k, v in doc["model"].items() if k != "name"}
    fields.update({f"parallel.{k}": v for k, v in doc["parallel"].items()})
    fields.update({f"training.{k}": v for k, v in doc["training"].items()})
    fields.update({f"cluster.{k}": doc["cluster"][k] for k in IDENTITY_CLUSTER})
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return {"name": plan.name, "sha256": digest, "fields": fields}


def plan_mismatch(recorded: dict, plan, prefixes: tuple[str, ...] = ("",)) -> list[str]:
    """The fields (of those starting with one of ``prefixes``) where a recorded identity and
    ``plan`` differ, each as ``'key recorded (recorded) vs plan (plan)'``."""
    ours = plan_identity(plan)["fields"]
    theirs = recorded.get("fields", {})
    keys = [k for k in dict.fromkeys([*theirs, *ours]) if k.startswith(prefixes)]
    return [f"{k} {theirs.get(k)} vs {ours.get(k)}" for k in keys if theirs.get(k) != ours.get(k)]
