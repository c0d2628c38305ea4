"""Issue 28.5-28.7 at the command line: output paths, portable names, warnings, one what-if
report from every command, cost that says 'infeasible' instead of printing divergent money."""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
PLAN = str(ROOT / "plans" / "llama3-70b-h100.yaml")
#: A what-if small enough for a test: GPT 1.7B, fabric x node count, layouts pinned.
SMALL_SWEEP = {"name": "fabric-x-nodes", "model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "nodes": 2},
               "global_batch": 64, "tokens": 1e10, "grid": {"fabric": ["ib-hdr", "ib-ndr"], "nodes": [2, 4]},
               "space": {"tp": [2], "pp": [1], "cp": [1], "zero": [1], "micro_batch": [2]}}


def strict(constant: str):
    raise AssertionError(f"{constant} is not JSON")


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("trainplan: error: ") and "Traceback" not in err
    return err


def test_missing_folder_outside_the_working_directory_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path.parent / f"absent-{os.getpid()}" / "dir" / "t.json"
    assert main(["simulate", PLAN, "--engine", "des", "--trace", str(target)]) == 2
    assert "does not exist" in one_error(capsys)
    assert not target.parent.parent.exists()                # nothing created
    assert main(["simulate", PLAN, "--engine", "des", "--trace", "sub/t.json"]) == 0
    assert (tmp_path / "sub" / "t.json").exists()           # inside the working directory: created


def test_a_file_where_a_folder_belongs_and_the_reverse(tmp_path, capsys):
    existing = tmp_path / "taken"
    existing.write_text("keep me")
    assert main(["whatif", str(ROOT / "sweeps" / "example.yaml"), "--report", str(existing)]) == 2
    assert "is a file, not a folder" in one_error(capsys)
    assert main(["report", "whatif", str(ROOT / "sweeps" / "example.yaml"), "--out", str(existing)]) == 2
    one_error(capsys)
    assert existing.read_text() == "keep me"
    assert main(["simulate", PLAN, "--engine", "des", "--gantt", str(tmp_path)]) == 2
    assert "is a folder" in one_error(capsys)


