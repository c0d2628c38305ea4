"""The planner's worker processes, which end with the command that started them.

``imap(fn, items, jobs)`` is ``map`` over ``jobs`` processes (a ``ProcessPoolExecutor``),
with three guarantees a search needs when it is stopped:

- a worker leaves Ctrl-C to its parent (SIGINT ignored: one sentence from the parent instead
  of a KeyboardInterrupt traceback per worker) and dies on SIGTERM without a word;
- the workers are ended (SIGTERM, then SIGKILL) as soon as the caller stops iterating: an
  exception, SIGINT or SIGTERM in the parent (the command line turns both into an exception,
  ``trainplan.common.stop_on_signals``), so none is left to PID 1 to finish the search;
- a worker dies with its parent even when the parent is SIGKILLed (Linux
  ``prctl(PR_SET_PDEATHSIG)``, prctl(2)).

The workers are forked (where the platform forks) with SIGINT and SIGTERM blocked, so a
signal that arrives while they start reaches the parent, not a half-made worker.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
from concurrent.futures import ProcessPoolExecutor

#: prctl(2) option number (linux/prctl.h).
PR_SET_PDEATHSIG = 1
#: Seconds a worker has to exit after SIGTERM before SIGKILL; a worker holds nothing to save.
TERM_GRACE_S = 2.0
_STOPS = {signal.SIGINT, signal.SIGTERM}


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):   # no prctl: the parent's own clean-up still ends the workers
            pass


def _worker_start() -> None:
    """A worker's first act: Ctrl-C is its parent's, SIGTERM ends it, it dies with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def _context():
    return mp.get_context("fork") if sys.platform.startswith("linux") else mp.get_context()


def workers_for(jobs: int, items: int) -> int:
    """Processes worth starting: at most ``jobs``, the items and this machine's cores (more
    processes than cores only share them)."""
    return max(1, min(int(jobs), items, os.cpu_count() or 1))


def end_workers(pool: ProcessPoolExecutor) -> None:
    """Every worker of ``pool`` ended now (SIGTERM, SIGKILL after ``TERM_GRACE_S``), queued work dropped."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        p.join(TERM_GRACE_S)
        if p.is_alive():
            p.kill()
            p.join()
    # the pool's manager thread closes its wake-up pipe as it ends; at exit concurrent.futures'
    # _python_exit writes to that pipe unlocked (CPython 3.11), so a close racing it printed an
    # "Exception ignored ... Bad file descriptor" traceback after the one-sentence stop: let it end first
    manager = getattr(pool, "_executor_manager_thread", None)
    if manager is not None:
        manager.join(TERM_GRACE_S)


def imap(fn, items: list, jobs: int):
    """``fn(item)`` for each item, in order, computed by up to ``jobs`` worker processes
    (in this process when one is enough)."""
    n = workers_for(jobs, len(items))
    if n <= 1:
        yield from map(fn, items)
        return
    pool = ProcessPoolExecutor(max_workers=n, mp_context=_context(), initializer=_worker_start)
    ok = False
    try:
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)   # the workers fork at the first submit
        try:
            results = pool.map(fn, items)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        yield from results
        ok = True
    finally:
        if ok:
            pool.shutdown(wait=True)
        else:
            end_workers(pool)
