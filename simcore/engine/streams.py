"""Stream primitives of the event engine: the FIFO stream that runs a rank's operations
in issue order, and the SimPy environment that counts the events it schedules."""
from __future__ import annotations

from collections import deque

import simpy


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
