"""The discrete-event engine: one training step, action by action, on SimPy.

The engine consumes a ``StepCosts`` (seconds per virtual stage per micro-batch, from the
pure math) and the schedule of ``simcore.model.schedules`` (torch.distributed.pipelining's
order) and plays them out in time; it never recomputes FLOPs or bytes. Bubble, exposed
communication and compute are then *measured* on the timeline (``trace.split_step``),
as a profiler would, not taken from closed forms.

What runs (per simulated rank):

- the **compute stream** is the rank's process: it walks the schedule, waits for an
  action's input (the activation of the previous stage, or the gradient of the next),
  then runs recompute / kernels; blocking TP/CP/EP communication (``forward_comm_s``,
  ``backward_comm_s``) follows the kernels on the ``tp`` stream, since the compute
  stream waits on it (Megatron's TP all-reduces are synchronous); on a calibrated CPU
  host a pipeline chunk also waits for its input's hand-over first (the ``wait`` stream:
  idle, so bubble, as the executor measures it) and blocks in its send call last (``pp``);
  where torch posts a later receive in the same call (1F1B's steady phase,
  ``schedules.fused_p2p``) the post follows once the message is on its way (``pp``),
  and that receive's hand-over wait is shorter by it;
- **communication streams** (``pp`` send/recv, ``dp`` gathers, ``dp`` reductions,
  ``copy`` host-device) are FIFO ``simpy.Resource`` queues of capacity 1, like a CUDA
  stream holding NCCL kernels in issue order;
- **p2p sends** are asynchronous (torch's ``isend``): the sender goes on computing;
- **DDP / FSDP2 gradient reduction** (Li et al. 2020, PyTorch Distributed, Sec. 3.2):
  the per-step reduction of a stage is issued in ``grad_buckets`` equal buckets while
  that stage's last backward runs (gradient accumulation reduces only once per step),
  and overlaps the rest of the schedule; where ``grad_sync_holds_send`` (DDP under
  torch.distributed.pipelining, on a calibrated profile) that backward sends its input
  gradient only once the reduction is done;
- **FSDP2 parameter all-gather** (``param_gather_s``): the gather of the next unit of
  work (action, or layer at layer granularity) is issued when the current one starts,
  torch FSDP2's one-ahead prefetch; the work waits for its own gather;
- then the optimizer step, with optimizer-offload copies over PCIe (gradients down
  before, parameters up after) and the ZeRO-1/2 parameter all-gather.

Links: every transfer is a *fluid flow* over named links (a GPU's NIC or NVLink port
per direction, its PCIe link). ``FairShareLinks`` gives each active flow its max-min
fair share of every link it crosses (progressive filling, Bertsekas & Gallager, Data
Networks, Sec. 6.5.2), recomputed whenever a flow starts or ends. Work is in
seconds of the flow's uncontended time (the collective model's answer), so a link's
capacity is 1 and two flows on one link each take twice as long. A collective is one
flow over the links of all its members (fast: one event pair per collective, not one
per ring step). This is a fluid process rather than a ``BaseResource`` subclass
because a SimPy resource grants whole units, while bandwidth is divided continuously.

Compute shares the GPU with communication kernels: while a data-parallel collective
(DDP/ZeRO gradient reduction, FSDP2 or ZeRO-1/2 parameter all-gather) runs on a rank, that
rank's compute kernels progress at ``1/k`` of their speed, k = the GPU's
``comm_compute_interference`` (catalog ``efficiency.yaml``, carried in
``StepCosts.time_detail_s``), so hiding T seconds of such communication costs T (1 - 1/k)
of compute: the same physics as the analytic path (``simulate._interference_loss``).
Pipeline sends and the blocking TP/CP/EP collectives do not slow compute, as there.

Speed: a chunk of compute on a rank with no data-parallel collective in flight is one
timeout (no collective can start during it: only the rank's own process issues them);
streams are plain FIFO queues started synchronously (no SimPy event per operation);
gradient buckets issued while the previous bucket of the stage's reduction is still on
the wire join that flow (back-to-back flows on one FIFO stream over the same links are one
flow of their summed work, so this is exact in time); and a stage's last backward is cut
into at most ``MAX_BUCKET_CHUNKS`` chunks to issue its buckets.

Symmetry: ``mode="representative"`` simulates one data-parallel replica (one rank per
pipeline stage), assuming every replica does the same; ``mode="full"`` simulates every
(pipeline stage, data-parallel replica) pair, with data-parallel collectives as barriers
across the replicas, to check the reduction and to place stragglers. TP and CP ranks of
a group run in lockstep (every TP/CP collective is blocking), so each group is one
simulated process, labelled with the global rank of its first member.
"""
from __future__ import annotations

