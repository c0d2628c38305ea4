"""Start the ranks of a Plan and run measured training steps on them.

On one host ``run(plan)`` spawns ``plan.parallel.gpus`` processes itself
(``torch.multiprocessing``, start method "spawn"; gloo on CPU, nccl when there is one
GPU per rank); on a cluster ``python -m executors.launch PLAN`` runs under torchrun's
rendezvous (``torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m
executors.launch PLAN``) and rank 0 prints the Measurement as JSON. A rank that fails ends
the run with its message. Each rank beats a heartbeat after it is built and after each step;
one that makes no progress for ``timeout_s`` (from its last heartbeat, not from the start)
ends the run naming the rank (``executors.watchdog``), so the timeout must exceed one step
and the start-up, not the whole run.

Data are synthetic by default: each sequence counts up from a random start with a random
stride modulo the vocabulary, so the loss can fall; a token file (a flat numpy memmap of
uint16 token ids) is the option. Batches depend only on (seed, step), which is what makes
a resumed run repeat the loss trajectory of an uninterrupted one.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from executors.act_offload import offload_host_peak
from executors.procs import init_distributed, spawn
from executors.watchdog import heartbeat
from simcore.plan.spec import Plan, ZeroStage
from simcore.results import StepResult, write_chrome_trace

@dataclass(frozen=True, slots=True, kw_only=True)
class RunOptions:
    steps: int = 20
    """Steps run in all; the first ``warmup`` are discarded."""
    warmup: int = 5
    seed: int = 0
    checkpoint_dir: str | None = None
    resume: bool = False
    data_path: str | None = None
    lr: float | None = None
    instrument: bool = True
    timeout_s: float = 300.0
    """Progress timeout: seconds a rank may go without a heartbeat (start-up, one step)."""


# --------------------------------------------------------------------------- data and steps

def batch(plan: Plan, step: int, seed: int, data_path: str | None = None) -> torch.Tensor:
    """The global batch of ``step``: (global_batch, seq_len + 1) token ids."""
    m, n = plan.model, plan.training.global_batch
    rng = np.random.default_rng([seed, step])
    if data_path is not None:
        data = np.memmap(data_path, dtype=np.uint16, mode="r")
        if len(data) <= m.seq_len + 1:
            raise ValueError(f"token file {data_path} holds {len(data)} tokens, fewer than model.seq_len+1")
        starts = rng.integers(0, len(data) - m.seq_len - 1, size=n)
        rows = np.stack([data[s:s + m.seq_len + 1] for s in starts]).astype(np.int64) % m.vocab
        return torch.from_numpy(rows)
    start = rng.integers(0, m.vocab, size=(n, 1))
    stride = rng.integers(1, 8, size=(n, 1))
    return torch.from_numpy((start + stride * np.arange(m.seq_len + 1)) % m.vocab)


def local_batch(plan: Plan, step: int, seed: int, dp_rank: int, data_path: str | None = None):
    """This data-parallel rank's rows: (tokens, labels), each (global_batch / dp, seq_len)."""
    rows = batch(plan, step, seed, data_path).chunk(plan.parallel.dp)[dp_rank]
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


# --------------------------------------------------------------------------- one rank

