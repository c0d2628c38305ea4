"""Serving on this machine: predicted against measured (issue 53 target: the median over the
matrix of each metric's absolute error within 15%).

The measured side is trainplan's serving loop (``executors/serving_loop.py``): the tiny Llama-style
model of ``plans/serving/tiny-localhost.yaml`` (4 layers, hidden 256, GQA 4/2 heads, fp32, one core),
vLLM's scheduler, a paged KV cache, requests arriving on the wall clock. The predicted side is
``simulate_serving`` on the same plan and the same requests (arrivals, lengths, seed), its
iterations priced by ``simcore.serving.cost`` with this host's profile and its serving calibration.

Steps (one command, a few minutes on the 2-core host):

1. the matrix: ``max_num_seqs`` in MAX_NUM_SEQS x loads {offline, Poisson at LOADS of the offline
   cell's measured request rate}, REQUESTS requests of PROMPT prompt and OUTPUT output tokens, a
   token budget of BUDGET (chunked prefill); each cell measured by the loop and predicted;
2. before each ``max_num_seqs`` row, ``trainplan serve --calibrate``'s measurement for the model
   (its GEMMs at each row count, the first iteration after an idle wait, the loop's own costs
   fitted on probe workloads of its own: ``executors.calibrate.serving_probes``), as the training
   validation refreshes the host's speed before each run: on this shared host the speed a process
   gets moves from minute to minute (two runs a minute apart measured the same cell 20% apart).
   ``--calibrate-once`` measures once, ``--no-calibrate`` uses the figures already kept;
3. per cell the measured and predicted output tok/s, TTFT p50 and TPOT p50 and their errors
   (predicted / measured - 1), then each metric's median absolute error against the target.

Nothing is fitted to the matrix: its figures come from the host's profile and the serving
calibration, measured before it on other workloads. ``--csv`` writes the cells.
"""
from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simcore.engine.serving import simulate_serving  # noqa: E402
from simcore.plan.spec import PlanError  # noqa: E402
from simcore.serving.cost import replica_cost  # noqa: E402
from simcore.serving.load import load_serving_plan  # noqa: E402
from simcore.serving.spec import Arrival  # noqa: E402

PLAN = ROOT / "plans" / "serving" / "tiny-localhost.yaml"
MAX_NUM_SEQS = (2, 4, 8)
LOADS = (0.3, 0.7)
REQUESTS, PROMPT, OUTPUT, BUDGET = 80, 48, 32, 64
TARGET = 0.15
METRICS = (("output tok/s", lambda r: r.output_tok_s), ("TTFT p50", lambda r: r.ttft[0]),
           ("TPOT p50", lambda r: r.tpot[0]))


def cell_plan(base, seqs: int, rate: float | None):
    t = replace(base.traffic, num_requests=REQUESTS, prompt_len=PROMPT, output_len=OUTPUT,
                arrival=Arrival.OFFLINE if rate is None else Arrival.POISSON, rate=rate or 0.0)
    s = replace(base.scheduler, max_num_seqs=seqs, max_num_batched_tokens=BUDGET)
    return replace(base, scheduler=s, traffic=t)


def run_cell(plan, model, host):
    from trainplan.serving_run import run_serving

    predicted = simulate_serving(plan, replica_cost(plan, host=host))
    measured, _ = run_serving(plan, model)
    return predicted, measured


def _row(name: str, p, m) -> dict:
    row = {"cell": name}
    for metric, get in METRICS:
        row[f"{metric} predicted"], row[f"{metric} measured"] = get(p), get(m)
        row[f"{metric} error"] = get(p) / get(m) - 1 if get(m) else float("nan")
    row["iterations predicted"], row["iterations measured"] = p.iterations, m.iterations
    return row


