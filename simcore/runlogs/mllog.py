"""MLPerf Training ``:::MLLOG {json}`` logs. The reference loggers print no per-step time; what a
log supports is the time of each timed block (``block_start`` .. ``block_stop``, evaluation outside
it) over the steps in the block: ``epoch_count`` / ``global_batch_size`` steps, or for benchmarks
that count tokens (GPT-3: the count is a multiple of global_batch_size x max_sequence_length)
/ (global_batch_size x max_sequence_length). ``run_start`` .. ``run_stop`` (evaluations included)
gives the time to train, reported as a note."""
from __future__ import annotations

import json

from simcore.runlogs.base import LogError, RunLog, Sample

PREFIX = ":::MLLOG"


def matches(text: str) -> bool:
    return PREFIX in text


def events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        at = line.find(PREFIX)
        if at >= 0:
            try:
                out.append(json.loads(line[at + len(PREFIX):]))
            except json.JSONDecodeError:
                continue
    return out


def _steps(count: float, gbs: int, seq: int | None) -> float:
    if seq and count % (gbs * seq) == 0 and count % gbs == 0 and count // gbs >= seq:
        return count / (gbs * seq)
    return count / gbs


def parse(text: str, path: str) -> RunLog:
    evs = events(text)
    first = {}
    for e in evs:
        first.setdefault(e.get("key"), e)
    gbs = (first.get("global_batch_size") or {}).get("value")
    seq = (first.get("max_sequence_length") or {}).get("value")
    log = RunLog(stack="MLPerf Training (MLLOG)", path=path,
                 step_what="block_start..block_stop time over the steps in each block (evaluation excluded)")
    if gbs:
        log.layout["global_batch"] = int(gbs)
    if seq:
        log.layout["seq_len"] = int(seq)
    starts = {}
    for e in evs:
        meta = e.get("metadata") or {}
        key, at = e.get("key"), meta.get("first_epoch_num", meta.get("epoch_num"))
        if key == "block_start":
            starts[at] = e
        elif key == "block_stop" and at in starts and gbs and meta.get("epoch_count"):
            steps = _steps(meta["epoch_count"], int(gbs), seq)
            elapsed = (e["time_ms"] - starts[at]["time_ms"]) / 1e3
            end = int(round((at + meta["epoch_count"]) / (meta["epoch_count"] / steps)))
            log.samples.append(Sample(step=end, step_s=elapsed / steps))
    if evs and not log.samples and not gbs:
        raise LogError(f"{path} has MLLOG lines but no global_batch_size event, so no step time can be computed")
    if "run_start" in first and "run_stop" in first:
        minutes = (first["run_stop"]["time_ms"] - first["run_start"]["time_ms"]) / 6e4
        log.notes.append(f"run_start..run_stop: {minutes:.1f} min (the time to train, evaluations included)")
    return log
