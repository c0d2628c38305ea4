"""Measure a training step in the simulator's schema (``simcore.results``).

Per rank and step the recorder keeps spans on the streams the simulator uses:
"compute" (forward / backward per micro-batch, optimizer step) and one communication
stream per mesh axis ("dp", "tp", "pp", ...). Collectives are timed from torch's own
entry points (``torch.distributed`` and ``torch.distributed._functional_collectives``,
the functions DDP's comm hooks, FSDP2, ZeroRedundancyOptimizer, DTensor and the
pipelining schedules call), from the call to the completion of their ``Work`` future;
a collective that blocks the host (a synchronous call) is cut out of the compute spans,
so that ``simcore.results.split_step`` sees compute, exposed communication and bubble as
the simulator defines them. Functional (DTensor) collectives are waited on at once.
Pipeline receives are counted but not drawn: their wait is the upstream stage's compute,
i.e. bubble, not transfer. An asynchronous collective issued and completed inside one
compute span was awaited there (DDP's bucket all-reduces, which ``backward`` waits for
before it returns; ZeroRedundancyOptimizer's broadcasts, which its ``step`` waits for):
the host waits from the last such call to the last completion, and that interval is cut
out of the compute span as well. Limits: the host cannot see other waits inside an
autograd hook (FSDP2's unshard wait) and counts them as compute.

Memory (CPU): the exact bytes of this rank's local parameter, gradient and optimizer
state tensors (DTensor local shards), and the peak bytes of tensors saved for backward
(``torch.autograd.graph.saved_tensors_hooks``; parameters excluded, storages counted
once), counted on the last warm-up step, since the hooks cost a Python call per saved
tensor. On CUDA the total is ``torch.cuda.max_memory_allocated``.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.tensor import DTensor

from simcore.results import Span, subtract_intervals

#: torch.distributed functions (name -> span kind) that the recorder times.
_C10D = {"all_reduce": "all_reduce", "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
         "all_gather_single": "all_gather", "_all_gather_base": "all_gather",
         "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
         "reduce_scatter_single": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
         "broadcast": "broadcast", "all_to_all_single": "all_to_all", "all_to_all": "all_to_all"}
# isend/irecv stay unpatched (P2POp checks their identity); batch_isend_irecv is timed instead.
#: functional collectives (DTensor's redistribution calls these).
_FUNCOL = {"all_reduce": "all_reduce", "all_gather_single": "all_gather", "all_gather_tensor": "all_gather",
           "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
           "all_to_all_single": "all_to_all", "broadcast": "broadcast"}


def tensor_bytes(t) -> int:
    """Bytes of a tensor's local data (a DTensor's local shard)."""
    if t is None or not isinstance(t, torch.Tensor):
        return 0
    if isinstance(t, DTensor):
        t = t._local_tensor
    return t.numel() * t.element_size()


@dataclass(kw_only=True)
class Recorder:
    """Spans and collective counts of one rank; times relative to ``step_start``."""

    rank: int
    axis_of: dict = field(default_factory=dict)
    """frozenset of global ranks -> mesh axis name."""
    spans: list = field(default_factory=list)
    blocking: list = field(default_factory=list)
    """(start, end) of collectives that blocked the host from call to completion."""
    issued: list = field(default_factory=list)
    """(start, end) of asynchronous collectives: call to completion of their future."""
    counts: Counter = field(default_factory=Counter)
    step_start: float = 0.0
    enabled: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _local: threading.local = field(default_factory=threading.local)

    def start_step(self) -> None:
        self.spans, self.blocking, self.issued = [], [], []
        self.step_start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.step_start

    @contextlib.contextmanager
    def span(self, kind: str, name: str):
        """Time one piece of work on the compute stream."""
        start = self.now()
        try:
            yield
        finally:
            self.spans.append(("compute", kind, name, start, self.now(), 0.0))

    def comm(self, kind: str, axis: str, nbytes: float, start: float, end: float, blocking: bool) -> None:
        with self._lock:
            self.spans.append((axis, kind, f"{kind} {axis}", start, end, nbytes))
            if blocking:
                self.blocking.append((start, end))
            elif kind != "send":   # the pipeline schedule never waits on its sends inside a chunk
                self.issued.append((start, end))

    def awaited(self) -> list[tuple[float, float]]:
        """Per compute span, the host's wait for the asynchronous collectives it issued and
        saw complete: from the last call to the last completion (none where it issued none)."""
        waits = []
        for stream, _kind, _name, start, end, _nbytes in self.spans:
            inside = [(s, e) for s, e in self.issued if start <= s and e <= end] if stream == "compute" else []
            if inside:
                waits.append((max(s for s, _ in inside), max(e for _, e in inside)))
        return [(s, e) for s, e in waits if e > s]

    def step_spans(self) -> list[Span]:
        """This step's spans, compute spans with the host's waits cut out: blocking
        collectives and the awaited tail of asynchronous ones."""
        out = []
        blocks = sorted(self.blocking + self.awaited())
        for stream, kind, name, start, end, nbytes in self.spans:
            pieces = subtract_intervals([(start, end)], blocks) if stream == "compute" else [(start, end)]
            out.extend(Span(self.rank, stream, kind, name, s, e - s, nbytes) for s, e in pieces if e > s)
        return out


# --------------------------------------------------------------------------- collectives

def axis_map(mesh) -> dict:
    """frozenset(ranks) -> axis name for every axis of ``mesh`` larger than one, and the world."""
    out = {frozenset(range(dist.get_world_size())): "world"}
    for axis in mesh.mesh_dim_names:
        if mesh[axis].size() > 1:
            out[frozenset(dist.get_process_group_ranks(mesh.get_group(axis)))] = axis
    return out


def _axis(rec: Recorder, group) -> str:
    if group is None:
        return rec.axis_of.get(frozenset(range(dist.get_world_size())), "world")
    if not isinstance(group, dist.ProcessGroup):  # functional-collective group forms
        group = dist.distributed_c10d._resolve_process_group(funcol._resolve_group_name(group))
    return rec.axis_of.get(frozenset(dist.get_process_group_ranks(group)), "other")


def _wrap(rec: Recorder, fn, kind: str, functional: bool):
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if getattr(rec._local, "depth", 0) or not rec.enabled:
            return fn(*args, **kwargs)
        bound = sig.bind_partial(*args, **kwargs).arguments
        axis = _axis(rec, bound.get("group"))
        first = next(iter(bound.values()), None)
        nbytes = sum(map(tensor_bytes, first)) if isinstance(first, (list, tuple)) else tensor_bytes(first)
        rec.counts[(kind, axis)] += 1
        start = rec.now()
        rec._local.depth = 1
        try:
            out = fn(*args, **kwargs)
            if functional:
                funcol.wait_tensor(out)  # the host waits here; DTensor keeps the same object
        finally:
            rec._local.depth = 0
        if bound.get("async_op") and out is not None:
            _on_done(out, lambda: rec.comm(kind, axis, nbytes, start, rec.now(), False))
        else:
            rec.comm(kind, axis, nbytes, start, rec.now(), True)
        return out
    return timed


#: Kinds of work (``_wrap_p2p``: "p2p" and the group's backend) whose ``get_future`` raised.
#: gloo's point-to-point works have none, and finding that out costs 160-290 us a call (a
#: C++ exception turned into Python's), about 1% of a 30 ms step with ten sends: ask once.
_NO_FUTURE: set = set()


def _on_done(work, callback, kind=None) -> None:
    """Call ``callback`` when ``work`` completes; a work without a future (gloo's
    point-to-point works) is taken as done when it has been handed to the transport.
    ``kind`` names works that all have, or all lack, a future (see ``_NO_FUTURE``)."""
    if kind is None or kind not in _NO_FUTURE:
        try:
            work.get_future().then(lambda _f: callback())
            return
        except RuntimeError:
            if kind is not None:
                _NO_FUTURE.add(kind)
    callback()


def _wrap_p2p(rec: Recorder, fn):
    @functools.wraps(fn)
    def timed(p2p_ops, *args, **kwargs):
        if getattr(rec._local, "depth", 0) or not rec.enabled:
            return fn(p2p_ops, *args, **kwargs)
        start = rec.now()
        rec._local.depth = 1
        try:
            works = fn(p2p_ops, *args, **kwargs)
        finally:
            rec._local.depth = 0
        works = works or []
        for i, op in enumerate(p2p_ops):  # a coalesced batch may return one work for all ops
            kind = "send" if op.op is dist.isend else "recv"
            axis = _axis(rec, op.group)
            rec.counts[(kind, axis)] += 1
            if kind == "send" and works:
                nbytes = tensor_bytes(op.tensor)
                _on_done(works[min(i, len(works) - 1)],
                         lambda a=axis, n=nbytes: rec.comm("send", a, n, start, rec.now(), False),
                         ("p2p", dist.get_backend(op.group)))
        return works
    return timed


@contextlib.contextmanager
def record_collectives(rec: Recorder):
    """Patch torch's collective entry points to report to ``rec`` while inside."""
    patched = []
    for module, table, functional in ((dist, _C10D, False), (dist.distributed_c10d, _C10D, False),
                                      (funcol, _FUNCOL, True)):
        for name, kind in table.items():
            fn = getattr(module, name, None)
            if fn is None:
                continue
            patched.append((module, name, fn))
            setattr(module, name, _wrap(rec, fn, kind, functional))
    from torch.distributed.pipelining import schedules  # its _batch_p2p issues every pipeline send/recv

    for module, name in ((dist, "batch_isend_irecv"), (dist.distributed_c10d, "batch_isend_irecv"),
                         (schedules, "_batch_p2p")):
        patched.append((module, name, getattr(module, name)))
        setattr(module, name, _wrap_p2p(rec, getattr(module, name)))
    try:
        yield rec
    finally:
        for module, name, fn in reversed(patched):
            setattr(module, name, fn)


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


