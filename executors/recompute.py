"""The Plan's activation recomputation on the executor's blocks, as the stacks apply it.

- ``selective``: the attention core only (softmax(QK^T)V; Korthikanti et al. 2022 Sec. 4.2).
- ``full``: every block wrapped in ``checkpoint_wrapper``; with Megatron's
  ``{layers: N, method: block}`` the first N blocks of each model chunk only
  (megatron/core/transformer/transformer_block.py ``_checkpointed_forward``). Megatron's
  ``uniform`` groups of N > 1 layers (one checkpoint around N blocks) are not run here
  (``check_recompute`` refuses them): wrapping a group would rename the blocks FSDP2, the
  checkpoints and the collectives list key on.
- ``layer:N``: torchtitan's every-Nth-block checkpointing (torchtitan/distributed/
  activation_checkpoint.py ``_apply_layer_sac``: a block is wrapped when its count is a
  multiple of N), counted per model chunk as ``simcore.model.recompute`` counts it.
- ``op``: torchtitan's per-op selective checkpointing (``_apply_op_sac``): the outputs of the
  matmuls, of the fused attention kernels and of the tensor-parallel reduce-scatters are
  saved, except every second ``aten.mm``; the rest is recomputed
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``).
"""
from __future__ import annotations

from collections import defaultdict

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from simcore.plan.spec import Recompute, RecomputeMethod, TrainingSpec

#: torchtitan's op-level SAC save list: matmuls, the fused attention kernels and (its
#: ``comm_ops``) the reduce-scatters and the experts' all-to-alls.
SAVE_OPS = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops.aten.max.default,
            # torchtitan's comm_ops: a saved reduce-scatter is not re-communicated in the backward
            torch.ops._c10d_functional.reduce_scatter_tensor.default,
            torch.ops._c10d_functional.all_to_all_single.default}


def check_recompute(tr: TrainingSpec) -> None:
    """ValueError (one sentence) for a policy the executor does not run."""
    if tr.recompute == Recompute.DOTS:
        raise ValueError("training.recompute=dots is JAX's checkpoint_dots_with_no_batch_dims (MaxText's minimal "
                         "remat policy) and is not run by the executor (torch); use op, selective, full or layer:N")
    if tr.recompute == Recompute.FULL and tr.recompute_method == RecomputeMethod.UNIFORM and tr.recompute_layers > 1:
        raise ValueError(f"training.recompute {{layers: {tr.recompute_layers}, method: uniform}} is not run by the "
                         "executor (it checkpoints single blocks); use layers: 1, method: block or layer:N")


def op_sac_wrapper(block: torch.nn.Module) -> torch.nn.Module:
    """torchtitan's per-op SAC: save the listed ops' outputs, except every second mm."""
    def context_fn():
        meta = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == torch.ops.aten.mm.default:
                meta[key] += 1
            save = func in SAVE_OPS and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return checkpoint_wrapper(block, context_fn=context_fn, preserve_rng_state=False)


def apply_recompute(model, tr: TrainingSpec) -> None:
    """Wrap the blocks of one model chunk (``model.layers``, in order) as ``tr`` says."""
    check_recompute(tr)
    rc = tr.recompute
    for i, (name, block) in enumerate(list(model.layers.items())):
        if rc == Recompute.SELECTIVE:
            block.attention.core = checkpoint_wrapper(block.attention.core, preserve_rng_state=False)
        elif rc == Recompute.OP:
            model.layers[name] = op_sac_wrapper(block)
        elif (rc == Recompute.LAYER and (i + 1) % tr.recompute_layers == 0) or (
                rc == Recompute.FULL and (tr.recompute_method == RecomputeMethod.UNIFORM or i < tr.recompute_layers)):
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)
