"""A GPU's peak: the CUDA context and the caching allocator's margin over the tensors, whether
the gradients are live when the activations peak, one rank's bytes by kind from its parts
(``rank_row``; ``simcore.model.memory`` sums the parts per rank), and whether the ranks fit
their GPUs and the offloaded states their node's host memory (``fits``).
"""
from __future__ import annotations

from simcore.model import activations as acts
from simcore.plan.spec import EXPANDABLE_SEGMENTS_MARGIN, Plan, ZeroImpl, ZeroStage  # noqa: F401 (re-exported)

#: CUDA context with torch's kernels loaded, cuBLAS/cuDNN workspaces, per process: what
#: NVML counts as used and torch's allocator statistics do not (PyTorch docs, "CUDA
#: semantics / memory management"). 1343 MiB is Hugging Face's measurement of a process
#: that only loaded torch's CUDA kernels ("Efficient Training on a Single GPU", 2022,
#: transformers docs/source/en/model_memory_anatomy.md at 249ef8164cfb: "1343 MB").
CUDA_CONTEXT_BYTES = 1343 * 1024**2
#: The caching allocator's margin: bytes it reserves beyond the live tensors at the peak
#: (torch.cuda.max_memory_reserved over max_memory_allocated), as a share of the tensors.
#: An assumption, stated, not fitted: the allocator rounds large requests up to 2 MiB
#: multiples, keeps freed blocks cached per stream and never merges blocks of different
#: segments (c10/cuda/CUDACachingAllocator.cpp: kRoundLarge, kLargeBuffer, segments split
#: but not joined), and a training step frees and re-allocates tensors of a few large sizes
#: (a layer's gathered parameters and gradients, the logits), so the reserve settles above the
#: peak by a share of the largest transients; 10% keeps a layout at 72 GiB of tensors off an
#: 80 GiB GPU. Settable per Plan (``training.allocator_margin``): ``EXPANDABLE_SEGMENTS_MARGIN``
#: for PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.
ALLOCATOR_MARGIN = 0.10
#: The kinds ``StepCosts.memory_bytes`` and traces carry, in order.
MEMORY_KINDS = ("weights", "gradients", "optimizer_states", "activations", "comm_buffers", "framework")


def framework_terms(plan: Plan) -> tuple[float, float, bool]:
    """(CUDA context and library workspaces, the allocator's margin as a share of the tensor
    bytes, count comm buffers): ``training.allocator_margin`` where the Plan sets it; a
    calibrated profile's ``memory`` entry where it has one (a CPU host: no CUDA context, no
    caching allocator, and the executor counts the tensors a rank owns); else the defaults above."""
    entry = acts.memory_entry(plan)
    margin = plan.training.allocator_margin
    if margin is None:
        margin = float(entry.get("allocator_fragmentation", ALLOCATOR_MARGIN))
    return (float(entry.get("framework_bytes", CUDA_CONTEXT_BYTES)), margin,
            bool(entry.get("comm_buffers", True)))


def gradients_at_activation_peak(plan: Plan) -> bool:
    """Whether the gradients are allocated when the activations peak (the backward's start).
    They are not on a step that accumulates nothing into storage it keeps: one micro-batch,
    no pipeline, and no data-parallel buffer that outlives the step. torch's
    ``zero_grad(set_to_none=True)`` (the default since torch 2.0) frees them, FSDP2 assigns each
    sharded gradient after its reduce-scatter, and a layer's gradient appears as its
    activations are freed; the peak is then the backward's start (no gradients) or the
    optimizer step (gradients, no activations), whichever is larger. DDP's buckets and
    Megatron's contiguous gradient buffer (``parallel.zero`` 0-1 with data parallel) persist,
    as do gradients accumulated over micro-batches and gradients zeroed rather than freed
    (``training.grads_to_none: false``, torch 1.x's ``zero_grad()``); stepped in the backward
    (``optimizer_in_backward``), one tensor's gradient is live from its start; a calibrated host counts
    as its executor measures (every kind at once)."""
    par = plan.parallel
    if acts.executor_activations(plan) or plan.num_microbatches > 1 or par.pp > 1 or not plan.training.grads_to_none:
        return True
    if plan.training.optimizer_in_backward:   # one tensor's gradient at a time, from the backward's start
        return True
    return par.dp * par.cp > 1 and par.zero <= ZeroStage.OPTIMIZER_STATES


def reduce_deferred(plan: Plan) -> bool:
    """Whether FSDP2's reduce-scatter runs only after a pipeline stage's last backward, when no
    activation is left: torch.distributed.pipelining turns gradient sync off for every backward
    (``PipelineStage.backward_maybe_with_nosync``: ``set_requires_gradient_sync(False)``) and the
    schedule reduces once all micro-batches are done (``perform_reduce_grad``, "scheduled after
    all microbatches W, B actions"; torch 2.13 ``distributed/pipelining/stage.py``). Its buffers
    (``memory.comm_buffer_terms``' ``fsdp_reduce_scatter``) then never meet the activations' peak."""
    par = plan.parallel
    return (par.pp > 1 and par.zero >= ZeroStage.GRADIENTS and par.zero_impl == ZeroImpl.FSDP2
            and par.dp * par.cp > 1)


