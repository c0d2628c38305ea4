"""The event engine serving requests: arrivals, continuous batching, a paged KV cache, preemption.

Replicas sit behind a router. Round robin sends request i to replica i mod R whatever their
state, so each replica is simulated on its own; least outstanding requests reads the replicas'
state at each arrival, so they run on one clock (``serving_route``). A replica's events are the
arrivals and the ends of its iterations: it runs one iteration after another while it has work, each formed
by the scheduler's rules (``simcore.serving.spec``: vLLM's v1 scheduler, or TensorRT-LLM's
guaranteed-no-evict and static-batch capacity policies) and lasting
``simcore.serving.cost.iteration_s``; idle, it waits for the next arrival.

Decoding requests are held in aggregate (their count, their contexts' sum, a heap of the step
at which each ends, and per KV-block phase the count that needs a new block at a step), so an
iteration costs O(1) plus its admissions and completions: an hour at 100 requests/s runs in
seconds (bench/serving_speed.py).

A disaggregated plan runs two pools in turn (``_disaggregated``): prefill instances to each
request's first token, then, after its KV cache's transfer, decode instances.
"""
from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import replace

import numpy as np

from simcore.engine.serving_measure import (ServingResult, ServingTimeline, arrival_times, measure, per_token,
                                            request_lengths)
from simcore.engine.serving_route import round_robin, route
from simcore.plan.spec import PlanError
from simcore.serving.cost import ReplicaCost, iteration_s, kv_bytes_per_token, replica_cost
from simcore.serving.spec import CapacityPolicy, ServingPlan, SloSpec

__all__ = ["ServingResult", "ServingTimeline", "arrival_times", "per_token", "request_lengths", "simulate_serving"]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class _Replica:
    """One replica's scheduler state; ``run`` simulates it over its arrivals."""

    def __init__(self, rc: ReplicaCost, plan: ServingPlan, index: int = 0, log: list | None = None):
        self.rc, self.bs = rc, rc.block_size
        self.index, self.log = index, log          # the timeline's iteration list, when one is kept
        self.queued: deque[int] = deque()          # a closed loop's requests not yet sent
        s = plan.scheduler
        self.max_seqs, self.budget, self.chunked = s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill
        # TensorRT-LLM's policies reserve a request's blocks to completion at admission (never preempting)
        self.reserving = s.capacity_policy != CapacityPolicy.ON_DEMAND
        self.prefilled = False                    # a decode instance of a disaggregated plan
        self.static = s.capacity_policy == CapacityPolicy.STATIC_BATCH
        self.window = s.batch_window_s                # dynamic batching: the oldest request's wait
        self.wake, self.timer = -1.0, 0               # when a held batch forms; the hold's count
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
        self.arrived = req.arrived

    def _held(self, now: float) -> bool:
        """Dynamic batching: no batch runs, fewer than a full one wait and the oldest has waited
        less than the window; ``wake`` is then when it will have (a new hold: a new ``timer``)."""
        if not (self.window and not self.running and self.waiting and len(self.waiting) < self.max_seqs):
            return False
        deadline = float(self.arrived[self.waiting[0]]) + self.window
        if now >= deadline:
            return False
        if deadline != self.wake:
            self.wake, self.timer = deadline, self.timer + 1
        return True

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
            if self.prefilled:                        # its KV arrived from a prefill instance
                if self._reservation(rid) > self.free:
                    break
                self.waiting.popleft()
                self.free -= self._reservation(rid)
                self.running.add(rid)
                self.order.append(rid)
                self._join(rid, self.P[rid])
                budget -= 1
                continue
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
            self._join(rid, entry[2])

    def _join(self, rid: int, ctx: int) -> None:
        """A request whose ``ctx`` tokens are in the cache joins the decoders."""
        self.c0[rid], self.s0[rid] = ctx, self.step
        self.n_dec += 1
        self.sum_ctx += ctx
        if not self.reserving:                        # a reserving policy holds its blocks already
            self.phase[(self.step - ctx) % self.bs] += 1
        heapq.heappush(self.ends, (self.step + self.O[rid] - self.gen[rid], rid, self.epoch[rid]))

    def begin(self, now: float) -> float:
        """Form and cost the next iteration at ``now``; its end time, or -1.0 when idle or holding a
        batch for the window (``wake`` then says until when)."""
        if not self.running and not self.waiting or self._held(now):
            return -1.0
        self.wake = -1.0
        tokens, pairs, kv_read, chunks = self._schedule()
        n_dec, sum_ctx = self.n_dec, self.sum_ctx        # after any preemption
        rows = n_dec + sum(1 for e, c, _ in chunks if e[1] + c >= e[2])
        dt = iteration_s(self.rc, tokens + n_dec, pairs + sum_ctx + n_dec, kv_read + sum_ctx, rows,
                         chunks=len(chunks), decodes=n_dec, idle_s=now - self.end)
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
            end = self.begin(now)
            if end < 0:                               # holding a batch: no one else sends meanwhile
                now = self.wake
                continue
            now = end
            self.complete(now)

    def run(self, arrivals: np.ndarray, ids: np.ndarray) -> None:
        """Serve requests ``ids`` arriving at ``arrivals`` alone (a round-robin share)."""
        n, now, nxt = len(arrivals), 0.0, 0
        while nxt < n or self.waiting or self.running:
            while nxt < n and arrivals[nxt] <= now:
                self.waiting.append(int(ids[nxt]))
                nxt += 1
            end = self.begin(now)
            if end < 0:                               # idle, or holding a batch until ``wake``
                now = min(float(arrivals[nxt]) if nxt < n else math.inf, self.wake if self.wake >= 0 else math.inf)
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
        self.arrived = np.zeros(n)   # each request's arrival (a closed loop's: when it was sent)


