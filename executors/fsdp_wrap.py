"""FSDP2's parameter groups as the Plan's stack wraps them (``parallel.fsdp_root``,
``simcore.plan.choices.FsdpRoot``), for the executor and for ``trainplan memory --torch``.

- ``resharded``: one group per block and the root group (embedding, final norm, output), all
  resharded after forward (ZeRO-3) or none (ZeRO-2).
- ``output_kept``: torchtitan since July 2025 (llama3/infra/parallelize.py @2c8b5947
  ``apply_fsdp``): the embedding and every block their own groups, ``[norm, output]`` one group
  with ``reshard_after_forward=False``, and the root holding nothing.
- ``kept``: torchtitan before it on torch < 2.8 (parallelize_llama.py @54ef42221): the root
  group and the last block not resharded after forward.
"""
from __future__ import annotations

from torch import nn
from torch.distributed.fsdp import fully_shard

from simcore.plan.spec import FsdpRoot


def shard_groups(model: nn.Module, root: FsdpRoot, reshard_after_forward: bool, **kw) -> nn.Module:
    """``fully_shard`` the executor's Transformer group by group; returns the root module."""
    blocks = list(model.layers.values())
    if root == FsdpRoot.OUTPUT_KEPT:
        if model.embed is not None:
            fully_shard(model.embed, reshard_after_forward=reshard_after_forward, **kw)
        for block in blocks:
            fully_shard(block, reshard_after_forward=reshard_after_forward, **kw)
        fully_shard([model.norm, model.output], reshard_after_forward=False, **kw)
        return fully_shard(model, reshard_after_forward=reshard_after_forward, **kw)
    kept = root == FsdpRoot.KEPT
    for i, block in enumerate(blocks):
        fully_shard(block, reshard_after_forward=reshard_after_forward and not (kept and i == len(blocks) - 1), **kw)
    return fully_shard(model, reshard_after_forward=reshard_after_forward and not kept, **kw)