from dataclasses import dataclass

import functools
import math
from collections import defaultdict, deque

import numpy as np
import simpy

from simcore.model.costs import StepCosts
from simcore.model.schedules import Action, Op, build_schedule, fused_p2p
from simcore.plan.spec import ZeroStage
from simcore.results import GIB, Span, StepResult, rate_fields, split_step
from topologies.placement import rank_grid

GRANULARITIES = ("microbatch", "layer")
#: Resolution of the DDP bucket train: the engine cuts a stage's last backward into at most
#: this many chunks and issues the buckets whose gradients a chunk completes at its end
#: (DDP issues each 25 MB bucket as soon as it is full: thousands for a 10B-parameter
#: stage). Only the tail changes: at most 1/32 of the stage's reduction can be left after
#: the backward instead of one bucket; a modelling resolution, not a hardware figure.
MAX_BUCKET_CHUNKS = 32
MODES = ("representative", "full")
_EPS = 1e-12


# --------------------------------------------------------------------------- fluid links

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


# --------------------------------------------------------------------------- the step

class _Fifo:
    """A stream: operations run one at a time in issue order, like a CUDA stream holding
    NCCL kernels. ``simpy.Resource(capacity=1)`` did the same with two scheduled events per
    operation; this starts the next operation synchronously when the previous one frees
    the stream (the engine issues tens of thousands of operations per step)."""

    __slots__ = ("queue", "busy")

    def __init__(self):
        self.queue: deque = deque()
        self.busy = False

    def submit(self, start) -> None:
        """Run ``start(free)`` now if the stream is idle, else after the operations before it."""
        if self.busy:
            self.queue.append(start)
        else:
            self.busy = True
            start(self._free)

    def _free(self) -> None:
        if self.queue:
            self.queue.popleft()(self._free)
        else:
            self.busy = False


class _CountingEnv(simpy.Environment):
    """A SimPy environment that counts scheduled events (for ``bench/engine.py``)."""

    def __init__(self):
        super().__init__()
        self.scheduled = 0

    def schedule(self, event, priority=1, delay=0):
        self.scheduled += 1
        super().schedule(event, priority, delay)


def _pieces(costs: StepCosts, a: Action, n: int, posted: bool = False) -> tuple[tuple[str, str, float], ...]:
    """(stream, kind, seconds) run back to back by one of ``n`` chunks of compute action ``a``;
    ``posted``: its receive was posted with an earlier send (``schedules.fused_p2p``)."""
    v = a.stage
    if a.op == Op.W:
        return (("compute", "backward_weight", costs.backward_weight_s[v] / n),)
    send, wait = costs.host_p2p_s(v, a.op == Op.F)   # CPU host: the receive's hand-over, the send call
    if posted:   # the post ran on this rank after that send (``_Step._post``)
        wait = max(0.0, wait - costs.p2p_post_s)
    if a.op == Op.F:
        work = (("compute", "forward", costs.forward_s[v] / n), ("tp", "all_reduce", costs.forward_comm_s[v] / n))
    else:
        kind, t = ("backward", costs.backward_s(v)) if a.op == Op.B else ("backward_input", costs.backward_input_s[v])
        work = (("compute", "recompute", costs.recompute_s[v] / n), ("compute", kind, t / n),
                ("tp", "all_reduce", costs.backward_comm_s[v] / n))
    return (("wait", "recv", wait / n), *work, ("pp", "send", send / n))