def test_unwritable_folder_is_one_sentence(tmp_path, capsys, monkeypatch):
    """A folder the user cannot write to (as root every folder is writable, so the permission
    check itself answers 'no' for this one folder)."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == locked else real(p, mode))
    assert main(["simulate", PLAN, "--engine", "des", "--trace", str(locked / "t.json")]) == 2
    assert "not writable" in one_error(capsys)
    assert not (locked / "t.json").exists()


def test_best_plan_file_name_is_portable(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "32",
                 "--top-k", "0", "--rows", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=strict)
    name = Path(out["best_plan_file"]).name
    assert ":" not in name and name.endswith(".yaml") and (tmp_path / name).exists()
    assert "headroom_gib" in out["table"][0] and "step_time_s_lo" in out["table"][0]


def test_whatif_report_is_the_same_from_every_command(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(SMALL_SWEEP))
    assert main(["whatif", str(sweep), "--report", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert main(["report", "whatif", str(sweep), "--out", str(tmp_path / "b")]) == 0
    files = lambda d: sorted(p.name for p in (tmp_path / d).iterdir())  # noqa: E731
    assert files("a") == files("b") and {"index.html", "report.md", "cells.csv"} <= set(files("a"))
    assert (tmp_path / "a" / "cells.csv").read_text() == (tmp_path / "b" / "cells.csv").read_text()
    header = printed.splitlines()[0].split()
    assert header[:4] == ["fabric", "nodes", "GPUs", "layout"] and "e+" not in printed
    assert len([ln for ln in printed.splitlines() if ln.startswith(("ib-hdr", " ib-hdr", "ib-ndr", " ib-ndr"))]) == 4


def test_cost_of_102400_gpus_says_spot_is_infeasible(tmp_path, capsys):
    plan = tmp_path / "big.yaml"
    from bench.cost import BIG_PLAN

    plan.write_text(yaml.safe_dump(BIG_PLAN))
    assert main(["cost", str(plan), "--tokens", "1.5e13"]) == 0
    out = capsys.readouterr().out
    spot = next(ln for ln in out.splitlines() if ln.strip().startswith("spot"))
    assert "infeasible" in spot and "$" not in spot
    assert max(len(tok) for tok in out.replace(",", "").split()) < 80   # no 190-digit figure
    assert main(["cost", str(plan), "--tokens", "1.5e13", "--json"]) == 0
    assert json.loads(capsys.readouterr().out, parse_constant=strict)["spot"]["usd"] is None


def test_absurd_input_is_warned_or_refused(tmp_path, capsys):
    doc = yaml.safe_load(Path(PLAN).read_text())
    doc["model"]["seq_len"] = 16384
    longer = tmp_path / "longer.yaml"
    longer.write_text(yaml.safe_dump(doc))
    assert main(["simulate", str(longer)]) == 0
    err = capsys.readouterr().err
    assert "trainplan: warning: model.seq_len=16,384 is 2x its trained context" in err
    doc["model"]["layers"] = 1_000_000_000
    deep = tmp_path / "deep.yaml"
    deep.write_text(yaml.safe_dump(doc))
    assert main(["cost", str(deep), "--tokens", "1e12"]) == 2   # no run could be: the bound and its reason
    assert "model.layers=1,000,000,000 is over 10,000: ten times the deepest transformer trained" in one_error(capsys)
    doc["model"] = {"name": "wide", "layers": 80, "hidden": 2**40, "heads": 1024, "vocab": 100, "seq_len": 128}
    deep.write_text(yaml.safe_dump(doc))   # within every bound, and still a step of years
    assert main(["cost", str(deep), "--tokens", "1e12"]) == 2
    assert "no run can train" in one_error(capsys)


def test_local_validation_says_how_loaded_the_host_is(tmp_path, monkeypatch):
    """Issue 28.8: the host's load, a re-measured host speed against the profile's, and how far
    to trust the comparison on a shared host."""
    import executors.calibrate.profile as calib
    from trainplan import jobs

    path = tmp_path / "localhost.yaml"
    profile = {"measured_on": {"device": "cpu", "date": "2026-01-01T00:00:00Z", "calibration_s": 9.5},
               "oversubscription": {"matmul_flops_per_s_per_rank": {1: 2.0e10}}}
    path.write_text(yaml.safe_dump(profile))
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1 * cores, 0.0, 0.0))
    slower = {**profile, "oversubscription": {"matmul_flops_per_s_per_rank": {1: 1.0e10}}}
    monkeypatch.setattr(calib, "refresh_host_speed", lambda p: slower)
    quiet = jobs.host_conditions(path)
    assert "10% per core" in quiet[0] and "calibrated 2026-01-01" in quiet[0]
    assert "0.50x as fast" in quiet[1]                      # a stale profile is re-measured
    assert not any("shared with other work" in line for line in quiet)
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0 * cores, 0.0, 0.0))
    busy = jobs.host_conditions(path, refresh=False)
    assert "300% per core" in busy[0] and "shared with other work" in busy[-1]
    path.write_text(yaml.safe_dump({"measured_on": {"device": "cuda"}}))
    assert jobs.host_conditions(path) == []                 # a GPU's speed does not follow the CPU load


def test_the_validation_report_says_the_hosts_load_moves_its_figures(tmp_path, monkeypatch):
    """Issue 57.10: the terminal warned that the host's load moves the figures, the HTML report did not."""
    import pandas as pd

    import executors.calibrate.profile as calib
    import trainplan.validate as validate
    from trainplan import jobs

    path = tmp_path / "localhost.yaml"
    path.write_text((ROOT / "tests/data/localhost-profile.yaml").read_text())
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    monkeypatch.setattr(calib, "refresh_host_speed", lambda p: None)
    loads = iter([(0.4, 0, 0), (0.4, 0, 0), (5.5, 0, 0)])
    monkeypatch.setattr(os, "getloadavg", lambda: next(loads))
    monkeypatch.setattr(validate, "validate_matrix", lambda *a, **k: validate.MatrixResult(pd.DataFrame(), (), ()))
    html = jobs.validate_job(ROOT / "validation/local.yaml", tmp_path / "rep", only=["dp2"], progress=False)
    from html import unescape

    for text in (unescape(html.read_text()), (tmp_path / "rep/report.md").read_text()):
        assert "The host's load while the layouts ran moves these figures" in text
        assert "load average 0.4 when the runs started, 5.5 when they ended" in text
