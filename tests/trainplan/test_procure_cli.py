"""`trainplan procure`: the answers, the report files, and one sentence for bad input."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--gpus", "h100-sxm,b200", "--nodes", "64,128,256"]


def test_deadline_and_budget_with_report(tmp_path, capsys):
    out = tmp_path / "rep"
    assert main(["procure", str(ROOT / "sweeps/procure-llama3-70b.yaml"), *SMALL, "--deadline-days", "60",
                 "--budget", "3e7", "--report", str(out)]) == 0
    text = capsys.readouterr().out
    assert "answer: Cheapest option that trains llama3-70b on 15 T tokens within 60 days:" in text
    assert "answer: Fastest option that trains llama3-70b on 15 T tokens within $30M paid out:" in text
    assert "front of each way of paying" in text
    for name in ("index.html", "report.md", "frontier.png", "options.csv"):
        assert (out / name).stat().st_size > 0
    md = (out / "report.md").read_text()
    assert "## Days against dollars" in md and "## Assumptions and sources" in md and "CBRE" in md
    assert "cheapest within 60 days" in md


def test_json_answers(capsys):
    assert main(["procure", "--model", "llama3-70b", "--seq-len", "8192", "--tokens", "15e12", *SMALL,
                 "--deadline-days", "5", "--no-resimulate", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["answers"][0].startswith("No evaluated option trains llama3-70b on 15 T tokens within 5 days")
    assert {o["mode"] for o in data["options"]} == {"on_demand", "reserved", "spot", "buy"}


def test_bad_candidates_file_is_one_sentence_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("model: llama3-70b\ntokens: 15.0e+12\nbuy: {utilisation: 2}\n")
    out = tmp_path / "rep"
    assert main(["procure", str(bad), "--report", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "trainplan: error: candidates.buy.utilisation=2 must be a share in (0, 1]"
    assert not out.exists() or not any(out.iterdir())


def test_bad_flags_are_one_sentence(capsys):
    assert main(["procure", "--model", "llama3-70b", "--tokens", "1e12", "--nodes", "16,x"]) == 2
    assert capsys.readouterr().err.strip() == "trainplan: error: --nodes '16,x' must be a comma-separated list of whole numbers"
    assert main(["procure", "--tokens", "1e12"]) == 2
    assert "procure needs --model and --tokens" in capsys.readouterr().err


def test_bench_prints_its_figure(capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_procure", ROOT / "bench" / "procure.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "GPUS", ["h100-sxm"])
    monkeypatch.setattr(bench, "FABRICS", ["ib-ndr"])
    monkeypatch.setattr(bench, "DEFAULT_NODES", (32, 64))
    monkeypatch.setattr("sys.argv", ["procure.py", "--jobs", "1"])
    assert bench.main() == 0
    out = capsys.readouterr().out
    assert "cells: 2 (1 GPU types x 2 sizes x 1 fabrics)" in out
    assert "procurement wall time:" in out and "(target < 60 s:" in out
