"""Kineto traces (``simcore.runlogs.kineto.RankTrace``) to the prediction's schema: each collective kernel's
process group mapped to a mesh axis under the Plan's rank grid, each rank's step as ``Span``s,
and the measured ``StepResult`` that ``reports.compare.compare`` holds against the prediction.

A step on the GPU runs from its first kernel to the next step's first kernel (the last step:
to its last kernel's end). Within it, ``results.split_step`` splits the time as it splits a
predicted step (compute, exposed communication, offload stall, idle), with two refinements:
a stage-to-stage send/recv that the compute stream waits on is *pipeline idle* (the NCCL
kernel spins until the other stage sends) and counts as bubble, as the simulator counts it;
time when no kernel runs at all is a *host-bound gap* (the GPU waits for the CPU), also bubble.
"""
from __future__ import annotations

import statistics
from collections import Counter

from simcore.results import COMM_STREAMS, Span, split_step, subtract_intervals
from topologies.placement import rank_grid

#: Kernel class to the Span stream and the time_s key of its busy time.
CLASS_STREAM = {"gemm": "compute", "attention": "compute", "other": "compute", "memory": "copy"}
CLASS_PHASE = {"gemm": "gemm", "attention": "attention", "other": "other_kernels", "memory": "memcpy"}


def union(intervals) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(e, out[-1][1]))
        else:
            out.append((s, e))
    return out


def length(intervals) -> float:
    return sum(e - s for s, e in intervals)


class AxisMap:
    """A process group's ranks to the mesh axis whose group they form under the Plan's grid."""

    def __init__(self, plan):
        par = plan.parallel
        self.grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
        self.ep, self.pp = par.ep, par.pp
        self.sizes = {"tp": par.tp, "cp": par.cp, "dp": par.dp, "pp": par.pp}
        self.notes: Counter = Counter()

    def axis(self, group, rank: int, collective: str) -> str:
        """tp, cp, ep, pp or dp; a guess from the collective (noted) where the group says nothing."""
        if group and all(0 <= r < self.grid.world for r in group) and rank in group:
            g = set(group)
            for axis in ("tp", "cp", "pp", "dp"):
                if self.sizes[axis] > 1 and g == set(self.grid.group_of(rank, axis)):
                    return axis
            dp_cp = {r for d in self.grid.group_of(rank, "dp") for r in self.grid.group_of(d, "cp")}
            if len(g) > 1 and g == dp_cp:
                return "dp"   # FSDP / gradient reduction over dp x cp
            if self.ep > 1 and len(g) == self.ep and g <= dp_cp:
                return "ep"
            if len(g) == 2 and collective in ("send", "recv", "send_recv") and self.pp > 1:
                return "pp"
            self.notes[f"a group of ranks {sorted(g)[:8]}{'...' if len(g) > 8 else ''} matches no axis of the "
                       f"Plan's grid (pp {self.grid.pp}, dp {self.grid.dp}, cp {self.grid.cp}, tp {self.grid.tp}); "
                       "counted as dp"] += 1
            return "dp"
        p2p = collective in ("send", "recv", "send_recv")   # NCCL lowers all-to-all to SendRecv too
        guess = "pp" if p2p and self.pp > 1 else "ep" if (p2p or collective == "all_to_all") and self.ep > 1 else \
            next((a for a in ("dp", "tp", "cp") if self.sizes[a] > 1), "dp")
        self.notes[f"{collective or 'NCCL'} kernels carry no process group (a trace of torch < 2.2): "
                   f"their axis, {guess}, is guessed from the collective and the Plan"] += 1
        return guess


def step_windows(trace) -> dict[str, tuple[float, float]]:
    """Each step's GPU window (us): its first kernel to the next step's first kernel."""
    first, last = {}, {}
    for k in trace.kernels:
        if k.step:
            first[k.step] = min(first.get(k.step, k.start_us), k.start_us)
            last[k.step] = max(last.get(k.step, k.end_us), k.end_us)
    names = [n for n, _, _ in trace.steps if n in first]
    return {n: (first[n], first[names[i + 1]] if i + 1 < len(names) else last[n]) for i, n in enumerate(names)}


def rank_step(trace, step: str, window: tuple[float, float], axes: AxisMap) -> tuple[list[Span], dict]:
    """One rank's step: its kernels as Spans (seconds from the window's start) and its breakdown."""
    t0, t1 = window
    spans = []
    for k in trace.kernels:
        if not (k.start_us < t1 and k.end_us > t0):
            continue
        if k.klass == "comm":
            stream, kind = axes.axis(k.group, trace.rank, k.collective), k.collective or "nccl"
        else:
            stream, kind = CLASS_STREAM[k.klass], k.klass
        spans.append(Span(trace.rank, stream, kind, k.name[:120], (k.start_us - t0) / 1e6,
                          (k.end_us - k.start_us) / 1e6, bytes=k.bytes))
    return spans, breakdown(spans, trace.rank, (t1 - t0) / 1e6)


def _busy(spans, pred, end: float) -> list[tuple[float, float]]:
    return union((max(0.0, s.start_s), min(end, s.end_s)) for s in spans if pred(s) and s.end_s > 0 and s.start_s < end)


