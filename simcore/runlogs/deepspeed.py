"""DeepSpeed: the ThroughputTimer line (``epoch=0/micro_step=N/global_step=N, RunningAvgSamplesPerSec=X,
CurrSamplesPerSec=X, MemAllocated=XGB, MaxMemAllocated=XGB``, or the older ``0/N, SamplesPerSec=X, ...``),
with Megatron-DeepSpeed's ``samples/sec: X | iteration N/M | elapsed time per iteration (ms): X |
... approx flops per GPU: XTFLOPS`` lines where the log has them. SamplesPerSec counts the global
batch (train_batch_size) per second; MaxMemAllocated is torch.cuda.max_memory_allocated in GiB."""
from __future__ import annotations

import re

from simcore.runlogs import megatron
from simcore.runlogs.base import RunLog, Sample

TIMER = re.compile(r"(?:global_step=(\d+)|\b\d+/(\d+)),\s*(?:RunningAvgSamplesPerSec=[0-9.eE+-]+,\s*)?"
                   r"(?:Curr)?SamplesPerSec=([0-9.eE+-]+)(?:.*?MaxMemAllocated=([0-9.]+)GB)?")
MAX_MEM = re.compile(r"MaxMemAllocated=([0-9.]+)GB")
SEE_MEMORY = re.compile(r"Max_MA\s+([0-9.]+)\s*GB")


def matches(text: str) -> bool:
    return TIMER.search(text) is not None or "MaxMemAllocated=" in text


def parse(text: str, path: str) -> RunLog:
    meg = megatron.parse_text(text, path) if megatron.matches(text) else None
    log = RunLog(stack="DeepSpeed", path=path, step_what="ThroughputTimer lines (samples/s of the global batch)",
                 memory_what="MaxMemAllocated (torch.cuda.max_memory_allocated: tensors only)")
    for line in text.splitlines():
        m = TIMER.search(line)
        if m:
            log.samples.append(Sample(step=int(m.group(1) or m.group(2)), samples_per_s=float(m.group(3))))
        mem = MAX_MEM.search(line) or SEE_MEMORY.search(line)
        if mem:
            log.peak_memory_bytes = max(log.peak_memory_bytes or 0.0, float(mem.group(1)) * 2**30)
    if meg and meg.samples:
        log.stack = "Megatron-DeepSpeed"
        log.step_what = meg.step_what
        log.samples = meg.samples
        log.layout = meg.layout
    return log
