"""Target (issue 53): a capacity search over the catalog's GPU kinds in under 60 s.

Llama 3 70B at 20 req/s Poisson (prompt 1024, output 256 tokens, 2000 requests a simulation),
SLO TTFT <= 1 s and TPOT <= 50 ms at p99, round robin: every priced GPU kind the cost model
covers, bf16 and fp8, TP 1/2/4/8, the fewest replicas of each meeting the SLO. Prints the wall
time, the simulations and the three cheapest options.

    .venv/bin/python bench/serving_search.py [--jobs N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.planner.serving_search import capacity_search  # noqa: E402
from simcore.serving.load import serving_from_dict  # noqa: E402
from simcore.serving.spec import SloSpec  # noqa: E402

TARGET_S = 60.0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    plan = serving_from_dict({
        "model": "llama3-70b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 4},
        "traffic": {"arrival": "poisson", "rate": 20, "num_requests": 2000, "prompt_len": 1024, "output_len": 256}})
    t0 = time.perf_counter()
    res = capacity_search(plan, slo=SloSpec(ttft_s=1.0, tpot_s=0.05), rate=20, jobs=args.jobs)
    wall = time.perf_counter() - t0
    met = [o for o in res.options if o.met]
    kinds = len({o.gpu for o in res.options})
    print(f"{len(res.options)} variants over {kinds} GPU kinds ({len(met)} meet the SLO), "
          f"{sum(o.simulations for o in res.options)} simulations in {wall:.1f} s with {args.jobs} process(es) "
          f"(target < {TARGET_S:.0f} s): {'PASS' if wall < TARGET_S else 'FAIL'}")
    print("not searched: " + ", ".join(f"{g} ({w})" for g, w in res.left_out.items()))
    for o in met[:3]:
        print(f"  {o.gpus:>3} x {o.gpu:<9} {o.precision} TP{o.tp} x {o.replicas}: ${o.usd_per_mtok['on_demand']:.3f}/Mtok "
              f"on-demand, ${o.usd_per_mtok['reserved']:.3f} reserved, ${o.usd_per_mtok['buy']:.3f} buy; "
              f"p99 TTFT {o.result.slo_ttft_s * 1e3:.0f} ms, p99 TPOT {o.result.slo_tpot_s * 1e3:.1f} ms")
    return 0 if wall < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
