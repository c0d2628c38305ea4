"""The per-rank process of one simulated step: each rank walks its schedule, waits for
its inputs and parameter gathers, runs its compute in chunks, issues its gradient buckets
and ends with the optimizer step (``simcore.engine.des`` plays it and measures it)."""
from __future__ import annotations

import functools

from simcore.engine.step_comm import _StepComm
from simcore.model.costs import StepCosts
from simcore.model.schedules import Action, Op
from simcore.results import Span

#: Resolution of the DDP bucket train: the engine cuts a stage's last backward into at most
#: this many chunks and issues the buckets whose gradients a chunk completes at its end
#: (DDP issues each 25 MB bucket as soon as it is full: thousands for a 10B-parameter
#: stage). Only the tail changes: at most 1/32 of the stage's reduction can be left after
#: the backward instead of one bucket; a modelling resolution, not a hardware figure.
MAX_BUCKET_CHUNKS = 32


def _pieces(costs: StepCosts, a: Action, n: int, posted: bool = False) -> tuple[tuple[str, str, float], ...]:
    """(stream, kind, seconds) run back to back by one of ``n`` chunks of compute action ``a``;
    ``posted``: its receive was posted with an earlier send (``schedules.fused_p2p``)."""
    v = a.stage
    if a.op == Op.W:
        return (("compute", "backward_weight", costs.backward_weight_s[v] / n),)
    send, wait = costs.host_p2p_s(v, a.op == Op.F)   # CPU host: the receive's hand-over, the send call
    if posted:   # the post ran on this rank after that send (``_Step._post``)
        wait = max(0.0, wait - costs.p2p_post_s)
    out_s, back_s = costs.copies_s(v)   # activation offload: the layers' waits for their copies
    if a.op == Op.F:
        work = (("compute", "forward", costs.forward_s[v] / n), ("tp", "all_reduce", costs.forward_comm_s[v] / n),
                ("copy", "activation_offload", out_s / n))
    else:
        kind, t = ("backward", costs.backward_s(v)) if a.op == Op.B else ("backward_input", costs.backward_input_s[v])
        work = (("copy", "activation_reload", back_s / n), ("compute", "recompute", costs.recompute_s[v] / n),
                ("compute", kind, t / n), ("tp", "all_reduce", costs.backward_comm_s[v] / n))
    return (("wait", "recv", wait / n), *work, ("pp", "send", send / n))


class _Step(_StepComm):
    """One simulated step: the process of each simulated rank, on the state and communication
    of ``_StepComm``; ``run()`` plays it and returns the span tuples."""

    # ---- the compute stream of one rank
    def _items(self, acts: list[Action]) -> list[tuple[Action, int, int, bool]]:
        """(action, chunk, chunks, issues-reduction) in order. DDP, ZeRO-1 and pipelined
        FSDP2: the last B/W of a stage carries its gradient buckets; FSDP2 alone (ZeRO-2/3,
        ``grad_reduce_per_microbatch``): every B/W reduce-scatters its micro-batch's
        gradients layer by layer (gradient accumulation does not skip it)."""
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

    @functools.cache  # noqa: B019
    def _pieces(self, op: Op, stage: int, n: int, posted: bool) -> tuple:
        return tuple(p for p in _pieces(self.costs, Action(stage, op), n, posted) if p[2] > 0)

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
        paired = None   # a paired forward whose activation waits for its pair's backward
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
                if reduce and self.holds_send:   # DDP's reducer inside torch's stage backward
                    for ev in held:
                        if not ev.triggered:
                            yield ev
                if a in self.paired:
                    paired = a
                    continue
                if paired is not None:
                    self._output(unit, paired)
                    paired = None
                self._output(unit, a)
                yield from self._post(unit, a)
        for ev in reductions:
            if not ev.triggered:
                yield ev
        yield from self._optimizer(unit)

    def _optimizer(self, unit):
        """Offload copy down, optimizer step, copy up, ZeRO-1 parameter all-gather."""
        local = self.costs.plan.parallel.rank_stages(unit[0])
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
