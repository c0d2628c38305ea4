"""The ``synthetic`` fixture of the calibration tests: a synthetic CPU profile written to a
file, which the simulator reads through ``TRAINPLAN_PROFILE``."""
import pytest
import yaml

from tests.executors.calibrate.synthetic import synthetic_profile


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(synthetic_profile()))
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    return path
