"""Checkpoint and resume with torch.distributed.checkpoint (DCP).

Each rank writes its own shards (``torch/distributed/checkpoint/state_dict.py`` gives one
state dict per model and optimizer whatever the wrapping: DDP, FSDP2, DTensor TP,
pipeline stages named as in the full model). A checkpoint is written into a hidden
temporary directory and renamed to ``step-N`` once every rank has finished, then
``latest`` is rewritten atomically: a crash mid-write leaves the previous checkpoint as
``latest``. ZeroRedundancyOptimizer has no DCP state-dict support, so each rank stores
its optimizer shard under its own key. On several hosts ``root`` must be a shared file
system.
"""
from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (_init_optim_state, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from simcore.results import atomic_write_text


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


def save(trainer, root, step: int) -> Path:
    """Write this step's checkpoint under ``root`` on every rank; returns its directory."""
    root = Path(root)
    tmp, final = root / f".step-{step}.tmp", root / f"step-{step}"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        root.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dcp.save(_state(trainer), checkpoint_id=str(tmp))
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        atomic_write_text(root / "latest", final.name + "\n")
    dist.barrier()
    return final


def load(trainer, root) -> int:
    """Restore the ``latest`` checkpoint under ``root``; returns the step to run next."""
    root = Path(root)
    try:
        name = (root / "latest").read_text().strip()
    except OSError:
        raise ValueError(f"--resume: no checkpoint in {root} (no 'latest' file)") from None
    state = _state(trainer)
    groups = copy.deepcopy(state["optim"]["param_groups"]) if "optim" in state else None
    dcp.load(state, checkpoint_id=str(root / name))
    model = nn.ModuleList(trainer.parts)
    set_model_state_dict(model, state["model"])
    if "optim" in state:  # DCP does not round-trip tuples (betas): hyper-parameters come from the plan
        set_optimizer_state_dict(model, trainer.optimizer, {**state["optim"], "param_groups": groups})
    else:
        inner = trainer.optimizer.optim
        inner.load_state_dict({**inner.state_dict(), "state": state[f"optim_shard_rank{dist.get_rank()}"]})
    return int(name.split("-")[1])