def state_bytes(parts, optimizer) -> dict[str, float]:
    """Weights, gradients and optimizer states held by this rank, in bytes."""
    params = [p for part in parts for p in part.parameters()]
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer keeps its shard in .optim
    opt = sum(tensor_bytes(v) for state in inner.state.values() for v in state.values())
    return {"weights": float(sum(map(tensor_bytes, params))),
            "gradients": float(sum(tensor_bytes(p.grad) for p in params)),
            "optimizer_states": float(opt)}


# --------------------------------------------------------------------------- pipeline stages

def instrument_stage(stage, rec: Recorder) -> None:
    """Time a ``PipelineStage``'s per-micro-batch compute, named in torch's action notation
    ("2F0": stage 2, forward, micro-batch 0; B full backward, I input-, W weight-gradient)."""
    sid = stage.stage_index
    fwd, bwd, bwd_w = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def forward_one_chunk(mb, *args, **kwargs):
        with rec.span("forward", f"{sid}F{mb}") if rec.enabled else contextlib.nullcontext():
            return fwd(mb, *args, **kwargs)

    def backward_one_chunk(mb, *args, **kwargs):
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        kind, letter = ("backward", "B") if full else ("backward_input", "I")
        with rec.span(kind, f"{sid}{letter}{mb}") if rec.enabled else contextlib.nullcontext():
            return bwd(mb, *args, **kwargs)

    def backward_weight_one_chunk(mb, *args, **kwargs):
        with rec.span("backward_weight", f"{sid}W{mb}") if rec.enabled else contextlib.nullcontext():
            return bwd_w(mb, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


# --------------------------------------------------------------------------- summary

def dp_sync_wait_s(rank_spans: list[list]) -> float:
    """One step's wait for the last rank at the data-parallel gradient sync: each rank's
    dp-axis collective spans run from its own launch to the common end, so the mean rank
    waits its span less the shortest (the last rank's) one; 0 without dp collectives."""
    per_rank = [sum(s.duration_s for s in spans if s.stream == "dp") for spans in rank_spans]
    if len(per_rank) < 2 or not any(per_rank):
        return 0.0
    return sum(per_rank) / len(per_rank) - min(per_rank)


def summarise(plan, records: list[dict], warmup: int) -> "StepResult":
    """Per-rank records of ``executors.launch.run_rank`` -> one Measurement. The step time
    is the slowest rank's, averaged over the measured bare steps (the recorder's hooks cost
    host time of their own, 0-10% of a step on a CPU host); its breakdown is that rank's
    ``split_step`` on the recorded steps, scaled to the bare step time; spans are those of
    the median recorded step on every rank. Without bare steps the recorded ones give both."""
    from simcore.model import workload as wl
    from simcore.results import GIB, MEMORY_KINDS, StepResult, rate_fields, split_step

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
               **({"dp_sync_wait_s": sum(waits) / k} if any(waits) else {}),
               **({"recorder_overhead": recorded_time / step_time - 1} if bare else {}),
               **{f"calls.{kind}.{axis}": float(c) for (kind, axis), c in sorted(calls.items())}})
