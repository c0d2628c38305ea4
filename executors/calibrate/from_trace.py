"""Fit the figures a team's own profiler traces determine into a profile of the catalog's shape
(``trainplan calibrate --from-trace DIR --plan PLAN``, issue 52 item 3).

The traces are read elsewhere (``simcore.runlogs.kineto``; the command turns them into the
plain records below), so this module is the arithmetic and the profile:

- collectives: each NCCL call's bytes ("In msg nelems" x dtype) and kernel time, by collective,
  group size and link class (the group inside one NVLink domain, or across), fitted as
  t = latency + bus_bytes / bus_bandwidth by least squares on the relative error, with NCCL's
  bus factors (nccl-tests ``doc/PERFORMANCE.md``: all-reduce moves 2(n-1)/n of the buffer
  through each rank, all-gather and reduce-scatter (n-1)/n of the full buffer, broadcast the
  buffer). One call's kernel on one rank also holds that rank's wait for the others, so a call
  seen on several ranks of its group counts with its shortest kernel (the last rank to arrive
  waits for no one), each message size with its fastest call;
- GEMMs: an aten::mm/addmm/bmm/baddbmm's FLOPs (from its "Input Dims") over its kernels' time,
  over the datasheet peak of its operands' precision: the matmul efficiency at that size;
- attention: a flash SDPA op's FLOPs (causal: half the score block, as the model counts them)
  over its kernels' time, over the 16-bit peak: the forward and backward fractions.

A figure is written only where the trace determines it (``judge``); the others stay the
catalog's, and the profile's ``from_trace`` section says which were fitted, from what (files,
kernel count, residual), and why the rest were not.
"""
from __future__ import annotations

import datetime as _dt
import math
import statistics
from dataclasses import dataclass, replace

from simcore.model.collectives import group_net
from simcore.model.compute import FLASH_BACKWARD_FLOP_RATIO, device_model

#: Ring steps of each collective in the model's latency (simcore.model.collectives).
RING_STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "broadcast": 1, "reduce": 1}
#: A fit whose root-mean-square relative error exceeds this is not written: the calls scatter
#: more than a line through them explains (a robustness choice, not hardware).
FIT_MAX_RESIDUAL = 0.25
#: The model's bus bandwidth is NCCL's large-message plateau: it is fitted only where the
#: largest message is at least this big and its bandwidth term is at least half its time (on
#: NVLink, nccl-tests' bus bandwidth is still rising at a few MiB; a small message runs the LL
#: protocol, whose bandwidth is not the plateau's).
BANDWIDTH_MIN_BYTES = 16 * 2**20
#: A fitted latency above this many times the catalog's for the group is the ranks' wait for
#: one another, not the link's (seen on one rank's trace of DDP: 2 ms for a 2-GPU all-reduce).
LATENCY_CEILING = 10.0
#: Bytes per element of the precisions torch names in a CPU op's "Input type".
TYPE_PRECISION = {"c10::bfloat16": "bf16", "c10::half": "fp16", "float": "fp32", "c10::float8_e4m3fn": "fp8"}


@dataclass(frozen=True, slots=True)
class CollectiveCall:
    """One NCCL kernel: the call's key (``step``, the ``index``-th of its collective and group in
    the step on its rank) matches it across ranks."""

    collective: str
    group: tuple[int, ...]
    rank: int
    step: str
    index: int
    bytes: float
    seconds: float


@dataclass(frozen=True, slots=True)
class OpCall:
    """One GEMM or attention op with its kernels' time: ``kind`` gemm, attention_forward or
    attention_backward; ``flops`` as the model counts them."""

    kind: str
    op: str
    flops: float
    seconds: float
    precision: str


def bus_bytes(collective: str, n: int, in_bytes: float) -> float:
    """Bytes through each rank's link (NCCL PERFORMANCE.md's bus factors); ``in_bytes`` is the
    call's input: an all-gather's is one rank's shard of the n-times-larger buffer."""
    if collective == "all_reduce":
        return in_bytes * 2 * (n - 1) / n
    if collective == "all_gather":
        return in_bytes * (n - 1)
    if collective in ("reduce_scatter", "all_to_all"):
        return in_bytes * (n - 1) / n
    return in_bytes