def simulate_serving(plan: ServingPlan, rc: ReplicaCost | None = None, slo: SloSpec | None = None,
                     timeline: ServingTimeline | None = None) -> ServingResult:
    """Serve the plan's traffic on its replicas behind its router and measure it against ``slo``
    (the plan's where none is given); fill ``timeline`` where one is given."""
    slo = slo or plan.slo
    if plan.disaggregation is not None:
        return _disaggregated(plan, rc or replica_cost(plan), slo, timeline)
    rc = rc or replica_cost(plan)
    arrivals = arrival_times(plan)
    log = timeline.iterations if timeline is not None else None
    reps = [_Replica(rc, plan, k, log) for k in range(plan.replicas)]
    prompt, output = request_lengths(plan)
    _check_fits(plan, rc, prompt, output)
    req = _Requests(prompt, output)
    req.arrived = arrivals   # the same array a closed loop writes its send times into
    for rep in reps:
        rep.attach(req)
    route(plan, reps, arrivals)
    if timeline is not None:
        timeline.arrivals, timeline.first, timeline.finish, timeline.kv_blocks = arrivals, req.first, req.finish, rc.kv_blocks
        timeline.output = output
    return measure(reps, arrivals, req.first, req.finish, prompt, output, rc.kv_blocks, slo)


def _check_fits(plan: ServingPlan, rc: ReplicaCost, prompt: np.ndarray, output: np.ndarray) -> None:
    """Refuse a request whose whole context cannot sit in a replica's KV cache (vLLM checks the
    longest context against the cache at start-up); it would be preempted and re-admitted forever.
    Its KV holds its prompt and outputs but the last (under a reserving policy: all of them)."""
    longest = int((prompt + output).max()) - (plan.scheduler.capacity_policy == CapacityPolicy.ON_DEMAND)
    if _ceil_div(longest, rc.block_size) > rc.kv_blocks:
        raise PlanError(f"a request of {longest} tokens needs more KV blocks than a replica's {rc.kv_blocks} "
                        f"(kv_cache.block_size={rc.block_size}); use more GPUs per replica")


def kv_transfer_s(plan: ServingPlan, prefill: ServingPlan, prompt: np.ndarray) -> np.ndarray:
    """Each request's KV cache from its prefill instance to its decode instance: every prefill
    rank sends its shard (``kv_bytes_per_token`` of the prefill TP) over its own link, NVLink where
    both pools fit in one NVLink domain, else its share of the node's NICs (DistServe, Zhong et
    al., OSDI 2024, Sec. 4: the transfer over the network between instances)."""
    c = plan.cluster
    link = c.node.gpu.intra_link_bytes_per_s if plan.gpus <= c.nvlink_domain else (
        c.fabric.nic_bytes_per_s if c.fabric else c.node.gpu.intra_link_bytes_per_s)
    return prompt * kv_bytes_per_token(prefill) / link


def _disaggregated(plan: ServingPlan, rc: ReplicaCost, slo: SloSpec | None,
                   timeline: ServingTimeline | None) -> ServingResult:
    """Two pools: the prefill instances serve every request to its first token (the plan's
    router), its KV cache travels to a decode instance (in turn, by arrival there), which admits
    it when its blocks to completion fit (no preemption: a preempted decode would need its KV sent
    again) and decodes the rest."""
    d = plan.disaggregation
    pre = replace(plan, tp=d.prefill_tp, replicas=d.prefill_replicas, disaggregation=None)
    dec = replace(plan, disaggregation=None)
    rc_pre = replica_cost(pre)
    arrivals = arrival_times(plan)
    prompt, output = request_lengths(plan)
    log = timeline.iterations if timeline is not None else None
    first_pass = _Requests(prompt, np.ones_like(output))
    prefills = [_Replica(rc_pre, pre, k, log) for k in range(d.prefill_replicas)]
    for rep in prefills:
        rep.attach(first_pass)
    route(pre, prefills, arrivals)
    first = first_pass.finish
    at_decode = first + kv_transfer_s(plan, pre, prompt)
    second = _Requests(prompt, output)
    second.gen, second.first = [1] * len(prompt), first.copy()
    decodes = [_Replica(rc, dec, d.prefill_replicas + k, log) for k in range(plan.replicas)]
    for rep in decodes:
        rep.attach(second)
        rep.prefilled = rep.reserving = True
    order = np.array([i for i in np.argsort(at_decode, kind="stable") if output[i] > 1], dtype=np.int64)
    round_robin(decodes, at_decode, order)
    finish = np.where(output > 1, second.finish, first)
    if timeline is not None:
        timeline.arrivals, timeline.first, timeline.finish, timeline.kv_blocks = arrivals, first, finish, rc.kv_blocks
        timeline.output = output
        timeline.replica_kv_blocks = {**{k: rc_pre.kv_blocks for k in range(d.prefill_replicas)},
                                      **{d.prefill_replicas + k: rc.kv_blocks for k in range(plan.replicas)}}
    return measure(prefills + decodes, arrivals, first, finish, prompt, output, rc.kv_blocks, slo)
