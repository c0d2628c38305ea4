"""The consumer tests load every export with the real tools' parsers. They need pinned
packages that `make test-interop` installs in venvs of their own and then runs with
TRAINPLAN_INTEROP set: `1` for tests/plan/consumers (the `interop` extra: DeepSpeed,
transformers, accelerate, torchtitan 0.3) and `tt02` for tests/plan/consumers_tt02
(torchtitan 0.2.2, which cannot share a venv with 0.3). The default suite collects neither."""
import os

_SUITES = {"1": "consumers", "tt02": "consumers_tt02"}
collect_ignore = [d for key, d in _SUITES.items() if os.environ.get("TRAINPLAN_INTEROP") != key]
