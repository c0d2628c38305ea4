"""One entry point: a log file or a directory of rank logs -> the RunLog(s) with per-step timing."""
from __future__ import annotations

import json
from pathlib import Path

from simcore.runlogs import composer, deepspeed, hf, megatron, mllog, torchtitan
from simcore.runlogs.base import ANSI, LogError, RunLog

STACKS = ("Megatron-LM/NeMo/Megatron-Bridge (also golden_values_*.json), torchtitan, DeepSpeed, "
          "Composer/llm-foundry, Hugging Face Trainer or MLPerf :::MLLOG")
#: Text formats, tried in this order (DeepSpeed before Megatron: Megatron-DeepSpeed prints both).
TEXT = ((mllog.matches, mllog.parse), (deepspeed.matches, deepspeed.parse),
        (megatron.matches, megatron.parse_text), (torchtitan.matches, torchtitan.parse),
        (composer.matches, composer.parse), (hf.matches, hf.parse))
#: A rank log larger than this is read in its first and last halves of it.
MAX_BYTES = 64 * 2**20


def _read(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LogError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        data = data[:MAX_BYTES // 2] + b"\n" + data[-MAX_BYTES // 2:]
    return data.decode("utf-8", errors="replace")


def _json_doc(text: str, path: Path):
    """The parsed JSON document where the file is JSON; None where it is not."""
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")) or stripped.startswith(("{'", "[20", "[rank", "[titan")):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if path.suffix == ".json" or exc.pos >= len(text.rstrip()) - 1:
            raise LogError(f"{path} is cut-off or broken JSON ({exc.msg} at line {exc.lineno}): "
                           "it holds no complete per-step values") from None
        return None


def parse_file(path: Path) -> RunLog | None:
    """The RunLog of one file, or None where it holds no line of a known stack. Raises LogError
    for an empty or broken file."""
    text = _read(path)
    if not text.strip():
        raise LogError(f"{path} is empty: no per-iteration lines of {STACKS} in it")
    doc = _json_doc(text, path)
    if doc is not None:
        if megatron.is_golden(doc):
            return megatron.parse_golden(doc, str(path))
        if hf.is_results(doc):
            return hf.from_metrics(doc, str(path))
        return None
    plain = ANSI.sub("", text)
    for match, parse in TEXT:
        if match(plain):
            return parse(plain, str(path))
    return None


def parse_path(path: str | Path) -> list[RunLog]:
    """The RunLogs with per-step values of a file, or of every file in a directory (rank logs);
    LogError (one sentence) where there are none."""
    path = Path(path)
    if not path.exists():
        raise LogError(f"--log {path} does not exist")
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    if not files:
        raise LogError(f"--log {path} is an empty directory: no log files in it")
    logs, errors = [], []
    for f in files:
        try:
            log = parse_file(f)
        except LogError as exc:
            if not path.is_dir():
                raise
            errors.append(str(exc))
            continue
        if log is not None and log.samples:
            logs.append(log)
    if not logs:
        where = f"any of the {len(files)} files in {path}" if path.is_dir() else str(path)
        raise LogError(f"no per-iteration timing lines of {STACKS} found in {where}")
    return logs
