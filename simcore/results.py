"""The schema a prediction and a measurement share: scalar results, breakdowns, spans.

``StepResult`` is both the ``Prediction`` of the simulator and the ``Measurement`` of the
executor (``source`` tells which), so the two can be compared field by field. A
``Span`` is one interval of work on one stream of one rank; timelines export to the
Chrome trace event format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU),
which Perfetto opens.

How a timeline becomes the scalar breakdown (``split_step``), for one rank over one step:
compute time is the union of compute-stream spans; exposed communication is time when
the compute stream is idle and a communication stream is busy; offload stall is time
when only a host-device copy is busy; bubble is the rest of the idle time. The four add
up to the step time.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

GIB = 1024**3

#: Streams of a rank. "compute" runs kernels; "wait" holds idle time whose cause the
#: simulator knows (a CPU host's pipeline receive hand-over), counted as bubble; the others
#: carry communication or copies.
STREAMS = ("compute", "tp", "cp", "ep", "pp", "dp", "dp_shard", "dp_replicate", "copy", "wait")
DP_STREAMS = ("dp", "dp_shard", "dp_replicate")   # dp_*: hybrid sharding's groups
COMM_STREAMS = ("tp", "cp", "ep", "pp", *DP_STREAMS)

#: Kinds of span. backward_input / backward_weight are the zero-bubble split of backward.
KINDS = ("forward", "backward", "backward_input", "backward_weight", "recompute", "optimizer",
         "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send", "recv",
         "offload", "idle")

#: Memory breakdown keys (bytes per GPU).
MEMORY_KINDS = ("weights", "gradients", "optimizer_states", "activations", "comm_buffers", "framework")


@dataclass(frozen=True, slots=True)
class Span:
    """One interval of work on one stream of one rank."""

    rank: int
    stream: str
    kind: str
    name: str
    start_s: float
    duration_s: float
    bytes: float = 0.0
    flops: float = 0.0

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """One training step, predicted (``source`` analytic/des) or measured (``measured``)."""

    source: str
    plan_name: str
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    offload_s: float
    memory_per_gpu_gib: float
    fits: bool
    memory_bytes: dict[str, float] = field(default_factory=dict)
    """Bytes per GPU by kind (MEMORY_KINDS), for the most loaded rank."""
    time_s: dict[str, float] = field(default_factory=dict)
    """Seconds per phase of the step (forward, backward, tp_comm, dp_comm, ...)."""
    memory_per_rank_gib: tuple[float, ...] = ()
    spans: tuple[Span, ...] = ()
    notes: tuple[str, ...] = ()
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self, spans: bool = False) -> dict:
        out = asdict(self)
        out["breakdown"] = {"memory_bytes": out.pop("memory_bytes"), "time_s": out.pop("time_s")}
        out.update(out.pop("extra"))
        out["notes"] = list(self.notes)
        out["memory_per_rank_gib"] = list(self.memory_per_rank_gib)
        if spans:
            out["spans"] = [asdict(s) for s in self.spans]
        else:
            out.pop("spans")
        return out


Prediction = StepResult
Measurement = StepResult


def rate_fields(plan, step_s: float, model_flops_per_step: float, hardware_flops_per_step: float) -> dict:
    """The StepResult fields every path derives the same way from a step time and the step's
    FLOPs (simcore.model.workload's counting): tokens/s, TFLOP/s per GPU, and MFU/HFU against the
    GPU's dense peak for the plan's precision (0 where the device has no such peak)."""
    gpus = plan.parallel.gpus
    model_tf = model_flops_per_step / step_s / gpus / 1e12
    hw_tf = hardware_flops_per_step / step_s / gpus / 1e12
    peak = plan.cluster.node.gpu.peak(plan.training.precision.value)
    return {"tokens_per_s": plan.training.global_batch * plan.model.seq_len / step_s,
            "model_tflops_per_gpu": model_tf, "hardware_tflops_per_gpu": hw_tf,
            "mfu": model_tf * 1e12 / peak if peak else 0.0, "hfu": hw_tf * 1e12 / peak if peak else 0.0}


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def subtract_intervals(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of the (merged, sorted) intervals ``a`` not covered by ``b`` (sorted by start; may overlap).

    A two-pointer sweep: linear in len(a) + len(b)."""
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        cur, k = s, j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def split_step(spans: list[Span] | tuple[Span, ...], rank: int, start_s: float, end_s: float) -> dict[str, float]:
    """Compute, exposed communication, offload stall and bubble of one rank in [start, end]."""
    def clip(streams):
        return _union([(max(s.start_s, start_s), min(s.end_s, end_s)) for s in spans
                       if s.rank == rank and s.stream in streams and s.end_s > start_s and s.start_s < end_s])

    compute = clip(("compute",))
    comm = subtract_intervals(clip(COMM_STREAMS), compute)
    offload = subtract_intervals(subtract_intervals(clip(("copy",)), compute), comm)
    total = end_s - start_s
    c, x, o = _length(compute), _length(comm), _length(offload)
    return {"compute_s": c, "exposed_comm_s": x, "offload_s": o, "bubble_s": max(0.0, total - c - x - o)}


def to_chrome_trace(spans, process_name: str = "trainplan") -> dict:
    """Chrome trace JSON: one process per rank, one thread per stream, times in microseconds."""
    events = []
    seen = set()
    for s in spans:
        tid = STREAMS.index(s.stream) if s.stream in STREAMS else len(STREAMS)
        if (s.rank, tid) not in seen:
            seen.add((s.rank, tid))
            events.append({"ph": "M", "name": "thread_name", "pid": s.rank, "tid": tid,
                           "args": {"name": s.stream}})
            events.append({"ph": "M", "name": "process_name", "pid": s.rank, "tid": tid,
                           "args": {"name": f"{process_name} rank {s.rank}"}})
        events.append({"ph": "X", "name": s.name, "cat": s.kind, "pid": s.rank, "tid": tid,
                       "ts": s.start_s * 1e6, "dur": s.duration_s * 1e6,
                       "args": {"bytes": s.bytes, "flops": s.flops}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a report is for sharing
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_chrome_trace(spans, path: str | os.PathLike, process_name: str = "trainplan") -> None:
    atomic_write_text(path, json.dumps(to_chrome_trace(spans, process_name)))
