"""Each pipeline rank's actions in one step as torch lowers them for FSDP2, and the calls
FSDP2 makes over them: per block, its all-gathers in forward and backward and its
reduce-scatters (``fsdp_phase_calls``). ``simcore.model.collective_plan`` lists them and
``simcore.model.dp_costs`` charges them, so the two agree by construction.
"""
from __future__ import annotations

import functools

from simcore.model.schedules import MAX_ACTIVE_STAGES, Action, Op, add_reduce_grad, add_unshard_reshard, build_schedule
from simcore.plan.rules import torch_rounds
from simcore.plan.spec import Plan, Schedule, ZeroStage

#: Groups of pp micro-batches after which a multi-stage schedule's FSDP2 calls grow by the
#: same amount per further group (the steady phase repeats per group; the warm-up and
#: cool-down are fixed): ``_fsdp_stage_calls`` walks STEADY_GROUPS and STEADY_GROUPS + 1
#: groups and extrapolates, which tests/model/test_fsdp_calls.py holds to the full walk.
STEADY_GROUPS = 4

#: The schedules torch runs as multi-stage runtime schedules (UNSHARD/RESHARD lowering).
_RUNTIME_SCHEDULES = (Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE)


def fsdp_unit_calls(actions: list[Action], stage: int, reshard_after_forward: bool,
                    pipelined: bool) -> tuple[int, int]:
    """(all-gathers, reduce-scatters) of one FSDP module of ``stage`` over a rank's actions
    (``fsdp_phase_calls``, the gathers of both phases summed)."""
    forward, backward, scatters = fsdp_phase_calls(actions, stage, reshard_after_forward, pipelined)
    return forward + backward, scatters


def fsdp_phase_calls(actions: list[Action], stage: int, reshard_after_forward: bool,
                     pipelined: bool) -> tuple[int, int, int]:
    """(forward all-gathers, backward all-gathers, reduce-scatters) of one FSDP module of
    ``stage`` over a rank's actions.

    FSDP2 all-gathers whenever a forward, backward or UNSHARD finds the module sharded (an
    UNSHARD precedes a forward: it counts as one); it reshards after forward (ZeRO-3), at
    RESHARD, and after backward when not pipelined (then also reduce-scattering);
    pipelined, REDUCE_GRAD reduce-scatters."""
    return _phase_calls_by_stage(actions, reshard_after_forward, pipelined).get(stage, (0, 0, 0))


def _phase_calls_by_stage(actions, reshard_after_forward: bool, pipelined: bool) -> dict[int, tuple[int, int, int]]:
    """``fsdp_phase_calls`` of every stage in ``actions``, in one pass."""
    sharded: dict[int, bool] = {}
    calls: dict[int, list[int]] = {}
    gathers = {Op.UNSHARD: 0, Op.F: 0, Op.B: 1, Op.I: 1}   # op -> the phase its gather counts in
    for a in actions:
        op, stage = a.op, a.stage
        c = calls.get(stage)
        if c is None:
            c = calls[stage] = [0, 0, 0]
        phase = gathers.get(op)
        if phase is not None:
            if sharded.get(stage, True):
                c[phase] += 1
            sharded[stage] = False
        if op == Op.RESHARD or (op == Op.F and reshard_after_forward):
            sharded[stage] = True
        elif (op == Op.B and not pipelined) or op == Op.REDUCE_GRAD:
            c[2] += 1
            sharded[stage] = True
    return {stage: (c[0], c[1], c[2]) for stage, c in calls.items()}


def fsdp_stage_calls(plan: Plan, stage: int) -> tuple[int, int, int]:
    """Per step, (forward all-gathers, backward all-gathers, reduce-scatters) of each block
    of virtual stage ``stage`` under FSDP2 (``parallel.zero`` 2 or 3), as the executor's
    torch issues them (``fsdp_phase_calls`` over the rank's actions)."""
    par = plan.parallel
    return _fsdp_stage_calls(par.schedule, par.pp, plan.num_microbatches, par.vpp,
                             par.zero == ZeroStage.WEIGHTS, stage)


def fsdp_stages_calls(plan: Plan, stages: int) -> tuple[tuple[int, int, int], ...]:
    """``fsdp_stage_calls`` of virtual stages 0 to ``stages`` - 1, in one look-up."""
    par = plan.parallel
    return _fsdp_stages_calls(par.schedule, par.pp, plan.num_microbatches, par.vpp, par.zero == ZeroStage.WEIGHTS,
                              stages)


