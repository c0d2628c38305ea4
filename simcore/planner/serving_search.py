"""Serving capacity search (issue 53, item 4): the cheapest GPU kind, TP degree x replicas and
precision that serves a traffic rate within the SLOs, priced per million output tokens.

A *variant* is a catalog node (one per GPU kind that has a rental price and the figures the
cost model needs), a precision (bf16 throughout; fp8 weights, GEMMs and KV cache where the GPU
has an FP8 peak; the weight-only w8a16 and w4a16 where named) and a TP degree (1, 2, 4, 8 within a node, dividing the heads, the weights
fitting). Its *option* is the fewest replicas that meet the SLO at the rate, found by the event
engine: one replica's offline saturation throughput gives the lower bound ceil(rate / saturation)
(fewer cannot keep up; one fewer is simulated to confirm it), then the replicas double until the
SLO holds and a bisection finds the fewest (more replicas never make a replica's share of the
traffic heavier). A variant whose lone
request misses a target (its prefill alone over the TTFT target, one decode step over the TPOT
target) or that needs more than ``max_gpus`` fails without a search.

Cost of an option at the rate it is sized for: its GPU-hours at the catalog's rental prices
(``simcore.planner.prices.resolve_prices``: on-demand, reserved) or, buying, the capex a used
GPU-hour carries, the facility and the energy (``buy_sheet``), over the output tokens of an hour
of the traffic: $ per million output tokens. Energy: the GPUs at their TDP times the PUE (an
upper bound: a serving GPU seldom draws its TDP), kWh per million output tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from simcore.engine.serving import ServingResult, simulate_serving
from simcore.plan.spec import PlanError
from simcore.planner.prices import buy_sheet, resolve_prices
from simcore.planner.serving_disagg_search import fewest_pools
from simcore.planner.workers import imap
from simcore.model.compute import device_model
from simcore.serving.cost import decode_s, prefill_s, replica_cost
from simcore.serving.spec import (Arrival, DisaggSpec, Dtype, PrecisionSpec, ServingPlan, SloSpec, at_rate,
                                  check_serving, sized)
from topologies.components import CatalogError
from topologies.hardware import load_catalog

PRECISIONS = {"bf16": PrecisionSpec(weights=Dtype.BF16, activations=Dtype.BF16, kv_cache=Dtype.BF16),
              "fp8": PrecisionSpec(weights=Dtype.FP8, activations=Dtype.FP8, kv_cache=Dtype.FP8),
              "w8a16": PrecisionSpec(weights=Dtype.INT8, activations=Dtype.BF16, kv_cache=Dtype.BF16),
              "w4a16": PrecisionSpec(weights=Dtype.INT4, activations=Dtype.BF16, kv_cache=Dtype.BF16)}
#: Searched unless asked otherwise: the weight-only formats trade accuracy the model does not
#: price, so they are ranked only when named (``--precisions bf16,fp8,w4a16``).
DEFAULT_PRECISIONS = ("bf16", "fp8")
MODES = ("on_demand", "reserved", "buy")
#: Loads of the throughput-latency frontier, as multiples of the target rate.
FRONTIER_LOADS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingOption:
    """One variant's fewest replicas that meet the SLO (``met`` false: none within ``max_gpus``)."""

    node: str
    gpu: str
    precision: str
    tp: int
    replicas: int
    met: bool
    why: str
    """Why no replica count meets the SLO ('' where one does)."""
    result: ServingResult | None
    usd_per_gpu_hour: dict
    """Mode -> $ per GPU-hour (NaN where the catalog has no price)."""
    usd_per_mtok: dict
    """Mode -> $ per million output tokens at the target rate."""
    kwh_per_mtok: float
    simulations: int
    prefill_tp: int = 0
    prefill_replicas: int = 0
    """A disaggregated option's prefill instances (``serving_disagg_search``); 0: co-located."""

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas + self.prefill_tp * self.prefill_replicas

    @property
    def layout(self) -> str:
        co = f"TP{self.tp} x {self.replicas}"
        return co if not self.prefill_tp else f"P TP{self.prefill_tp} x {self.prefill_replicas} + D {co}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    options: list[ServingOption]
    """Ranked: those meeting the SLO first, cheapest in ``mode`` first."""
    left_out: dict[str, str]
    """Priced GPU kinds not searched -> why (the cost model lacks a figure)."""
    slo: SloSpec
    rate: float
    mode: str

    @property
    def best(self) -> ServingOption | None:
        o = self.options[0] if self.options else None
        return o if o is not None and o.met and not math.isnan(o.usd_per_mtok[self.mode]) else None


