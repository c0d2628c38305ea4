"""State changed by mistake (issue 57.7): a refused command leaves the cached profile as it was,
and a failed run leaves no torch error files in $TMPDIR."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import yaml

from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
MATRIX = str(ROOT / "validation" / "local.yaml")


@pytest.fixture
def profile(tmp_path, monkeypatch):
    """A copy of the test profile as this host's cached one, stale (so a validation would re-measure
    its host speed into it), and a record of every re-measurement."""
    import executors.calibrate.profile as calib

    doc = yaml.safe_load((ROOT / "tests/data/localhost-profile.yaml").read_text())
    doc.setdefault("measured_on", {})["date"] = "2020-01-01T00:00:00Z"
    path = tmp_path / "localhost.yaml"
    path.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    calls = []
    monkeypatch.setattr(calib, "refresh_host_speed", lambda p: calls.append(p))
    monkeypatch.setattr(calib, "calibrate", lambda *a, **k: calls.append(a))
    return path, path.read_bytes(), calls


@pytest.mark.parametrize("argv", [
    ["validate", "--matrix", MATRIX, "--only", "dp2", "--only", "dp22"],          # a mistyped --only
    ["report", "validate", "--matrix", MATRIX, "--only", "tp3", "--out", "rep"],
    ["calibrate", "--plan", str(ROOT / "plans/tiny-localhost.yaml")],            # --plan without --from-run
    ["calibrate", "--refresh", "--from-run", "run.json", "--plan", str(ROOT / "plans/tiny-localhost.yaml")],
    ["calibrate", "--quick", "--refresh"],
])
def test_a_refused_command_leaves_the_profile_as_it_was(profile, argv, tmp_path, monkeypatch, capsys):
    path, before, calls = profile
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainplan: error: ") and "\n" not in err
    assert calls == [] and path.read_bytes() == before
    assert not (tmp_path / "rep").exists()


def _fails(rank, world, device):
    raise RuntimeError(f"rank {rank} broke")


def test_a_failed_run_leaves_no_torch_error_files(tmp_path, monkeypatch):
    from executors import procs

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # where torch puts its per-rank error files
    with pytest.raises(RuntimeError, match="broke"):
        procs.spawn(_fails, 2, timeout_s=60, start_method="fork")
    assert list(tmp_path.iterdir()) == []