@functools.lru_cache(maxsize=4096)
def _fsdp_stages_calls(schedule: Schedule, pp: int, m: int, vpp: int, reshard_after_forward: bool,
                       stages: int) -> tuple[tuple[int, int, int], ...]:
    return tuple(_fsdp_stage_calls(schedule, pp, m, vpp, reshard_after_forward, v) for v in range(stages))


@functools.lru_cache(maxsize=65536)
def _fsdp_stage_calls(schedule: Schedule, pp: int, m: int, vpp: int, reshard_after_forward: bool,
                      stage: int) -> tuple[int, int, int]:
    """``fsdp_stage_calls`` by the only fields it reads (the layout search asks for thousands
    of schedule shapes): closed forms where the walk over the actions has one
    (``tests/model/test_fsdp_calls.py`` holds them to it), else the walk, of at most
    ``STEADY_GROUPS + 1`` groups of pp micro-batches (more are extrapolated).

    Alone, every micro-batch gathers in forward (ZeRO-3: again in backward) and
    reduce-scatters. Pipelined, REDUCE_GRAD reduce-scatters once; ZeRO-2 gathers once (a
    multi-stage schedule keeps up to ``MAX_ACTIVE_STAGES`` stages unsharded, so all of a
    rank's stages when it has no more); ZeRO-3 gathers at each action after a forward of
    the stage, as the forward reshards and the backward does not: GPipe's forwards each,
    then its first backward; 1F1B's and ZB-H1's without virtual stages (whose warm-up is 1F1B's)
    ``w = min(m, pp - rank)`` leading forwards, then every backward but the cool-down's
    first-to-last run of ``w - 1``; DualPipeV's (its V's two stages stay unsharded,
    ``MAX_ACTIVE_STAGES``) ``w = 2 pp - v`` on virtual stage v: stage r's forwards up to its
    first backward, stage 2 pp - 1 - r's r + 1 forwards, then each alternates."""
    if pp == 1:
        return m, (m if reshard_after_forward else 0), m
    if not reshard_after_forward and (schedule not in _RUNTIME_SCHEDULES or vpp <= MAX_ACTIVE_STAGES):
        return 1, 0, 1
    if schedule not in _RUNTIME_SCHEDULES or (schedule == Schedule.ZERO_BUBBLE and vpp == 1):
        lead = m if schedule == Schedule.GPIPE else min(m, pp * vpp - stage)
        return lead, m - lead + 1, 1
    if m % pp == 0 and m > (STEADY_GROUPS + 1) * pp:   # affine in m past the warm-up: extrapolate
        k = m // pp - STEADY_GROUPS
        a, b = (_fsdp_rank_calls(schedule, pp, g * pp, vpp, reshard_after_forward, stage % pp).get(stage, (0, 0, 0))
                for g in (STEADY_GROUPS, STEADY_GROUPS + 1))
        return tuple(x + (y - x) * k for x, y in zip(a, b))
    return _fsdp_rank_calls(schedule, pp, m, vpp, reshard_after_forward, stage % pp).get(stage, (0, 0, 0))


