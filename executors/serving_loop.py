"""A real serving loop on this host: requests arrive on the wall clock, vLLM's continuous-batching
scheduler forms each iteration, and the executor's model runs it with a paged KV cache
(``executors.serving_kv``); every request's arrival, token times and finish are measured.

The scheduler is the one the serving engine simulates (``simcore.engine.serving._Replica``; the
rules in ``simcore.serving.spec``: vLLM's v1 ``Scheduler.schedule`` @00024d3145, and TensorRT-LLM's
reserving policies), kept here per request rather than in aggregate. Each iteration:

1. every decoding request whose next token starts a new KV block gets one; while they do not fit,
   the most recently admitted running request is preempted (its blocks freed, its prompt and
   outputs recomputed when it is admitted again, at the head of the queue);
2. the prefilling requests, in admission order, take chunks out of the token budget
   (``max_num_batched_tokens`` less one token per decoding request), preempting the newest
   running requests for their blocks; without chunked prefill a prompt is taken only whole;
3. waiting requests are admitted in arrival order while fewer than ``max_num_seqs`` run, the budget
   lasts and their first chunk's blocks (under a reserving policy: their blocks to completion) fit.

Then the iteration runs (``forward_iteration``); decoding requests gain a token, finished prompts
their first token. Nothing here reads a plan file: the caller passes the limits, the arrivals and
the lengths (``trainplan.serving_run`` draws them from the serving plan as the simulator does).
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from executors.procs import torch_threads
from executors.serving_kv import Batch, KVPool, forward_iteration, physical_blocks


class ServingLoopError(ValueError):
    """A run the loop cannot make (one sentence)."""


@dataclass(frozen=True, slots=True)
class LoopLimits:
    """The scheduler's limits and the KV cache's size, as the serving plan gives them."""

    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    kv_blocks: int
    block_size: int
    policy: str = "on_demand"
    """on_demand (vLLM), guaranteed_no_evict or static_batch (TensorRT-LLM's, reserving)."""


class _Seq:
    """A running request: its tokens (prompt and outputs so far), KV tokens written, blocks."""

    __slots__ = ("rid", "tokens", "total", "done", "blocks", "decoding")

    def __init__(self, rid: int, tokens: list[int]):
        self.rid, self.tokens, self.total = rid, tokens, len(tokens)
        self.done, self.blocks, self.decoding = 0, [], False


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class LoopRecord:
    """What a run measured, times in seconds from its start; the iteration log has the serving
    engine's timeline form: (replica, start, end, prefill tokens, decoding requests, KV blocks used)."""

    arrivals: list[float]
    first: list[float]
    finish: list[float]
    token_times: list[list[float]]
    iterations_log: list[tuple] = field(default_factory=list)
    shapes: list[tuple] = field(default_factory=list)
    """Per iteration, its work as ``simcore.serving.cost.iteration_s`` takes it: (tokens, query-key
    pairs, KV tokens read, rows emitting a token, prefill chunks, decoding requests, seconds since the
    last iteration ended)."""
    outputs: list[list[int]] = field(default_factory=list)
    """Each request's generated tokens (greedy)."""
    preemptions: int = 0
    kv_area: float = 0.0
    kv_max: float = 0.0
    end: float = 0.0

    @property
    def iterations(self) -> int:
        return len(self.iterations_log)


class Scheduler:
    """vLLM's scheduler over per-request state (module docstring); ``schedule`` forms an iteration,
    ``complete`` ends it with the tokens it produced."""

    def __init__(self, limits: LoopLimits, prompts: list[list[int]], outputs: list[int], pool: KVPool):
        self.lim, self.bs, self.pool = limits, limits.block_size, pool
        self.reserving = limits.policy != "on_demand"
        self.static = limits.policy == "static_batch"
        self.free = limits.kv_blocks
        self.prompts, self.O = prompts, outputs
        self.out: list[list[int]] = [[] for _ in prompts]
        self.waiting: deque[int] = deque()
        self.running: list[_Seq] = []          # admission order
        self.preemptions = 0

    def used(self) -> int:
        return self.lim.kv_blocks - self.free

    def _alloc(self, seq: _Seq, n: int) -> None:
        self.free -= n
        seq.blocks += self.pool.take(n)

    def _release(self, seq: _Seq) -> None:
        self.free += len(seq.blocks)
        self.pool.give_back(seq.blocks)
        seq.blocks = []
        self.running.remove(seq)

    def _preempt_last(self) -> _Seq | None:
        if not self.running:
            return None
        seq = self.running[-1]
        self._release(seq)
        self.waiting.appendleft(seq.rid)
        self.preemptions += 1
        return seq

    def _grow_decoders(self) -> None:
        if self.reserving:
            return
        while True:
            needing = [s for s in self.running if s.decoding and s.done % self.bs == 0]
            if len(needing) <= self.free or self._preempt_last() is None:
                break
        for s in needing:
            self._alloc(s, 1)

    def _continue_prefills(self, budget: int, chunks: list) -> int:
        for seq in [s for s in self.running if not s.decoding]:
            if budget <= 0:
                break
            if seq not in self.running:
                continue
            c = min(seq.total - seq.done, budget)
            if c < seq.total - seq.done and not self.lim.chunked_prefill:
                break
            need = 0 if self.reserving else _ceil_div(seq.done + c, self.bs) - _ceil_div(seq.done, self.bs)
            while need > self.free:
                victim = self._preempt_last()
                if victim is None or victim is seq:
                    break
            if seq not in self.running or need > self.free:
                break
            self._alloc(seq, need)
            chunks.append((seq, c))
            budget -= c
        return budget

    def _admit(self, budget: int, chunks: list) -> None:
        lim = self.lim
        admit = not (self.static and self.running)
        while admit and self.waiting and len(self.running) < lim.max_num_seqs and (budget > 0 or self.static):
            rid = self.waiting[0]
            total = len(self.prompts[rid]) + len(self.out[rid])    # a preempted request recomputes its outputs
            c = max(0, min(total, budget))
            if c < total and not lim.chunked_prefill:
                c = 0
                if not self.static:
                    break
            whole = _ceil_div(len(self.prompts[rid]) + self.O[rid], self.bs)
            need = whole if self.reserving else _ceil_div(c, self.bs)
            if need > self.free:   # (one that could never fit is refused by run_loop before the start)
                break
            self.waiting.popleft()
            seq = _Seq(rid, self.prompts[rid] + self.out[rid])
            self.running.append(seq)
            self._alloc(seq, need)
            if c:
                chunks.append((seq, c))
            budget -= c

    def schedule(self) -> tuple[list[tuple[_Seq, int]], list[_Seq]]:
        """This iteration's prefill chunks (request, tokens) and decoding requests."""
        self._grow_decoders()
        chunks: list[tuple[_Seq, int]] = []
        budget = self.lim.max_num_batched_tokens - sum(1 for s in self.running if s.decoding)
        budget = self._continue_prefills(budget, chunks)
        self._admit(budget, chunks)
        decodes = [s for s in self.running if s.decoding]
        return chunks, decodes

    def batch(self, chunks, decodes) -> Batch:
        return Batch(chunks=[(s.blocks, s.done, s.tokens[s.done:s.done + c], s.done + c >= s.total) for s, c in chunks],
                     decodes=[(s.blocks, s.done, s.tokens[-1]) for s in decodes])

    def complete(self, chunks, decodes, sampled: list[int], now: float, rec: LoopRecord) -> None:
        """Decoders gain their token (those at their last leave); finished prompts their first."""
        emitted = iter(sampled[sum(1 for s, c in chunks if s.done + c >= s.total):])
        for s in decodes:
            s.done += 1
            self._emit(s, next(emitted), now, rec)
        emitted = iter(sampled)
        for s, c in chunks:
            s.done += c
            if s.done < s.total:
                continue
            s.decoding = True
            self._emit(s, next(emitted), now, rec)

    def _emit(self, seq: _Seq, token: int, now: float, rec: LoopRecord) -> None:
        rid = seq.rid
        self.out[rid].append(token)
        seq.tokens.append(token)
        rec.token_times[rid].append(now)
        if math.isnan(rec.first[rid]):
            rec.first[rid] = now
        if len(self.out[rid]) >= self.O[rid]:
            rec.finish[rid] = now
            self._release(seq)


def iteration_shape(chunks: list[tuple[_Seq, int]], decodes: list[_Seq]) -> tuple:
    """An iteration's work counted as the serving engine counts it (``_Replica.begin``)."""
    ctx = sum(s.done for s in decodes)
    pairs = sum(c * s.done + c * (c + 1) / 2 for s, c in chunks) + ctx + len(decodes)
    rows = len(decodes) + sum(1 for s, c in chunks if s.done + c >= s.total)
    return (sum(c for _, c in chunks) + len(decodes), pairs, sum(s.done for s, _ in chunks) + ctx, rows,
            len(chunks), len(decodes))


def run_loop(model, limits: LoopLimits, arrivals: list[float], prompts: list[list[int]], outputs: list[int],
             clock=time.perf_counter, sleep=time.sleep) -> LoopRecord:
    """Serve the requests (arriving ``arrivals`` seconds after the start, in order) on ``model``
    (on its device, in its dtype); one torch thread (one core: the calibrated profile's unit). The
    record of what happened. A GPU's iteration ends when its sampled tokens reach the host."""
    spec = model.spec
    longest = max(len(p) + o for p, o in zip(prompts, outputs))
    held = longest - (limits.policy == "on_demand")       # the last token's KV is never written
    if longest - 1 > spec.seq_len:
        raise ServingLoopError(f"model.seq_len={spec.seq_len} is shorter than the longest request's context of "
                               f"{longest - 1} tokens (its prompt and outputs but the last)")
    if _ceil_div(held, limits.block_size) > limits.kv_blocks:
        raise ServingLoopError(f"a request of {held} tokens needs more KV blocks than the {limits.kv_blocks} the "
                               f"plan gives (kv_cache.block_size={limits.block_size})")
    weight = model.output.weight     # the pool in the model's dtype, on its device
    pool = KVPool(spec, physical_blocks(limits.kv_blocks, limits.max_num_seqs, longest, limits.block_size),
                  limits.block_size, dtype=weight.dtype, device=weight.device)
    sched = Scheduler(limits, prompts, outputs, pool)
    n = len(arrivals)
    rec = LoopRecord(arrivals=list(arrivals), first=[math.nan] * n, finish=[math.nan] * n,
                     token_times=[[] for _ in range(n)])
    with torch_threads(1):
        _serve(model, sched, rec, clock, sleep)
    rec.preemptions, rec.outputs = sched.preemptions, sched.out
    return rec


def _serve(model, sched: Scheduler, rec: LoopRecord, clock, sleep) -> None:
    arrivals, n, nxt, t0 = rec.arrivals, len(rec.arrivals), 0, clock()
    total = sched.lim.kv_blocks
    while nxt < n or sched.waiting or sched.running:
        now = clock() - t0
        while nxt < n and arrivals[nxt] <= now:
            sched.waiting.append(nxt)
            nxt += 1
        if not sched.waiting and not sched.running:
            sleep(max(0.0, arrivals[nxt] - now))
            continue
        chunks, decodes = sched.schedule()
        if not chunks and not decodes:
            raise ServingLoopError("an iteration scheduled no work: the KV cache cannot hold one request")
        used = sched.used()
        rec.shapes.append((*iteration_shape(chunks, decodes), now - rec.end))
        sampled = forward_iteration(model, sched.pool, sched.batch(chunks, decodes))
        sched.complete(chunks, decodes, sampled, clock() - t0, rec)    # the tokens' time: sampled
        end = clock() - t0                                              # the iteration's: its bookkeeping done
        rec.iterations_log.append((0, now, end, sum(c for _, c in chunks), len(decodes), used))
        rec.kv_area += (end - now) * used / total
        rec.kv_max = max(rec.kv_max, used / total)
        rec.end = end
