"""Test-session set-up: tests never depend on this machine's cached calibration.

``cluster: {node: localhost}`` resolves through a calibrated profile; the suite uses a
committed one (``tests/data/localhost-profile.yaml``, measured on a 2-core CI-class
machine by ``trainplan calibrate``) so results do not change with what a developer's
cache holds. Ranks spawned by the executor inherit the variable.
"""
from __future__ import annotations

import os
from pathlib import Path

os.environ["TRAINPLAN_PROFILE"] = str(Path(__file__).parent / "data" / "localhost-profile.yaml")
