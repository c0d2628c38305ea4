"""The event engine serving requests: arrivals, continuous batching, a paged KV cache, preemption.

Replicas sit behind a router. Round robin sends request i to replica i mod R whatever their
state, so each replica is simulated on its own; least outstanding requests reads the replicas'
state at each arrival, so they run on one clock (a heap of iteration ends, ``_least_outstanding``). A replica's events are the arrivals and
the ends of its iterations: it runs one iteration after another while it has work, each formed
by the scheduler's rules (``simcore.serving.spec``: vLLM's v1 scheduler, or TensorRT-LLM's
guaranteed-no-evict and static-batch capacity policies) and lasting
``simcore.serving.cost.iteration_s``; idle, it waits for the next arrival.

Decoding requests are held in aggregate (their count, their contexts' sum, a heap of the step
at which each ends, and per KV-block phase the count that needs a new block at a step), so an
iteration costs O(1) plus its admissions and completions: an hour at 100 requests/s runs in
seconds (bench/serving_speed.py).
"""
from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from simcore.engine.serving_measure import (ServingResult, ServingTimeline, arrival_times, measure, per_token,
                                            request_lengths)
from simcore.plan.spec import PlanError
from simcore.serving.cost import ReplicaCost, iteration_s, replica_cost
from simcore.serving.spec import Arrival, CapacityPolicy, Router, ServingPlan, SloSpec

