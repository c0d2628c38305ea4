"""serve: a serving plan's traffic on its replicas through the event engine; latency percentiles,
throughput, KV-cache occupancy, goodput under the plan's SLO; with --run, the same traffic on this
host's serving loop, measured beside the prediction (--calibrate: the loop's costs on this host for
the plan's model first; ``trainplan.serving_run``). serve-plan: the cheapest GPU kind,
TP x replicas and precision that serves a rate within the SLO, and each option's frontier."""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, replace

from reports.plots import save_figure
from reports.serving_plots import serving_chrome_trace, serving_figure
from simcore.engine.serving import ServingTimeline, simulate_serving
from simcore.plan.spec import PlanError
from simcore.results import atomic_write_text
from simcore.serving.cost import replica_cost
from simcore.serving.load import load_serving_plan, slo_from_dict
from simcore.serving.spec import Arrival

_MODE_LABEL = {"on_demand": "on-demand", "reserved": "reserved", "buy": "buy"}


def _ms(xs) -> str:
    return "  ".join(f"{x * 1e3:9.1f}" for x in xs)


def _serving_host(args, plan):
    """This host's serving-loop figures for the plan's model (measured first where --calibrate asks,
    or --run needs them and none are kept); a note where a localhost plan is predicted without them."""
    from trainplan.serving_run import calibrate_serving, check_runnable, host_costs_for, serving_calibration_path

    if args.run or args.calibrate:
        check_runnable(plan)
    host = host_costs_for(plan)
    if args.calibrate or (args.run and host is None):
        print(f"trainplan: measuring the serving loop's costs for {plan.model.name} on this host", file=sys.stderr)
        host, path = calibrate_serving(plan)
        print(f"trainplan: wrote {path}", file=sys.stderr)
    elif host is None and plan.cluster.node.name == "localhost":
        print(f"trainplan: note: {serving_calibration_path()} has no serving-loop figures for this model: the "
              "prediction is the profile's roofline alone (trainplan serve PLAN --calibrate measures them)", file=sys.stderr)
    return host


def _print_measured(r, m) -> None:
    """The loop's measured figures beside the prediction's, with the error of each."""
    print("\nmeasured on this host's serving loop (executors/serving_loop.py) beside the prediction:")
    print(f"{'':24}{'predicted':>11}  {'measured':>11}  {'error':>7}")
    rows = [("TTFT p50 (ms)", r.ttft[0] * 1e3, m.ttft[0] * 1e3), ("TTFT p90 (ms)", r.ttft[1] * 1e3, m.ttft[1] * 1e3),
            ("TPOT p50 (ms)", r.tpot[0] * 1e3, m.tpot[0] * 1e3), ("TPOT p90 (ms)", r.tpot[1] * 1e3, m.tpot[1] * 1e3),
            ("end-to-end p50 (ms)", r.e2e[0] * 1e3, m.e2e[0] * 1e3), ("output tok/s", r.output_tok_s, m.output_tok_s),
            ("makespan (s)", r.makespan_s, m.makespan_s), ("iterations", r.iterations, m.iterations),
            ("preemptions", r.preemptions, m.preemptions)]
    for name, p, x in rows:
        err = f"{p / x - 1:+7.1%}" if x else "      -"
        form = ",d" if isinstance(p, int) else ",.2f"
        print(f"{name:24}{p:>11{form}}  {x:>11{form}}  {err}")


