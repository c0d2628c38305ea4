"""FSDP2's parameter groups around the loss, and what the caching allocator keeps in its
side streams' pools.

Around the loss: which groups are still unsharded while the loss's backward runs depends on
how the stack wraps the model (``parallel.fsdp_root``, ``FsdpRoot``); ``memory.loss_overlap``
subtracts only the others from the loss's transients.

Side-stream pools: torch's caching allocator never hands a cached block to another stream
(c10/cuda/CUDACachingAllocator.cpp: ``get_free_block`` fails when the block's stream differs;
with expandable segments, ``find_expandable_block`` maps pages per stream). FSDP2 allocates in
two streams of its own (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py):

- ``foreach_all_gather`` allocates each group's all-gather output in the copy-in stream, and
  the group keeps it until the next all-gather has waited on its copy-out
  (``AllGatherState``): the pool holds two groups' outputs at its peak;
- ``foreach_reduce`` allocates the reduce-scatter output in the reduce-scatter stream, and the
  sharded gradients FSDP2 assigns are views of it, so that pool holds every sharded gradient
  (reduce dtype) until ``zero_grad`` frees them; the next forward's activations cannot reuse it.

``torch.cuda.max_memory_reserved`` therefore counts both pools beside the default stream's
peak. The allocator releases cached blocks when an allocation would fail
(``release_cached_blocks`` before its retry), so the pools are not part of what must fit:
``trainplan memory`` reports them apart from the total (``stream_cache``).
"""
from __future__ import annotations

from simcore.model.activations import executor_activations
from simcore.model.optim_states import param_bytes
from simcore.plan.spec import FsdpRoot, Plan, Precision, ZeroImpl, ZeroStage


def _fsdp2_sharded(plan: Plan) -> bool:
    par = plan.parallel
    return par.zero >= ZeroStage.GRADIENTS and par.zero_impl == ZeroImpl.FSDP2 and par.dp * par.cp > 1


def output_group(plan: Plan, ends: float) -> float:
    """Parameters of the output layer among a stage's ``ends`` (all of them when tied)."""
    return ends if plan.model.tied_embeddings else ends / 2


def kept_through_loss(plan: Plan, ends: float, layer_max: float) -> float:
    """Bytes of FSDP2 parameter groups still unsharded while the loss's backward runs, on the
    last stage: none (``resharded``), the ``[norm, output]`` group (``output_kept``), or the
    root group and the last block (``kept``)."""
    root = plan.parallel.fsdp_root
    if root == FsdpRoot.RESHARDED or not _fsdp2_sharded(plan):
        return 0.0
    wb = param_bytes(plan.training)
    if root == FsdpRoot.OUTPUT_KEPT:
        return wb * output_group(plan, ends)
    return wb * (ends + layer_max)


def root_group_params(plan: Plan, ends: float) -> float:
    """Parameters of the largest group at a model's ends: the root (embedding, norm, output)
    or, under ``output_kept``, the embedding and the output each a group of their own."""
    return output_group(plan, ends) if plan.parallel.fsdp_root == FsdpRoot.OUTPUT_KEPT else ends


def side_stream_cache(plan: Plan, ends: float, layer_max: float, sharded_grads_zeroed: float) -> float:
    """Bytes FSDP2's copy-in and reduce-scatter pools keep reserved beyond the default stream's
    peak on one GPU: two groups' all-gather outputs (the largest group and a block), and the
    sharded gradients when the peak counted them as freed (``sharded_grads_zeroed``: the
    gradient bytes the peak left out). Zero without FSDP2 sharding over data-parallel ranks,
    and on a calibrated host (its executor's allocator is not CUDA's)."""
    if not _fsdp2_sharded(plan) or executor_activations(plan):
        return 0.0
    tr = plan.training
    gathered = 1 if tr.precision == Precision.FP8 else param_bytes(tr)   # FP8 weights gathered in FP8
    copy_in = gathered * (max(root_group_params(plan, ends), layer_max) + layer_max)
    return copy_in + sharded_grads_zeroed

