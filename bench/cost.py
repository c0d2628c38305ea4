"""Benchmark: `trainplan cost` as a user runs it, on every shipped plan and a 102,400-GPU plan.

Each plan is priced by the command line in a fresh interpreter (imports, the prediction,
the analytic run cost, the step-time intervals, the default 200-run Monte-Carlo of
failures and spot preemptions), timed end to end. Target: under 10 s each on this machine.

    .venv/bin/python bench/cost.py [--tokens 1e12] [--monte-carlo 200]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 10.0
#: Llama 3 405B on 12,800 DGX H100 (102,400 GPUs): TP 8, PP 16, DP 800, a 12,800-sequence batch.
BIG_PLAN = {"name": "llama3-405b-102400-h100",
            "model": {"name": "llama3-405b", "seq_len": 8192},
            "cluster": {"node": "dgx-h100", "nodes": 12800, "fabric": "ib-ndr"},
            "parallel": {"tp": 8, "pp": 16, "dp": 800, "zero": 1, "sequence_parallel": True, "schedule": "1f1b"},
            "training": {"global_batch": 12800, "micro_batch": 1, "precision": "bf16", "recompute": "selective",
                         "flash_attention": True}}


#: A CPU host has no catalog price: the bench prices it at $1 per GPU-hour to time the rest.
CPU_PRICES = ["on_demand_usd=1", "reserved_usd=1", "spot_usd=1"]


def time_cost(plan: Path, tokens: float, monte_carlo: int) -> tuple[float, str]:
    """Wall seconds of one `trainplan cost` and its 'time to train' line."""
    cmd = [sys.executable, "-m", "trainplan", "cost", str(plan), "--tokens", f"{tokens:g}",
           "--monte-carlo", str(monte_carlo)]
    if "localhost" in plan.stem:
        cmd += [arg for price in CPU_PRICES for arg in ("--price", price)]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT),
                                                                          "PATH": "/usr/bin:/bin"})
    wall = time.perf_counter() - start
    if out.returncode != 0:
        return wall, f"exit {out.returncode}: {out.stderr.strip().splitlines()[-1] if out.stderr else ''}"
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("time to train")), "")
    return wall, line.removeprefix("time to train: ")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=float, default=1e12)
    parser.add_argument("--monte-carlo", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "llama3-405b-102400-h100.yaml"
        big.write_text(yaml.safe_dump(BIG_PLAN, sort_keys=False))
        plans = sorted((ROOT / "plans").glob("*.yaml")) + [big]
        worst = 0.0
        print(f"{'plan':<32} {'wall s':>7}  time to train ({args.tokens:.3g} tokens)")
        for plan in plans:
            wall, line = time_cost(plan, args.tokens, args.monte_carlo)
            worst = max(worst, wall)
            print(f"{plan.stem:<32} {wall:>7.2f}  {line}")
    print(f"slowest: {worst:.2f} s (target < {TARGET_S:.0f} s each: {'met' if worst < TARGET_S else 'MISSED'})")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
