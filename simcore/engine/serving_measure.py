"""The serving engine's traffic and figures: each request's arrival and lengths drawn from the
plan's traffic, and a run measured (latency percentiles, throughput, goodput under the SLO, KV
occupancy) into a ``ServingResult``; a ``ServingTimeline`` keeps what the run did over time."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simcore.serving.spec import Arrival, ServingPlan, SloSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingResult:
    """What a simulated serving run gives, times in seconds."""

    requests: int
    ttft: tuple[float, float, float]
    """Time to first token, (p50, p90, p99)."""
    tpot: tuple[float, float, float]
    """Time per output token after the first, (p50, p90, p99)."""
    e2e: tuple[float, float, float]
    ttft_mean: float
    tpot_mean: float
    output_tok_s: float
    total_tok_s: float
    req_s: float
    makespan_s: float
    kv_occupancy_mean: float
    """Time-weighted share of the KV blocks in use (busy and idle time), mean over replicas; under
    TensorRT-LLM's policies, the blocks reserved to completion."""
    kv_occupancy_max: float
    kv_blocks: int
    """KV blocks of one replica."""
    preemptions: int
    iterations: int
    goodput_req_s: float
    """Requests per second that meet both SLO targets (all requests where no SLO is given)."""
    slo_met: bool | None
    """Whether both targets hold at the SLO's percentile; None without an SLO."""
    slo_ttft_s: float
    slo_tpot_s: float
    """TTFT and TPOT at the SLO's percentile (NaN without an SLO)."""


@dataclass(slots=True)
class ServingTimeline:
    """What a run did over time, kept when one is passed to ``simulate_serving``: per iteration
    (replica, start s, end s, prefill tokens, decoding requests, KV blocks in use or reserved),
    and per request its arrival, first token and finish times."""

    iterations: list = field(default_factory=list)
    arrivals: np.ndarray | None = None
    first: np.ndarray | None = None
    finish: np.ndarray | None = None
    output: np.ndarray | None = None
    """Each request's output tokens."""
    kv_blocks: int = 0
    replica_kv_blocks: dict = field(default_factory=dict)
    """Replica -> its KV blocks where the replicas differ (a disaggregated plan's two pools)."""


def arrival_times(plan: ServingPlan) -> np.ndarray:
    """Request arrival times: Poisson at ``traffic.rate`` (seeded), all at 0 (offline), or the
    trace's times (its gaps scaled so that its mean rate is ``traffic.rate`` where one is given)."""
    t = plan.traffic
    if t.arrival in (Arrival.OFFLINE, Arrival.CONCURRENCY):     # a closed loop's are written as it runs
        return np.zeros(t.num_requests)
    if t.arrival == Arrival.TRACE:
        times = np.asarray(t.times[:t.num_requests], dtype=float)
        scale = t.trace_rate / t.rate if t.rate > 0 and np.isfinite(t.trace_rate) else 1.0
        return times * scale
    rng = np.random.default_rng(t.seed)
    return np.cumsum(rng.exponential(1.0 / t.rate, t.num_requests))


def request_lengths(plan: ServingPlan) -> tuple[np.ndarray, np.ndarray]:
    """Each request's prompt and output tokens: the fixed lengths, or draws from the dataset
    (uniform with replacement, seeded apart from the arrivals)."""
    t = plan.traffic
    if not t.dataset:
        return np.full(t.num_requests, t.prompt_len), np.full(t.num_requests, t.output_len)
    pairs = np.asarray(t.dataset, dtype=np.int64)
    if t.arrival == Arrival.TRACE:           # each traced request keeps its own lengths
        return pairs[:t.num_requests, 0], pairs[:t.num_requests, 1]
    pick = np.random.default_rng([t.seed, 1]).integers(0, len(pairs), t.num_requests)
    return pairs[pick, 0], pairs[pick, 1]


def _percentiles(x: np.ndarray) -> tuple[float, float, float]:
    if x.size == 0:
        return (0.0, 0.0, 0.0)
    return tuple(float(v) for v in np.percentile(x, [50, 90, 99]))


def per_token(first: np.ndarray, finish: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Each request's time per output token after the first (0 for a one-token output)."""
    steps = np.maximum(output - 1, 1)
    return np.where(output > 1, (finish - first) / steps, 0.0)


def measure(reps, arrivals, first, finish, prompt, output, kv_blocks: int, slo: SloSpec | None) -> ServingResult:
    ttft, e2e = first - arrivals, finish - arrivals
    tpot = per_token(first, finish, output)
    # TPOT's figures over the requests that have one (benchmark_serving's rule); all when none does
    tp = tpot[output > 1] if np.any(output > 1) else tpot
    span = float(finish.max() - arrivals.min())
    busy = [r for r in reps if r.iterations]
    good, met, at_p = len(arrivals), None, (float("nan"), float("nan"))
    if slo is not None:
        good = int(np.count_nonzero((ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)))
        at_p = (float(np.percentile(ttft, slo.percentile)), float(np.percentile(tp, slo.percentile)))
        met = slo.holds(*at_p)
    return ServingResult(
        requests=len(arrivals), ttft=_percentiles(ttft), tpot=_percentiles(tp), e2e=_percentiles(e2e),
        ttft_mean=float(ttft.mean()), tpot_mean=float(tp.mean()),
        output_tok_s=float(output.sum()) / span, total_tok_s=float((prompt + output).sum()) / span,
        req_s=len(arrivals) / span, makespan_s=span,
        kv_occupancy_mean=float(np.mean([r.kv_area / r.end for r in busy])) if busy else 0.0,
        kv_occupancy_max=max((r.kv_max for r in busy), default=0.0), kv_blocks=kv_blocks,
        preemptions=sum(r.preemptions for r in reps), iterations=sum(r.iterations for r in reps),
        goodput_req_s=good / span, slo_met=met, slo_ttft_s=at_p[0], slo_tpot_s=at_p[1])
