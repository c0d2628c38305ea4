"""How a serving plan's requests reach its replicas (``simcore.engine.serving``): in turn, to the
replica with the fewest outstanding requests, or from closed-loop clients bound to the replicas
in turn. A replica is ``serving._Replica`` (``run``, ``run_closed``, ``begin``, ``complete``)."""
from __future__ import annotations

import heapq

import numpy as np

from simcore.serving.spec import Arrival, Router, ServingPlan


def route(plan: ServingPlan, reps: list, arrivals: np.ndarray) -> None:
    """Serve every request on the replicas as the plan's traffic and router send them."""
    if plan.traffic.arrival == Arrival.CONCURRENCY:
        # the clients bound to the replicas in turn (fewer clients than replicas: some idle),
        # each busy replica's requests in turn
        c = plan.traffic.concurrency
        busy = reps[:min(c, len(reps))]
        for k, rep in enumerate(busy):
            idx = np.arange(k, len(arrivals), len(busy))
            if idx.size:
                rep.run_closed(idx, c // len(busy) + (k < c % len(busy)), arrivals)
    elif plan.router == Router.LEAST_OUTSTANDING and len(reps) > 1:
        _least_outstanding(reps, arrivals)
    else:
        round_robin(reps, arrivals, np.arange(len(arrivals)))


def round_robin(reps: list, arrivals: np.ndarray, order: np.ndarray) -> None:
    """Requests ``order`` (by arrival) to the replicas in turn; each replica alone on its share."""
    for k, rep in enumerate(reps):
        idx = order[k::len(reps)]
        if idx.size:
            rep.run(arrivals[idx], idx)


def _least_outstanding(reps: list, arrivals: np.ndarray) -> None:
    """Route each arrival to the replica with the fewest outstanding requests (ties: the next
    after the last chosen, so identical idle replicas take turns), on one clock: before an
    arrival at t, every iteration that ends before t has ended (an iteration ending exactly at
    t sees the arrival, as in ``_Replica.run``); requests arriving at one instant are all
    routed before an idle replica starts. A replica holding a batch for its window (dynamic
    batching) is not busy: an arrival may fill the batch; its wake-up is an event that a newer
    hold (``_Replica.timer``) or a started batch makes stale."""
    heap: list[tuple[float, int, int]] = []   # (time, replica, -1: an iteration ends; else the hold's timer)
    busy, starting, last, r = [False] * len(reps), [], -1, len(reps)

    def schedule(k: int, end: float) -> None:
        busy[k] = end >= 0
        if end >= 0:
            heapq.heappush(heap, (end, k, -1))
        elif reps[k].wake >= 0:
            heapq.heappush(heap, (reps[k].wake, k, reps[k].timer))

    def advance(until: float, inclusive: bool) -> None:
        while heap and (heap[0][0] < until or (inclusive and heap[0][0] <= until)):
            t, k, timer = heapq.heappop(heap)
            if timer < 0:
                reps[k].complete(t)
            elif timer != reps[k].timer or reps[k].pending is not None:
                continue   # a stale wake-up: the batch started, or a newer hold replaced it
            schedule(k, reps[k].begin(t))

    def start(now: float) -> None:
        for k in starting:
            schedule(k, reps[k].begin(now))
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
