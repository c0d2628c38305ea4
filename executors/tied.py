"""Tied input embedding and output layer under tensor and pipeline parallelism.

Tensor parallel: the token embedding is vocabulary-parallel (``RowwiseParallel`` on an
``nn.Embedding`` shards its weight by rows, ``Shard(0)``) and the output layer is
column-parallel (``ColwiseParallel`` on the (vocab, hidden) weight, also ``Shard(0)``), so
one DTensor serves both, as Megatron-Core's ``VocabParallelEmbedding`` weight serves its
``ColumnParallelLinear`` output layer (``megatron/core/models/common/language_module/
language_module.py``, ``shared_embedding_or_output_weight``). ``parallelize_module``
distributes each module's parameter separately, so ``retie`` points the output layer back
at the embedding's DTensor; autograd then sums both uses' gradients into it.

Pipeline parallel: the first stage holds the embedding and the last the output layer,
each a copy initialised from the same weights. Under DualPipeV both stages sit on rank 0 (its V):
the two copies' gradients are summed there, with no group (``sum_local_copies``). After the backward (and the data-parallel
reduction) of each step their gradients are summed over the embedding group, so both
copies take the same update and stay equal: Megatron-Core ``finalize_model_grads.py``
``_allreduce_word_embedding_grads`` (NVIDIA/Megatron-LM, megatron/core/distributed/). The local shard
is reduced: both copies are sharded alike by TP (``Shard(0)``) and by FSDP2 (dim 0 over dp).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from executors.model import Transformer


def retie(model: Transformer) -> None:
    """After tensor parallelism: the output layer uses the embedding's (sharded) weight."""
    if model.spec.tied_embeddings and model.embed is not None and model.output is not None:
        model.output.weight = model.embed.tok.weight


def shared_weight(parts: list) -> torch.nn.Parameter | None:
    """This rank's copy of the tied weight on a pipeline end: the first stage's token
    embedding or the last stage's output layer (unwrapped from DDP / checkpoint wrappers)."""
    for part in parts:
        for name, p in part.named_parameters():
            if name.endswith("embed.tok.weight") or name.endswith("output.weight"):
                return p
    return None


def _local_grad(weight: torch.nn.Parameter) -> torch.Tensor:
    """The gradient of ``weight`` as this rank holds its shard (a local slice, no communication)."""
    grad = weight.grad
    if isinstance(grad, DTensor):
        # the vocabulary-parallel embedding's gradient comes back Replicate: take this rank's
        # shard so both copies reduce the same rows
        if grad.placements != weight.placements:
            weight.grad = grad = grad.redistribute(weight.device_mesh, weight.placements)
        grad = grad._local_tensor
    return grad


def sum_local_copies(parts: list) -> None:
    """DualPipeV: rank 0's embedding and output layer are the tied weight's two copies; each takes
    their summed gradient (a no-op where this rank holds fewer than both)."""
    copies = [p for part in parts for name, p in part.named_parameters()
              if name.endswith(("embed.tok.weight", "output.weight"))]
    if len(copies) != 2 or any(w.grad is None for w in copies):
        return
    a, b = map(_local_grad, copies)
    a.add_(b)
    b.copy_(a)


def allreduce_shared_grad(weight: torch.nn.Parameter | None, group) -> None:
    """Sum the tied copies' gradients over the embedding group (a no-op off the pipeline's ends)."""
    if group is None or weight is None or weight.grad is None:
        return
    dist.all_reduce(_local_grad(weight), group=group)
