"""Fuzzing the Plan loader and the command line's numeric options (issue 57.6): huge, zero,
negative, non-finite and deeply nested input either answers or is refused in one sentence,
exit code 2, never a traceback, and never runs for long.

"Long" is measured in CPU seconds of this process (``ITIMER_PROF``), not wall time, so a host
busy with other work does not fail the test; a command past ``CPU_LIMIT_S`` is stopped and
reported. Hypothesis runs derandomized, without its per-example deadline and database."""
from __future__ import annotations

import contextlib
import io
import math
import os
import signal
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: CPU seconds a command may take: a bound on a hang, far above what any of these needs.
CPU_LIMIT_S = 20.0
FUZZ = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


class RanTooLong(BaseException):
    """A command used more than ``CPU_LIMIT_S`` CPU seconds (a BaseException: main must not catch it)."""


def _too_long(signum, frame):
    raise RanTooLong(f"more than {CPU_LIMIT_S:g} CPU seconds")


def run(*argv: str) -> tuple[int, str, str]:
    """``trainplan ARGV`` in this process: (exit code, stdout, stderr), within ``CPU_LIMIT_S``."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGPROF, _too_long)
    signal.setitimer(signal.ITIMER_PROF, CPU_LIMIT_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:   # argparse's own refusal: its usage line and one error line
                code = exc.code
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
    return code, out.getvalue(), err.getvalue()


def assert_answers_or_refuses(argv: tuple[str, ...]) -> None:
    code, _, err = run(*argv)
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err, (argv, err)
    if code == 2 and not err.startswith("usage:"):
        last = err.strip().splitlines()[-1]
        assert last.startswith("trainplan: error: ") and len(last) > len("trainplan: error: ") + 10, (argv, err)
        assert err.strip().count("trainplan: error:") == 1, (argv, err)


INTS = st.one_of(st.sampled_from([0, -1, 1, 2, 3, 8, 64, 1000, 2**31, 2**63, 10**30]),
                 st.integers(min_value=-10**6, max_value=10**7))
FLOATS = st.one_of(st.sampled_from(["0", "-1", "1e-300", "0.5", "1", "1e9", "1e12", "1e300", "inf", "-inf", "nan"]),
                   st.floats(allow_nan=False, allow_infinity=False, min_value=-1e20, max_value=1e20).map(repr))


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # what a command writes (plan's best plan) lands here


def maybe(values):
    """An option's value, or None: the option left out (so one bad value does not hide the rest)."""
    return st.one_of(st.none(), values)


def usual(good: list, bad=None):
    """A value a user would give (half the time), else a fuzzed one: the commands must also run."""
    return st.one_of(st.sampled_from(good), bad if bad is not None else INTS)


def options(**given) -> tuple[str, ...]:
    """``--flag value`` for each option given (not None)."""
    out = []
    for flag, value in given.items():
        if value is not None:
            out += ["--" + flag.replace("_", "-"), str(value)]
    return tuple(out)


#: An option's value passes the command line whole: the numbers and also what a shell may hand it.
TOP_K = st.one_of(st.integers(min_value=-2, max_value=3), st.sampled_from([33, 2**63]))


@settings(FUZZ, max_examples=25)
@given(nodes=maybe(usual([1, 2, 4, 64])), global_batch=usual([16, 64, 1024]), seq_len=maybe(usual([512, 4096])),
       tokens=maybe(usual(["1e9", "1e12"], FLOATS)), top_k=maybe(TOP_K), rows=maybe(usual([3], INTS)),
       jobs=maybe(st.sampled_from([-1, 0, 1, 2, 2**63])), min_headroom=maybe(usual(["0", "10"], FLOATS)))
def test_plan_options(**given):
    assert_answers_or_refuses(("plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--out", "best.yaml",
                               *options(**given)))


@settings(FUZZ, max_examples=20)
@given(tokens=usual(["1e12", "15e12"], FLOATS), monte_carlo=maybe(st.integers(min_value=-3, max_value=300)),
       seed=maybe(INTS), price=maybe(st.sampled_from(["restart_s", "on_demand_usd", "failures_per_gpu_hour", "pue"])),
       value=usual(["1", "100"], FLOATS))
def test_cost_options(tokens, monte_carlo, seed, price, value):
    extra = ("--price", f"{price}={value}") if price else ()
    assert_answers_or_refuses(("cost", str(ROOT / "plans/llama3-70b-h100.yaml"),
                               *options(tokens=tokens, monte_carlo=monte_carlo, seed=seed), *extra))


@settings(FUZZ, max_examples=20)
@given(rank=usual([0, 3, 63]), factor=usual(["1.5", "3"], FLOATS), stage=maybe(usual([0, 3])),
       granularity=st.sampled_from(["microbatch", "layer"]))
def test_simulate_options(rank, factor, stage, granularity):
    extra = ("--slow-stage", f"{stage}={factor}") if stage is not None else ()
    assert_answers_or_refuses(("simulate", str(ROOT / "plans/llama3-70b-h100.yaml"), "--engine", "des",
                               "--granularity", granularity, "--slow", f"{rank}={factor}", *extra))


