"""The serving question of a procurement (issue 53, item 4): with a ``serving`` section in the
candidates, the cheapest GPU kind, TP x replicas and precision that serves the trained model at
a request rate within the SLO, among the candidates' GPU kinds, answered beside the training
answer by the serving capacity search (``simcore.planner.serving_search``, the event engine).

    serving: {rate: 20, prompt_len: 1024, output_len: 256, ttft_ms: 500, tpot_ms: 50,
              percentile: 99, precisions: [bf16, fp8], tp: [1, 2, 4, 8], max_gpus: 512,
              num_requests: 1000}

``rate`` (requests per second, Poisson), the two lengths and at least one latency target are
required. The options are ranked by the first of the candidates' ways of paying that serving
prices (on-demand, reserved, buy; spot is not offered to a service that must stay up).
"""
from __future__ import annotations

import math

import pandas as pd

from simcore.plan.spec import PlanError
from simcore.planner.serving_search import MODES, PRECISIONS, SearchResult, capacity_search, search_nodes
from simcore.serving.load import serving_from_dict, slo_from_dict
from simcore.serving.spec import ServingPlan

KEYS = {"rate", "prompt_len", "output_len", "ttft_ms", "tpot_ms", "percentile", "precisions", "tp", "max_gpus",
        "num_requests"}
#: Requests a simulation serves where the section gives no count (as ``serve-plan``'s plans).
DEFAULT_REQUESTS = 1000


def check_serving_section(value) -> dict | None:
    """The ``serving`` section, checked field by field (one sentence naming the first bad one)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PlanError("candidates.serving must be a mapping (rate, prompt_len, output_len, ttft_ms, tpot_ms, ...)")
    unknown = sorted(set(value) - KEYS)
    if unknown:
        raise PlanError(f"unknown candidates.serving field '{unknown[0]}' (known: {', '.join(sorted(KEYS))})")
    for key in ("rate", "prompt_len", "output_len"):
        if key not in value:
            raise PlanError(f"candidates.serving needs '{key}'")
    for key in ("rate", "max_gpus", "prompt_len", "output_len", "num_requests"):
        v = value.get(key)
        whole = key != "rate"
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v <= 0 or (whole and v != int(v))):
            raise PlanError(f"candidates.serving.{key}={v!r} must be a positive {'whole ' if whole else ''}number")
    if "ttft_ms" not in value and "tpot_ms" not in value:
        raise PlanError("candidates.serving needs a latency target: ttft_ms or tpot_ms")
    slo_from_dict({k: value[k] for k in ("ttft_ms", "tpot_ms", "percentile") if k in value})
    for v in value.get("precisions") or ():
        if v not in PRECISIONS:
            raise PlanError(f"candidates.serving.precisions: '{v}' is not one of: {', '.join(PRECISIONS)}")
    for v in value.get("tp") or ():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PlanError(f"candidates.serving.tp: {v!r} must be a positive whole number")
    return dict(value)


def serving_plan(model: dict, s: dict, node: str) -> ServingPlan:
    """The serving plan the search varies: the candidates' model on ``node``, Poisson at the rate."""
    traffic = {"arrival": "poisson", "rate": s["rate"], "num_requests": int(s.get("num_requests", DEFAULT_REQUESTS)),
               "prompt_len": int(s["prompt_len"]), "output_len": int(s["output_len"])}
    slo = {k: s[k] for k in ("ttft_ms", "tpot_ms", "percentile") if k in s}
    try:
        return serving_from_dict({"name": f"{model.get('name', 'model')}-serving", "model": model,
                                  "hardware": {"node": node}, "traffic": traffic, "slo": slo})
    except PlanError as exc:
        raise PlanError(f"candidates.serving: {exc}") from None


def ranking_mode(modes: tuple[str, ...]) -> str:
    """The first of the candidates' ways of paying that serving prices (on-demand otherwise)."""
    return next((m for m in modes if m in MODES), "on_demand")