def search_nodes(gpus: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """One catalog node per GPU kind with a rental price and the cost model's figures (the first
    listed), or the named GPUs'; and the priced GPU kinds left out, with why."""
    cat = load_catalog()
    seen, out, left = set(), [], {}
    for name in cat.nodes:
        gpu = cat.node(name).gpu
        if gpu.name in seen or gpu.name not in cat.prices.gpus or (gpus and gpu.name not in gpus):
            continue
        seen.add(gpu.name)
        try:
            device_model(gpu, "bf16")
        except (PlanError, CatalogError) as exc:
            left[gpu.name] = str(exc).split(" (known")[0]
            continue
        out.append(name)
    missing = sorted(set(gpus or ()) - seen)
    if missing:
        known = ", ".join(sorted(g for g in cat.prices.gpus))
        raise PlanError(f"--gpus names {', '.join(missing)}, which no priced catalog node holds (known: {known})")
    return out, left


def variant(plan: ServingPlan, node: str, precision: str, tp: int, replicas: int = 1) -> ServingPlan:
    """The plan on ``node`` at ``precision``, TP ``tp`` and ``replicas`` (checked)."""
    from simcore.plan.load import _cluster

    v = sized(replace(plan, cluster=_cluster({"node": node}, load_catalog(), None), tp=tp, replicas=replicas,
                      precision=PRECISIONS[precision], name=f"{plan.model.name}-{node}-{precision}-tp{tp}x{replicas}"))
    check_serving(v)
    return v


def prices_of(plan: ServingPlan) -> tuple[dict, float]:
    """($ per GPU-hour by mode, kW per GPU at the wall), from the catalog."""
    gpu = plan.cluster.node.gpu
    cat = load_catalog().prices
    try:
        sheet = resolve_prices(plan)
        out = {"on_demand": sheet.on_demand_usd, "reserved": sheet.reserved_usd}
    except PlanError:
        out = {"on_demand": math.nan, "reserved": math.nan}
    kw = gpu.tdp_w / 1000 * cat.pue if math.isfinite(gpu.tdp_w) and gpu.tdp_w > 0 else math.nan
    try:
        b = buy_sheet(gpu.name, plan.cluster.fabric.name if plan.cluster.fabric else None)
        out["buy"] = b.capex_usd_per_gpu_hour() + b.facility_usd_per_gpu_hour(gpu.tdp_w) + kw * cat.usd_per_kwh
    except PlanError:
        out["buy"] = math.nan
    return out, kw


def _lone_request_misses(plan: ServingPlan, rc, slo: SloSpec) -> str:
    t = plan.traffic
    first = prefill_s(rc, t.prompt_len)
    if first > slo.ttft_s:
        return f"one request's prefill takes {first * 1e3:.0f} ms > TTFT {slo.ttft_s * 1e3:g} ms"
    step = decode_s(rc, 1, t.prompt_len + t.output_len)
    if step > slo.tpot_s:
        return f"one decode step takes {step * 1e3:.1f} ms > TPOT {slo.tpot_s * 1e3:g} ms"
    return ""


def _fewest_replicas(plan: ServingPlan, rc, slo: SloSpec, rate: float, max_gpus: int):
    """(replicas, result, simulations, why): the fewest replicas meeting ``slo`` at ``rate``."""
    t = plan.traffic
    off = replace(plan, replicas=1, traffic=replace(t, arrival=Arrival.OFFLINE,
                                                    num_requests=max(2 * plan.scheduler.max_num_seqs, 64)))
    sat = simulate_serving(off, rc).req_s
    cap = max_gpus // plan.tp
    lo = max(1, math.ceil(rate / sat))          # fewer cannot keep up
    if lo > cap:
        return 0, None, 1, f"needs at least {lo * plan.tp} GPUs (saturation {sat:.2f} req/s a replica) > {max_gpus}"
    sims, failed, hi, best = 1, 0, lo, None
    while True:
        r = simulate_serving(replace(at_rate(plan, rate), replicas=hi), rc, slo)
        sims += 1
        if r.slo_met:
            best = r
            break
        failed = hi
        if hi >= cap:
            return 0, None, sims, f"misses the SLO with {cap * plan.tp} GPUs (the most searched)"
        hi = min(cap, 2 * hi)
    if hi == lo and lo > 1:                     # check the bound: lo - 1 must miss
        failed = lo - 1
        r = simulate_serving(replace(at_rate(plan, rate), replicas=failed), rc, slo)
        sims += 1
        if r.slo_met:
            hi, best, failed = failed, r, 0
    elif hi > lo:
        failed = max(failed, lo - 1)
    while hi - failed > 1:
        mid = (hi + failed) // 2
        r = simulate_serving(replace(at_rate(plan, rate), replicas=mid), rc, slo)
        sims += 1
        if r.slo_met:
            hi, best = mid, r
        else:
            failed = mid
    return hi, best, sims, ""


def evaluate(args) -> ServingOption:
    """One variant's option (``args``: plan, node, precision, tp, slo, rate, max_gpus, and the
    prefill TP of a disaggregated variant, 0 for co-located replicas)."""
    plan, node, precision, tp, slo, rate, max_gpus, prefill_tp = args
    replicas, prefills, result, sims, why = 0, 0, None, 0, ""
    try:
        v = variant(plan, node, precision, tp)
        rc = replica_cost(v)
        why = _lone_request_misses(v, rc, slo)
        if not why and prefill_tp:
            check_serving(replace(v, disaggregation=DisaggSpec(prefill_tp=prefill_tp, prefill_replicas=1)))
            prefills, replicas, result, sims, why = fewest_pools(v, prefill_tp, slo, rate, max_gpus)
        elif not why:
            replicas, result, sims, why = _fewest_replicas(v, rc, slo, rate, max_gpus)
    except PlanError as exc:
        v, why = None, str(exc)
    gpu = load_catalog().node(node).gpu
    prices, kw = prices_of(v) if v is not None else ({m: math.nan for m in MODES}, math.nan)
    mtok_h = rate * plan.traffic.output_len * 3600 / 1e6
    gpus = tp * replicas + (prefill_tp * prefills if result is not None else 0)
    return ServingOption(
        node=node, gpu=gpu.name, precision=precision, tp=tp, replicas=replicas, met=result is not None, why=why,
        result=result, usd_per_gpu_hour=prices,
        usd_per_mtok={m: (gpus * p / mtok_h if result is not None else math.nan) for m, p in prices.items()},
        kwh_per_mtok=gpus * kw / mtok_h if result is not None else math.nan, simulations=sims,
        prefill_tp=prefill_tp if result is not None else 0, prefill_replicas=prefills if result is not None else 0)


def variants(plan: ServingPlan, nodes: list[str], precisions: list[str], tps: list[int]) -> list[tuple]:
    """(node, precision, tp) to search: TP within a node and dividing the heads; fp8 where the GPU has a peak."""
    cat, out = load_catalog(), []
    for node in nodes:
        n = cat.node(node)
        for precision in precisions:
            if precision == "fp8" and not n.gpu.peak("fp8"):
                continue
            out += [(node, precision, tp) for tp in tps if tp <= n.gpus_per_node and plan.model.heads % tp == 0]
    return out


def capacity_search(plan: ServingPlan, *, slo: SloSpec, rate: float, gpus: list[str] | None = None,
                    precisions: list[str] | None = None, tps: list[int] | None = None, max_gpus: int = 512,
                    mode: str = "on_demand", jobs: int = 1, disaggregated: bool = False) -> SearchResult:
    """Every variant's option, those that meet the SLO first, cheapest (in ``mode``) first;
    ``disaggregated``: prefill and decode pools of every pair of TP degrees instead of
    co-located replicas (``simcore.planner.serving_disagg_search``)."""
    if mode not in MODES:
        raise PlanError(f"mode={mode!r} is not one of: {', '.join(MODES)}")
    if plan.disaggregation is not None:
        raise PlanError("the capacity search sizes co-located replicas; serve a disaggregated plan with "
                        "`trainplan serve` (drop its disaggregation section to search)")
    if not rate > 0:
        raise PlanError(f"rate={rate!r} must be a positive number of requests per second")
    bad = sorted(set(precisions or ()) - set(PRECISIONS))
    if bad:
        raise PlanError(f"precision {', '.join(bad)} is not one of: {', '.join(PRECISIONS)}")
    nodes, left = search_nodes(gpus)
    cells = variants(plan, nodes, precisions or list(DEFAULT_PRECISIONS), tps or [1, 2, 4, 8])
    pairs = sorted({tp for _, _, tp in cells}) if disaggregated else [0]
    items = [(plan, node, prec, tp, slo, rate, max_gpus, p) for node, prec, tp in cells for p in pairs]
    options = list(imap(evaluate, items, jobs))
    ranked = sorted(options, key=lambda o: (not o.met, _nan_last(o.usd_per_mtok.get(mode, math.nan)), o.gpus))
    return SearchResult(options=ranked, left_out=left, slo=slo, rate=rate, mode=mode)


def _nan_last(x: float) -> float:
    return math.inf if math.isnan(x) else x


def frontier(plan: ServingPlan, option: ServingOption, slo: SloSpec, rate: float,
             loads: tuple[float, ...] = FRONTIER_LOADS) -> list[tuple[float, ServingResult]]:
    """The option's throughput-latency frontier: (rate, result) at each multiple of the target rate."""
    v = variant(plan, option.node, option.precision, option.tp, option.replicas)
    rc = replica_cost(v)
    if option.prefill_tp:
        v = sized(replace(v, disaggregation=DisaggSpec(prefill_tp=option.prefill_tp,
                                                       prefill_replicas=option.prefill_replicas)))
    return [(x * rate, simulate_serving(at_rate(v, x * rate), rc, slo)) for x in loads]
