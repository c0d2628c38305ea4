"""Benchmark: the full layout search for GPT-3 175B on 1536 A100-80GB (192 DGX A100).

Every valid layout (tp, pp, cp, vpp, ZeRO stage, schedule, micro-batch, recompute,
offload) is enumerated and pruned (rules, memory, dominance, and the bound that leaves
untimed a family whose step floor's interval lies above the best's:
``simcore.planner.bound``), ranked by the analytic path, and the top 10 are re-simulated on
the event engine. Target: under 30 s wall on the 2-core CI machine; issue 50 asks for
within 20% of its filing day's 9.7 s (11.6 s) on this 2-core host.

``--question llama3-405b`` searches issue 50's frontier question instead: Llama 3 405B on
16,384 H100 (2,048 DGX H100 on RoCE 400G), 2,048 sequences of 8,192 tokens a step, in one
process by default (target: under 30 s on one core).

    .venv/bin/python bench/search.py [--question gpt3-175b|llama3-405b] [--jobs N] [--top-k 10]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.planner.search import search  # noqa: E402

TARGET_S = 30.0
#: name: (model, cluster, global batch, processes by default)
QUESTIONS = {
    "gpt3-175b": ("gpt3-175b", {"node": "dgx-a100-80gb", "nodes": 192, "fabric": "ib-hdr"}, 1536, os.cpu_count() or 1),
    "llama3-405b": ({"name": "llama3-405b", "seq_len": 8192}, {"node": "dgx-h100", "nodes": 2048, "fabric": "roce-400"},
                    2048, 1),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", choices=sorted(QUESTIONS), default="gpt3-175b")
    parser.add_argument("--jobs", type=int, default=None, help="processes (default: 2 cores' worth, 1 for llama3-405b)")
    parser.add_argument("--top-k", type=int, default=10)
    args = parser.parse_args()
    model, cluster, batch, jobs = QUESTIONS[args.question]
    args.jobs = args.jobs or jobs
    start = time.perf_counter()
    result = search(model, cluster, batch, top_k=args.top_k, jobs=args.jobs, progress=sys.stderr.isatty())
    wall = time.perf_counter() - start
    t = result.tally
    print(f"layouts: {t.candidates} candidates, {t.broke_rule} break a rule, {t.no_fit} do not fit, "
          f"{t.dominated} dominated, {t.bounded} left untimed by the bound, {t.simulated} ranked analytically, "
          f"{min(args.top_k, len(result.table))} by the event engine")
    cols = ["rank", "layout", "step_time_s", "des_step_time_s", "mfu", "memory_per_gpu_gib"]
    print(result.table[[c for c in cols if c in result.table]].head(5).to_string(index=False))
    print(f"search wall time: {wall:.1f} s with {args.jobs} process(es) (target < {TARGET_S:.0f} s: "
          f"{'met' if wall < TARGET_S else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