class _Step:
    """State of one simulated step; ``run()`` plays it and returns the span tuples."""

    def __init__(self, costs: StepCosts, granularity: str, mode: str, factors: dict, slowdown: float,
                 jitter: float, seed: int):
        plan, par = costs.plan, costs.plan.parallel
        self.costs, self.granularity, self.full = costs, granularity, mode == "full"
        self.pp, self.stages, self.m = par.pp, costs.stages, plan.num_microbatches
        self.schedule = build_schedule(par.schedule, par.pp, self.m, par.vpp)
        self.env = _CountingEnv()
        self.net = FairShareLinks(self.env, slowdown)
        self.grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
        self.replicas = par.dp if self.full else 1
        self.units = [(i, j) for j in range(self.replicas) for i in range(par.pp)]
        self.label = {u: self.grid.rank(pp=u[0], dp=u[1]) for u in self.units}
        self.factor = factors
        self.jitter, self.rng = jitter, np.random.default_rng(seed)
        self.gpus_per_node = plan.cluster.gpus_per_node
        self.streams = {(u, s): _Fifo() for u in self.units for s in ("pp", "dp_gather", "dp_reduce", "copy")}
        self.fsdp = par.zero >= ZeroStage.WEIGHTS
        self.dp_busy: dict[int, int] = defaultdict(int)   # data-parallel collectives issued, not done
        self.open_reduce: dict = {}                       # unit -> the reduction last issued, mergeable
        self.arrived: dict = {}
        self.barriers: dict = {}
        self.seq: dict = defaultdict(int)
        self.spans: list[tuple] = []
        self.end: dict = {}

    # ---- links
    def _node(self, rank: int) -> int:
        return rank // self.gpus_per_node

    @functools.cache  # noqa: B019  (one _Step per simulated step)
    def _p2p_links(self, src: int, dst: int) -> tuple:
        port = "nvlink" if self._node(src) == self._node(dst) else "nic"
        return ((port, src, "out"), (port, dst, "in"))

    @functools.cache  # noqa: B019
    def _dp_links(self, unit) -> tuple:
        rank = self.label[unit]
        group = self.grid.group_of(rank, "dp")
        port = "nic" if len({self._node(r) for r in group}) > 1 else "nvlink"
        return ((port, rank, "out"), (port, rank, "in"))

    # ---- events between ranks
    def _event(self, key) -> simpy.Event:
        ev = self.arrived.get(key)
        if ev is None:
            ev = self.arrived[key] = self.env.event()
        return ev

    def _arrive(self, key) -> None:
        ev = self._event(key)
        if not ev.triggered:
            ev.succeed()

    def _on_stream(self, unit, stream: str, start) -> None:
        """Queue ``start(free)`` on a FIFO stream; ``start`` launches the work and the work
        calls ``free()`` when it ends, which starts the stream's next operation."""
        self.streams[unit, stream].submit(start)

    def _send(self, unit, dst, key, name: str) -> None:
        """Asynchronous p2p of one activation (or its gradient) on the sender's pp stream."""
        src, peer = self.label[unit], self.label[dst]

        def start(free):
            t0 = self.env.now

            def finish():
                dur = self.env.now - t0
                self.spans.append((src, "pp", "send", name, t0, dur))
                self.spans.append((peer, "pp", "recv", name, t0, dur))
                free()
                self._arrive(key)
            self.net.transfer(self._p2p_links(src, peer), self.costs.p2p_s, (), then=finish)
        self._on_stream(unit, "pp", start)

    def _collective(self, unit, stream: str, kind: str, name: str, work_s: float) -> simpy.Event:
        """A data-parallel collective: one flow; in full mode a barrier over the replicas.
        A gradient bucket issued while the previous reduction of this rank is still queued
        or on the wire joins it (representative mode; see the module docstring)."""
        rank = self.label[unit]
        rec = self.open_reduce.get(unit) if stream == "dp_reduce" else None
        if rec is not None:
            rec["last"] = name
            if rec["flow"] is None:
                rec["work"] += work_s
            else:
                self.net.extend(rec["flow"], work_s)
            return rec["done"]
        done = self.env.event()
        rec = {"flow": None, "work": work_s, "done": done, "last": name}
        if stream == "dp_reduce" and self.replicas == 1:
            self.open_reduce[unit] = rec
        self.dp_busy[rank] += 1

        def start(free):
            t0 = self.env.now

            def finish():
                if self.open_reduce.get(unit) is rec:
                    del self.open_reduce[unit]
                label = name if rec["last"] == name else f"{name}..{rec['last']}"
                self.spans.append((rank, "dp", kind, label, t0, self.env.now - t0))
                self.dp_busy[rank] -= 1
                free()
                done.succeed()
            if self.replicas == 1:
                rec["flow"] = self.net.transfer(self._dp_links(unit), rec["work"], (rank,), then=finish)
            else:
                self._barrier(unit, stream, work_s, finish)
        self._on_stream(unit, stream, start)
        return done

    def _barrier(self, unit, stream: str, work_s: float, finish) -> None:
        """Full mode: the collective starts when the last replica issues it; all finish together."""
        key = (unit[0], stream, self.seq[unit, stream])
        self.seq[unit, stream] += 1
        waiting = self.barriers.setdefault(key, [])
        waiting.append(finish)
        if len(waiting) == self.replicas:
            del self.barriers[key]
            members = [(unit[0], j) for j in range(self.replicas)]
            links = tuple(link for u in members for link in self._dp_links(u))
            self.net.transfer(links, work_s, tuple(self.label[u] for u in members),
                              then=lambda: [f() for f in waiting])

    # ---- the compute stream of one rank
    def _items(self, acts: list[Action]) -> list[tuple[Action, int, int, bool]]:
        """(action, chunk, chunks, issues-reduction) in order. DDP / ZeRO-1/2: the last B/W
        of a stage carries its gradient buckets; FSDP2 (ZeRO-3): every B/W reduce-scatters
        its micro-batch's gradients layer by layer (gradient accumulation does not skip it)."""
        last = {}
        for k, a in enumerate(acts):
            if a.op in (Op.B, Op.W):
                last[a.stage] = k
        items = []
        for k, a in enumerate(acts):
            grads = a.op in (Op.B, Op.W) if self.fsdp else last.get(a.stage) == k
            reduce = grads and self.costs.grad_reduce_per_step_s[a.stage] > 0
            if self.granularity == "layer":
                n = max(1, self.costs.layers[a.stage])
            elif reduce:
                units = self.costs.layers[a.stage] if self.fsdp else self.costs.grad_buckets[a.stage]
                n = max(1, min(units, MAX_BUCKET_CHUNKS))
            else:
                n = 1
            items += [(a, c, n, reduce) for c in range(n)]
        return items

    def _gather(self, unit, item):
        a, _c, n, _r = item
        if a.op == Op.W or self.costs.param_gather_s[a.stage] <= 0:
            return None
        work = self.costs.param_gather_s[a.stage] / 2 / n  # half forward, half backward
        return self._collective(unit, "dp_gather", "all_gather", f"{a.stage}UNSHARD", work)

    def _input_key(self, a: Action):
        if a.op == Op.F and a.stage > 0:
            return ("F", a.stage, a.microbatch)
        if a.op in (Op.B, Op.I) and a.stage < self.stages - 1:
            return ("B", a.stage, a.microbatch)
        return None

    def _output(self, unit, a: Action) -> None:
        if a.op == Op.F and a.stage < self.stages - 1:
            peer, key, name = a.stage + 1, ("F", a.stage + 1, a.microbatch), f"{a.stage}SEND_F{a.microbatch}"
        elif a.op in (Op.B, Op.I) and a.stage > 0:
            peer, key, name = a.stage - 1, ("B", a.stage - 1, a.microbatch), f"{a.stage}SEND_B{a.microbatch}"
        else:
            return
        dst = (peer % self.pp, unit[1])
        if dst == unit or self.costs.p2p_s <= 0:
            self._arrive(key + (unit[1],))
        else:
            self._send(unit, dst, key + (unit[1],), name)

    @functools.cache  # noqa: B019
    def _pieces(self, op: Op, stage: int, n: int, posted: bool) -> tuple:
        return tuple(p for p in _pieces(self.costs, Action(stage, op), n, posted) if p[2] > 0)

    def _fused(self, a: Action) -> tuple[bool, bool]:
        """``schedules.fused_p2p`` of ``a`` where the costs carry a receive post (CPU host)."""
        if self.costs.p2p_post_s <= 0:
            return False, False
        return fused_p2p(self.costs.plan.parallel.schedule, self.pp, self.m, a)

    def _post(self, unit, a: Action):
        """The receive torch posts in the same call as ``a``'s send: on the sender, after the
        message left (``_output``), so that it can hide in the wait for the reply."""
        if self._fused(a)[0]:
            t = self.env.now
            yield self.env.timeout(self.costs.p2p_post_s)
            self.spans.append((self.label[unit], "pp", "recv", f"{a}POST", t, self.costs.p2p_post_s))

    def _run_chunk(self, unit, a: Action, n: int):
        rank, factor = self.label[unit], self.factor.get(unit, 1.0)
        if self.jitter:
            factor *= float(self.rng.lognormal(-self.jitter**2 / 2, self.jitter))
        pieces = [(s, k, d * factor if s == "compute" else d)
                  for s, k, d in self._pieces(a.op, a.stage, n, self._fused(a)[1])]
        name = str(a)
        t = self.env.now
        if self.net.slowdown == 1.0 or not self.dp_busy[rank]:  # nothing slows it: one event
            yield self.env.timeout(sum(d for _s, _k, d in pieces))
            for s, k, d in pieces:
                self.spans.append((rank, s, k, name, t, d))
                t += d
            return
        for s, k, d in pieces:
            yield self.net.compute(rank, d) if s == "compute" else self.env.timeout(d)
            self.spans.append((rank, s, k, name, t, self.env.now - t))
            t = self.env.now

    def _rank(self, unit):
        acts = [a for a in self.schedule[unit[0]] if a is not None]
        items = self._items(acts)
        reductions, held, gather = [], [], self._gather(unit, items[0]) if items else None
        for idx, item in enumerate(items):
            a, c, n, reduce = item
            key = self._input_key(a) if c == 0 else None
            if key is not None:
                ev = self._event(key + (unit[1],))
                if not ev.triggered:
                    yield ev
            mine, gather = gather, self._gather(unit, items[idx + 1]) if idx + 1 < len(items) else None
            if mine is not None and not mine.triggered:
                yield mine
            yield from self._run_chunk(unit, a, n)
            if reduce:
                issued = self._reduce(unit, a, c, n)
                reductions += issued
                held = (held if c else []) + issued
            if c == n - 1:
                if reduce and self.costs.grad_sync_holds_send:   # DDP's reducer inside torch's stage backward
                    for ev in held:
                        if not ev.triggered:
                            yield ev
                self._output(unit, a)
                yield from self._post(unit, a)
        for ev in reductions:
            if not ev.triggered:
                yield ev
        yield from self._optimizer(unit)

    def _reduce(self, unit, a: Action, c: int, n: int) -> list[simpy.Event]:
        """The gradient reduction that chunk ``c`` of ``n`` of action ``a`` completes: FSDP2's
        reduce-scatter of its layers' micro-batch gradients, or the DDP buckets it filled
        (issued together: one flow, back to back on the FIFO stream as they would run)."""
        grad = self.costs.grad_reduce_per_step_s[a.stage]
        if self.fsdp:
            return [self._collective(unit, "dp_reduce", "reduce_scatter", f"{a.stage}REDUCE_SCATTER{a.microbatch}",
                                     grad / self.m / n)]
        buckets = max(1, self.costs.grad_buckets[a.stage])
        first, stop = (c * buckets) // n, ((c + 1) * buckets) // n
        if stop == first:
            return []
        name = f"{a.stage}REDUCE_GRAD{first}" + (f"-{stop - 1}" if stop - first > 1 else "")
        kind = "all_reduce" if self.costs.plan.parallel.zero == ZeroStage.NONE else "reduce_scatter"
        return [self._collective(unit, "dp_reduce", kind, name, grad * (stop - first) / buckets)]

    def _optimizer(self, unit):
        """Offload copy down, optimizer step, copy up, ZeRO-1/2 parameter all-gather."""
        local = range(unit[0], self.stages, self.pp)
        c, rank = self.costs, self.label[unit]
        copy_s = sum(c.offload_per_step_s[v] for v in local)
        opt_s = sum(c.optimizer_per_step_s[v] for v in local)
        sync_s = sum(c.param_sync_per_step_s[v] for v in local)
        on_host = c.plan.training.offload.value != "none"
        for name, work in (("grads to host", copy_s / 2), ("optimizer", opt_s), ("params to device", copy_s / 2)):
            if work <= 0:
                continue
            t0 = self.env.now
            if name == "optimizer":  # on the host with optimizer offload: the GPU waits on a copy-side job
                yield self.env.timeout(work * (1.0 if on_host else self.factor.get(unit, 1.0)))
                stream = "copy" if on_host else "compute"
            else:
                yield self.net.transfer((("pcie", rank),), work)
                stream = "copy"
            self.spans.append((rank, stream, "optimizer" if name == "optimizer" else "offload", name, t0,
                               self.env.now - t0))
        if sync_s > 0:
            yield self._collective(unit, "dp_gather", "all_gather", "param sync", sync_s)
        self.end[unit] = self.env.now

    def run(self) -> list[Span]:
        for unit in self.units:
            self.env.process(self._rank(unit))
        self.env.run()
        if len(self.end) != len(self.units):
            raise RuntimeError("the schedule deadlocked: some ranks never reached the optimizer step")
        return [Span(*s) for s in sorted(self.spans, key=lambda s: (s[0], s[4], s[1]))]


