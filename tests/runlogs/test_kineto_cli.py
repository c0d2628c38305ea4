"""`trainplan compare PLAN --trace DIR` end to end on a real trace (fixtures/kineto/SOURCES.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainplan.cli import main

KINETO = Path(__file__).parent / "fixtures" / "kineto"

#: The DDP trace's job: 2 ranks of an A100 (from the trace); the model (a small transformer in
#: place of the trace's CNN), batch and precision are guessed.
PLAN = """name: hta-ddp
model: {name: small, layers: 4, hidden: 512, heads: 8, vocab: 1000, seq_len: 256}
cluster: {node: dgx-a100-40gb, nodes: 1, gpus_per_node: 2}
parallel: {dp: 2}
training: {global_batch: 8, micro_batch: 4, precision: bf16}
"""


@pytest.fixture
def plan(tmp_path) -> str:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN)
    return str(path)


def test_trace_against_prediction_writes_both_timelines_and_the_page(plan, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compare", plan, "--trace", str(KINETO / "hta_nccl_ddp"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "differs most" in text and "dp_comm" in text and "ProfilerStep#5" in text and "host_gaps_s" in text
    trace = json.loads((out / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert any("predicted" in n for n in names) and any("measured" in n for n in names)
    assert "Collectives by process group" in text or "collectives by process group" in text
    assert "Phase by phase" in (out / "report.md").read_text() and (out / "index.html").exists()


def test_json(plan, capsys):
    assert main(["compare", plan, "--trace", str(KINETO / "hta_nccl_ddp"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["field"] for r in doc["phases"]} >= {"step_time_s", "compute_s", "phase.dp_comm"}
    assert len(doc["steps"]) == 2
    calls = {(c["axis"], c["collective"], c["group"]): c for c in doc["collectives"]}
    assert set(calls) == {("dp", "all_reduce", "0,1"), ("dp", "broadcast", "0,1")}
    assert calls["dp", "all_reduce", "0,1"]["calls_per_step"] == 5
    assert calls["dp", "all_reduce", "0,1"]["bytes_per_call"] > 1e6   # fp32 gradient buckets


def test_needs_log_or_trace(plan, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["compare", plan])
    assert exc.value.code == 2 and "--log" in capsys.readouterr().err


def test_broken_trace_is_one_sentence(plan, tmp_path, capsys):
    bad = tmp_path / "rank-0.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1,')
    assert main(["compare", plan, "--trace", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "truncated" in err and "Traceback" not in err and err.count("\n") == 1