def serving_search(model: dict, s: dict, gpus: tuple[str, ...], modes: tuple[str, ...], jobs: int = 1) -> SearchResult:
    """The serving capacity search over ``gpus`` (those of them the serving cost model covers)."""
    nodes, _ = search_nodes(list(gpus) or None)
    if not nodes:
        raise PlanError("candidates.serving: none of the candidates' GPUs has a rental price and the serving "
                        "cost model's figures")
    plan = serving_plan(model, s, nodes[0])
    return capacity_search(plan, slo=plan.slo, rate=float(s["rate"]), gpus=list(gpus) or None,
                           precisions=s.get("precisions"), tps=s.get("tp"), max_gpus=int(s.get("max_gpus", 512)),
                           mode=ranking_mode(modes), jobs=jobs)


def serving_summary(res: SearchResult) -> str:
    """The answer in a few words, for a report's summary."""
    best = res.best
    if best is None:
        return f"none meets the SLO at {res.rate:g} req/s"
    return (f"{best.gpus} x {best.gpu} (TP{best.tp} x {best.replicas}, {best.precision}), "
            f"${best.usd_per_mtok[res.mode]:.3f}/Mtok at {res.rate:g} req/s")


def serving_answer(res: SearchResult, s: dict) -> str:
    """One sentence: the cheapest option that meets the SLO at the rate, or that none does."""
    head = (f"Serving it at {res.rate:g} req/s (prompt {s['prompt_len']}, output {s['output_len']} tokens), "
            f"SLO {res.slo.describe()}: ")
    best = res.best
    if best is None:
        return head + "no searched GPU kind, precision and TP meets the SLO (see the serving table)."
    p = res.slo.percentile
    return (head + f"{best.gpus} x {best.gpu} as {best.replicas} replica(s) of TP{best.tp} in {best.precision}, "
            f"${best.usd_per_mtok[res.mode]:.3f} per million output tokens ({res.mode.replace('_', '-')}, "
            f"${best.usd_per_gpu_hour[res.mode]:.2f} per GPU-hour), p{p:g} TTFT {best.result.slo_ttft_s * 1e3:.0f} ms, "
            f"p{p:g} TPOT {best.result.slo_tpot_s * 1e3:.1f} ms (event engine).")


def serving_table(res: SearchResult, rows: int = 20) -> pd.DataFrame:
    """The options that meet the SLO, cheapest first, then why the others cannot."""
    p = res.slo.percentile
    out = []
    for o in res.options[:rows]:
        r = o.result
        out.append({"gpu": o.gpu, "precision": o.precision, "TP x replicas": f"{o.tp} x {o.replicas}" if o.met else "-",
                    "GPUs": o.gpus if o.met else "-",
                    f"p{p:g} TTFT ms": round(r.slo_ttft_s * 1e3, 1) if o.met else "-",
                    f"p{p:g} TPOT ms": round(r.slo_tpot_s * 1e3, 2) if o.met else "-",
                    **{f"$/Mtok {m.replace('_', '-')}": (round(o.usd_per_mtok[m], 3)
                                                          if o.met and math.isfinite(o.usd_per_mtok[m]) else "-")
                       for m in MODES},
                    "kWh/Mtok": round(o.kwh_per_mtok, 3) if o.met and math.isfinite(o.kwh_per_mtok) else "-",
                    "why not": o.why if not o.met else ""})
    return pd.DataFrame(out)


def serving_doc(res: SearchResult, s: dict) -> dict:
    """The search as JSON: the answer, the rate, the ranking mode and every option's figures."""
    options = []
    for o in res.options:
        r = o.result
        options.append({"gpu": o.gpu, "node": o.node, "precision": o.precision, "tp": o.tp, "replicas": o.replicas,
                        "met": o.met, "why": o.why, "usd_per_mtok": o.usd_per_mtok, "usd_per_gpu_hour": o.usd_per_gpu_hour,
                        "kwh_per_mtok": o.kwh_per_mtok, "slo_ttft_s": r.slo_ttft_s if r else None,
                        "slo_tpot_s": r.slo_tpot_s if r else None, "goodput_req_s": r.goodput_req_s if r else None})
    return {"answer": serving_answer(res, s), "rate": res.rate, "mode": res.mode, "slo": res.slo.describe(),
            "left_out": res.left_out, "options": options}
