"""Faults of a run's rank processes: a progress watchdog, the signals, ending every rank.

The launcher (``executors.procs.spawn``) gives each rank a heartbeat: two slots of a shared
array, the ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process of the host)
of the rank's last progress and how many steps it had done. The parent polls them; a live
rank with no heartbeat for the progress timeout has hung, and the run ends naming it. This
is torch elastic's timer and NCCL's watchdog in small: torch elastic's
``torch/distributed/elastic/timer/`` expires a worker that did not renew its timer in time,
and ``ProcessGroupNCCL``'s watchdog aborts a collective that made no progress within the
group's timeout (pytorch/pytorch at cf30153c, torch 2.13.0).

When several ranks are silent (the others wait on the hung one inside a collective), the
one named is a rank the kernel reports stopped (``/proc/PID/stat`` state ``T``, as after
SIGSTOP), else the one with the fewest steps done, else the one silent longest.

Ranks are ended with SIGTERM, then SIGKILL after ``TERM_GRACE_S``; SIGCONT goes with the
SIGTERM because a stopped process receives nothing else until it is continued (signal(7)).
A rank dies with its parent (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, prctl(2)) and leaves
Ctrl-C to it: the parent ends the ranks and says so once, instead of every rank printing a
KeyboardInterrupt traceback.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

#: Seconds a rank has to exit after SIGTERM before SIGKILL. torch elastic's ``PContext.close``
#: waits 30 s (torch/distributed/elastic/multiprocessing/api.py) for workers that flush
#: state; a rank here holds none worth the wait (checkpoints are written atomically).
TERM_GRACE_S = 5.0
#: The collectives' own timeout (the process group's) as a multiple of the progress
#: timeout: longer, so the parent's watchdog, which names the hung rank, speaks first and a
#: waiting peer's "timed out" does not.
COLLECTIVE_TIMEOUT_FACTOR = 2.0
#: prctl(2) option number, from linux/prctl.h.
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15

_heart = None   # (shared array, rank) in a rank started by spawn; None elsewhere (torchrun)


class RunInterrupted(KeyboardInterrupt):
    """The run was stopped by SIGINT or SIGTERM; every rank was ended. ``exit_code`` is the
    shell's 128 + signal number (130, 143)."""

    def __init__(self, signum: int):
        self.signum, self.exit_code = signum, 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}: every rank of the run was ended "
                         "and its temporary files removed")


# --------------------------------------------------------------------------- in a rank

def heartbeat(steps: int | None = None) -> None:
    """Tell the parent's watchdog this rank made progress (and, if given, how many steps it
    has done). A no-op outside ranks started by ``executors.procs.spawn``."""
    if _heart is None:
        return
    beats, rank = _heart
    beats[2 * rank] = time.monotonic()
    if steps is not None:
        beats[2 * rank + 1] = steps


def start_rank(rank: int, beats, parent: int) -> None:
    """A rank's first act: its heartbeat, its name, its signals, death with its parent."""
    global _heart
    _heart = (beats, rank)
    heartbeat()
    # Ctrl-C reaches the whole foreground process group: the parent handles it for all
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # a forked rank inherits the parent's handler
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, f"trainplan rank{rank}"[:15].encode())   # `ps` tells the ranks apart
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:   # the parent died before the line above
            os._exit(1)


# --------------------------------------------------------------------------- in the parent

def new_heartbeats(ctx, world: int):
    """The shared heartbeat array of ``world`` ranks, every rank starting now."""
    beats = ctx.RawArray("d", 2 * world)
    now = time.monotonic()
    for r in range(world):
        beats[2 * r] = now
    return beats


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (R, S, D, T, Z...); '' where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2:].split(" ", 1)[0]


def check_progress(processes, beats, timeout_s: float) -> None:
    """Raise RuntimeError naming the hung rank if a live rank made no progress for ``timeout_s``."""
    now = time.monotonic()
    live = [r for r, p in enumerate(processes) if p.is_alive()]
    if not live or now - min(beats[2 * r] for r in live) <= timeout_s:
        return
    stopped = [r for r in live if process_state(processes[r].pid) in ("T", "t")]
    hung = min(stopped or live, key=lambda r: (beats[2 * r + 1], beats[2 * r]))
    why = ", it is stopped (SIGSTOP)" if hung in stopped else ""
    raise RuntimeError(f"rank {hung} stopped making progress: no heartbeat for {now - beats[2 * hung]:.0f} s "
                       f"(the progress timeout is {timeout_s:g} s), after {int(beats[2 * hung + 1])} steps{why}; "
                       "every rank of the run was ended")


def end_ranks(processes, grace_s: float = TERM_GRACE_S) -> None:
    """End every live rank: SIGTERM and SIGCONT, then SIGKILL to those alive after ``grace_s``."""
    live = [p for p in processes if p.is_alive()]
    for p in live:
        for sig in (signal.SIGTERM, signal.SIGCONT):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, sig)
    deadline = time.monotonic() + grace_s
    for p in live:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in live:
        if p.is_alive():
            p.kill()
        p.join()


class ParentSignals:
    """SIGINT and SIGTERM in the parent while its ranks run, both handled alike: the first
    raises ``RunInterrupted`` (while ``armed``) or is kept for ``raise_kept`` (while the
    ranks are being ended, which must not be cut short); later ones are ignored. A signal
    the process ignored (``nohup``, a background job's SIGINT) stays ignored."""

    def __init__(self):
        self.armed, self.got, self._old = True, None, {}

    def _handle(self, signum, frame):
        if self.got is None:
            self.got = signum
            if self.armed:
                raise RunInterrupted(signum)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                old = signal.getsignal(sig)
                if old is not signal.SIG_IGN:
                    self._old[sig] = old
                    signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        if exc[0] is None and self.got is not None:
            raise RunInterrupted(self.got)
        return False