def cmd_serve(args) -> None:
    plan = load_serving_plan(args.plan)
    rc = replica_cost(plan, host=_serving_host(args, plan))
    timeline = ServingTimeline() if (args.trace or args.plot) else None
    r = simulate_serving(plan, rc, timeline=timeline)
    measured = None
    if args.run:
        from trainplan.serving_run import run_serving

        measured, _ = run_serving(plan)
    if timeline is not None:
        _write_pictures(args, plan, timeline)
    if args.json:
        print(json.dumps({"plan": plan.name, **asdict(r), **({"measured": asdict(measured)} if measured else {})},
                         indent=2))
        return
    t = plan.traffic
    load = {Arrival.POISSON: f"{t.rate:g} req/s Poisson", Arrival.OFFLINE: "offline (all at t=0)",
            Arrival.CONCURRENCY: f"a closed loop of {t.concurrency} clients"}.get(t.arrival) or (
        f"the trace's arrivals at {t.rate or t.trace_rate:.3g} req/s" + (f" (its own {t.trace_rate:.3g})" if t.rate else ""))
    d = plan.disaggregation
    pools = f"{plan.replicas} x TP{plan.tp}" if d is None else \
        f"prefill {d.prefill_replicas} x TP{d.prefill_tp} + decode {plan.replicas} x TP{plan.tp}"
    print(f"{plan.name}: {plan.model.name} on {pools} {plan.cluster.node.gpu.name}, "
          f"{plan.precision.weights}/{plan.precision.activations}/KV {plan.precision.kv_cache}, router {plan.router}")
    lengths = (f"prompt {t.prompt_len}, output {t.output_len} tokens" if not t.dataset else
               f"lengths {'from' if t.arrival == Arrival.TRACE else 'drawn from'} {t.dataset_path} "
               f"({len(t.dataset):,} requests; mean prompt {t.prompt_len}, "
               f"mean output {t.output_len}, longest {t.max_total} tokens)")
    print(f"traffic: {r.requests} requests, {load}, {lengths}")
    s = plan.scheduler
    print(f"scheduler: {s.capacity_policy} admission, at most {s.max_num_seqs} requests and "
          f"{s.max_num_batched_tokens} tokens an iteration, chunked prefill {'on' if s.chunked_prefill else 'off'}")
    print(f"KV cache: {r.kv_blocks} blocks of {plan.kv_cache.block_size} tokens per replica "
          f"({rc.weight_bytes / 2**30:.1f} GiB weights per GPU)")
    print(f"{'':22}{'p50':>9}  {'p90':>9}  {'p99':>9}  (ms)")
    print(f"{'TTFT':22}{_ms(r.ttft)}")
    print(f"{'TPOT':22}{_ms(r.tpot)}")
    print(f"{'end-to-end latency':22}{_ms(r.e2e)}")
    print(f"throughput: {r.output_tok_s:,.0f} output tok/s, {r.total_tok_s:,.0f} total tok/s, {r.req_s:.2f} req/s "
          f"over {r.makespan_s:.1f} s")
    print(f"KV occupancy: mean {r.kv_occupancy_mean:.0%}, max {r.kv_occupancy_max:.0%}; "
          f"{r.preemptions} preemptions, {r.iterations} iterations")
    if plan.slo is not None:
        p = plan.slo.percentile
        print(f"SLO {plan.slo.describe()}: {'holds' if r.slo_met else 'MISSED'} (p{p:g} TTFT {r.slo_ttft_s * 1e3:.1f} ms, "
              f"p{p:g} TPOT {r.slo_tpot_s * 1e3:.2f} ms); goodput {r.goodput_req_s:.2f} of {r.req_s:.2f} req/s")
    if measured is not None:
        _print_measured(r, measured)


def _search_inputs(args):
    """The plan, its SLO (the plan's, then the flags') and the rate (the plan's Poisson rate, or --rate)."""
    plan = load_serving_plan(args.plan)
    slo = plan.slo
    flags = {k: v for k, v in (("ttft_ms", args.ttft_ms), ("tpot_ms", args.tpot_ms),
                               ("percentile", args.percentile)) if v is not None}
    if flags:
        base = {} if slo is None else {k: v * 1e3 for k, v in (("ttft_ms", slo.ttft_s), ("tpot_ms", slo.tpot_s))
                                       if math.isfinite(v)} | {"percentile": slo.percentile}
        slo = slo_from_dict(base | flags)
    if slo is None:
        raise PlanError("serve-plan needs an SLO: a slo section in the plan, or --ttft-ms / --tpot-ms")
    t = plan.traffic
    own = t.rate if t.arrival == Arrival.POISSON else (t.rate or t.trace_rate) if t.arrival == Arrival.TRACE else None
    rate = args.rate if args.rate is not None else own
    if rate is None:
        raise PlanError("serve-plan needs a request rate: traffic.arrival=poisson with traffic.rate, or --rate")
    return plan, slo, rate


def _csv(value: str | None, cast=str) -> list | None:
    if not value:
        return None
    try:
        return [cast(x.strip()) for x in value.split(",") if x.strip()]
    except ValueError:
        raise PlanError(f"{value!r} must be a comma-separated list of {cast.__name__}") from None


def _money(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.3f}"


def _option_row(i: int, o, mode: str) -> str:
    r = o.result
    return (f"{i:>4}  {o.gpu:<10} {o.node:<14} {o.precision:<5} {o.layout:<22} {o.gpus:>5}  "
            f"{r.slo_ttft_s * 1e3:>9.1f}  {r.slo_tpot_s * 1e3:>9.2f}  {r.goodput_req_s:>8.2f}  "
            + "  ".join(f"{_money(o.usd_per_mtok[m]):>9}" for m in ("on_demand", "reserved", "buy"))
            + f"  {o.kwh_per_mtok:>8.3f}" + ("  <- ranked by " + _MODE_LABEL[mode] if i == 1 else ""))


def _print_frontier(plan, res, top: int) -> None:
    from simcore.planner.serving_search import frontier

    for o in [o for o in res.options if o.met][:top]:
        print(f"\nfrontier of {o.gpu} {o.precision} {o.layout} ({o.gpus} GPUs): load against latency (ms)")
        print(f"  {'load req/s':>10}  {'TTFT p50':>9}  {'TTFT p99':>9}  {'TPOT p50':>9}  {'TPOT p99':>9}  "
              f"{'out tok/s':>10}  {'goodput':>8}  SLO")
        for rate, r in frontier(plan, o, res.slo, res.rate):
            print(f"  {rate:>10.2f}  {r.ttft[0] * 1e3:>9.1f}  {r.ttft[2] * 1e3:>9.1f}  {r.tpot[0] * 1e3:>9.2f}  "
                  f"{r.tpot[2] * 1e3:>9.2f}  {r.output_tok_s:>10,.0f}  {r.goodput_req_s:>8.2f}  "
                  f"{'holds' if r.slo_met else 'missed'}")