def fit_alpha_beta(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """(latency s, seconds per bus byte, RMS relative error) of t = a + x * c through (x, t),
    least squares on the relative error (weights 1/t^2: a small message counts as much as a
    large one). One distinct x: no slope, a = its mean time."""
    xs = {x for x, _ in points}
    if len(xs) < 2:
        a = statistics.fmean(t for _, t in points)
        return a, 0.0, _residual(points, a, 0.0)
    w = [1.0 / t ** 2 for _, t in points]
    sw = sum(w)
    sx = sum(wi * x for wi, (x, _) in zip(w, points))
    st = sum(wi * t for wi, (_, t) in zip(w, points))
    sxx = sum(wi * x * x for wi, (x, _) in zip(w, points))
    sxt = sum(wi * x * t for wi, (x, t) in zip(w, points))
    det = sw * sxx - sx * sx
    c = (sw * sxt - sx * st) / det
    a = (st - c * sx) / sw
    return a, c, _residual(points, a, c)


def _residual(points, a: float, c: float) -> float:
    return math.sqrt(statistics.fmean(((a + c * x - t) / t) ** 2 for x, t in points))


def envelope(calls: list[CollectiveCall]) -> list[tuple[float, float]]:
    """(bus bytes, seconds) per distinct message: each call its shortest kernel over the ranks
    that recorded it, each size its fastest call."""
    by_call: dict[tuple, float] = {}
    for c in calls:
        key = (c.step, c.index, c.bytes)
        by_call[key] = min(by_call.get(key, math.inf), c.seconds)
    by_size: dict[float, float] = {}
    n = len(calls[0].group)
    for (_, _, b), t in by_call.items():
        x = bus_bytes(calls[0].collective, n, b)
        by_size[x] = min(by_size.get(x, math.inf), t)
    return sorted(by_size.items())


def judge(points, a: float, c: float, residual: float, *, model_latency_s: float, link_bytes_per_s: float,
          largest_bytes: float) -> tuple[bool, bool, list[str]]:
    """(latency determined, bandwidth determined, why each is not) of one fit."""
    why = []
    if residual > FIT_MAX_RESIDUAL:
        why.append(f"the calls scatter {residual:.0%} about the fit (over {FIT_MAX_RESIDUAL:.0%})")
        return False, False, why
    lat = a > 0 and (c <= 0 or points[0][0] * c <= a)
    if a <= 0:
        why.append("latency: the fit's intercept is not positive")
    elif not lat:
        why.append("latency: even the smallest message is bandwidth-bound")
    elif a > LATENCY_CEILING * model_latency_s:
        lat = False
        why.append(f"latency: {a * 1e6:.0f} us is over {LATENCY_CEILING:g}x the catalog's "
                   f"{model_latency_s * 1e6:.1f} us, the ranks' wait for one another (give every rank's trace)")
    bw = c > 0 and largest_bytes >= BANDWIDTH_MIN_BYTES
    if c <= 0:
        why.append("bandwidth: the kernel time does not grow with the message")
    elif largest_bytes < BANDWIDTH_MIN_BYTES:
        why.append(f"bandwidth: the largest message is {largest_bytes / 2**20:.3g} MiB, "
                   f"below the {BANDWIDTH_MIN_BYTES // 2**20} MiB of NCCL's plateau")
    elif points[-1][0] * c < 0.5 * (a + points[-1][0] * c):
        bw = False
        why.append("bandwidth: the largest message's time is mostly latency or wait")
    elif 1.0 / c > 1.05 * link_bytes_per_s:
        bw = False
        why.append(f"bandwidth: {1e-9 / c:.0f} GB/s is over the link's {link_bytes_per_s / 1e9:.0f} GB/s")
    return lat, bw, why


def _stride(group: tuple[int, ...]) -> int:
    g = sorted(group)
    return min((b - a for a, b in zip(g, g[1:])), default=1) or 1


def collective_fits(plan, calls: list[CollectiveCall]) -> list[dict]:
    """One fit per collective, group size and link class (NVLink domain or network): its latency
    and bus bandwidth where determined, the catalog's model for the group, and why not."""
    dev = device_model(plan.cluster.node.gpu, plan.training.precision.value)
    ideal = replace(dev, nvlink_efficiency=1.0, nic_efficiency=1.0)
    groups: dict[tuple, list[CollectiveCall]] = {}
    for c in calls:
        if len(c.group) > 1 and c.bytes > 0:
            net = group_net(plan.cluster, ideal, len(c.group), _stride(c.group))
            groups.setdefault((c.collective, len(c.group), "nvlink" if net.nodes == 1 else "net", net), []).append(c)
    fits = []
    for (coll, n, link, net), cs in sorted(groups.items(), key=lambda kv: kv[0][:3]):
        pts = envelope(cs)
        a, c, res = fit_alpha_beta(pts)
        steps = RING_STEPS.get(coll, 1) * (n - 1)
        inter = RING_STEPS.get(coll, 1) * (net.nodes - 1)
        model_lat = dev.base_latency_s + (steps - inter) * dev.nvlink_hop_latency_s + inter * dev.net_hop_latency_s
        lat, bw, why = judge(pts, a, c, res, model_latency_s=model_lat, link_bytes_per_s=net.bus_bytes_per_s,
                             largest_bytes=max(x.bytes for x in cs))
        ranks = {x.rank for x in cs}
        fits.append({"collective": coll, "ranks": n, "link": link, "kernels": len(cs), "sizes": len(pts),
                     "ranks_traced": len(ranks), "latency_s": a, "bus_bytes_per_s": 1.0 / c if c > 0 else None,
                     "residual": res, "latency_determined": lat, "bandwidth_determined": bw, "why_not": why,
                     "base_latency_s": a - (steps - inter) * dev.nvlink_hop_latency_s - inter * dev.net_hop_latency_s,
                     "link_bytes_per_s": net.bus_bytes_per_s, "catalog_latency_s": model_lat,
                     "catalog_bus_bytes_per_s": net.bus_bytes_per_s * (dev.nvlink_efficiency if net.nodes == 1
                                                                        else dev.nic_efficiency)})
    return fits


#: The aten ops whose Input Dims give a GEMM's shape: (index of A, index of B) in their inputs.
GEMM_OPS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::_addmm_activation": (1, 2), "aten::bmm": (0, 1),
            "aten::baddbmm": (1, 2)}
