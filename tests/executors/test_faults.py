"""Faults of a real run (executors/watchdog.py, executors/procs.py, executors/checkpoint.py):
a hung rank, signals to the parent, the parent's death, checkpoints that do not match.

The command-line tests run ``trainplan run`` in a session of its own (so the run is one
process group, which is how "no process of the run left" is checked) with the ranks forked
instead of spawned: the same launcher, seconds faster on two cores."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executors import launch, procs, watchdog
from simcore.plan.load import plan_from_dict

PLAN = "plans/tiny-localhost.yaml"
ROOT = Path(__file__).resolve().parents[2]
#: Seconds to wait for what must happen (ranks started, a run ended, its processes gone): a bound
#: on a hang, never a speed target, so a host busy with other work only makes the waits longer.
PATIENCE_S = 300
#: ``trainplan`` as a user runs it, its ranks forked.
DRIVER = ("import sys; from executors import launch; launch.run.__kwdefaults__['start_method'] = 'fork'; "
          "from trainplan.cli import main; sys.exit(main(sys.argv[1:]))")


def _group(pgid: int) -> dict[int, str]:
    """The live processes of a process group: pid -> name (zombies are dead)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if int(rest[2]) == pgid and rest[0] != "Z":
            out[int(entry)] = name
    return out


def _end_with_parent() -> None:
    """In the child before exec: SIGTERM it when the test process dies (Linux ``PR_SET_PDEATHSIG``),
    so a killed test run leaves no million-step run behind in its own session."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # 1: PR_SET_PDEATHSIG
    # a test run started as a background job inherits SIGINT ignored (POSIX shells without job
    # control), which a command keeps: the run gets Ctrl-C's default, as at a terminal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_run(tmp_path, *args: str) -> tuple[subprocess.Popen, dict[int, int]]:
    """``trainplan run PLAN ARGS`` in its own session, temporary files under ``tmp_path``;
    returns once its four ranks run, with their pids by rank."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, "run", PLAN, "--warmup", "1", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_end_with_parent)
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        ranks = {int(n.removeprefix("trainplan rank")): pid for pid, n in _group(proc.pid).items()
                 if n.startswith("trainplan rank")}
        if len(ranks) == 4 and list(tmp_path.glob("trainplan-ranks-*")):
            time.sleep(2.0)   # into the steps
            assert proc.poll() is None, proc.communicate()
            return proc, ranks
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the ranks did not start")


def _assert_all_gone(proc: subprocess.Popen, tmp_path) -> None:
    deadline = time.monotonic() + PATIENCE_S   # the zombies' parents reap them
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group(proc.pid) == {}, "a process of the run is left"
    assert list(tmp_path.glob("trainplan-ranks-*")) == []


def test_a_frozen_rank_ends_the_run_within_the_progress_timeout_naming_it(tmp_path):
    proc, ranks = _start_run(tmp_path, "--steps", "1000000", "--progress-timeout", "3")
    os.kill(ranks[2], signal.SIGSTOP)
    frozen = time.monotonic()
    _, err = proc.communicate(timeout=PATIENCE_S)
    took = time.monotonic() - frozen
    assert proc.returncode == 2 and took >= 3, (took, err)   # not before its progress timeout (speed: bench/)
    assert err.strip().splitlines() == [err.strip()], err   # one sentence, no tracebacks
    assert "rank 2 stopped making progress" in err and "it is stopped (SIGSTOP)" in err
    _assert_all_gone(proc, tmp_path)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_run_ends_every_rank_and_removes_its_files(tmp_path, signum, code):
    proc, _ = _start_run(tmp_path, "--steps", "1000000")
    if signum == signal.SIGINT:
        os.killpg(proc.pid, signum)   # Ctrl-C: the terminal signals the whole foreground group
    else:
        os.kill(proc.pid, signum)     # `timeout`, scancel, Kubernetes: the parent alone
    _, err = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == code, err
    assert err.strip() == (f"trainplan: stopped by {signal.Signals(signum).name}: every rank of the run "
                           "was ended and its temporary files removed")
    _assert_all_gone(proc, tmp_path)


def test_ranks_die_with_their_parent(tmp_path):
    proc, ranks = _start_run(tmp_path, "--steps", "1000000")
    proc.kill()
    proc.communicate(timeout=PATIENCE_S)
    deadline = time.monotonic() + PATIENCE_S
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group(proc.pid) == {}


# --------------------------------------------------------------------------- the watchdog, in process

def _beating(rank, world, device, seconds, hang_rank=None):
    """Beat every 50 ms for ``seconds``; ``hang_rank`` then stops beating (and sleeps)."""
    end = time.monotonic() + seconds
    steps = 0
    while time.monotonic() < end:
        time.sleep(0.05)
        steps += 1
        watchdog.heartbeat(steps)
    if rank == hang_rank:
        time.sleep(60)
    return rank


