"""Megatron-LM, NeMo and Megatron-Bridge: the ``iteration N/M | ... | elapsed time per iteration
(ms): X | throughput per GPU (TFLOP/s/GPU): X`` lines, the memory report, the arguments block,
and the functional tests' ``golden_values_*.json``. Megatron-DeepSpeed's ``approx flops per GPU:
XTFLOPS`` reads as the TFLOP/s. Each line's time is the mean over its log interval."""
from __future__ import annotations

import re

from simcore.runlogs.base import RunLog, Sample

ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*([0-9.]+)")
THROUGHPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([0-9.]+)")
APPROX_FLOPS = re.compile(r"approx flops per GPU:\s*([0-9.]+)\s*TFLOPS")
MEMORY = re.compile(r"\[Rank (\d+)\] \(after \d+ iterations\) memory \(MB\) \| allocated: [0-9.]+ \| "
                    r"max allocated: ([0-9.]+)")
MEM_BYTES = re.compile(r"mem-max-allocated-bytes:\s*([0-9.eE+]+)")
ARG = re.compile(r"^\s*([a-z_0-9]+) \.{2,}\s*(\S.*?)\s*$")

#: Megatron argument -> Plan layout field.
ARG_FIELDS = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
              "context_parallel_size": "cp", "expert_model_parallel_size": "ep",
              "data_parallel_size": "dp", "virtual_pipeline_model_parallel_size": "vpp",
              "micro_batch_size": "micro_batch", "global_batch_size": "global_batch",
              "seq_length": "seq_len", "num_layers": "layers", "world_size": "gpus"}


def matches(text: str) -> bool:
    return ITERATION.search(text) is not None


def parse_text(text: str, path: str) -> RunLog:
    log = RunLog(stack="Megatron-LM", path=path,
                 step_what="'elapsed time per iteration (ms)' lines (each the mean over its log interval)")
    for line in text.splitlines():
        m = ITERATION.search(line)
        if m:
            tput = THROUGHPUT.search(line) or APPROX_FLOPS.search(line)
            log.samples.append(Sample(step=int(m.group(1)), step_s=float(m.group(2)) / 1e3,
                                      tflops_per_gpu=float(tput.group(1)) if tput else None))
            continue
        mem = MEMORY.search(line) or MEM_BYTES.search(line)
        if mem:
            value = float(mem.group(mem.lastindex))
            value = value if mem.re is MEM_BYTES else value * 2**20
            log.peak_memory_bytes = max(log.peak_memory_bytes or 0.0, value)
            log.memory_what = "max allocated (torch.cuda.max_memory_allocated: tensors only, no allocator cache)"
    log.layout = arguments(text)
    return log


def arguments(text: str) -> dict:
    """The layout fields of the ``arguments`` block (Plan field -> int); {} without one."""
    start = text.find("------------------------ arguments ------------------------")
    if start < 0:
        return {}
    end = text.find("end of arguments", start)
    block = text[start:end if end > 0 else len(text)]
    out = {}
    for line in block.splitlines():
        m = ARG.match(line)
        if m and m.group(1) in ARG_FIELDS:
            value = m.group(2)
            if value == "None" and m.group(1) == "virtual_pipeline_model_parallel_size":
                value = "1"
            if value.isdigit():
                out[ARG_FIELDS[m.group(1)]] = int(value)
    return out


def is_golden(doc) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("iteration-time"), dict) \
        and isinstance(doc["iteration-time"].get("values"), dict)


def parse_golden(doc: dict, path: str) -> RunLog:
    """A functional test's golden values: ``iteration-time`` (s) and ``mem-max-allocated-bytes``
    per logged step."""
    log = RunLog(stack="Megatron-LM functional test (golden values)", path=path,
                 step_what="'iteration-time' values (s, one per logged step)")
    mems = (doc.get("mem-max-allocated-bytes") or {}).get("values") or {}
    for step, value in doc["iteration-time"]["values"].items():
        if isinstance(value, (int, float)) and str(step).isdigit():
            mem = mems.get(step)
            log.samples.append(Sample(step=int(step), step_s=float(value),
                                      memory_bytes=float(mem) if isinstance(mem, (int, float)) else None))
    if mems:
        log.memory_what = "mem-max-allocated-bytes (torch.cuda.max_memory_allocated: tensors only)"
    return log
