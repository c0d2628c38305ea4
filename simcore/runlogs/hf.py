"""Hugging Face Trainer: its closing metrics, as ``train_results.json`` / ``all_results.json`` or as
the dict it prints (``{'train_runtime': X, 'train_samples_per_second': X, 'train_steps_per_second':
X, ...}``). One whole-run mean: warm-up is inside it and no step can be dropped."""
from __future__ import annotations

import ast
import re

from simcore.runlogs.base import RunLog, Sample

PRINTED = re.compile(r"\{[^{}]*'train_runtime'[^{}]*\}")


def is_results(doc) -> bool:
    return isinstance(doc, dict) and "train_runtime" in doc and "train_steps_per_second" in doc


def matches(text: str) -> bool:
    return PRINTED.search(text) is not None


def from_metrics(metrics: dict, path: str) -> RunLog:
    steps_per_s = float(metrics.get("train_steps_per_second") or 0)
    log = RunLog(stack="Hugging Face Trainer", path=path,
                 step_what="train_steps_per_second (one mean over the whole run, warm-up included)")
    if steps_per_s > 0:
        runtime = float(metrics.get("train_runtime") or 0)
        log.samples.append(Sample(step=max(round(runtime * steps_per_s), 1), step_s=1 / steps_per_s,
                                  samples_per_s=float(metrics.get("train_samples_per_second") or 0) or None))
    log.notes.append("the Trainer reports one whole-run mean: its warm-up steps are in it")
    return log


def parse(text: str, path: str) -> RunLog:
    found = None
    for m in PRINTED.finditer(text):
        try:
            doc = ast.literal_eval(m.group(0))
        except (ValueError, SyntaxError):
            continue
        if is_results(doc):
            found = doc
    return from_metrics(found or {}, path)
