"""Fluid links of the event engine: transfers and compute kernels as flows with max-min
fair rates.

Links: every transfer is a *fluid flow* over named links (a GPU's NIC or NVLink port
per direction, its PCIe link). ``FairShareLinks`` gives each active flow its max-min
fair share of every link it crosses (progressive filling, Bertsekas & Gallager, Data
Networks, Sec. 6.5.2), recomputed whenever a flow starts or ends. Work is in
seconds of the flow's uncontended time (the collective model's answer), so a link's
capacity is 1 and two flows on one link each take twice as long. A collective is one
flow over the links of all its members (fast: one event pair per collective, not one
per ring step). This is a fluid process rather than a ``BaseResource`` subclass
because a SimPy resource grants whole units, while bandwidth is divided continuously.
"""
from __future__ import annotations

from collections import defaultdict

import simpy

_EPS = 1e-12


class _Flow:
    __slots__ = ("links", "left", "rate", "cap", "stamp", "version", "done", "ranks")

    def __init__(self, links, work_s, done, ranks, cap):
        self.links, self.left, self.done, self.ranks, self.cap = links, work_s, done, ranks, cap
        self.rate, self.stamp, self.version = 0.0, 0.0, 0


class FairShareLinks:
    """Flows on shared links with fluid max-min fair bandwidth (capacity 1 per link).

    ``transfer(links, work_s, ranks)`` returns an event that fires when the flow has
    moved ``work_s`` seconds' worth of uncontended transfer. ``compute(rank, work_s)``
    runs kernels at rate 1, or ``1 / slowdown`` while a flow touches ``rank``.
    """

    def __init__(self, env: simpy.Environment, slowdown: float = 1.0):
        self.env, self.slowdown = env, slowdown
        self.on_link: dict = defaultdict(set)
        self.comm_on_rank: dict[int, int] = defaultdict(int)
        self.compute_of_rank: dict[int, _Flow] = {}

    def transfer(self, links: tuple, work_s: float, ranks: tuple[int, ...] = (), then=None):
        """Start a flow that slows the compute of ``ranks``; returns its completion event, or
        calls ``then()`` at completion instead and returns the flow."""
        done = self.env.event() if then is None else then
        flow = _Flow(links, work_s, done, ranks, 1.0)
        flow.stamp = self.env.now
        for link in links:
            self.on_link[link].add(flow)
        touched = self._count_comm(ranks, +1)
        self._rerate(self._component(links) | touched)
        return flow if then is not None else done

    def extend(self, flow: _Flow, work_s: float) -> None:
        """Add ``work_s`` to a flow still on the wire: the next operation of the same FIFO
        stream over the same links would start the instant this one ends, at the same rate."""
        now = self.env.now
        flow.left = max(0.0, flow.left - flow.rate * (now - flow.stamp)) + work_s
        flow.stamp = now
        flow.version += 1
        self.env.timeout(flow.left / flow.rate).callbacks.append(self._finisher(flow, flow.version))

    def compute(self, rank: int, work_s: float) -> simpy.Event:
        cap = 1.0 / self.slowdown if self.comm_on_rank[rank] else 1.0
        flow = _Flow((), work_s, self.env.event(), (rank,), cap)
        flow.stamp = self.env.now
        self.compute_of_rank[rank] = flow
        self._rerate({flow})
        return flow.done

    def _count_comm(self, ranks, delta: int) -> set:
        """Update the comm count of ``ranks``; the compute flows whose speed changes."""
        changed = set()
        for r in ranks:
            before = self.comm_on_rank[r]
            self.comm_on_rank[r] = before + delta
            flow = self.compute_of_rank.get(r)
            if flow is not None and (before == 0) != (before + delta == 0):
                flow.cap = 1.0 / self.slowdown if before + delta else 1.0
                changed.add(flow)
        return changed

    def _component(self, links) -> set:
        """Every flow connected to ``links`` through shared links."""
        flows, todo, seen = set(), list(links), set(links)
        while todo:
            for f in self.on_link.get(todo.pop(), ()):
                if f not in flows:
                    flows.add(f)
                    for link in f.links:
                        if link not in seen:
                            seen.add(link)
                            todo.append(link)
        return flows

    def _rerate(self, flows: set) -> None:
        now = self.env.now
        for f in flows:  # settle progress at the old rates
            f.left = max(0.0, f.left - f.rate * (now - f.stamp))
            f.stamp = now
        rates = _max_min_rates(flows)
        for f in flows:
            f.rate = rates[f]
            f.version += 1
            self.env.timeout(f.left / f.rate).callbacks.append(self._finisher(f, f.version))

    def _finisher(self, flow: _Flow, version: int):
        def finish(_event):
            if flow.version != version:
                return  # superseded by a later re-rating
            flow.left, flow.stamp = 0.0, self.env.now
            for link in flow.links:
                self.on_link[link].discard(flow)
            if not flow.links:
                del self.compute_of_rank[flow.ranks[0]]
                touched = set()
            else:
                touched = self._count_comm(flow.ranks, -1)
            self._rerate(self._component(flow.links) | touched)
            if isinstance(flow.done, simpy.Event):
                flow.done.succeed()
            else:
                flow.done()
        return finish


def _max_min_rates(flows) -> dict:
    """Progressive filling: raise every unfrozen flow's rate together until a link is full
    (its flows freeze) or a flow reaches its own cap."""
    if len(flows) == 1:  # alone on its links: its own cap (links have capacity 1)
        return {f: min(f.cap, 1.0) for f in flows}
    rates, active = {}, set(flows)
    room: dict = {}
    users: dict = defaultdict(int)
    for f in active:
        for link in f.links:
            room[link] = 1.0
            users[link] += 1
    level = 0.0
    while active:
        step = min(f.cap for f in active) - level
        for link, n in users.items():
            if n:
                step = min(step, room[link] / n)
        level += step
        for link, n in users.items():
            room[link] -= step * n
        frozen = [f for f in active if f.cap - level <= _EPS or any(room[k] <= _EPS for k in f.links)]
        for f in frozen:
            rates[f] = level
            active.discard(f)
            for link in f.links:
                users[link] -= 1
    return rates
