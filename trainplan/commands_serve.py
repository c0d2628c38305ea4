"""serve: a serving plan's traffic on its replicas through the event engine; latency percentiles,
throughput and KV-cache occupancy."""
from __future__ import annotations

import json
from dataclasses import asdict

from simcore.engine.serving import simulate_serving
from simcore.serving.cost import replica_cost
from simcore.serving.load import load_serving_plan


def cmd_serve(args) -> None:
    plan = load_serving_plan(args.plan)
    rc = replica_cost(plan)
    r = simulate_serving(plan, rc)
    if args.json:
        print(json.dumps({"plan": plan.name, **asdict(r)}, indent=2))
        return
    t = plan.traffic
    load = f"{t.rate:g} req/s Poisson" if t.arrival.value == "poisson" else "offline (all at t=0)"
    ms = lambda xs: "  ".join(f"{x * 1e3:9.1f}" for x in xs)   # noqa: E731
    print(f"{plan.name}: {plan.model.name} on {plan.replicas} x TP{plan.tp} {plan.cluster.node.gpu.name}, "
          f"{plan.precision.weights}/{plan.precision.activations}/KV {plan.precision.kv_cache}")
    print(f"traffic: {r.requests} requests, {load}, prompt {t.prompt_len}, output {t.output_len} tokens")
    print(f"KV cache: {r.kv_blocks} blocks of {plan.kv_cache.block_size} tokens per replica "
          f"({rc.weight_bytes / 2**30:.1f} GiB weights per GPU)")
    print(f"{'':22}{'p50':>9}  {'p90':>9}  {'p99':>9}  (ms)")
    print(f"{'TTFT':22}{ms(r.ttft)}")
    print(f"{'TPOT':22}{ms(r.tpot)}")
    print(f"{'end-to-end latency':22}{ms(r.e2e)}")
    print(f"throughput: {r.output_tok_s:,.0f} output tok/s, {r.total_tok_s:,.0f} total tok/s, {r.req_s:.2f} req/s "
          f"over {r.makespan_s:.1f} s")
    print(f"KV occupancy: mean {r.kv_occupancy_mean:.0%}, max {r.kv_occupancy_max:.0%}; "
          f"{r.preemptions} preemptions, {r.iterations} iterations")
