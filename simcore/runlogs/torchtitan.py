"""torchtitan's metrics line, ``step: N  loss: X  memory: X GiB(Y%)  tps: N  tflops: X  mfu: X%``
(colour codes stripped first), and its ``Building device mesh with parallelism: pp=.., dp_replicate=..,
dp_shard=.., cp=.., tp=.., ep=..`` line for the layout. ``tps`` is tokens/s per GPU; ``memory`` is
the peak reserved memory (torch.cuda.max_memory_reserved)."""
from __future__ import annotations

import re

from simcore.runlogs.base import ANSI, RunLog, Sample, number

STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*\S+.*?memory:\s*([0-9.]+)\s*GiB.*?tps:\s*([0-9,]+)"
                  r"(?:.*?tflops:\s*([0-9.]+))?(?:.*?mfu:\s*([0-9.]+)%)?")
MESH = re.compile(r"Building device mesh with parallelism: (.*)$")


def matches(text: str) -> bool:
    return STEP.search(ANSI.sub("", text)) is not None


def parse(text: str, path: str) -> RunLog:
    log = RunLog(stack="torchtitan", path=path, step_what="metrics lines (tps, tflops, mfu per logged step)",
                 memory_what="peak reserved (torch.cuda.max_memory_reserved, allocator cache included)")
    for line in ANSI.sub("", text).splitlines():
        m = STEP.search(line)
        if m:
            log.samples.append(Sample(step=int(m.group(1)), memory_bytes=float(m.group(2)) * 2**30,
                                      tokens_per_s_per_gpu=number(m.group(3)),
                                      tflops_per_gpu=float(m.group(4)) if m.group(4) else None,
                                      mfu=float(m.group(5)) / 100 if m.group(5) else None))
            continue
        mesh = MESH.search(line)
        if mesh:
            log.layout = mesh_layout(mesh.group(1))
    return log


def mesh_layout(text: str) -> dict:
    """Plan layout fields from ``pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=1, ep=1, etp=1``."""
    dims = {k.strip(): int(v) for k, v in re.findall(r"(\w+)=(-?\d+)", text)}
    out = {f: dims[f] for f in ("pp", "cp", "tp", "ep") if f in dims}
    if "dp_replicate" in dims or "dp_shard" in dims:
        replicate, shard = max(dims.get("dp_replicate", 1), 1), max(dims.get("dp_shard", 1), 1)
        out["dp"] = replicate * shard
        if replicate > 1 and shard > 1:   # HSDP, as the importer reads it (replicate alone is DDP)
            out["dp_replicate"] = replicate
    return out