# --------------------------------------------------------------------------- entry point

def _factors(costs: StepCosts, stragglers: dict[int, float] | None, full: bool) -> dict:
    """Slow-down of each simulated unit: the slowest of the global ranks it stands for
    (a TP group waits for its slowest member; in representative mode a pipeline stage
    is as slow as its slowest replica, which the data-parallel reduction waits for)."""
    par = costs.plan.parallel
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    out: dict = {}
    for rank, factor in (stragglers or {}).items():
        if not 0 <= rank < grid.world:
            raise ValueError(f"stragglers rank {rank} is outside the plan's ranks 0..{grid.world - 1}")
        if not (factor > 0 and math.isfinite(factor)):
            raise ValueError(f"stragglers[{rank}]={factor} must be a positive slow-down factor")
        c = grid.coords(rank)
        unit = (c["pp"], c["dp"] if full else 0)
        out[unit] = max(out.get(unit, 1.0), factor)
    return out


def stage_stragglers(costs_or_plan, stages: dict[int, float]) -> dict[int, float]:
    """Expand ``{pipeline stage: factor}`` into ``{global rank: factor}`` for ``simulate_des``."""
    par = getattr(costs_or_plan, "plan", costs_or_plan).parallel
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    return {r: f for s, f in stages.items() for r in range(grid.world) if grid.coords(r)["pp"] == s}