__all__ = ["ServingResult", "ServingTimeline", "arrival_times", "per_token", "request_lengths", "simulate_serving"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Replica:
    """One replica's scheduler state; ``run`` simulates it over its arrivals."""

    def __init__(self, rc: ReplicaCost, plan: ServingPlan, index: int = 0, log: list | None = None):
        self.rc, self.bs = rc, rc.block_size
        self.index, self.log = index, log          # the timeline's iteration list, when one is kept
        self.queued: deque[int] = deque()          # a closed loop's requests not yet sent
        s, t = plan.scheduler, plan.traffic
        self.max_seqs, self.budget, self.chunked = s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill
        # TensorRT-LLM's policies reserve a request's blocks to completion at admission (never preempting)
        self.reserving = s.capacity_policy != CapacityPolicy.ON_DEMAND
        self.static = s.capacity_policy == CapacityPolicy.STATIC_BATCH
        self.free = rc.kv_blocks
        self.waiting: deque[int] = deque()
        self.prefilling: list[list[int]] = []     # [rid, done, total], admission order
        self.order: list[int] = []                # running rids in admission order (stale entries skipped)
        self.running: set[int] = set()
        self.step = 0                             # decode steps so far
        self.n_dec = self.sum_ctx = 0
        self.phase = [0] * self.bs                # decoders needing a block at a step, by step % bs
        self.ends: list[tuple[int, int, int]] = []  # (end step, rid, epoch)
        self.preemptions = self.iterations = 0
        self.kv_area = self.kv_max = 0.0
        self.end = 0.0
        self.pending: list | None = None           # the chunks of the iteration under way

    def attach(self, req: "_Requests") -> None:
        """Share the per-request state (indexed by the request's global id) with the other replicas."""
        self.gen, self.c0, self.s0, self.epoch = req.gen, req.c0, req.s0, req.epoch
        self.first, self.finish = req.first, req.finish
        self.P, self.O = req.prompt, req.output

    def _reservation(self, rid: int) -> int:
        """The blocks a request needs to complete: its prompt and all its output (TensorRT-LLM's
        ``getRemainingBlocksToCompletion`` at admission)."""
        return _ceil_div(self.P[rid] + self.O[rid], self.bs)

    @property
    def outstanding(self) -> int:
        """Requests routed here and not finished (least-outstanding-requests routing)."""
        return len(self.waiting) + len(self.running)

    def _ctx(self, rid: int) -> int:
        return self.c0[rid] + self.step - self.s0[rid]

    def _preempt_last(self) -> int | None:
        """Preempt the most recently admitted running request (vLLM ``self.running.pop()``)."""
        while self.order and self.order[-1] not in self.running:
            self.order.pop()
        if not self.order:
            return None
        rid = self.order.pop()
        self.running.discard(rid)
        self.epoch[rid] += 1
        pre = next((p for p in self.prefilling if p[0] == rid), None)
        if pre is not None:
            self.prefilling.remove(pre)
            self.free += _ceil_div(pre[1], self.bs)
        else:
            ctx = self._ctx(rid)
            self.gen[rid] += self.step - self.s0[rid]
            self.n_dec -= 1
            self.sum_ctx -= ctx
            self.phase[(self.s0[rid] - self.c0[rid]) % self.bs] -= 1
            self.free += _ceil_div(ctx, self.bs)
        self.waiting.appendleft(rid)
        self.preemptions += 1
        return rid

    def _grow_decoders(self) -> None:
        """The blocks this step's decode tokens need, preempting until they fit."""
        while self.phase[self.step % self.bs] > self.free:
            if self._preempt_last() is None:
                break
        self.free -= self.phase[self.step % self.bs]

    def _schedule(self) -> tuple[int, float, float, list[list[int]]]:
        """This iteration's prefill work: (tokens, query-key pairs, KV tokens read, chunks [entry, c, o])."""
        self._grow_decoders()
        budget, tokens, pairs, kv_read, chunks = self.budget - self.n_dec, 0, 0.0, 0.0, []
        for entry in list(self.prefilling):
            if budget <= 0:
                break
            if entry not in self.prefilling:
                continue
            c = min(entry[2] - entry[1], budget)
            if c < entry[2] - entry[1] and not self.chunked:
                break
            need = 0 if self.reserving else _ceil_div(entry[1] + c, self.bs) - _ceil_div(entry[1], self.bs)
            while need > self.free and self._preempt_last() not in (None, entry[0]):
                pass
            if entry not in self.prefilling or need > self.free:
                break
            self.free -= need
            chunks.append([entry, c, entry[1]])
            budget -= c
        # a static batch is formed whole when none runs; its prompts then take the budget in turn
        admit = not (self.static and self.running)
        while admit and self.waiting and len(self.running) < self.max_seqs and (budget > 0 or self.static):
            rid = self.waiting[0]
            total = self.P[rid] + self.gen[rid]       # a preempted request recomputes its outputs too
            c = max(0, min(total, budget))
            if c < total and not self.chunked:
                c = 0
                if not self.static:
                    break
            need = self._reservation(rid) if self.reserving else _ceil_div(c, self.bs)
            if need > self.free:
                if not self.running and (need if self.reserving else _ceil_div(total, self.bs)) > self.rc.kv_blocks:
                    raise PlanError(f"a request of {self.P[rid] + self.O[rid] if self.reserving else total} tokens "
                                    f"needs more KV blocks than a replica's {self.rc.kv_blocks} "
                                    f"(kv_cache.block_size={self.bs}); use more GPUs per replica")
                break
            self.waiting.popleft()
            self.free -= need
            entry = [rid, 0, total]
            self.prefilling.append(entry)
            self.running.add(rid)
            self.order.append(rid)
            if c:
                chunks.append([entry, c, 0])
            budget -= c
        for _, c, o in chunks:
            tokens += c
            pairs += c * o + c * (c + 1) / 2
            kv_read += o
        return tokens, pairs, kv_read, chunks

    def _finish_iteration(self, now: float, chunks: list) -> None:
        """Decoders gain a token (those at their last leave); finished prefills join the decoders."""
        if self.n_dec:
            self.sum_ctx += self.n_dec
            self.step += 1
            while self.ends and self.ends[0][0] <= self.step:
                _, rid, ep = heapq.heappop(self.ends)
                if ep != self.epoch[rid]:
                    continue
                ctx = self._ctx(rid)
                self._finished(rid, now)
                self.n_dec -= 1
                self.sum_ctx -= ctx
                if not self.reserving:
                    self.phase[(self.s0[rid] - self.c0[rid]) % self.bs] -= 1
                self.free += self._reservation(rid) if self.reserving else _ceil_div(ctx, self.bs)
        for entry, c, _ in chunks:
            entry[1] += c
            if entry[1] < entry[2]:
                continue
            self.prefilling.remove(entry)
            rid = entry[0]
            self.gen[rid] += 1
            if np.isnan(self.first[rid]):
                self.first[rid] = now
            if self.gen[rid] >= self.O[rid]:
                self._finished(rid, now)
                self.free += self._reservation(rid) if self.reserving else _ceil_div(entry[2], self.bs)
                continue
            self.c0[rid], self.s0[rid] = entry[2], self.step
            self.n_dec += 1
            self.sum_ctx += entry[2]
            if not self.reserving:                    # a reserving policy holds its blocks already
                self.phase[(self.step - entry[2]) % self.bs] += 1
            heapq.heappush(self.ends, (self.step + self.O[rid] - self.gen[rid], rid, self.epoch[rid]))

    def begin(self, now: float) -> float:
        """Form and cost the next iteration at ``now``; its end time, or -1.0 when idle."""
        if not self.running and not self.waiting:
            return -1.0
        tokens, pairs, kv_read, chunks = self._schedule()
        n_dec, sum_ctx = self.n_dec, self.sum_ctx        # after any preemption
        rows = n_dec + sum(1 for e, c, _ in chunks if e[1] + c >= e[2])
        dt = iteration_s(self.rc, tokens + n_dec, pairs + sum_ctx + n_dec, kv_read + sum_ctx, rows)
        if dt <= 0:
            raise PlanError("an iteration scheduled no work: the KV cache cannot hold one request")
        total = self.rc.kv_blocks
        self.kv_area += dt * (total - self.free) / total
        self.kv_max = max(self.kv_max, (total - self.free) / total)
        self.pending = chunks
        if self.log is not None:
            self.log.append((self.index, now, now + dt, tokens, n_dec, total - self.free))
        return now + dt

    def complete(self, now: float) -> None:
        """End the iteration under way at ``now``."""
        self.iterations += 1
        self._finish_iteration(now, self.pending)
        self.pending = None
        self.end = now

    def _finished(self, rid: int, now: float) -> None:
        """A request's last token at ``now``; under a closed loop its client sends the next one."""
        self.finish[rid] = now
        self.running.discard(rid)
        if self.queued:
            nxt = self.queued.popleft()
            self.arrivals[nxt] = now
            self.waiting.append(nxt)

    def run_closed(self, ids: np.ndarray, clients: int, arrivals: np.ndarray) -> None:
        """Serve requests ``ids`` from ``clients`` closed-loop clients: the first ``clients``
        at 0, then each at the moment one finishes (no think time); their times written to ``arrivals``."""
        self.arrivals, self.queued = arrivals, deque(int(i) for i in ids[clients:])
        for rid in ids[:clients]:
            arrivals[rid] = 0.0
            self.waiting.append(int(rid))
        now = 0.0
        while self.waiting or self.running:
            now = self.begin(now)
            self.complete(now)

    def run(self, arrivals: np.ndarray, ids: np.ndarray) -> None:
        """Serve requests ``ids`` arriving at ``arrivals`` alone (a round-robin share)."""
        n, now, nxt = len(arrivals), 0.0, 0
        while nxt < n or self.waiting or self.running:
            while nxt < n and arrivals[nxt] <= now:
                self.waiting.append(int(ids[nxt]))
                nxt += 1
            end = self.begin(now)
            if end < 0:
                now = float(arrivals[nxt])
                continue
            now = end
            self.complete(now)


class _Requests:
    """Per-request state shared by the replicas, by global request id."""

    def __init__(self, prompt: np.ndarray, output: np.ndarray):
        n = len(prompt)
        self.prompt, self.output = prompt.tolist(), output.tolist()   # each request's lengths
        self.gen = [0] * n          # tokens generated
        self.c0 = [0] * n           # KV tokens when it joined the decoders
        self.s0 = [0] * n           # step at which it joined
        self.epoch = [0] * n
        self.first = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)


