"""Request lengths from a dataset file: each request of a serving run draws its prompt and output
token counts from the file's lines (uniformly, with the traffic's seed), as a benchmark replays a
dataset of real conversations.

One request a line, in either form:

- JSON Lines: ``{"prompt_len": 812, "output_len": 154}``, or the line format of TensorRT-LLM's
  ``benchmarks/cpp/prepare_dataset.py`` (trtllm-bench's datasets): ``{"task_id": 0,
  "input_ids": [...], "output_tokens": 154}``, whose prompt is ``len(input_ids)``;
- CSV with a header naming ``prompt_len`` and ``output_len`` columns.

Lengths are token counts (a ShareGPT file must be tokenized first, as vLLM's and TensorRT-LLM's
benchmark scripts do with the model's tokenizer). A bad line is one sentence naming the file, the
line and the field.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

from simcore.plan.choices import PlanError

#: Lines a dataset may hold (a larger file is sampled by the tool that made it).
MAX_LINES = 10_000_000


def _length(value, path: Path, line: int, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"traffic.dataset {path}, line {line}: {key}={value!r} must be a whole number of tokens, at least 1")
    return value


def _json_line(text: str, path: Path, line: int) -> tuple[int, int]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"traffic.dataset {path}, line {line}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise PlanError(f"traffic.dataset {path}, line {line}: a line must be a JSON object")
    if "input_ids" in row:
        if not isinstance(row["input_ids"], list) or not row["input_ids"]:
            raise PlanError(f"traffic.dataset {path}, line {line}: input_ids must be a non-empty list of token ids")
        prompt = len(row["input_ids"])
        return prompt, _length(row.get("output_tokens"), path, line, "output_tokens")
    for key in ("prompt_len", "output_len"):
        if key not in row:
            raise PlanError(f"traffic.dataset {path}, line {line}: needs prompt_len and output_len "
                            "(or trtllm-bench's input_ids and output_tokens)")
    return _length(row["prompt_len"], path, line, "prompt_len"), _length(row["output_len"], path, line, "output_len")


def _csv_rows(f, path: Path) -> list[tuple[int, int]]:
    reader = csv.DictReader(f)
    if not reader.fieldnames or not {"prompt_len", "output_len"} <= set(reader.fieldnames):
        raise PlanError(f"traffic.dataset {path}: a CSV needs a header naming prompt_len and output_len")
    out = []
    for i, row in enumerate(reader, 2):
        pair = []
        for key in ("prompt_len", "output_len"):
            try:
                pair.append(_length(int(row[key]), path, i, key))
            except (TypeError, ValueError):
                raise PlanError(f"traffic.dataset {path}, line {i}: {key}={row[key]!r} must be a whole number "
                                "of tokens, at least 1") from None
        out.append((pair[0], pair[1]))
        if len(out) > MAX_LINES:
            raise PlanError(f"traffic.dataset {path} holds more than {MAX_LINES:,} requests; sample it first")
    return out


def read_lengths(path: str | os.PathLike) -> tuple[tuple[int, int], ...]:
    """The (prompt, output) token counts of every request in the file."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"traffic.dataset {path} is not a file")
    with path.open(encoding="utf-8", errors="replace") as f:
        if path.suffix.lower() == ".csv":
            rows = _csv_rows(f, path)
        else:
            rows = []
            for i, text in enumerate(f, 1):
                if text.strip():
                    rows.append(_json_line(text, path, i))
                    if len(rows) > MAX_LINES:
                        raise PlanError(f"traffic.dataset {path} holds more than {MAX_LINES:,} requests; sample it first")
    if not rows:
        raise PlanError(f"traffic.dataset {path} holds no request")
    return tuple(rows)