def default_interference(costs: StepCosts) -> float:
    """The GPU's ``comm_compute_interference`` (catalog efficiency.yaml or a calibrated
    profile) as ``step_costs`` carried it; 1.0 (none) for hand-built costs without it."""
    return float(costs.time_detail_s.get("comm_compute_interference", 1.0))


def simulate_des(costs: StepCosts, *, granularity: str = "microbatch", mode: str = "representative",
                 stragglers: dict[int, float] | None = None, seed: int = 0,
                 comm_compute_interference: float | None = None, jitter: float = 0.0) -> StepResult:
    """Play one training step on the event engine and measure it from its timeline.

    ``stragglers`` maps global ranks to a compute slow-down factor (``stage_stragglers``
    builds it for whole pipeline stages). ``comm_compute_interference`` (k >= 1): compute
    runs at 1/k speed while a data-parallel collective runs on its GPU; None takes the
    catalog figure from ``costs`` (``default_interference``).
    ``jitter`` is the log-normal sigma of per-chunk compute noise drawn from
    ``numpy.random.default_rng(seed)`` (0: deterministic).
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} must be one of: {', '.join(GRANULARITIES)}")
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of: {', '.join(MODES)}")
    slowdown = default_interference(costs) if comm_compute_interference is None else comm_compute_interference
    if not slowdown >= 1.0:
        raise ValueError(f"comm_compute_interference={slowdown} must be at least 1.0")
    if jitter < 0:
        raise ValueError(f"jitter={jitter} must be non-negative")
    step = _Step(costs, granularity, mode, _factors(costs, stragglers, mode == "full"), slowdown, jitter, seed)
    spans = step.run()
    return _result(costs, spans, max(step.end.values()), step, mode)


def _result(costs: StepCosts, spans: list[Span], step_s: float, step: _Step, mode: str) -> StepResult:
    plan = costs.plan
    ranks = sorted(step.label.values())
    own: dict[int, list[Span]] = defaultdict(list)
    for s in spans:
        own[s.rank].append(s)
    splits = {r: split_step(own[r], r, 0.0, step_s) for r in ranks}   # sort + sweep: once per rank
    critical = max(ranks, key=lambda r: (splits[r]["compute_s"] + splits[r]["exposed_comm_s"]
                                         + splits[r]["offload_s"], -r))
    split = splits[critical]
    by_kind: dict[str, float] = defaultdict(float)
    for s in spans:
        if s.rank == critical:
            name = {"tp": "tp_comm", "pp": "pp_comm", "dp": "dp_comm", "wait": "pp_wait"}.get(s.stream, s.kind)
            by_kind[name] += s.duration_s
    by_kind["bubble"] = split["bubble_s"]
    peak = plan.cluster.node.gpu.peak(plan.training.precision.value)
    notes = list(costs.notes)
    if not peak:
        notes.append(f"no {plan.training.precision.value} peak for {plan.cluster.node.gpu.name}: mfu/hfu are 0")
    # as the analytic path: the most loaded pipeline rank, and host memory for offload
    memory = max(costs.memory_per_rank_bytes, default=sum(costs.memory_bytes.values()))
    host_ok = costs.time_detail_s.get("host_memory_per_node_bytes", 0.0) <= plan.cluster.node.host_memory_bytes
    return StepResult(
        source="des", plan_name=plan.name, step_time_s=step_s,
        **rate_fields(plan, step_s, costs.model_flops_per_step, costs.hardware_flops_per_step),
        compute_s=split["compute_s"], exposed_comm_s=split["exposed_comm_s"], bubble_s=split["bubble_s"],
        offload_s=split["offload_s"], memory_per_gpu_gib=memory / GIB,
        fits=memory <= plan.cluster.node.gpu.hbm_bytes and host_ok, memory_bytes=dict(costs.memory_bytes),
        time_s=dict(by_kind), memory_per_rank_gib=tuple(b / GIB for b in costs.memory_per_rank_bytes),
        spans=tuple(spans), notes=tuple(notes),
        extra={"critical_rank": critical, "simulated_ranks": len(ranks), "des_events": step.env.scheduled,
               "full_mode": float(mode == "full")},
    )

# =========================================================================== whole training run
# A whole training run on SimPy: work, checkpoints, failures, restarts, preemptions.
# 
# One process trains: it works ``interval_s`` of useful steps, then writes a checkpoint
# (``checkpoint_s`` blocking), and repeats until ``work_s`` of useful work is done. A
# second process draws the time to the next interruption from an exponential law with
# ``failure_rate_per_s`` (failures and, for spot capacity, preemptions: independent
# Poisson processes, so their rates add) and interrupts the first. An interruption loses
# the work since the last completed checkpoint (a checkpoint cut short is lost too), then
# costs ``restart_s`` (detect, reschedule, relaunch) plus ``restore_s`` (read the
# checkpoint back) before training resumes. This is the model of Daly, "A higher order
# estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), 2006,
# Sec. 2, played out event by event rather than in expectation; interruptions during a
# restart start the restart over, as in Daly's model.

@dataclass(frozen=True, slots=True, kw_only=True)
class RunSample:
    """One simulated training run."""

    wall_s: float
    """Wall time from start to the last useful step."""
    interruptions: int
    lost_work_s: float
    """Useful work redone after interruptions (and checkpoints cut short)."""
    checkpoints: int
    checkpoint_s: float
    """Time spent writing checkpoints that completed."""
    restart_s: float
    """Time spent restarting and restoring."""


class _Log:
    __slots__ = ("done_s", "interruptions", "lost_s", "checkpoints", "checkpoint_s", "restart_s")

    def __init__(self) -> None:
        self.done_s = 0.0
        self.interruptions = 0
        self.lost_s = 0.0
        self.checkpoints = 0
        self.checkpoint_s = 0.0
        self.restart_s = 0.0


def _train(env: simpy.Environment, log: _Log, work_s: float, interval_s: float,
           checkpoint_s: float, recover_s: float, finished: simpy.Event):
    """The training job. Between interruptions it runs segments of ``interval_s`` work,
    each closed by a ``checkpoint_s`` write (none after the last); one timeout covers
    the whole uninterrupted stretch, and an interruption is resolved against the
    segment boundaries, so events scale with interruptions, not with checkpoints.
    After an interruption it recovers for ``recover_s``; an interruption during the
    recovery starts the recovery over."""
    period = interval_s + checkpoint_s
    recovering = False
    while recovering or log.done_s < work_s:
        start = env.now
        if recovering:
            try:
                yield env.timeout(recover_s)
                log.restart_s += recover_s
                recovering = False
            except simpy.Interrupt:
                log.restart_s += env.now - start
                log.interruptions += 1
            continue
        left = work_s - log.done_s
        full = max(0, math.ceil(left / interval_s) - 1)    # checkpoints still to write
        try:
            yield env.timeout(left + full * checkpoint_s)
            log.checkpoints += full
            log.checkpoint_s += full * checkpoint_s
            log.done_s = work_s
        except simpy.Interrupt:
            elapsed = env.now - start
            saved = min(full, int(elapsed // period))     # checkpoints completed before the failure
            log.checkpoints += saved
            log.checkpoint_s += saved * checkpoint_s
            log.done_s += saved * interval_s
            log.lost_s += min(elapsed - saved * period, interval_s)
            log.interruptions += 1
            recovering = True
    finished.succeed()


def _interrupter(env: simpy.Environment, job: simpy.Process, rate_per_s: float, rng: np.random.Generator):
    """Failures (and preemptions) as a Poisson process: exponential gaps."""
    while job.is_alive:
        yield env.timeout(rng.exponential(1.0 / rate_per_s))
        if job.is_alive:
            job.interrupt("failure")


def simulate_training_run(*, work_s: float, interval_s: float, checkpoint_s: float, restore_s: float,
                          restart_s: float, failure_rate_per_s: float,
                          rng: np.random.Generator) -> RunSample:
    """One run of ``work_s`` seconds of useful steps with checkpoints every ``interval_s``."""
    if work_s <= 0 or interval_s <= 0:
        raise ValueError(f"work_s={work_s} and interval_s={interval_s} must be positive")
    env = simpy.Environment()
    log = _Log()
    finished = env.event()
    job = env.process(_train(env, log, work_s, interval_s, checkpoint_s, restart_s + restore_s, finished))
    if failure_rate_per_s > 0:
        env.process(_interrupter(env, job, failure_rate_per_s, rng))
    env.run(until=finished)
    return RunSample(wall_s=env.now, interruptions=log.interruptions, lost_work_s=log.lost_s,
                     checkpoints=log.checkpoints, checkpoint_s=log.checkpoint_s, restart_s=log.restart_s)


def monte_carlo_runs(n: int, seed: int, **kwargs) -> list[RunSample]:
    """``n`` independent runs; run i draws from ``default_rng([seed, i])`` (reproducible)."""
    return [simulate_training_run(rng=np.random.default_rng([seed, i]), **kwargs) for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else math.nan
