"""The serving calibration's probes: the model's GEMMs at the row counts an iteration gives them
(``bench_linear``), what an iteration costs more after the loop idled (``bench_wake``), and short
offline runs of ``executors.serving_loop`` on a
model, whose iterations (their measured time and their composition) the serving calibration fits
(``simcore.serving.host``). The workloads are fixed here and are none of a validation matrix's:

- ``decode R x P``: R requests of P prompt and ``OUTPUT`` output tokens admitted together
  (budget ``R x P``): one iteration of R whole prompts, then OUTPUT - 1 of R decodes, for (R, P) in
  ``BATCHES`` (short contexts and long ones);
- ``mixed``: ``MIXED_REQUESTS`` requests of ``MIXED_PROMPT`` prompt tokens, at most
  ``MIXED_REQUESTS`` running and ``MIXED_BUDGET`` tokens an iteration: chunked prefills beside
  decodes, as a loaded server runs them.

Each round runs every workload once, one after the other (rounds interleave the workloads so a
change in the host's load reaches all of them); the first round warms up and is dropped.
"""
from __future__ import annotations

import random
import statistics
import time

import torch
import torch.nn.functional as F

from executors.procs import torch_threads
from executors.serving_kv import Batch, KVPool, forward_iteration
from executors.serving_loop import LoopLimits, run_loop

OUTPUT = 16
BATCHES = ((1, 16), (2, 16), (4, 16), (8, 16), (16, 16), (1, 64), (4, 64), (16, 64))
MIXED_REQUESTS, MIXED_PROMPT, MIXED_OUTPUT, MIXED_BUDGET = 4, 48, 16, 24
ROUNDS = 4
BLOCK_SIZE = 16
#: The probes' token budget: prompts beyond it are chunked, as a server with such a budget chunks them.
BUDGET = 64
#: Row counts at which the GEMMs are timed (an iteration's tokens; the output layer's emitting rows).
GEMM_ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
GEMM_REPS = 15
#: Idle waits (s) after which an iteration is timed against the same iteration run back to back.
WAKE_IDLES = (0.002, 0.01, 0.03, 0.1, 0.3)
WAKE_REPS = 9
WAKE_PROMPT = 32


def _median_s(fn, reps: int, device: torch.device) -> float:
    """The median wall time of ``fn`` over ``reps`` calls after one warm-up; on a GPU each call
    waits for its kernels (the loop waits for each iteration's sampled tokens likewise)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def bench_linear(model, rows=None, reps: int | None = None) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(rows, seconds) of the first layer's linear modules together (each on an input of its own
    width), and of the output layer, at each row count (``GEMM_ROWS``); one torch thread, interleaved
    over the counts."""
    rows, reps = rows or GEMM_ROWS, reps or GEMM_REPS
    layer = next(iter(model.layers.values()))
    linears = [m for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    w = model.output.weight
    kw = {"dtype": w.dtype, "device": w.device}
    with torch_threads(1):
        inputs = {n: [torch.randn(n, lin.in_features, **kw) for lin in linears] for n in rows}
        heads = {n: torch.randn(n, model.output.in_features, **kw) for n in rows}
        per_layer, head = {n: [] for n in rows}, {n: [] for n in rows}
        for _ in range(3):
            for n in rows:
                per_layer[n].append(_median_s(lambda: [F.linear(x, m.weight) for x, m in zip(inputs[n], linears)], reps,
                                              w.device))
                head[n].append(_median_s(lambda: F.linear(heads[n], w), reps, w.device))
    return ([(n, statistics.median(per_layer[n])) for n in rows], [(n, statistics.median(head[n])) for n in rows])


def bench_wake(model, idles=None, reps: int | None = None) -> list[tuple[float, float]]:
    """(idle s, extra s): one prefill of ``WAKE_PROMPT`` tokens after the loop slept that long (as it
    sleeps until the next arrival), less the same prefill right after two others; the medians of
    ``reps`` interleaved rounds. (On a shared host an idle core's caches and clock do not stay
    the loop's: the first iteration after a wait is slower, more so the longer the wait.)"""
    idles, reps = idles or WAKE_IDLES, reps or WAKE_REPS
    spec, w = model.spec, model.output.weight
    pool = KVPool(spec, -(-WAKE_PROMPT // BLOCK_SIZE), BLOCK_SIZE, dtype=w.dtype, device=w.device)
    batch = Batch(chunks=[(list(range(len(pool.free_ids))), 0, [1] * WAKE_PROMPT, True)], decodes=[])
    timed = {d: [] for d in (0.0, *idles)}
    with torch_threads(1):
        for _ in range(reps):
            for idle in timed:
                forward_iteration(model, pool, batch)
                forward_iteration(model, pool, batch)
                if idle:
                    time.sleep(idle)
                t0 = time.perf_counter()
                forward_iteration(model, pool, batch)
                timed[idle].append(time.perf_counter() - t0)
    base = statistics.median(timed[0.0])
    return [(d, max(0.0, statistics.median(timed[d]) - base)) for d in idles]


def probe_workloads(vocab: int, seed: int = 0) -> list[tuple[str, LoopLimits, list[list[int]], list[int]]]:
    """(name, limits, prompts, outputs) of each probe run."""
    rng = random.Random(seed)

    def prompts(n: int, length: int) -> list[list[int]]:
        return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]

    runs = []
    for r, p in BATCHES:
        limits = LoopLimits(max_num_seqs=r, max_num_batched_tokens=min(r * p, BUDGET), chunked_prefill=True,
                            kv_blocks=r * -(-(p + OUTPUT) // BLOCK_SIZE), block_size=BLOCK_SIZE)
        runs.append((f"decode {r} x {p}", limits, prompts(r, p), [OUTPUT] * r))
    n = MIXED_REQUESTS
    limits = LoopLimits(max_num_seqs=n, max_num_batched_tokens=MIXED_BUDGET, chunked_prefill=True,
                        kv_blocks=n * -(-(MIXED_PROMPT + MIXED_OUTPUT) // BLOCK_SIZE), block_size=BLOCK_SIZE)
    runs.append(("mixed", limits, prompts(n, MIXED_PROMPT), [MIXED_OUTPUT] * n))
    return runs


def probe_longest() -> int:
    """The longest context a probe request reaches (the probe model's positions)."""
    return max(max(p for _, p in BATCHES) + OUTPUT, MIXED_PROMPT + MIXED_OUTPUT)


def describe() -> str:
    return (f"probe runs of the serving loop, offline: {OUTPUT} outputs of (requests at once x prompt tokens) "
            f"{', '.join(f'{r}x{p}' for r, p in BATCHES)}, and {MIXED_REQUESTS} {MIXED_PROMPT}-token "
            f"prompts chunked by a {MIXED_BUDGET}-token budget; {ROUNDS - 1} rounds after a warm-up")


def bench_serving_loop(model, rounds: int | None = None, progress=None) -> list[tuple[float, tuple]]:
    """(seconds, shape) of every probe iteration after the first round (``LoopRecord.shapes``)."""
    rounds = rounds or ROUNDS
    runs = probe_workloads(model.spec.vocab)
    rows = []
    for k in range(rounds):
        for name, limits, prompts, outputs in runs:
            t0 = time.perf_counter()
            rec = run_loop(model, limits, [0.0] * len(prompts), prompts, outputs)
            if progress:
                progress(f"round {k + 1} {name}: {rec.iterations} iterations in {time.perf_counter() - t0:.2f} s")
            if k:
                rows += [(end - start, shape) for (_, start, end, *_), shape in zip(rec.iterations_log, rec.shapes)]
    return rows
