"""Request lengths from a dataset file: each request of a serving run draws its prompt and output
token counts from the file's lines (uniformly, with the traffic's seed), as a benchmark replays a
dataset of real conversations.

One request a line, in one of these forms:

- JSON Lines: ``{"prompt_len": 812, "output_len": 154}``, or the line format of TensorRT-LLM's
  ``benchmarks/cpp/prepare_dataset.py`` (trtllm-bench's datasets): ``{"task_id": 0,
  "input_ids": [...], "output_tokens": 154}``, whose prompt is ``len(input_ids)``;
- CSV with a header naming ``prompt_len`` and ``output_len`` columns;
- a request trace, whose lines also carry their arrival: Azure's LLM inference traces
  (Azure/AzurePublicDataset ``data/AzureLLMInferenceTrace_conv.csv`` @790921015d:
  ``TIMESTAMP,ContextTokens,GeneratedTokens``, the timestamp ``2023-11-16 18:15:46.6805900``),
  a CSV with ``arrival_s,prompt_len,output_len``, or JSON Lines with ``arrival_s``. Such a file
  can drive ``traffic.arrival: trace`` (the requests in the file's order, at its times).

Lengths are token counts (a ShareGPT file must be tokenized first, as vLLM's and TensorRT-LLM's
benchmark scripts do with the model's tokenizer). A bad line is one sentence naming the file, the
line and the field.
"""
from __future__ import annotations

import csv
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from simcore.plan.choices import PlanError

#: Lines a dataset may hold (a larger file is sampled by the tool that made it).
MAX_LINES = 10_000_000


def _length(value, path: Path, line: int, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"traffic.dataset {path}, line {line}: {key}={value!r} must be a whole number of tokens, at least 1")
    return value


def _json_line(text: str, path: Path, line: int) -> tuple[tuple[int, int], float | None]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"traffic.dataset {path}, line {line}: not JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise PlanError(f"traffic.dataset {path}, line {line}: a line must be a JSON object")
    at = None
    if "arrival_s" in row:
        v = row["arrival_s"]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise PlanError(f"traffic.dataset {path}, line {line}: arrival_s={v!r} must be a number of seconds")
        at = float(v)
    if "input_ids" in row:
        if not isinstance(row["input_ids"], list) or not row["input_ids"]:
            raise PlanError(f"traffic.dataset {path}, line {line}: input_ids must be a non-empty list of token ids")
        prompt = len(row["input_ids"])
        return (prompt, _length(row.get("output_tokens"), path, line, "output_tokens")), at
    for key in ("prompt_len", "output_len"):
        if key not in row:
            raise PlanError(f"traffic.dataset {path}, line {line}: needs prompt_len and output_len "
                            "(or trtllm-bench's input_ids and output_tokens)")
    return (_length(row["prompt_len"], path, line, "prompt_len"),
            _length(row["output_len"], path, line, "output_len")), at


#: CSV column names: (prompt, output, arrival or None) in the forms above.
CSV_FORMS = (("prompt_len", "output_len", "arrival_s"), ("ContextTokens", "GeneratedTokens", "TIMESTAMP"))


def _seconds(value: str, path: Path, line: int) -> float:
    """An arrival in seconds: a number, or an Azure trace's ``YYYY-MM-DD HH:MM:SS.fffffff``."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        day, clock = value.strip().split(" ")
        whole, _, frac = clock.partition(".")
        stamp = datetime.fromisoformat(f"{day} {whole}").replace(tzinfo=timezone.utc).timestamp()
        return stamp + (float("0." + frac) if frac else 0.0)
    except ValueError:
        raise PlanError(f"traffic.dataset {path}, line {line}: arrival {value!r} is neither seconds nor a "
                        "'YYYY-MM-DD HH:MM:SS.fff' timestamp") from None


def _csv_rows(f, path: Path) -> tuple[list[tuple[int, int]], list[float]]:
    reader = csv.DictReader(f)
    cols = set(reader.fieldnames or ())
    form = next((c for c in CSV_FORMS if {c[0], c[1]} <= cols), None)
    if form is None:
        raise PlanError(f"traffic.dataset {path}: a CSV needs a header naming prompt_len and output_len "
                        "(or an Azure trace's ContextTokens and GeneratedTokens)")
    timed = form[2] in cols
    out, times = [], []
    for i, row in enumerate(reader, 2):
        pair = []
        for key in form[:2]:
            try:
                pair.append(_length(int(row[key]), path, i, key))
            except (TypeError, ValueError):
                raise PlanError(f"traffic.dataset {path}, line {i}: {key}={row[key]!r} must be a whole number "
                                "of tokens, at least 1") from None
        out.append((pair[0], pair[1]))
        if timed:
            times.append(_seconds(row[form[2]] or "", path, i))
        if len(out) > MAX_LINES:
            raise PlanError(f"traffic.dataset {path} holds more than {MAX_LINES:,} requests; sample it first")
    return out, times


def read_requests(path: str | os.PathLike) -> tuple[tuple[tuple[int, int], ...], tuple[float, ...] | None]:
    """The (prompt, output) token counts of every request in the file, and where every line
    carries one, their arrivals in seconds after the first (sorted; None otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"traffic.dataset {path} is not a file")
    with path.open(encoding="utf-8", errors="replace") as f:
        if path.suffix.lower() == ".csv":
            rows, times = _csv_rows(f, path)
        else:
            rows, times = [], []
            for i, text in enumerate(f, 1):
                if text.strip():
                    pair, at = _json_line(text, path, i)
                    rows.append(pair)
                    if at is not None:
                        times.append(at)
                    if len(rows) > MAX_LINES:
                        raise PlanError(f"traffic.dataset {path} holds more than {MAX_LINES:,} requests; sample it first")
    if not rows:
        raise PlanError(f"traffic.dataset {path} holds no request")
    if len(times) != len(rows):
        return tuple(rows), None
    order = sorted(range(len(rows)), key=times.__getitem__)
    t0 = times[order[0]]
    return tuple(rows[k] for k in order), tuple(times[k] - t0 for k in order)


def read_lengths(path: str | os.PathLike) -> tuple[tuple[int, int], ...]:
    """The (prompt, output) token counts of every request in the file."""
    return read_requests(path)[0]
