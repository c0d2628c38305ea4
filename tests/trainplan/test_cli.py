"""The command line: one sentence and exit code 2 for bad input; never a traceback."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_check_prints_resolved_plan(capsys):
    assert main(["check", str(ROOT / "plans/gpt3-175b-a100.yaml")]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "tp: 8" in out and "micro_batches_per_step: 96" in out


def test_check_json(capsys):
    assert main(["check", str(ROOT / "plans/gpt3-175b-a100.yaml"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["derived"]["gpus_used"] == 1536


def test_bad_plan_is_one_sentence_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: gpt3-175b\ncluster: {node: dgx-a100-80gb, nodes: 1}\n"
                   "parallel: {tp: 7}\ntraining: {global_batch: 8}\n")
    assert main(["check", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "trainplan: error: parallel.tp=7 does not divide model.heads=96"


def test_missing_file_exit_2(capsys):
    assert main(["check", "/nonexistent/plan.yaml"]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_catalog_lists_every_kind_with_sources(capsys):
    assert main(["catalog", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"gpus", "nodes", "fabrics", "storage", "prices", "models"}
    assert all(row["source"] for row in data["gpus"])
    gpus = {row["gpu"]: row for row in data["gpus"]}
    assert {"b300", "gb200", "gb300", "mi325x", "mi355x"} <= set(gpus)
    assert gpus["gb200"]["nvfp4_tflops"] == 10000 and math.isnan(gpus["h100-sxm"]["nvfp4_tflops"])   # none on Hopper
    nodes = {row["node"]: row for row in data["nodes"]}
    assert nodes["gb200-nvl72"]["nvlink_domain_gpus"] == 72 and "https://" in nodes["gb200-nvl72"]["source"]


def test_console_script_has_no_traceback(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [\n")
    proc = subprocess.run([sys.executable, "-m", "trainplan.cli", "check", str(bad)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
