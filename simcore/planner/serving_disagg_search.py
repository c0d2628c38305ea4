"""The capacity search's disaggregated options (``serve-plan --disaggregate``): for each GPU kind,
precision and pair of TP degrees (prefill, decode), the fewest prefill and decode instances that
meet the SLO at the rate (DistServe, Zhong et al., OSDI 2024, Sec. 4: each phase sized for its own
target).

The two pools are sized apart, as their latencies are apart: a request's first token comes from
the prefill pool alone (``simcore.engine.serving``: the first token equals the prefill pool's own
run), so the fewest prefill instances are those whose prompts-only run meets the TTFT target; the
decode pool then takes the fewest instances that meet the TPOT target behind that prefill pool.
Each count is found as the co-located search finds replicas: from a saturation lower bound,
doubled until the target holds, then bisected.
"""
from __future__ import annotations

import math
from dataclasses import replace

from simcore.engine.serving import simulate_serving
from simcore.serving.cost import replica_cost
from simcore.serving.spec import Arrival, DisaggSpec, ServingPlan, SloSpec, at_rate, sized


def _fewest(lo: int, cap: int, holds) -> tuple[int, object, int]:
    """(the fewest n in [lo, cap] with ``holds(n)`` true, its result, calls); 0 where none does.
    ``holds(n)`` -> (bool, result); it holds for every n above one where it holds."""
    calls, failed, hi, best = 0, lo - 1, lo, None
    while True:
        ok, r = holds(hi)
        calls += 1
        if ok:
            best = r
            break
        failed = hi
        if hi >= cap:
            return 0, None, calls
        hi = min(cap, 2 * hi)
    while hi - failed > 1:
        mid = (hi + failed) // 2
        ok, r = holds(mid)
        calls += 1
        if ok:
            hi, best = mid, r
        else:
            failed = mid
    return hi, best, calls


def prompts_only(plan: ServingPlan) -> ServingPlan:
    """The traffic with every output one token: what a prefill instance serves."""
    t = plan.traffic
    pairs = tuple((p, 1) for p, _ in t.dataset) if t.dataset else None
    return replace(plan, traffic=replace(t, output_len=1, dataset=pairs))


def fewest_pools(plan: ServingPlan, prefill_tp: int, slo: SloSpec, rate: float,
                 max_gpus: int) -> tuple[int, int, object, int, str]:
    """(prefill instances, decode instances, result, simulations, why) for ``plan`` (the decode
    instances' node, precision and TP) with prefill instances of TP ``prefill_tp``."""
    pre = replace(prompts_only(at_rate(plan, rate)), tp=prefill_tp, replicas=1)
    rc_pre = replica_cost(pre)
    off = replace(pre, traffic=replace(pre.traffic, arrival=Arrival.OFFLINE,
                                       num_requests=max(2 * pre.scheduler.max_num_seqs, 64)))
    sat = simulate_serving(off, rc_pre).req_s
    sims = 1
    p_lo, p_cap = max(1, math.ceil(rate / sat)), max(0, (max_gpus - plan.tp) // prefill_tp)
    if p_lo > p_cap:
        return 0, 0, None, sims, f"needs at least {p_lo} prefill instances of TP{prefill_tp} (beyond {max_gpus} GPUs)"

    def ttft_holds(n: int):
        r = simulate_serving(replace(pre, replicas=n), rc_pre, slo)
        return r.slo_ttft_s <= slo.ttft_s, r

    prefills, _, calls = _fewest(p_lo, p_cap, ttft_holds)
    sims += calls
    if not prefills:
        return 0, 0, None, sims, f"the TTFT target misses with {p_cap} prefill instances of TP{prefill_tp}"
    pooled = replace(at_rate(plan, rate), disaggregation=DisaggSpec(prefill_tp=prefill_tp, prefill_replicas=prefills))
    rc = replica_cost(replace(pooled, disaggregation=None))
    d_cap = (max_gpus - prefills * prefill_tp) // plan.tp

    def both_hold(n: int):
        r = simulate_serving(sized(replace(pooled, replicas=n)), rc, slo)
        return bool(r.slo_met), r

    decodes, result, calls = _fewest(1, d_cap, both_hold) if d_cap >= 1 else (0, None, 0)
    sims += calls
    if not decodes:
        return prefills, 0, None, sims, f"the TPOT target misses with {d_cap} decode instances of TP{plan.tp}"
    return prefills, decodes, result, sims, ""
