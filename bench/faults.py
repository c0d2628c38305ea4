"""Benchmark: how fast a run's faults end it (executors/watchdog.py, executors/procs.py).

The tests check what happens (the hung rank named, not before its progress timeout; every
rank ended); how fast is measured here, where a busy host reads as a slower figure instead
of a failed suite (issue 57.9). Targets:

- a rank that stops beating is ended within ``HANG_TARGET_S`` of its progress timeout;
- a rank killed by a signal ends the run within ``KILL_TARGET_S``, the other rank asleep.

    .venv/bin/python bench/faults.py [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executors import procs, watchdog  # noqa: E402

HANG_TARGET_S = 5.0
KILL_TARGET_S = 10.0
TIMEOUT_S = 1.0
BEAT_S = 1.0


def _beat_then_hang(rank, world, device):
    end = time.monotonic() + BEAT_S
    while time.monotonic() < end:
        time.sleep(0.05)
        watchdog.heartbeat()
    if rank == 1:
        time.sleep(120)
    return rank


def _killed(rank, world, device):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)


def _seconds(fn) -> float:
    t = time.monotonic()
    try:
        procs.spawn(fn, 2, timeout_s=TIMEOUT_S if fn is _beat_then_hang else 60, start_method="fork")
    except RuntimeError:
        pass
    return time.monotonic() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    hang = [_seconds(_beat_then_hang) - BEAT_S - TIMEOUT_S for _ in range(args.repeats)]
    kill = [_seconds(_killed) for _ in range(args.repeats)]
    print(f"host load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"hung rank ended {max(hang):.2f} s past its progress timeout at worst (target < {HANG_TARGET_S:g} s): "
          + ", ".join(f"{h:.2f}" for h in hang))
    print(f"killed rank ends the run in {max(kill):.2f} s at worst (target < {KILL_TARGET_S:g} s): "
          + ", ".join(f"{k:.2f}" for k in kill))
    return 0 if max(hang) < HANG_TARGET_S and max(kill) < KILL_TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