def print_table(rows: list[dict]) -> None:
    head = f"{'cell':<26}" + "".join(f"{m + ' pred/meas':>26}{'err':>8}" for m, _ in METRICS) + f"{'iterations':>16}"
    print(head)
    for r in rows:
        line = f"{r['cell']:<26}"
        for metric, _ in METRICS:
            scale = 1e3 if metric != "output tok/s" else 1.0
            p, m = r[f"{metric} predicted"] * scale, r[f"{metric} measured"] * scale
            line += f"{p:>12.2f} / {m:>11.2f}{r[f'{metric} error']:>+8.1%}"
        print(line + f"{r['iterations predicted']:>8} / {r['iterations measured']:<6}")
    print("(TTFT and TPOT in ms; error = predicted / measured - 1)")
    for metric, _ in METRICS:
        med = statistics.median(abs(r[f"{metric} error"]) for r in rows)
        print(f"median |error| {metric:<14} {med:6.1%}  target {TARGET:.0%}: {'met' if med <= TARGET else 'MISSED'}")
    offline = statistics.median(abs(r["output tok/s error"]) for r in rows if r["cell"].endswith("offline"))
    print(f"  (a Poisson cell's throughput is its arrival rate where the server keeps up; the offline cells' "
          f"alone: median |error| {offline:.1%})")


def _print_host(host) -> None:
    print(f"  per iteration {host.iteration_s * 1e6:.0f} us, per decode {host.decode_s * 1e6:.1f} us, per prefill "
          f"token {host.prefill_token_s * 1e6:.1f} us, per chunk {host.chunk_s * 1e6:.0f} us, per KV token read "
          f"{host.kv_token_s * 1e6:.2f} us; one layer's GEMMs at 1/8/64 rows "
          + "/".join(f"{t * 1e6:.0f}" for n, t in host.linear if n in (1, 8, 64)) + " us; after an idle wait of "
          + ", ".join(f"{d * 1e3:g} ms +{x * 1e6:.0f} us" for d, x in host.wake))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-calibrate", action="store_true", help="use the serving calibration already kept")
    ap.add_argument("--calibrate-once", action="store_true", help="calibrate once, not before each max_num_seqs row")
    ap.add_argument("--csv", type=Path, help="write the cells here")
    ap.add_argument("--plan", type=Path, default=PLAN, help="the serving plan (its model, precision and node; "
                    f"default {PLAN.relative_to(ROOT)}; plans/serving/small-gpu-localhost.yaml on a GPU)")
    ap.add_argument("--seqs", type=int, nargs="+", default=list(MAX_NUM_SEQS), help="the max_num_seqs rows")
    args = ap.parse_args(argv)
    from trainplan.serving_run import (calibrate_serving, check_runnable, host_costs_for, loop_model,
                                       serving_calibration_path, serving_device)

    t0 = time.perf_counter()
    try:
        base = load_serving_plan(args.plan)
        check_runnable(base)
    except PlanError as e:
        print(f"serving_local: {e}", file=sys.stderr)
        return 2
    host = host_costs_for(base) if args.no_calibrate else None
    model = loop_model(base)
    print(f"{base.name}: {base.model.name} on {serving_device()}, {base.precision.activations}")
    rows = []
    for seqs in args.seqs:
        if host is None or (seqs != args.seqs[0] and not (args.no_calibrate or args.calibrate_once)):
            t1 = time.perf_counter()
            host, path = calibrate_serving(base)
            print(f"calibrated the serving loop for {base.model.name} in {time.perf_counter() - t1:.0f} s ({path}):")
        else:
            print(f"the serving calibration kept in {serving_calibration_path()}:")
        _print_host(host)
        p, m = run_cell(cell_plan(base, seqs, None), model, host)
        rows.append(_row(f"seqs {seqs} offline", p, m))
        for load in LOADS:
            rate = load * m.req_s
            pp, mm = run_cell(cell_plan(base, seqs, rate), model, host)
            rows.append(_row(f"seqs {seqs} {rate:.1f} req/s ({load:.0%})", pp, mm))
        print(f"  max_num_seqs {seqs} done at {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(f"\n{REQUESTS} requests a cell, prompt {PROMPT}, output {OUTPUT} tokens, budget {BUDGET} tokens, "
          f"chunked prefill; {time.perf_counter() - t0:.0f} s in all\n")
    print_table(rows)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
