"""State and communication of one simulated step (``simcore.engine.des``).

``_StepState`` holds the step's state and its bookkeeping: the links between simulated
ranks, the events by which ranks wait for each other, and each rank's FIFO streams.
``_StepComm`` issues the step's communication on them: pipeline p2p sends (and the
receive torch posts with a send), data-parallel collectives with their barriers across
replicas in full mode, the gradient reduction and the FSDP2 parameter all-gather.
"""
from __future__ import annotations

import functools
from collections import defaultdict

import numpy as np
import simpy

from simcore.engine.links import FairShareLinks
from simcore.engine.streams import _CountingEnv, _Fifo
from simcore.model.costs import StepCosts
from simcore.model.dualpipe import paired_forwards
from simcore.model.schedules import Action, Op, build_schedule, fused_p2p
from simcore.plan.spec import ZeroStage
from topologies.placement import rank_grid


class _StepState:
    """State of one simulated step: links, events between ranks, streams."""

    def __init__(self, costs: StepCosts, granularity: str, mode: str, factors: dict, slowdown: float,
                 jitter: float, seed: int):
        plan, par = costs.plan, costs.plan.parallel
        self.costs, self.granularity, self.full = costs, granularity, mode == "full"
        self.pp, self.stages, self.m = par.pp, costs.stages, plan.num_microbatches
        self.schedule = build_schedule(par.schedule, par.pp, self.m, par.vpp, par.microbatch_group)
        self.rank_of = [par.stage_rank(v) for v in range(costs.stages)]   # v % pp, or DualPipeV's V
        # DualPipeV: a paired forward's activation leaves after the pair's backward (``Overlap``)
        self.paired = paired_forwards(par.pp, self.m) if par.v_shape else frozenset()
        # DDP's reducer inside the stage backward holds its send; DualPipeV reduces by replicate's
        # REDUCE_GRAD, after the send (``analytic._held_sends_s``)
        self.holds_send = costs.grad_sync_holds_send and not par.v_shape
        self.env = _CountingEnv()
        self.net = FairShareLinks(self.env, slowdown)
        self.grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
        self.replicas = par.dp if self.full else 1
        self.units = [(i, j) for j in range(self.replicas) for i in range(par.pp)]
        self.label = {u: self.grid.rank(pp=u[0], dp=u[1]) for u in self.units}
        self.factor = factors
        self.jitter, self.rng = jitter, np.random.default_rng(seed)
        self.domain_gpus = plan.cluster.nvlink_domain   # ranks of one NVLink domain (node or NVL72 rack)
        self.streams = {(u, s): _Fifo() for u in self.units for s in ("pp", "dp_gather", "dp_reduce", "copy")}
        self.fsdp = costs.grad_reduce_per_microbatch   # FSDP2 alone: each backward reduce-scatters
        self.dp_busy: dict[int, int] = defaultdict(int)   # data-parallel collectives issued, not done
        self.open_reduce: dict = {}                       # unit -> the reduction last issued, mergeable
        self.arrived: dict = {}
        self.barriers: dict = {}
        self.seq: dict = defaultdict(int)
        self.spans: list[tuple] = []
        self.end: dict = {}

    # ---- links
    def _node(self, rank: int) -> int:
        return rank // self.domain_gpus

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


class _StepComm(_StepState):
    """The communication of one simulated step: p2p sends, collectives, barriers, gradient
    reduction and parameter gathers, each on its rank's FIFO stream."""

    # ---- pipeline p2p
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
        dst = (self.rank_of[peer], unit[1])
        if dst == unit or self.costs.p2p_s <= 0:
            self._arrive(key + (unit[1],))
        else:
            self._send(unit, dst, key + (unit[1],), name)

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

    # ---- data-parallel collectives
    def _collective(self, unit, stream: str, kind: str, name: str, work_s: float) -> simpy.Event:
        """A data-parallel collective: one flow; in full mode a barrier over the replicas.
        A gradient bucket issued while the previous reduction of this rank is still queued
        or on the wire joins it (representative mode; see ``simcore.engine.des``)."""
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

    def _gather(self, unit, item):
        a, _c, n, _r = item
        gathers = self.costs.forward_gather_s if a.op == Op.F else self.costs.backward_gather_s
        if a.op == Op.W or gathers[a.stage] <= 0:
            return None
        return self._collective(unit, "dp_gather", "all_gather", f"{a.stage}UNSHARD", gathers[a.stage] / n)

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
