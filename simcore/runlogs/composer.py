"""Composer (MosaicML) and llm-foundry: the console logger's blocks, a ``[batch=B/N]:`` (or
``[epoch=E][batch=B/N]:``) header followed by ``Train <key>: <value>`` lines, and the ``Config:``
block's ``num_nodes`` / ``num_gpus_per_node``.

The keys read (composer/callbacks/speed_monitor.py, memory_monitor.py):

- ``throughput/samples_per_sec`` and ``throughput/batches_per_sec``: means over the speed
  monitor's window of batches (100 by default), so each block is a window mean, not one step.
  The console prints 4 decimals; a slow run's batches per second (``0.0027``) is then exact to
  only two digits, so the step time is the batch's samples over the samples per second, the
  batch read from the block's counters (``time/sample`` over ``time/batch``), where both are
  there, and one over the batches per second otherwise;
- ``throughput/device/tokens_per_sec``, ``throughput/device/mfu``,
  ``throughput/device/flops_per_sec`` (FLOP/s per GPU);
- ``memory/peak_allocated_mem``: gigabytes of 1e9 bytes (``_get_memory_report``:
  ``memory_stats[...] / 1.0e9``), torch.cuda's peak allocated. The memory monitor of 2022
  (``memory/allocated_mem`` in bytes) logs the bytes allocated so far, not a peak: not read.
- ``trainer/device_train_microbatch_size``: the micro-batch.
"""
from __future__ import annotations

import re

from simcore.runlogs.base import RunLog, Sample

HEADER = re.compile(r"^\s*(?:\[epoch=\d+\])?\[batch=(\d+)/\d+\]:\s*(.*)$")
METRIC = re.compile(r"Train ([\w/.\-]+):\s*([-+0-9.eE]+)")
CONFIG = re.compile(r"^(num_nodes|num_gpus_per_node):\s*(\d+)\s*$")


def matches(text: str) -> bool:
    return any(HEADER.match(line) for line in text.splitlines()) and "Train throughput/" in text


def parse(text: str, path: str) -> RunLog:
    log = RunLog(stack="Composer/llm-foundry", path=path,
                 step_what="console blocks (throughput over the speed monitor's window of batches)",
                 memory_what="peak allocated (memory/peak_allocated_mem: torch.cuda's, tensors only)")
    blocks: list[tuple[int, dict]] = []
    config: dict[str, int] = {}
    for line in text.splitlines():
        head = HEADER.match(line)
        if head:
            blocks.append((int(head.group(1)), {}))
            line = head.group(2)
        m = METRIC.search(line)
        if m and blocks:
            blocks[-1][1][m.group(1)] = float(m.group(2))
            continue
        c = CONFIG.match(line)
        if c:
            config[c.group(1)] = int(c.group(2))
    for step, values in blocks:
        sample = _sample(step, values)
        if sample is not None:
            log.samples.append(sample)
    log.layout = _layout(blocks, config)
    return log


def _sample(step: int, v: dict) -> Sample | None:
    per_s, batches_per_s = v.get("throughput/samples_per_sec"), v.get("throughput/batches_per_sec")
    batch = _batch(v)
    if per_s and batch:
        step_s = batch / per_s
    elif batches_per_s:
        step_s = 1 / batches_per_s
    else:
        return None
    flops = v.get("throughput/device/flops_per_sec")
    mem = v.get("memory/peak_allocated_mem")
    return Sample(step=step, step_s=step_s, samples_per_s=per_s or None,
                  tokens_per_s_per_gpu=v.get("throughput/device/tokens_per_sec"),
                  tflops_per_gpu=flops / 1e12 if flops else None, mfu=v.get("throughput/device/mfu"),
                  memory_bytes=mem * 1e9 if mem else None)


def _batch(v: dict) -> float | None:
    """Samples a batch, from the cumulative counters (None where they are not both there)."""
    batches, samples = v.get("time/batch"), v.get("time/sample")
    return samples / batches if batches and samples else None


def _layout(blocks: list[tuple[int, dict]], config: dict) -> dict:
    out = {}
    if {"num_nodes", "num_gpus_per_node"} <= set(config):
        out["gpus"] = config["num_nodes"] * config["num_gpus_per_node"]
    for _, v in blocks[::-1]:
        if "trainer/device_train_microbatch_size" in v:
            out["micro_batch"] = int(v["trainer/device_train_microbatch_size"])
        batch = _batch(v)
        if batch and batch == int(batch):
            out["global_batch"] = int(batch)
        if out.keys() >= {"micro_batch", "global_batch"}:
            break
    return out