def test_the_timeout_counts_from_the_last_progress_not_from_the_start():
    # a healthy run longer than the timeout finishes; a hang late in a run is caught a timeout after it,
    # not before (the timeout leaves a busy host's scheduler seconds of slack between beats)
    assert procs.spawn(_beating, 2, (6.0,), timeout_s=4.0, start_method="fork") == [0, 1]
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 stopped making progress: no heartbeat for \d+ s .* after \d+ steps"):
        procs.spawn(_beating, 2, (5.0, 1), timeout_s=4.0, start_method="fork")
    assert time.monotonic() - t >= 9.0


def _killed(rank, world, device):
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)   # as the OOM killer does: no exception, no record
    time.sleep(60)


def test_a_rank_killed_by_a_signal_ends_the_run_at_once_naming_it():
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="^rank 1 failed: it ended with signal SIGKILL$"):
        procs.spawn(_killed, 2, timeout_s=60, start_method="fork")
    assert time.monotonic() - t < 55   # rank 0 is ended with it, not left to its 60 s sleep


def test_a_stopped_rank_is_named_among_the_silent_ones():
    class Proc:
        def __init__(self, pid):
            self.pid = pid

        def is_alive(self):
            return True

    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(sleeper.pid, signal.SIGSTOP)
        time.sleep(0.2)
        now = time.monotonic()
        # rank 0 fell silent first and had done fewer steps, but rank 1 is the stopped one
        beats = [now - 10, 3, now - 5, 4]
        with pytest.raises(RuntimeError, match=r"rank 1 stopped making progress.*after 4 steps, it is stopped"):
            watchdog.check_progress([Proc(os.getpid()), Proc(sleeper.pid)], beats, 2.0)
        # none stopped: the one with the fewest steps
        with pytest.raises(RuntimeError, match=r"rank 0 stopped making progress.*after 3 steps; every"):
            watchdog.check_progress([Proc(os.getpid()), Proc(os.getpid())], beats, 2.0)
        watchdog.check_progress([Proc(os.getpid())] * 2, beats, 20.0)   # within the timeout: nothing
    finally:
        sleeper.kill()
        sleeper.wait()


# --------------------------------------------------------------------------- checkpoints

DOC = {"name": "c", "model": {"name": "r", "layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 16,
                              "tied_embeddings": False},
       "cluster": {"node": "localhost", "gpus_per_node": 2}, "training": {"global_batch": 4}}


def _plan(parallel: dict, **model):
    return plan_from_dict({**DOC, "model": {**DOC["model"], **model}, "parallel": parallel})


def _steps(plan, ckpt, resume=False):
    opts = launch.RunOptions(steps=1, warmup=0, checkpoint_dir=str(ckpt), resume=resume, timeout_s=60)
    return launch.launch_ranks(plan, opts, "fork")


def test_a_checkpoint_of_another_model_or_a_corrupt_latest_is_one_sentence(tmp_path):
    _steps(_plan({"dp": 2}), tmp_path)
    with pytest.raises(ValueError, match=r"holds another model shape \(checkpoint vs this plan: model.layers 2 vs 3;"
                                         r" model.hidden 32 vs 64; model.ffn_hidden 128 vs 256\): a resume needs"):
        _steps(_plan({"dp": 2}, layers=3, hidden=64), tmp_path, resume=True)
    (tmp_path / "latest").write_text("\x00\x17garbage")
    with pytest.raises(ValueError, match=r"latest is corrupt: it reads '\\x00\\x17garbage', not the name of a "):
        _steps(_plan({"dp": 2}), tmp_path, resume=True)
    (tmp_path / "latest").write_text("step-9\n")
    with pytest.raises(ValueError, match=r"latest names step-9 but .*step-9 holds no checkpoint"):
        _steps(_plan({"dp": 2}), tmp_path, resume=True)
    (tmp_path / "step-1").rename(tmp_path / "step-9")
    with pytest.raises(ValueError, match=r"step does not match: .*latest names step-9 but the checkpoint holds step 1"):
        _steps(_plan({"dp": 2}), tmp_path, resume=True)


def test_a_resume_onto_another_layout_works_where_torch_reshards_and_is_one_sentence_where_not(tmp_path):
    _steps(_plan({"dp": 2}), tmp_path)
    second = _steps(_plan({"pp": 2}), tmp_path, resume=True)   # DCP reshards the full state: it resumes
    assert [s["step"] for s in second[0]["steps"]] == [1]
    # ZeroRedundancyOptimizer's per-rank shards are no DCP state: another layout cannot read them
    with pytest.raises(ValueError, match=r"written by another layout \(checkpoint vs this plan: parallel.pp 2 vs 1; "
                                         r"parallel.dp 1 vs 2; parallel.zero 0 vs 1\) that torch cannot reshard"):
        _steps(_plan({"dp": 2, "zero": 1}), tmp_path, resume=True)
