"""PyTorch profiler (Kineto) traces read directly: one ``RankTrace`` per file, its GPU kernels
classified and each assigned to the ``ProfilerStep#N`` that launched it.

HolisticTraceAnalysis (HTA) is not a dependency: its wheel pulls in jupyterlab, too heavy for
CI, so the trace JSON (plain or gzip) is read here with the standard library. Its kernel
classes are followed (facebookresearch/HolisticTraceAnalysis, hta/common/types.py at commit
f4d0062c382f42bd8a74838bcdad1916c7d5d2da): COMMUNICATION is a name starting ``nccl``/``hccl``
or holding ``ncclKernel``; MEMORY is ``Memcpy``/``Memset``/``dma`` (and the ``gpu_memcpy`` /
``gpu_memset`` events); everything else is COMPUTATION, split further here by name into GEMMs,
attention and other kernels. Like HTA, a kernel belongs to the step whose CPU annotation holds
its launch (the ``cuda_runtime`` event with the same ``correlation``).

A collective's process group comes from the kernel's own ``args`` (torch >= 2.2: "Process Group
Ranks", "Process Group Name", "Collective name") or the trace's ``distributedInfo.pg_config``;
older traces carry none, and the group is then ``None``. Pure JSON: no torch, no Plan.
"""
from __future__ import annotations

import gzip
import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from simcore.runlogs.base import LogError

COMM = re.compile(r"(^nccl)|(^hccl)|(ncclKernel)|(ncclDevKernel)", re.I)
MEMORY = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
#: GEMMs by name (FBGEMM's embedding kernels carry its namespace fbgemm_gpu; they are not GEMMs).
GEMM = re.compile(r"(?<!fb)gemm|xmma|cutlass|cublas|matmul|wgmma|nvjet|splitKreduce", re.I)
ATTENTION = re.compile(r"flash|fmha|attention|attn|sdpa|cudnn.*mha", re.I)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
STEP = re.compile(r"^ProfilerStep#(\d+)$")
#: Bytes per element of the dtypes torch names in "dtype" (c10's ScalarType names).
DTYPE_BYTES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "byte": 1, "char": 1, "int": 4, "long": 8,
               "short": 2, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1}

#: A collective's name (from args or the NCCL kernel's name, lower case, no '_') to a Span kind.
COLLECTIVES = (("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter"), ("allgather", "all_gather"),
               ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("sendrecv", "send_recv"),
               ("send", "send"), ("recv", "recv"), ("reduce", "reduce"))


@dataclass(slots=True)
class Kernel:
    """One GPU event: times in microseconds, the trace's own clock."""

    start_us: float
    end_us: float
    stream: int
    klass: str
    """gemm, attention, other, memory or comm."""
    name: str
    step: str = ""
    collective: str = ""
    group: tuple[int, ...] | None = None
    bytes: float = 0.0
    """A collective's input bytes ("In msg nelems" x the dtype's size; 0 where the trace has none)."""


@dataclass
class RankTrace:
    """What one rank's trace file holds."""

    path: str
    rank: int
    world: int | None
    steps: list[tuple[str, float, float]] = field(default_factory=list)
    """(ProfilerStep#N, CPU start us, CPU end us), in trace order."""
    kernels: list[Kernel] = field(default_factory=list)
    device: str = ""


def classify(name: str, cat: str = "kernel") -> str:
    """HTA's kernel class, computation split into gemm / attention / other."""
    if COMM.search(name):
        return "comm"
    if cat in ("gpu_memcpy", "gpu_memset") or MEMORY.search(name):
        return "memory"
    if ATTENTION.search(name):
        return "attention"
    return "gemm" if GEMM.search(name) else "other"


def collective_kind(text: str) -> str:
    """all_reduce, all_gather, ... from "Collective name" or the kernel name ('' if none)."""
    key = text.lower().replace("_", "")
    key = re.sub(r"^nccl(dev)?kernel", "", key)
    return next((kind for word, kind in COLLECTIVES if word in key), "")