def breakdown(spans: list[Span], rank: int, step_s: float) -> dict[str, float]:
    """split_step's four parts (pipeline idle moved from exposed communication into bubble), and
    the time in each kernel class, each axis's collectives, hidden and exposed communication."""
    parts = split_step(spans, rank, 0.0, step_s)
    compute = _busy(spans, lambda s: s.stream == "compute", step_s)
    comm = _busy(spans, lambda s: s.stream in COMM_STREAMS, step_s)
    other_comm = _busy(spans, lambda s: s.stream in COMM_STREAMS and s.stream != "pp", step_s)
    pp = _busy(spans, lambda s: s.stream == "pp", step_s)
    pipeline_idle = length(subtract_intervals(subtract_intervals(pp, compute), other_comm))
    out = {"step_s": step_s, "compute_s": parts["compute_s"], "offload_s": parts["offload_s"],
           "exposed_comm_s": parts["exposed_comm_s"] - pipeline_idle,
           "bubble_s": parts["bubble_s"] + pipeline_idle, "pipeline_idle_s": pipeline_idle,
           "host_gaps_s": parts["bubble_s"], "hidden_comm_s": length(comm) - parts["exposed_comm_s"]}
    for klass, phase in CLASS_PHASE.items():
        out[f"{phase}_s"] = length(_busy(spans, lambda s, k=klass: s.kind == k and s.stream != "pp"
                                         and s.stream not in COMM_STREAMS, step_s))
    for axis in COMM_STREAMS:
        busy = _busy(spans, lambda s, a=axis: s.stream == a, step_s)
        if busy:
            out[f"{axis}_comm_s"] = length(busy)
            out[f"{axis}_exposed_s"] = length(subtract_intervals(busy, compute))
    return out


def measure(traces, plan) -> tuple[list[dict], list[Span], AxisMap]:
    """(one row per rank and step, the representative step's spans of every rank, the axis map)."""
    axes = AxisMap(plan)
    rows, spans_by = [], {}
    for t in traces:
        for step, window in step_windows(t).items():
            spans, row = rank_step(t, step, window, axes)
            rows.append({"step": step, "rank": t.rank, **row})
            spans_by[step, t.rank] = spans
    if not rows:
        raise ValueError("no step of the traces holds a GPU kernel")
    steps = sorted({r["step"] for r in rows}, key=lambda s: int(s.split("#")[1]))
    slow = {s: max(r["step_s"] for r in rows if r["step"] == s) for s in steps}
    rep = sorted(steps, key=slow.__getitem__)[len(steps) // 2]   # the median step
    spans = [s for (step, _), sp in spans_by.items() if step == rep for s in sp]
    return rows, spans, axes


def collective_rows(traces, axes: AxisMap) -> list[dict]:
    """Each NCCL collective by process group: its axis, calls and kernel time per step, bytes per call."""
    acc: dict[tuple, list] = {}
    for t in traces:
        nsteps = max(1, len({k.step for k in t.kernels if k.step}))
        for k in t.kernels:
            if k.klass != "comm" or not k.step:
                continue
            group = ",".join(map(str, k.group)) if k.group else "?"
            key = (t.rank, axes.axis(k.group, t.rank, k.collective), k.collective or "nccl", group)
            row = acc.setdefault(key, [0, 0.0, 0.0, nsteps])
            row[0] += 1
            row[1] += (k.end_us - k.start_us) / 1e6
            row[2] += k.bytes
    return [{"rank": r, "axis": a, "collective": c, "group": g, "calls_per_step": n / ns,
             "time_per_step_s": s / ns, "bytes_per_call": b / n}
            for (r, a, c, g), (n, s, b, ns) in sorted(acc.items())]


def slowest_rows(rows: list[dict]) -> list[dict]:
    """Per step, the row of the rank that took longest (it sets the step)."""
    by: dict[str, dict] = {}
    for r in rows:
        if r["step"] not in by or r["step_s"] > by[r["step"]]["step_s"]:
            by[r["step"]] = r
    return list(by.values())


def measured_result(plan, rows: list[dict], spans: list[Span], notes: list[str]):
    """The measured StepResult: per step the slowest rank's breakdown, averaged over the steps."""
    from simcore.model import workload as wl
    from simcore.results import StepResult, rate_fields

    crit = slowest_rows(rows)

    def mean(key: str) -> float:
        return statistics.mean(r.get(key, 0.0) for r in crit)

    step = mean("step_s")
    keys = sorted({k for r in crit for k in r} - {"step", "rank", "step_s"})
    time_s = {k[:-2]: mean(k) for k in keys if k.endswith("_s") and k not in ("compute_s", "offload_s", "exposed_comm_s")}
    return StepResult(
        source="measured", plan_name=plan.name, step_time_s=step,
        **rate_fields(plan, step, wl.model_flops_per_step(plan.model, plan.training.global_batch),
                      wl.hardware_flops_per_step(plan.model, plan.training.global_batch, plan.training.recompute)),
        compute_s=mean("compute_s"), exposed_comm_s=mean("exposed_comm_s"), bubble_s=mean("bubble_s"),
        offload_s=mean("offload_s"), memory_per_gpu_gib=0.0, fits=True, time_s=time_s, spans=tuple(spans),
        notes=tuple(notes))
