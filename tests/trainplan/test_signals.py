"""SIGTERM and SIGINT to the commands that start worker processes (plan, procure, report,
whatif): every worker ends with the command, one sentence, exit code 143 or 130
(simcore/planner/workers.py, trainplan.common.stop_on_signals).

Each command runs in a session of its own, so "no process of the command is left" is its
process group being empty. The waits are generous and nothing is timed: a busy host only
makes them longer."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
#: Seconds to wait for what must happen (workers started, the command gone): a bound on a hang,
#: not a speed target.
PATIENCE_S = 300


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
        rest = stat[stat.rindex(")") + 2:].split()
        if int(rest[2]) == pgid and rest[0] != "Z":
            out[int(entry)] = stat[stat.index("(") + 1:stat.rindex(")")]
    return out


def _end_with_test() -> None:
    """SIGKILL the command if the test process dies first (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    # a test run started as a background job inherits SIGINT ignored (POSIX shells without job
    # control), which a command keeps: the command gets Ctrl-C's default, as at a terminal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_with_workers(tmp_path, *args: str) -> subprocess.Popen:
    """``trainplan ARGS`` in a session of its own; returns once it runs two worker processes."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "trainplan.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_end_with_test)
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, ("the command ended before its workers started", proc.communicate())
        if len(_group(proc.pid)) >= 3:
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the workers did not start")


def _assert_all_gone(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while _group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _group(proc.pid) == {}, "a process of the command is left"


def _sweep(tmp_path) -> str:
    doc = {"name": "sig", "model": {"name": "llama3-70b", "seq_len": 8192}, "cluster": {"node": "dgx-h100", "nodes": 16},
           "global_batch": 1024, "tokens": 15e12, "grid": {"gpu": ["h100-sxm", "a100-80gb"], "nodes": [16, 32]},
           "jobs": 2}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(doc))
    return str(tmp_path / "sweep.yaml")


PLAN = ("plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "32", "--global-batch", "1024",
        "--seq-len", "8192", "--jobs", "2", "--out", "best.yaml")
COMMANDS = {
    "plan": lambda tmp: PLAN,
    "procure": lambda tmp: ("procure", str(ROOT / "sweeps/procure-llama3-70b.yaml"), "--report", "out"),
    "report": lambda tmp: ("report", "plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--nodes", "32",
                           "--seq-len", "8192", "--tokens", "15e12", "--jobs", "2", "--out", "out"),
    "whatif": lambda tmp: ("whatif", _sweep(tmp), "--report", "out"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_sigterm_ends_every_worker_with_one_sentence(tmp_path, command):
    proc = _start_with_workers(tmp_path, *COMMANDS[command](tmp_path))
    os.kill(proc.pid, signal.SIGTERM)   # `timeout`, scancel, Kubernetes: the parent alone
    _, err = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == 143, err
    assert err == ("trainplan: stopped by SIGTERM: every worker process it started was ended and no file was left "
                   "half-written\n")
    _assert_all_gone(proc)
    assert not list(tmp_path.rglob("*.tmp"))   # nothing half-written


def test_ctrl_c_is_one_sentence_not_a_blank_one(tmp_path):
    proc = _start_with_workers(tmp_path, *PLAN)
    os.killpg(proc.pid, signal.SIGINT)   # the terminal signals the whole foreground group
    _, err = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == 130, err
    assert err.startswith("trainplan: stopped by SIGINT: ") and err.count("\n") == 1, err
    _assert_all_gone(proc)


def test_workers_die_with_a_killed_parent(tmp_path):
    proc = _start_with_workers(tmp_path, *PLAN)
    proc.kill()
    proc.communicate(timeout=PATIENCE_S)
    _assert_all_gone(proc)
