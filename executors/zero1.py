"""ZeRO-1 under tensor parallelism: ``ZeroRedundancyOptimizer`` on the parameters' local shards.

``ZeroRedundancyOptimizer`` (``torch/distributed/optim/zero_redundancy_optimizer.py``)
flattens parameters into buckets and broadcasts them after the step, which a DTensor
parameter does not allow. The optimizer's update is elementwise, so it can run on each
parameter's local shard (``DTensor._local_tensor``, which shares its storage) with the
local shard of the gradient: the data-parallel ranks of one tensor-parallel rank hold the
same shards, and ZeRO-1 partitions and broadcasts those among them, as Megatron-Core's
distributed optimizer shards its (tensor-parallel local) parameters over the data-parallel
group (``megatron/core/optimizer/distrib_optimizer.py``). A gradient whose placement differs
from its parameter's (a sequence-parallel norm's ``Partial`` gradient) is redistributed to
it first: one all-reduce per step, where the optimizer reading the DTensor gradient would
all-reduce it at each read.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor


def _local(p: nn.Parameter) -> torch.Tensor:
    return p._local_tensor if isinstance(p, DTensor) else p


class LocalShardZero(ZeroRedundancyOptimizer):
    """``ZeroRedundancyOptimizer`` over the local shards of (possibly DTensor) parameters."""

    def __init__(self, params: list[nn.Parameter], **kwargs):
        self._pairs = [(p, _local(p)) for p in params]
        super().__init__([local for _, local in self._pairs], **kwargs)

    def step(self, closure=None, **kwargs):
        for p, local in self._pairs:
            grad = p.grad
            if isinstance(grad, DTensor):
                if grad.placements != p.placements:
                    grad = grad.redistribute(p.device_mesh, p.placements)
                grad = grad._local_tensor
            if local is not p:
                local.grad = grad
        return super().step(closure, **kwargs)