@functools.lru_cache(maxsize=None)
def _fsdp_rank_calls(schedule: Schedule, pp: int, m: int, vpp: int, reshard_after_forward: bool,
                     pp_rank: int) -> dict[int, tuple[int, int, int]]:
    """``_phase_calls_by_stage`` over the rank's lowered actions, walked on its compute actions
    as (kind, chunk) numbers (``_rank_ops``): with more stages than ``MAX_ACTIVE_STAGES``
    the lowering's UNSHARD and RESHARD of each action's window (``schedules.add_unshard_reshard``)
    and REDUCE_GRAD after a stage's last B or W (``add_reduce_grad``); else every stage of the
    rank stays active: the UNSHARD takes the place of the first gather, the RESHARD comes last,
    REDUCE_GRAD once, and the compute actions give the counts."""
    kinds, chunks = _rank_ops(schedule, pp, m, vpp, pp_rank)
    calls = [[0, 0, 0] for _ in range(vpp)]
    sharded = [True] * vpp
    if vpp <= MAX_ACTIVE_STAGES:
        for kind, c in zip(kinds, chunks):
            if kind < 2:   # F, or B / I (W gathers nothing and keeps the state)
                if sharded[c]:
                    calls[c][kind] += 1
                sharded[c] = kind == 0 and reshard_after_forward
        return {c * pp + pp_rank: (f, b, 1) for c, (f, b, _) in enumerate(calls)}
    ahead, window = [()] * len(chunks), ()   # the next MAX_ACTIVE_STAGES distinct chunks from each action
    for i in range(len(chunks) - 1, -1, -1):
        c = chunks[i]
        if c not in window:
            window = (c, *window[:MAX_ACTIVE_STAGES - 1])
        elif window[0] != c:   # the same chunks, this one first
            window = (c, *[s for s in window if s != c])
        ahead[i] = window
    active, done, end = set(), [0] * vpp, 2 if schedule == Schedule.ZERO_BUBBLE else 1   # B's (ZB-H1: W's) end a stage
    before = None   # the previous action's chunk: its window holds the same chunks where it holds that one
    for kind, c, upcoming in zip(kinds, chunks, ahead):
        if before not in upcoming:
            for s in active.difference(upcoming):   # RESHARD
                active.discard(s)
                sharded[s] = True
            for s in upcoming:
                if s not in active:   # UNSHARD: a forward-phase gather where the stage is sharded
                    active.add(s)
                    calls[s][0] += sharded[s]
                    sharded[s] = False
        before = c
        if kind < 2:
            calls[c][kind] += sharded[c]
            sharded[c] = kind == 0 and reshard_after_forward
        if kind == end:   # its stage's m-th: REDUCE_GRAD
            done[c] += 1
            if done[c] == m:
                calls[c][2] += 1
                sharded[c] = True
    return {c * pp + pp_rank: tuple(x) for c, x in enumerate(calls)}


def _rank_ops(schedule: Schedule, pp: int, m: int, vpp: int, rank: int) -> tuple[list[int], list[int]]:
    """Rank ``rank``'s compute actions of the interleaved 1F1B or ZB-H1 schedule in the order of
    ``schedules._interleaved_rank`` (torch's rounds rule), as (kinds, chunks): 0 F, 1 B or I,
    2 W, and the chunk (virtual stage // pp); idle slots and micro-batch numbers left out."""
    zb, g = schedule == Schedule.ZERO_BUBBLE, m // torch_rounds(pp, m)
    total = m * vpp
    warmup = min((vpp - 1) * g + (1 if zb else 2) * (pp - 1 - rank), total)
    kinds, chunks = [0] * warmup, [(o // g) % vpp for o in range(warmup)]
    owed, paid = [], 0   # ZB-H1: the chunks of the backwards whose W is owed
    for o in range(warmup, total + warmup):
        if o < total:
            kinds.append(0)
            chunks.append((o // g) % vpp)
        b = vpp - 1 - ((o - warmup) // g) % vpp
        kinds.append(1)
        chunks.append(b)
        if zb:
            owed.append(b)
            if o - warmup >= rank:   # rank r runs W r backwards late
                kinds.append(2)
                chunks.append(owed[paid])
                paid += 1
    kinds += [2] * (len(owed) - paid)
    chunks += owed[paid:]
    return kinds, chunks


@functools.lru_cache(maxsize=256)
def _compute_actions(schedule: Schedule, pp: int, m: int, vpp: int):
    """``build_schedule`` once per shape (read-only: cached)."""
    return build_schedule(schedule, pp, m, vpp)


def rank_actions(plan: Plan, pp_rank: int) -> list[Action]:
    """This pipeline rank's actions in one step, with FSDP's lowering where torch applies it
    (only the multi-stage runtime schedules add UNSHARD/RESHARD); without pipelining,
    F and B of every micro-batch."""
    par = plan.parallel
    return list(_lowered_actions(par.schedule, par.pp, plan.num_microbatches, par.vpp)[pp_rank])


@functools.lru_cache(maxsize=1024)
def _lowered_actions(schedule: Schedule, pp: int, m: int, vpp: int) -> tuple[tuple[Action, ...], ...]:
    """Every pipeline rank's actions, lowered as torch lowers them for FSDP (read-only: cached)."""
    if pp == 1:
        return (tuple(Action(0, op, i) for i in range(m) for op in (Op.F, Op.B)),)
    out, sched = [], _compute_actions(schedule, pp, m, vpp)
    for acts in (sched[r] for r in range(pp)):
        if schedule in _RUNTIME_SCHEDULES:
            acts = add_unshard_reshard(acts)
        out.append(tuple(a for a in add_reduce_grad(acts, m) if a is not None))
    return tuple(out)