def _least_outstanding(reps: list[_Replica], arrivals: np.ndarray) -> None:
    """Route each arrival to the replica with the fewest outstanding requests (ties: the next
    after the last chosen, so identical idle replicas take turns), on one clock: before an
    arrival at t, every iteration that ends before t has ended (an iteration ending exactly at
    t sees the arrival, as in ``_Replica.run``); requests arriving at one instant are all
    routed before an idle replica starts."""
    heap: list[tuple[float, int]] = []
    busy, starting, last, r = [False] * len(reps), [], -1, len(reps)

    def advance(until: float, inclusive: bool) -> None:
        while heap and (heap[0][0] < until or (inclusive and heap[0][0] <= until)):
            end, k = heapq.heappop(heap)
            reps[k].complete(end)
            nxt = reps[k].begin(end)
            if nxt >= 0:
                heapq.heappush(heap, (nxt, k))
            else:
                busy[k] = False

    def start(now: float) -> None:
        for k in starting:
            nxt = reps[k].begin(now)
            if nxt >= 0:
                heapq.heappush(heap, (nxt, k))
                busy[k] = True
        starting.clear()

    now = 0.0
    for i, t in enumerate(arrivals.tolist()):
        if t > now:
            start(now)
            now = t
        advance(t, False)
        k = min(range(r), key=lambda j: (reps[j].outstanding, (j - last - 1) % r))
        reps[k].waiting.append(i)
        last = k
        if not busy[k] and k not in starting:
            starting.append(k)
    start(now)
    advance(float("inf"), True)


def simulate_serving(plan: ServingPlan, rc: ReplicaCost | None = None, slo: SloSpec | None = None,
                     timeline: ServingTimeline | None = None) -> ServingResult:
    """Serve the plan's traffic on its replicas behind its router and measure it against ``slo``
    (the plan's where none is given); fill ``timeline`` where one is given."""
    rc = rc or replica_cost(plan)
    slo = slo or plan.slo
    arrivals = arrival_times(plan)
    log = timeline.iterations if timeline is not None else None
    reps = [_Replica(rc, plan, k, log) for k in range(plan.replicas)]
    prompt, output = request_lengths(plan)
    req = _Requests(prompt, output)
    for rep in reps:
        rep.attach(req)
    if plan.traffic.arrival == Arrival.CONCURRENCY:
        # the clients bound to the replicas in turn, each replica's requests in turn
        c = plan.traffic.concurrency
        for k, rep in enumerate(reps):
            idx = np.arange(k, len(arrivals), plan.replicas)
            clients = c // plan.replicas + (k < c % plan.replicas)
            if idx.size and clients:
                rep.run_closed(idx, clients, arrivals)
    elif plan.router == Router.LEAST_OUTSTANDING and plan.replicas > 1:
        _least_outstanding(reps, arrivals)
    else:
        for k, rep in enumerate(reps):
            idx = np.arange(k, len(arrivals), plan.replicas)
            if idx.size:
                rep.run(arrivals[idx], idx)
    if timeline is not None:
        timeline.arrivals, timeline.first, timeline.finish, timeline.kv_blocks = arrivals, req.first, req.finish, rc.kv_blocks
        timeline.output = output
    return measure(reps, arrivals, req.first, req.finish, prompt, output, rc.kv_blocks, slo)
