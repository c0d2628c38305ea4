"""Benchmark: a procurement search for Llama 3 70B (8k sequences, 15T tokens) over 300
hardware cells: 5 GPU types x 20 cluster sizes x 3 fabrics, four ways of paying each.

Every cell's layouts are searched on the analytic engine (pruned by the rules, memory and
dominance), priced (on-demand, reserved, spot, buy), and the front of each way of paying and
the deadline and budget answers re-simulated on the event engine. Target: under 60 s wall
on the 2-core CI machine.

    .venv/bin/python bench/procure.py [--jobs 2]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.planner.procure import run_procure  # noqa: E402
from simcore.planner.procure_answer import answer_lines  # noqa: E402
from simcore.planner.procure_input import DEFAULT_NODES, candidates_from_dict  # noqa: E402

TARGET_S = 60.0
GPUS = ["a100-80gb", "h100-sxm", "h200", "b200", "mi300x"]
FABRICS = ["ib-ndr", "ib-xdr", "roce-400"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    c = candidates_from_dict({"model": {"name": "llama3-70b", "seq_len": 8192}, "tokens": 15e12,
                              "deadline_days": 90, "budget_usd": 10e6, "gpus": GPUS, "nodes": list(DEFAULT_NODES),
                              "fabrics": FABRICS, "jobs": args.jobs})
    start = time.perf_counter()
    res = run_procure(c, progress=sys.stderr.isatty())
    wall = time.perf_counter() - start
    cells = res.cells
    pruned = int(cells["pruned"].fillna(False).astype(bool).sum()) if "pruned" in cells else 0
    print(f"cells: {len(cells)} ({len(GPUS)} GPU types x {len(DEFAULT_NODES)} sizes x {len(FABRICS)} fabrics), "
          f"{int(cells['fits'].sum())} fit, {pruned} skipped before any search (states overflow), "
          f"{len(res.options)} options, {res.resimulated} cells re-simulated on the event engine")
    for line in answer_lines(res):
        print(f"answer: {line}")
    print(f"procurement wall time: {wall:.1f} s with {args.jobs} process(es) (target < {TARGET_S:.0f} s: "
          f"{'met' if wall < TARGET_S else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
