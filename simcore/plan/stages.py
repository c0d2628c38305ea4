"""Where a Plan's virtual stages sit and how layers spread over them: pure functions of the
layout's sizes (re-exported by ``simcore.plan.spec``, whose ``Plan`` and ``ParallelSpec`` use them)."""
from __future__ import annotations

import functools


def rank_stages(rank: int, pp: int, vpp: int = 1, v_shape: bool = False) -> tuple[int, ...]:
    """The virtual stages pipeline rank ``rank`` holds, in model order. Loop style (torch's
    ``generate_stage_to_rank_mapping`` style "loop", Megatron's interleaving): r, r + pp, ...;
    V style (``v_shape``, DualPipeV's two stages a rank: style "v"): r and 2 pp - 1 - r, so that
    rank 0 holds the first and the last stage and rank pp - 1 the two middle ones."""
    return (rank, 2 * pp - 1 - rank) if v_shape else tuple(range(rank, pp * vpp, pp))


def stage_rank(stage: int, pp: int, v_shape: bool = False) -> int:
    """The pipeline rank holding virtual stage ``stage`` (``rank_stages`` inverted)."""
    return 2 * pp - 1 - stage if v_shape and stage >= pp else stage % pp


def rank_sums(per_stage, pp: int, v_shape: bool = False) -> tuple:
    """Per pipeline rank, the sum of its virtual stages' entries of ``per_stage`` (model order);
    a sequence of ``pp`` entries is per rank already."""
    if len(per_stage) == pp:
        return tuple(per_stage)
    if v_shape:
        return tuple(per_stage[r] + per_stage[2 * pp - 1 - r] for r in range(pp))
    return tuple(sum(per_stage[r::pp]) for r in range(pp))


@functools.lru_cache(maxsize=1024)
def even_split(layers: int, stages: int) -> tuple[int, ...]:
    """Spread ``layers`` over ``stages`` as evenly as possible; the extra layers go to
    the middle stages, since the first and last stages also hold the embedding and
    the logits (the choice Llama 3 405B made: 126 layers on 16 stages)."""
    base, extra = divmod(layers, stages)
    start = (stages - extra) // 2
    return tuple(base + (start <= i < start + extra) for i in range(stages))