def run_rank(rank: int, world: int, device: torch.device, plan: Plan, opts: RunOptions) -> dict:
    """Build this rank's trainer, run ``opts.steps`` steps and return its record."""
    from executors import checkpoint, measure, record
    from executors.parallel import LEARNING_RATE, build_mesh, build_trainer

    if world != plan.parallel.gpus:
        raise ValueError(f"the plan needs {plan.parallel.gpus} ranks (tp*pp*dp*cp) but {world} were started")
    mesh = build_mesh(plan, device.type)
    trainer = build_trainer(plan, mesh, device, opts.seed, opts.lr or LEARNING_RATE)
    heartbeat()
    first = checkpoint.load(trainer, opts.checkpoint_dir, plan) if opts.resume else 0
    heartbeat()
    rec = record.Recorder(rank=rank, axis_of=record.axis_map(mesh), enabled=False,
                          sync=(lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None)
    for stage in trainer.stages:
        record.instrument_stage(stage, rec)
    saved = measure.SavedActivations([p for part in trainer.parts for p in part.parameters()])
    dp_rank = mesh.get_local_rank("dp")
    steps, losses = [], []
    with record.record_collectives(rec):
        for step in range(first, first + opts.steps):
            tokens, labels = (t.to(device) for t in local_batch(plan, step, opts.seed, dp_rank, opts.data_path))
            dist.barrier()
            rec.counts.clear()
            # the recorder's hooks cost host time of their own: measured steps alternate
            # between recorded and bare ones, and the step time is the bare steps'
            instrument = opts.instrument and (step - first < opts.warmup or (step - first - opts.warmup) % 2 == 0)
            rec.enabled = instrument
            rec.start_step()
            # saved-tensor accounting costs a Python call per saved tensor: do it on the last
            # warm-up step only (every step has the same shapes, hence the same peak)
            account = opts.instrument and step - first == max(opts.warmup - 1, 0)
            with saved.hooks() if account else _null():
                loss = trainer.step(tokens, labels, span=rec.span if instrument else None)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            duration = rec.now()
            rec.enabled = False
            steps.append({"step": step, "duration_s": duration, "instrumented": instrument,
                          "spans": rec.step_spans() if instrument else [], "counts": dict(rec.counts)})
            losses.append(global_loss(plan, loss, device))
            heartbeat(step - first + 1)   # the parent's watchdog: this rank made progress
    if opts.checkpoint_dir:
        checkpoint.save(trainer, opts.checkpoint_dir, first + opts.steps, plan)
        heartbeat()
    memory = measure.state_bytes(trainer.parts, trainer.optimizer, device.type)
    memory["activations"] = float(saved.peak)
    if plan.parallel.zero == ZeroStage.GRADIENTS:   # FSDP2 keeps the unsharded parameters until backward
        memory["weights"] += saved.unsharded_peak
    cuda = {}
    if device.type == "cuda":
        memory["framework"] = max(0.0, torch.cuda.max_memory_allocated(device) - sum(memory.values()))
        free, total = torch.cuda.mem_get_info(device)
        cuda = {"cuda_memory": {"max_allocated": torch.cuda.max_memory_allocated(device),
                                "max_reserved": torch.cuda.max_memory_reserved(device), "device_used": total - free}}
    host = offload_host_peak(trainer.parts)
    return {"rank": rank, "steps": steps, "losses": losses, "memory_bytes": memory,
            "device": str(device), "host": socket.gethostname(), **cuda,
            **({"offload_host_bytes": host} if host else {})}


def _null():
    import contextlib

    return contextlib.nullcontext()


def global_loss(plan: Plan, loss: float | None, device: torch.device) -> float:
    """The step's loss averaged over data-parallel ranks (last-stage ranks hold it)."""
    t = torch.tensor([loss or 0.0, 1.0 if loss is not None else 0.0], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


# --------------------------------------------------------------------------- entry points

#: CPU ranks per core this host will start for one run; beyond it a run is refused rather
#: than left to crawl (the executor's tests run 4 ranks on 2 cores).
MAX_CPU_RANKS_PER_CORE = 4


def check_one_host(plan: Plan, cuda: bool) -> None:
    """A plan this host can start by itself: its GPUs, or ranks on its cores for localhost."""
    ranks = plan.parallel.gpus
    if cuda:
        return
    node = plan.cluster.node.name
    if node != "localhost":
        raise ValueError(f"cluster.node={node}: the plan needs {ranks} GPUs and this host has "
                         f"{torch.cuda.device_count()}; run it on the cluster with "
                         "`torchrun ... -m executors.launch PLAN`")
    limit = MAX_CPU_RANKS_PER_CORE * (os.cpu_count() or 1)
    if ranks > limit:
        raise ValueError(f"the plan needs {ranks} ranks but this host runs at most {limit} "
                         f"({MAX_CPU_RANKS_PER_CORE} per core)")


def launch_ranks(plan: Plan, opts: RunOptions, start_method: str = "spawn") -> list[dict]:
    """Start the plan's ranks on this host and return their records by rank."""
    from executors.parallel import check_executable

    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= plan.parallel.gpus
    check_one_host(plan, cuda)
    check_executable(plan, "cuda" if cuda else "cpu")
    if opts.steps <= opts.warmup:
        raise ValueError(f"--steps={opts.steps} must exceed --warmup={opts.warmup} (warm-up steps are discarded)")
    if opts.resume and not opts.checkpoint_dir:
        raise ValueError("--resume needs a checkpoint directory")
    return spawn(run_rank, plan.parallel.gpus, (plan, opts), timeout_s=opts.timeout_s, start_method=start_method)


def run(plan: Plan, *, steps: int = 20, warmup: int = 5, seed: int = 0, trace_path=None,
        checkpoint_dir=None, resume: bool = False, timeout_s: float = 300, data_path=None,
        start_method: str = "spawn") -> StepResult:
    """Run ``plan`` on this host and return the Measurement (``source="measured"``).
    ``start_method="fork"`` starts the ranks in a second instead of re-importing torch in
    each (CPU only)."""
    from executors.measure import summarise

    opts = RunOptions(steps=steps, warmup=warmup, seed=seed, checkpoint_dir=checkpoint_dir and str(checkpoint_dir),
                      resume=resume, data_path=data_path and str(data_path), timeout_s=timeout_s)
    result = summarise(plan, launch_ranks(plan, opts, start_method), warmup)
    if trace_path is not None:
        write_chrome_trace(result.spans, trace_path, process_name=plan.name or "measured")
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point under torchrun: every rank runs; rank 0 prints the Measurement."""
    from executors.measure import plan_identity, summarise
    from simcore.plan.load import load_plan

    ap = argparse.ArgumentParser(prog="python -m executors.launch")
    ap.add_argument("plan")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trace")
    ap.add_argument("--checkpoint-dir")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--data")
    ap.add_argument("--timeout", type=float, default=1800.0)
    a = ap.parse_args(argv)
    plan = load_plan(a.plan)
    opts = RunOptions(steps=a.steps, warmup=a.warmup, seed=a.seed, checkpoint_dir=a.checkpoint_dir,
                      resume=a.resume, data_path=a.data, timeout_s=a.timeout)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = init_distributed(rank, world, a.timeout)
    record = run_rank(rank, world, device, plan, opts)
    records = [None] * world if rank == 0 else None
    dist.gather_object(record, records, dst=0)
    if rank == 0:
        result = summarise(plan, records, a.warmup)
        if a.trace:
            write_chrome_trace(result.spans, a.trace, process_name=plan.name or "measured")
        print(json.dumps({**result.to_json(), "plan": plan_identity(plan)}, indent=2))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
