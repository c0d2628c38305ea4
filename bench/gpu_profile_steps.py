"""Where a step's time goes, kernel by kernel: the open causes of bench/RESULTS.md's GPU sections.

    python bench/gpu_profile_steps.py [--only bf16 bf16-offload ...] [--out DIR] [--warmup 2]

Runs layouts of validation/gpu.yaml in this process (one rank: nccl on a GPU, gloo on a CPU),
warms up, then profiles one step with ``torch.profiler`` (CPU and, on a GPU, CUDA activities) and
appends to DIR/profile_steps.txt: the top operators by self device time and by self host time,
and the step's wall time. What each layout is for (twenty-fifth session, "Left"):

- ``bf16-offload``: FSDP2's ``CPUOffloadPolicy`` backward paid about 2.4 s per accumulated
  micro-batch on the H200 (is it the blocking pageable D2H copy, page faults of fresh host
  memory, or the host ``+=``?);
- ``bf16-mb1``: the host-bound micro-batch-1 step, 27-38% slower than predicted (how many kernels
  an autocast layer launches against the fp32 probe layer the host cost was calibrated on);
- ``bf16-act-offload-12``: reserved against allocated memory with the host waiting for the copies.

On a CPU, ``--tiny`` runs the same layouts on a two-layer model (the GPU-only ones fail in one
sentence each), which checks the script before device time is spent on it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


#: ``--tiny``: the matrix's model shrunk to run a step in a second on a CPU.
TINY = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 4, "ffn_hidden": 256, "vocab": 512, "seq_len": 128}


def profile_layout(name: str, doc: dict, out: Path, warmup: int) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from executors.launch import local_batch
    from executors.parallel import build_mesh, build_trainer
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_validate import catalog_plan

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    plan = catalog_plan(doc, "dgx-h100")   # the executor reads no figure of the node
    trainer = build_trainer(plan, build_mesh(plan, device.type), device)
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    for step in range(warmup):
        trainer.step(*(t.to(device) for t in local_batch(plan, step, 0, 0)))
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    tokens, labels = (t.to(device) for t in local_batch(plan, warmup, 0, 0))
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        trainer.step(tokens, labels)
        sync()
        wall = time.perf_counter() - t0
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    text = [f"# {name}: one step, {wall:.4f} s wall ({device})"]
    if cuda:
        text.append(f"# max_allocated {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB, "
                    f"max_reserved {torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB")
    text += [f"## by {sort}", prof.key_averages().table(sort_by=sort, row_limit=30)]
    if cuda:
        text += ["## by self_cpu_time_total", prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)]
    with open(out / "profile_steps.txt", "a") as f:   # one file: the device tool brings back eight at most
        f.write("\n".join(text) + "\n\n")
    del trainer
    return text[0]


def main(argv=None) -> int:
    from trainplan.validate import load_matrix

    ap = argparse.ArgumentParser(prog="bench/gpu_profile_steps.py")
    ap.add_argument("--matrix", type=Path, default=ROOT / "validation" / "gpu.yaml")
    ap.add_argument("--only", nargs="*", default=["bf16", "bf16-mb1", "bf16-act-offload-12", "bf16-offload"])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "bench" / "out" / "profile")))
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tiny", action="store_true", help="a two-layer model (a CPU check of the script)")
    a = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    a.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", rank=0, world_size=1)
    try:
        for name, doc in load_matrix(a.matrix):
            if name not in a.only:
                continue
            if a.tiny:
                doc = {**doc, "model": {**doc["model"], **TINY}}
            try:
                print(profile_layout(name, doc, a.out, a.warmup), flush=True)
            except Exception as exc:   # a layout that fails is reported, the others still run
                print(f"{name}: FAILED {type(exc).__name__}: {str(exc)[:300]}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
