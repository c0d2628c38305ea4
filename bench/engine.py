"""Speed of the event engine on one step (targets from issue 4).

    .venv/bin/python bench/engine.py [--repeat 3]

GPT-3 175B on 1536 A100s (192 DGX A100 80GB), TP8 PP12 DP16, 1F1B, representative mode:

- 96 micro-batches, micro-batch granularity: target under 1 s;
- 96 micro-batches, layer granularity: target under 10 s;
- 1,024 micro-batches (global batch 16,384), micro-batch granularity: target under 5 s.

``step_costs`` is computed once outside the timed window (it is the math, not the
engine); one warm-up run is discarded, then the best of ``--repeat`` runs is reported
with the SimPy events it scheduled per second of wall time.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.engine.des import simulate_des  # noqa: E402
from simcore.model.step_costs import step_costs  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402


def gpt3_plan(global_batch: int):
    return plan_from_dict({"model": "gpt3-175b", "cluster": {"node": "dgx-a100-80gb", "nodes": 192},
                           "parallel": {"tp": 8, "pp": 12, "dp": 16, "schedule": "1f1b"},
                           "training": {"global_batch": global_batch, "micro_batch": 1, "recompute": "full"}},
                          Path("."))


CASES = (  # (label, global batch, granularity, target seconds)
    ("96 micro-batches, micro-batch granularity", 1536, "microbatch", 1.0),
    ("96 micro-batches, layer granularity", 1536, "layer", 10.0),
    ("1,024 micro-batches, micro-batch granularity", 16384, "microbatch", 5.0),
)


def time_case(global_batch: int, granularity: str, repeat: int) -> tuple[float, int, float]:
    costs = step_costs(gpt3_plan(global_batch))
    simulate_des(costs, granularity=granularity)  # warm-up, discarded
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = simulate_des(costs, granularity=granularity)
        best = min(best, time.perf_counter() - t0)
    return best, int(result.extra["des_events"]), result.step_time_s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (best is reported)")
    args = parser.parse_args(argv)
    failed = 0
    for label, batch, granularity, target in CASES:
        wall, events, step = time_case(batch, granularity, args.repeat)
        ok = wall < target
        failed += not ok
        print(f"{label:46s} wall {wall:6.3f} s  events {events:8d}  {events / wall:10.0f} events/s  "
              f"simulated step {step:8.2f} s  target < {target:g} s: {'ok' if ok else 'MISSED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
