"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

Each rank writes its own shards (``torch/distributed/checkpoint/state_dict.py`` gives one
state dict per model and optimizer whatever the wrapping: DDP, FSDP2, DTensor TP,
pipeline stages named as in the full model). A checkpoint is written into a hidden
temporary directory and renamed to ``step-N`` once every rank has finished, then
``latest`` is rewritten atomically: a crash mid-write leaves the previous checkpoint as
``latest``. Rank 0 adds ``trainplan.json`` (the step and the plan's identity,
``executors.measure.plan_identity``), so a resume of another model, a corrupt ``latest`` or
a layout torch cannot reshard into is one sentence naming what differs; a layout DCP
reshards still resumes. ZeroRedundancyOptimizer has no DCP state-dict support, so each
rank stores its optimizer shard under its own key. On several hosts ``root`` must be a shared file
system.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (_init_optim_state, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from executors.measure import plan_identity, plan_mismatch
from simcore.results import atomic_write_text

#: The file in a checkpoint's directory that says what it holds: its step and its plan's identity.
META = "trainplan.json"


def _is_zero1(optimizer) -> bool:
    return hasattr(optimizer, "optim") and hasattr(optimizer, "consolidate_state_dict")


def _state(trainer) -> dict:
    model = nn.ModuleList(trainer.parts)
    state = {"model": get_model_state_dict(model)}
    if _is_zero1(trainer.optimizer):
        _init_optim_state(trainer.optimizer.optim)  # DCP loads into existing tensors only
        # only the tensors: the hyper-parameters come from the plan
        state[f"optim_shard_rank{dist.get_rank()}"] = trainer.optimizer.optim.state_dict()["state"]
    else:
        state["optim"] = get_optimizer_state_dict(model, trainer.optimizer)
    return state


def save(trainer, root, step: int, plan=None) -> Path:
    """Write this step's checkpoint under ``root`` on every rank; returns its directory.
    With ``plan``, the checkpoint carries ``META`` (the step and the plan's identity) for a
    resume to check against."""
    root = Path(root)
    tmp, final = root / f".step-{step}.tmp", root / f"step-{step}"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(_state(trainer), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        if plan is not None:
            atomic_write_text(tmp / META, json.dumps({"step": step, "plan": plan_identity(plan)}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        atomic_write_text(root / "latest", final.name + "\n")
    dist.barrier()
    return final


def latest(root, plan=None) -> tuple[Path, int]:
    """The checkpoint ``root/latest`` names and its step, checked against what it says it
    holds and, with ``plan``, against the plan's model shape: ValueError in one sentence
    for a missing or corrupt ``latest``, a missing directory, another step or model."""
    root = Path(root)
    try:
        name = (root / "latest").read_text().strip()
    except OSError:
        raise ValueError(f"--resume: no checkpoint in {root} (no 'latest' file)") from None
    m = re.fullmatch(r"step-(\d+)", name)
    if not m:
        raise ValueError(f"--resume: {root / 'latest'} is corrupt: it reads {name[:40]!r}, not the name of "
                         "a checkpoint (step-N)")
    path, step = root / name, int(m.group(1))
    if not (path / ".metadata").is_file():
        raise ValueError(f"--resume: {root / 'latest'} names {name} but {path} holds no checkpoint")
    meta = _meta(path)
    if meta.get("step", step) != step:
        raise ValueError(f"--resume: step does not match: {root / 'latest'} names {name} but the checkpoint "
                         f"holds step {meta['step']}")
    if plan is not None and "plan" in meta:
        diff = plan_mismatch(meta["plan"], plan, ("model.",))
        if diff:
            raise ValueError(f"--resume: {path} holds another model shape (checkpoint vs this plan: "
                             f"{'; '.join(diff)}): a resume needs the model the checkpoint was written from")
    return path, step


def _meta(path: Path) -> dict:
    try:
        return json.loads((path / META).read_text())
    except OSError:   # a checkpoint written without a plan (or before META existed)
        return {}
    except ValueError:
        raise ValueError(f"--resume: {path / META} is corrupt (not JSON)") from None


def load(trainer, root, plan=None) -> int:
    """Restore the ``latest`` checkpoint under ``root``; returns the step to run next. A
    checkpoint that torch cannot load into this trainer (another layout it cannot reshard,
    corrupt files) is a ValueError in one sentence naming what differs."""
    path, step = latest(root, plan)
    state = _state(trainer)
    groups = copy.deepcopy(state["optim"]["param_groups"]) if "optim" in state else None
    model = nn.ModuleList(trainer.parts)
    try:
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(model, state["model"])
        if "optim" in state:  # DCP does not round-trip tuples (betas): hyper-parameters come from the plan
            set_optimizer_state_dict(model, trainer.optimizer, {**state["optim"], "param_groups": groups})
        else:
            inner = trainer.optimizer.optim
            inner.load_state_dict({**inner.state_dict(), "state": state[f"optim_shard_rank{dist.get_rank()}"]})
    except (CheckpointException, RuntimeError, KeyError, ValueError) as exc:
        raise ValueError(_load_failure(path, plan, exc)) from None
    return step


def _load_failure(path: Path, plan, exc: BaseException) -> str:
    """One sentence for a checkpoint torch could not load: the layout fields that differ
    from the plan's, else torch's own first line."""
    if isinstance(exc, CheckpointException) and exc.failures:
        exc = next(iter(exc.failures.values()))[0]
    cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    if isinstance(exc, KeyError):
        cause = f"it has no entry {cause}"
    meta = _meta(path)
    layout = ("parallel.", "training.precision")
    diff = plan_mismatch(meta["plan"], plan, layout) if plan is not None and "plan" in meta else []
    if diff:
        return (f"--resume: {path} was written by another layout (checkpoint vs this plan: {'; '.join(diff)}) "
                f"that torch cannot reshard into this one: {cause}")
    return f"--resume: {path} cannot be loaded into this plan's model and layout: {cause}"