#: A rank's row (``rank_rows``): its bytes by kind (MEMORY_KINDS), then ``total`` (GPU bytes)
#: and ``host`` (offloaded bytes per GPU).
ROW_KEYS = MEMORY_KINDS + ("total", "host")
ROW_GRADIENTS, ROW_FRAMEWORK, ROW_TOTAL, ROW_HOST = (ROW_KEYS.index(k) for k in ("gradients", "framework", "total", "host"))


def rank_row(states: dict[str, float], activations: float, buffers: float, context: float, margin: float,
             grads_live: bool) -> tuple[float, ...]:
    """One rank's row (``ROW_KEYS``) from its model states and its activation and buffer sums:
    where the gradients are not live at the activations' peak, the peak is the backward's
    start or its end (every gradient, and FSDP2's buffers there,
    ``memory.backward_end_buffers``), whichever is larger; then the allocator's margin and the
    CUDA context. Buffers that live only after the last backward (``states["deferred"]``,
    ``reduce_deferred``) count where they outweigh the activations, which are gone by then."""
    weights, grads, opt = states["weights"], states["gradients"], states["optimizer_states"]
    if deferred := states.get("deferred", 0.0):
        activations, buffers = (activations, buffers - deferred) if activations >= deferred else (0.0, buffers)
    if not grads_live:
        if activations + buffers >= grads + states["backward_end"] - states["resharded_at_end"]:
            grads = 0.0
        else:   # the backward's end (FSDP2's post-backwards, ZeRO-2's blocks resharded) or the optimizer step
            activations, buffers = 0.0, states["backward_end"]
            weights -= states["resharded_at_end"]
    tensors = weights + grads + opt + activations + buffers
    framework = context + margin * tensors
    return weights, grads, opt, activations, buffers, framework, tensors + framework, states["host"]


def peak_tensor_bytes(states: dict[str, float], activations: float, buffers: float, grads_live: bool) -> float:
    """The tensors at a rank's peak from its parts: ``rank_row``'s total without a CUDA
    context or an allocator margin."""
    return rank_row(states, activations, buffers, 0.0, 0.0, grads_live)[ROW_TOTAL]


#: ``rank_kinds``' tables by what ``memory.model_state_bytes`` and ``comm_buffer_terms`` read (all of
#: a plan but its recompute: a layout's variants share them), each with the node it was computed for
#: (kept by identity); cleared whole at ``_KINDS_MAX``.
_KINDS: dict[tuple, tuple] = {}
_KINDS_MAX = 4096


def rank_kinds(plan: Plan, count_buffers: bool) -> dict:
    """The table of ``plan``'s kinds of rank: by a rank's ``StageParams`` value, its (model states,
    buffer terms, their sum), as ``memory.rank_kind`` fills it; one table per what they read."""
    tr, node = plan.training, plan.cluster.node
    key = (plan.model, plan.parallel, tr.precision, tr.fp8_recipe, tr.fp8_param_gather, tr.optimizer, tr.master_weights,
           tr.autocast, tr.optimizer_state_dtype, tr.offload, tr.micro_batch, tr.optimizer_in_backward,
           tr.grad_compression, count_buffers, id(node))
    if (hit := _KINDS.get(key)) is None or hit[0] is not node:
        if len(_KINDS) >= _KINDS_MAX:
            _KINDS.clear()
        hit = _KINDS[key] = (node, {})
    return hit[1]


rank_kinds.cache_clear = _KINDS.clear   # as functools' caches answer (tests clear them all)


def summary_fields(totals: tuple[float, ...], worst: tuple[float, ...]) -> dict:
    """``StepCosts``' memory fields from every rank's total and the fullest rank's row."""
    return {"memory_bytes": dict(zip(MEMORY_KINDS, worst)), "memory_per_rank_bytes": tuple(totals)}


def host_node_bytes(plan: Plan, host_per_gpu: float) -> float:
    """Host memory that offload needs on one node, from the most loaded rank's bytes per GPU."""
    return host_per_gpu * plan.cluster.gpus_per_node


def host_bytes_per_node(plan: Plan, per_rank: list[dict[str, float]]) -> float:
    """Host memory that offload needs on one node (the most loaded rank's figure per GPU)."""
    return host_node_bytes(plan, max(m["host"] for m in per_rank))


def fits(plan: Plan, per_rank: list[dict[str, float]]) -> bool:
    """Every rank within its GPU's HBM, and offloaded states within the node's host memory."""
    hbm = plan.cluster.node.gpu.hbm_bytes
    host_ok = host_bytes_per_node(plan, per_rank) <= plan.cluster.node.host_memory_bytes
    return max(m["total"] for m in per_rank) <= hbm and host_ok