def read_json(path: Path) -> dict:
    """The trace document; LogError in one sentence when empty, truncated, or not a trace."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise LogError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not raw.strip():
        raise LogError(f"{path}: the file is empty, not a PyTorch profiler trace")
    try:
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        doc = json.loads(text)
    except (EOFError, OSError, zlib.error):
        raise LogError(f"{path}: the gzip stream is truncated or damaged, so the trace JSON cannot be read") from None
    except (UnicodeDecodeError, ValueError) as exc:   # an error at the very end: the file was cut short
        cut = isinstance(exc, json.JSONDecodeError) and exc.pos >= len(exc.doc.rstrip()) > 0
        what = "ends early (truncated)" if cut else "is not JSON"
        raise LogError(f"{path}: the trace JSON {what}, so no profiler events can be read") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        raise LogError(f"{path}: no 'traceEvents' list, so this is not a PyTorch profiler (Kineto) trace")
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def _ranks(value) -> tuple[int, ...] | None:
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    if isinstance(value, str) and value.strip().startswith("["):
        nums = re.findall(r"-?\d+", value)
        return tuple(int(n) for n in nums) if nums else None
    return None


def _group(args: dict, groups: dict) -> tuple[int, ...] | None:
    ranks = _ranks(args.get("Process Group Ranks"))
    if ranks is None and str(args.get("Process Group Name", "")) in groups:
        ranks = groups[str(args["Process Group Name"])]
    return ranks


def _rank_of(path: Path, info: dict, index: int) -> int:
    if isinstance(info.get("rank"), int):
        return info["rank"]
    m = re.search(r"rank[-_]?(\d+)", path.name)
    return int(m.group(1)) if m else index


def _step_of(launch: float, steps: list[tuple[str, float, float]]) -> str:
    for name, lo, hi in steps:
        if lo <= launch <= hi:
            return name
    return ""


def parse_trace(path: str | Path, index: int = 0) -> RankTrace:
    """One trace file: its steps and its GPU kernels, each tagged with its step (LogError if it has
    no ProfilerStep annotation or no GPU kernel, naming what is missing)."""
    path = Path(path)
    doc = read_json(path)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    groups = {str(g.get("pg_name")): _ranks(g.get("ranks")) for g in info.get("pg_config") or []
              if isinstance(g, dict)}
    steps = sorted(((e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in events
                    if STEP.match(str(e.get("name", ""))) and e.get("ph") == "X" and e.get("cat") != "gpu_user_annotation"),
                   key=lambda s: s[1])
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    props = doc.get("deviceProperties") or [{}]
    out = RankTrace(path=str(path), rank=_rank_of(path, info, index), world=world, steps=steps,
                    device=str(props[0].get("name", "")) if isinstance(props[0], dict) else "")
    if not steps:
        raise LogError(f"{path}: no ProfilerStep# annotation, so the trace cannot be cut into steps "
                       "(profile with torch.profiler.schedule and call prof.step() each iteration)")
    launches = {e["args"]["correlation"]: float(e["ts"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and isinstance(e.get("args"), dict)
                and "correlation" in e["args"]}
    for e in events:
        if e.get("cat") not in GPU_CATS or e.get("ph") != "X" or "dur" not in e:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        name = str(e.get("name", ""))
        start = float(e["ts"])
        klass = classify(name, e["cat"])
        k = Kernel(start_us=start, end_us=start + float(e["dur"]), stream=int(args.get("stream", e.get("tid", 0)) or 0),
                   klass=klass, name=name, step=_step_of(launches.get(args.get("correlation"), start), steps))
        if klass == "comm":
            k.collective = collective_kind(str(args.get("Collective name", ""))) or collective_kind(name)
            k.group = _group(args, groups)
            nelems = args.get("In msg nelems")
            if isinstance(nelems, (int, float)):
                k.bytes = float(nelems) * DTYPE_BYTES.get(str(args.get("dtype", "")).lower(), 0)
        out.kernels.append(k)
    if not out.kernels:
        raise LogError(f"{path}: no GPU kernel events (cat 'kernel'), so there is no GPU time to compare "
                       "(a CPU-only trace, or one profiled without ProfilerActivity.CUDA)")
    if not any(k.step for k in out.kernels):
        raise LogError(f"{path}: no GPU kernel was launched inside a ProfilerStep# annotation")
    return out


def trace_files(path: str | Path) -> list[Path]:
    """The trace files of ``path``: the file itself, or a directory's *.json / *.json.gz files."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise LogError(f"{path}: no such file or directory")
    files = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith((".json", ".json.gz")))
    if not files:
        raise LogError(f"{path}: no *.json or *.json.gz trace file in the directory")
    return files


def parse_traces(path: str | Path) -> list[RankTrace]:
    """Every rank's trace under ``path``, by rank; LogError if two files claim the same rank."""
    traces = sorted((parse_trace(f, i) for i, f in enumerate(trace_files(path))), key=lambda t: t.rank)
    ranks = [t.rank for t in traces]
    if len(set(ranks)) != len(ranks):
        dup = next(r for r in ranks if ranks.count(r) > 1)
        raise LogError(f"{path}: two trace files are both rank {dup} (keep one trace per rank in the directory)")
    return traces
