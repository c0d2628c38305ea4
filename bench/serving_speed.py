"""Target (issue 53): one hour of traffic at 100 requests/s simulated in under 10 s.

Llama 3 8B on 2 replicas of one H100 each (TP 1, the fewest that carry the load: one alone
saturates), Poisson at 100 req/s for 3600 s (360,000 requests), prompt 512 and output 128
tokens. The cost goes with the iterations, replicas x hour / iteration time: 8 lightly loaded
replicas run 4.7 M iterations, about 43 s on this machine. Prints the wall time and the figures.

    .venv/bin/python bench/serving_speed.py
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.engine.serving import simulate_serving  # noqa: E402
from simcore.serving.load import serving_from_dict  # noqa: E402

TARGET_S = 10.0


def main() -> int:
    plan = serving_from_dict({
        "model": "llama3-8b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 1, "replicas": 2},
        "traffic": {"arrival": "poisson", "rate": 100, "duration_s": 3600, "prompt_len": 512, "output_len": 128},
    })
    t0 = time.perf_counter()
    r = simulate_serving(plan)
    wall = time.perf_counter() - t0
    print(f"{r.requests} requests, {r.iterations} iterations simulated in {wall:.2f} s (target < {TARGET_S:.0f} s): "
          f"{'PASS' if wall < TARGET_S else 'FAIL'}")
    print(f"TTFT p50/p99 {r.ttft[0] * 1e3:.1f}/{r.ttft[2] * 1e3:.1f} ms, TPOT p50/p99 {r.tpot[0] * 1e3:.2f}/"
          f"{r.tpot[2] * 1e3:.2f} ms, {r.output_tok_s:,.0f} output tok/s, KV mean {r.kv_occupancy_mean:.1%}")
    return 0 if wall < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
