"""The consumer tests (tests/plan/consumers/) load every export with the real tools'
parsers: DeepSpeed, transformers, accelerate, torchtitan. They need the pinned extra
(`pip install -e .[interop]`), which `make test-interop` installs in its own venv and
then runs them with TRAINPLAN_INTEROP=1; the default suite does not collect them."""
import os

collect_ignore = [] if os.environ.get("TRAINPLAN_INTEROP") == "1" else ["consumers"]