#: Flash SDPA ops: (direction, index of the query, index of the key, index of is_causal).
ATTENTION_OPS = {"aten::_scaled_dot_product_flash_attention": ("forward", 0, 1, 4),
                 "aten::_flash_attention_forward": ("forward", 0, 1, 5),
                 "aten::_scaled_dot_product_flash_attention_backward": ("backward", 1, 2, 11),
                 "aten::_flash_attention_backward": ("backward", 1, 2, 9)}


def op_precision(types) -> str:
    """The precision of an op's operands from its "Input type" ('' if none is known)."""
    for t in types or ():
        p = TYPE_PRECISION.get(str(t).lower())
        if p:
            return p
    return ""


def gemm_flops(op: str, dims) -> float:
    """2 m k n (times the batch) of an aten GEMM from its "Input Dims"; 0 if the shapes do not say."""
    ia, ib = GEMM_OPS[op]
    try:
        a, b = list(dims[ia]), list(dims[ib])
    except (IndexError, TypeError):
        return 0.0
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 2.0 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return 2.0 * a[0] * a[1] * a[2] * b[2]
    return 0.0


def attention_flops(op: str, dims, concrete=None) -> tuple[str, float]:
    """(forward or backward, FLOPs the model counts) of a flash SDPA op: 4 b h s_q s_k d forward,
    half of it causal (is_causal from "Concrete Inputs"; a decoder's causal mask where the
    trace does not say), the backward ``FLASH_BACKWARD_FLOP_RATIO`` times that."""
    direction, iq, ik, ic = ATTENTION_OPS[op]
    try:
        q, k = list(dims[iq]), list(dims[ik])
    except (IndexError, TypeError):
        return direction, 0.0
    if len(q) != 4 or len(k) != 4:
        return direction, 0.0
    b, h, s, d = q
    causal = str((concrete or [])[ic]).lower() not in ("false", "0") if concrete and len(concrete) > ic else True
    fwd = 4.0 * b * h * s * k[2] * d * (0.5 if causal else 1.0)
    return direction, fwd * (FLASH_BACKWARD_FLOP_RATIO if direction == "backward" else 1.0)


def gemm_curve(plan, ops: list[OpCall], catalog_points) -> tuple[list[list[float]], dict] | None:
    """The matmul efficiency points the GEMMs seen determine (the median per half decade of
    FLOPs, each GEMM's rate over the datasheet peak of its precision), the catalog's points
    kept outside the range seen; and the fit's record. None without a GEMM of known shape."""
    gpu = plan.cluster.node.gpu
    obs = [(o.flops, o.flops / o.seconds / gpu.peak(o.precision)) for o in ops
           if o.kind == "gemm" and o.flops > 0 and o.seconds > 0 and gpu.peak(o.precision)]
    if not obs:
        return None
    bins: dict[float, list[tuple[float, float]]] = {}
    for f, e in obs:
        bins.setdefault(round(math.log10(f) * 2) / 2, []).append((f, e))
    seen = [[statistics.median(f for f, _ in v), statistics.median(e for _, e in v)] for _, v in sorted(bins.items())]
    lo, hi = seen[0][0], seen[-1][0]
    points = sorted([list(map(float, p)) for p in catalog_points if p[0] < lo / 3 or p[0] > hi * 3] + seen)
    res = math.sqrt(statistics.fmean((math.log(e / _at(seen, f))) ** 2 for f, e in obs))
    return points, {"gemms": len(obs), "flops_range": [min(f for f, _ in obs), max(f for f, _ in obs)],
                    "residual": res, "bins": len(seen),
                    "precisions": sorted({o.precision for o in ops if o.kind == "gemm" and o.precision})}


def _at(points, size: float) -> float:
    """Piecewise linear in log10(size), the ends held (topologies' EfficiencyCurve.at)."""
    if size <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if size <= x1:
            return y0 + (y1 - y0) * (math.log10(size) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))
    return points[-1][1]


def attention_fractions(plan, ops: list[OpCall]) -> dict[str, tuple[float, int, float]]:
    """Per direction: (median fraction of the 16-bit peak, ops, RMS relative spread)."""
    gpu = plan.cluster.node.gpu
    out = {}
    for direction in ("forward", "backward"):
        fr = [o.flops / o.seconds / gpu.peak(o.precision or "bf16") for o in ops
              if o.kind == f"attention_{direction}" and o.flops > 0 and o.seconds > 0 and gpu.peak(o.precision or "bf16")]
        if fr:
            m = statistics.median(fr)
            out[direction] = (m, len(fr), math.sqrt(statistics.fmean(((f - m) / m) ** 2 for f in fr)))
    return out


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