@settings(FUZZ, max_examples=20)
@given(nodes=maybe(usual([1, 8])), seq_len=maybe(usual([2048, 8192])))
def test_import_options(**given):
    assert_answers_or_refuses(("import", "--hf", str(ROOT / "examples/hf/llama3.1-8b/config.json"), "--cluster",
                               "dgx-h100", *options(**given)))


@settings(FUZZ, max_examples=10)
@given(tokens=usual(["1e11"], FLOATS), nodes=maybe(st.lists(usual([1, 4]), min_size=1, max_size=2)),
       budget=maybe(usual(["1e6"], FLOATS)), deadline_days=maybe(usual(["30"], FLOATS)),
       life_years=maybe(usual(["4"], FLOATS)), utilisation=maybe(usual(["0.8"], FLOATS)), rows=maybe(usual([5])),
       global_batch=maybe(usual([256])))
def test_procure_options(nodes, **given):
    sizes = ("--nodes", ",".join(str(min(n, 2048)) for n in nodes)) if nodes else ("--nodes", "2")
    assert_answers_or_refuses(("procure", "--model", "gpt-1.7b", "--gpus", "h100-sxm", "--modes", "reserved,buy",
                               "--no-resimulate", *sizes, *options(**given)))


# --------------------------------------------------------------------------- the Plan loader

BASE = yaml.safe_load((ROOT / "plans/llama3-8b-fsdp-h100.yaml").read_text())
FIELDS = [("model", k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len",
                                 "experts", "top_k", "dropout")] + \
         [("cluster", k) for k in ("nodes", "gpus_per_node", "nics_per_node", "nvlink_domain_gpus")] + \
         [("parallel", k) for k in ("tp", "pp", "dp", "cp", "ep", "vpp", "zero", "microbatch_group")] + \
         [("training", k) for k in ("global_batch", "micro_batch", "activation_offload", "allocator_margin")]


def _deep(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


VALUES = st.one_of(st.sampled_from([1, 2, 4, 8]), INTS, st.sampled_from([math.inf, -math.inf, math.nan, 1e308, -0.0, 0.5, True, None, "", "x",
                                          "1e9", [], {}, [1, 2]]),
                   st.integers(min_value=2, max_value=200).map(_deep))


def _plan_file(doc) -> str:
    fd, path = tempfile.mkstemp(suffix=".yaml", dir=os.getcwd())
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f)
    return path


@settings(FUZZ, max_examples=30)
@given(changes=st.lists(st.tuples(st.sampled_from(FIELDS), VALUES), min_size=1, max_size=3))
def test_plan_loader(changes):
    doc = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    doc["model"] = {"name": doc["model"]} if isinstance(doc["model"], str) else dict(doc["model"])
    for (section, key), value in changes:
        doc.setdefault(section, {})[key] = value
    path = _plan_file(doc)
    for argv in (("check", path), ("simulate", path, "--engine", "des"), ("collectives", path),
                 ("cost", path, "--tokens", "1e12", "--monte-carlo", "20")):
        assert_answers_or_refuses(argv)


@pytest.mark.parametrize("text", [
    "model: " + "[" * 5000 + "]" * 5000 + "\n",                                 # 5,000 levels deep
    "training: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n",
    "&a [*a]\n",                                                                # an alias of itself
    "model: llama3-8b\ncluster: {node: dgx-h100, gpus_per_node: 9223372036854775808}\ntraining: {global_batch: 8}\n",
])
def test_nested_and_absurd_files_are_one_sentence(text):
    Path("plan.yaml").write_text(text)
    for command in (("check",), ("simulate",), ("cost", "--tokens", "1e12"), ("memory",)):
        assert_answers_or_refuses((command[0], "plan.yaml", *command[1:]))


def test_a_file_past_any_plan_is_refused_unread():
    with open("big.yaml", "wb") as f:
        f.truncate(64 * 2**20)   # 64 MiB of NUL: a plan file is a page of text
    code, _, err = run("check", "big.yaml")
    assert code == 2 and err.startswith("trainplan: error: plan file big.yaml is over 16 MiB")


def test_the_step_by_step_tools_refuse_what_they_cannot_play_within_seconds():
    """A valid Plan of 8 stages x 4,096 micro-batches: the analytic engine answers; the event
    engine, the schedule and the collectives list refuse it in one sentence with the bound."""
    doc = {"model": {"name": "llama3-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
           "parallel": {"tp": 1, "pp": 8, "dp": 1}, "training": {"global_batch": 4096}}
    Path("long.yaml").write_text(yaml.safe_dump(doc))
    assert run("simulate", "long.yaml")[0] == 0
    for argv in (("simulate", "long.yaml", "--engine", "des"), ("schedule", "long.yaml"), ("collectives", "long.yaml")):
        code, _, err = run(*argv)
        assert code == 2 and "plays a step pass by pass, and this one has" in err and "over the" in err, (argv, err)
        assert err.count("\n") == 1


def test_topology_refuses_a_graph_it_cannot_build_within_seconds():
    doc = {"model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 131072}, "parallel": {"tp": 8},
           "training": {"global_batch": 131072}}
    Path("huge.yaml").write_text(yaml.safe_dump(doc))
    assert run("simulate", "huge.yaml")[0] == 0   # a million GPUs: the prediction needs no graph
    code, _, err = run("topology", "huge.yaml")
    assert code == 2 and "1,048,576 GPUs are over the 131,072 it builds within seconds" in err
