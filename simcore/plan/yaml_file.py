"""Reading a YAML file the user names (a Plan, a sweep, a candidates file, a matrix): one sentence
for every way it can fail (unreadable, not text, not YAML, empty, nested past what can be read)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from simcore.plan.choices import PlanError


#: The most bytes read of a file the user names: a Plan or a sweep is a page or two of text.
MAX_BYTES = 2**24


def read_yaml_file(path: str | os.PathLike, what: str):
    """The parsed document of a YAML file the user names (``what``: "plan file", "sweep
    file", ...); PlanError with one sentence if it cannot be read, parsed, or is empty."""
    path = Path(path)
    try:
        with open(path, "rb") as f:   # at most what any such file could hold: /dev/zero is not a plan
            data = f.read(MAX_BYTES + 1)
        text = data.decode()
    except OSError as exc:
        raise PlanError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PlanError(f"{what} {path} is not a text file") from None
    if len(data) > MAX_BYTES:
        raise PlanError(f"{what} {path} is over {MAX_BYTES // 2**20} MiB: a {what} is a page or two of text (the "
                        "shipped plans, sweeps and matrices are under 4 KiB each)")
    try:
        doc = yaml.safe_load(text)
    except RecursionError:
        raise PlanError(f"{what} {path} nests its lists or mappings deeper than YAML can be read here (Python's "
                        f"recursion limit, {sys.getrecursionlimit():,}); no {what} needs more than a few levels") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise PlanError(f"{what} {path} is not valid YAML{line}: {problem}") from None
    if doc is None:
        raise PlanError(f"{what} {path} is empty")
    return doc
