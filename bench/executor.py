"""Benchmark: the executor's step time against plain torch on the same model and ranks.

    .venv/bin/python bench/executor.py [PLAN] [--steps 65] [--warmup 5]

Prints four step times for PLAN's model and global batch: the executor's recorded steps
(spans, collective hooks) and its bare ones, which alternate within one run, a plain
single-process torch loop, and torch's DDP over the same number of ranks.
Target: instrumentation costs under 3% of the step time. Warm-up steps are discarded
and ranks synchronise only at step edges (nanoGPT's bench.py discipline).
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from executors import launch, procs
from executors.model import build_model, loss_fn
from executors.parallel import LEARNING_RATE
from simcore.plan.load import load_plan

TARGET_OVERHEAD = 0.03


def _loop(model, opt, plan, steps, warmup, rows_of, sync=lambda: None) -> float:
    times = []
    for step in range(steps):
        tokens, labels = rows_of(step)
        sync()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        n = plan.num_microbatches
        for x, y in zip(tokens.chunk(n), labels.chunk(n)):
            (loss_fn(model(x), y) / n).backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return sum(times[warmup:]) / len(times[warmup:])


def plain_step_s(plan, steps, warmup) -> float:
    """One process, the whole global batch, same micro-batch size."""
    torch.set_num_threads(1)
    model = build_model(plan.model)
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)

    def rows_of(step):
        rows = launch.batch(plan, step, 0)
        return rows[:, :-1], rows[:, 1:]
    return _loop(model, opt, plan, steps, warmup, rows_of)


def _ddp_rank(rank, world, device, plan, steps, warmup):
    model = torch.nn.parallel.DistributedDataParallel(build_model(plan.model))
    opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    n = plan.training.global_batch // world

    def rows_of(step):
        rows = launch.batch(plan, step, 0)[rank * n:(rank + 1) * n]
        return rows[:, :-1], rows[:, 1:]
    return _loop(model, opt, plan, steps, warmup, rows_of, sync=dist.barrier)


def ddp_step_s(plan, steps, warmup) -> float:
    """torch DDP over all the plan's ranks (data parallel only)."""
    world = plan.parallel.gpus
    if plan.training.global_batch % world:
        return float("nan")
    return max(procs.spawn(_ddp_rank, world, (plan, steps, warmup), start_method="fork"))


def executor_step_s(plan, steps, warmup) -> tuple[float, float]:
    """(instrumented, bare) mean step time of one executor run: its measured steps alternate
    between recorded and bare ones, so both come from the same ranks in the same minute (two
    separate launches on the shared 2-core host differ by more than the recorder costs)."""
    records = launch.launch_ranks(plan, launch.RunOptions(steps=steps, warmup=warmup), "fork")

    def mean(instrumented: bool) -> float:
        per_step = [max(r["steps"][i]["duration_s"] for r in records) for i in range(warmup, steps)
                    if records[0]["steps"][i]["instrumented"] == instrumented]
        return sum(per_step) / len(per_step)
    return mean(True), mean(False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("plan", nargs="?", default="plans/tiny-localhost.yaml")
    ap.add_argument("--steps", type=int, default=65)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    plan = load_plan(a.plan)
    on, off = executor_step_s(plan, a.steps, a.warmup)
    rows = [("executor, instrumented", on), ("executor, bare", off),
            ("plain torch, 1 process", plain_step_s(plan, a.steps, a.warmup)),
            (f"torch DDP, {plan.parallel.gpus} ranks", ddp_step_s(plan, a.steps, a.warmup))]
    print(f"# {a.plan}: {plan.parallel.gpus} ranks, global batch {plan.training.global_batch}, "
          f"{a.steps - a.warmup} measured steps")
    for name, t in rows:
        print(f"{name:>28}: {t * 1e3:8.2f} ms/step")
    overhead = on / off - 1
    verdict = "meets" if overhead < TARGET_OVERHEAD else "misses"
    print(f"{'instrumentation overhead':>28}: {overhead * 100:8.2f} %  ({verdict} the {TARGET_OVERHEAD:.0%} target)")


if __name__ == "__main__":
    main()