def _write_pictures(args, plan, timeline: ServingTimeline) -> None:
    """``--trace``: the iterations as a Chrome trace; ``--plot``: the KV cache, the decoding
    requests and the latency distributions in one figure. Each path said on stderr."""
    if args.trace:
        doc, left_out = serving_chrome_trace(timeline, plan.name)
        atomic_write_text(args.trace, json.dumps(doc))
        tail = f" (the first {len(timeline.iterations) - left_out:,} of {len(timeline.iterations):,} iterations)" \
            if left_out else ""
        print(f"trainplan: wrote {args.trace}{tail}", file=sys.stderr)
    if args.plot:
        save_figure(serving_figure(timeline, plan.name), args.plot)
        print(f"trainplan: wrote {args.plot}", file=sys.stderr)


def cmd_serve_plan(args) -> None:
    from simcore.planner.serving_search import capacity_search

    plan, slo, rate = _search_inputs(args)
    t0 = time.perf_counter()
    res = capacity_search(plan, slo=slo, rate=rate, gpus=_csv(args.gpus), precisions=_csv(args.precisions),
                          tps=_csv(args.tp, int), max_gpus=args.max_gpus, mode=args.mode, jobs=args.jobs,
                          disaggregated=args.disaggregate)
    wall = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"plan": plan.name, "rate": rate, "slo": asdict(slo), "mode": args.mode, "wall_s": wall,
                          "left_out": res.left_out, "options": [asdict(o) for o in res.options]}, indent=2, default=str))
        return
    t = plan.traffic
    met = [o for o in res.options if o.met]
    mean = "mean " if t.dataset else ""
    print(f"serve-plan: {plan.model.name} at {rate:g} req/s Poisson ({mean}prompt {t.prompt_len}, output {t.output_len} "
          f"tokens, {t.num_requests} requests a simulation), SLO {slo.describe()}, router {plan.router}")
    what = "GPU kind x precision x prefill TP x decode TP" if args.disaggregate else "GPU kind x precision x TP"
    print(f"searched {len(res.options)} variants ({what}) with "
          f"{sum(o.simulations for o in res.options)} simulations in {wall:.1f} s; {len(met)} meet the SLO")
    if res.left_out:
        print("not searched: " + "; ".join(f"{g} ({why})" for g, why in res.left_out.items()))
    p = slo.percentile
    print(f"\n{'rank':>4}  {'gpu':<10} {'node':<14} {'prec':<5} {'layout':<22} {'GPUs':>5}  {f'p{p:g} TTFT':>9}  "
          f"{f'p{p:g} TPOT':>9}  {'goodput':>8}  {'$/Mtok od':>9}  {'reserved':>9}  {'buy':>9}  {'kWh/Mtok':>8}")
    for i, o in enumerate(met[:args.top], 1):
        print(_option_row(i, o, res.mode))
    misses = [o for o in res.options if not o.met]
    for o in misses[:args.top]:
        print(f"   -  {o.gpu:<10} {o.node:<14} {o.precision:<5} {'TP' + str(o.tp):<22} {'':>5}  {o.why}")
    if len(misses) > args.top:
        print(f"   ... and {len(misses) - args.top} more variants that cannot meet the SLO")
    best = res.best
    if best is None:
        print("\nanswer: no searched option meets the SLO at this rate (see why above)")
        return
    shape = (f"{best.replicas} replica(s) of TP{best.tp}" if not best.prefill_tp else
             f"{best.prefill_replicas} prefill instance(s) of TP{best.prefill_tp} and {best.replicas} decode "
             f"instance(s) of TP{best.tp}")
    print(f"\nanswer: {best.gpus} x {best.gpu} ({best.node}) as {shape}, "
          f"{best.precision}: ${best.usd_per_mtok[res.mode]:.3f} per million output tokens "
          f"({_MODE_LABEL[res.mode]}, ${best.usd_per_gpu_hour[res.mode]:.2f} per GPU-hour), "
          f"p{p:g} TTFT {best.result.slo_ttft_s * 1e3:.0f} ms, p{p:g} TPOT {best.result.slo_tpot_s * 1e3:.1f} ms")
    print("cost: GPU-hours at the catalog's prices over one hour of the traffic's output tokens; buy = capex a used "
          "GPU-hour carries + facility + energy at TDP x PUE; kWh at TDP x PUE (an upper bound)")
    if args.frontier:
        _print_frontier(replace(plan, slo=slo), res, args.frontier)
