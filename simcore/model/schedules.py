"""Pipeline schedules as data: the ordered work of every pipeline rank.

Follows torch.distributed.pipelining (``torch/distributed/pipelining/schedules.py``,
torch 2.13) so that the simulated order and the executed order can be compared element
by element:

- an ``Action`` prints like torch's ``_Action``: ``"2F0"`` is stage 2, forward,
  micro-batch 0; ``"1SEND_B3"``; ``"0UNSHARD"`` (no micro-batch); an ``Overlap`` like torch's
  overlapped pair, ``"(0F5;5B2)OVERLAP_F_B"`` (``simcore.model.actions``);
- a schedule is ``dict[rank, list[Action | None]]`` where ``None`` is an idle slot;
- compute-only schedules are lowered by passes that add communication
  (``add_communication``, torch's ``_add_send_recv``) and FSDP unshard/reshard
  (``add_unshard_reshard``, torch's ``_add_unshard_reshard``).

Schedules (virtual stage ``v`` runs on rank ``v % pp``, the loop layout, but DualPipeV's V):

- GPipe (Huang et al. 2019): all forwards, then all backwards (``ScheduleGPipe``).
- 1F1B (Narayanan et al. 2021, PipeDream-Flush): warm-up forwards, steady one-forward
  one-backward, cool-down backwards (``Schedule1F1B``).
- Interleaved 1F1B (Narayanan et al. 2021, Sec. 2.2.2), depth-first over ``vpp``
  model chunks per rank (``ScheduleInterleaved1F1B``), a chunk taking ``group`` micro-batches
  in a row (Megatron-Core's ``microbatch_group_size_per_vp_stage``; torch's rounds rule).
- Zero bubble ZB-H1 (Qi et al. 2024, arXiv:2401.10241): backward split into input
  gradient ``I`` and weight gradient ``W``; ``W`` fills the cool-down bubble
  (``ScheduleInterleavedZeroBubble``, any ``vpp``).
- DualPipeV (DeepSeek-V3, arXiv 2412.19437 Sec. 3.2.1): two stages a rank as a V, a forward
  paired with another micro-batch's backward, the backward split where it fills the bubble
  (``ScheduleDualPipeV``; ``simcore.model.dualpipe``).
"""
from __future__ import annotations

from collections import defaultdict

from simcore.model import dualpipe as dp
from simcore.model.actions import COMPUTE_OPS, Action, Op, Overlap, RankActions, leaves  # noqa: F401  (re-exported)
from simcore.plan.rules import torch_rounds
from simcore.plan.spec import Schedule


# --------------------------------------------------------------------------- compute schedules

def _gpipe(pp: int, m: int) -> dict[int, RankActions]:
    """torch ``ScheduleGPipe._get_pipeline_order``: fill, then drain."""
    out = {}
    for rank in range(pp):
        ops: RankActions = [None] * rank
        ops += [Action(rank, Op.F, i) for i in range(m)]
        ops += [None] * (3 * (pp - 1 - rank))
        ops += [Action(rank, Op.B, i) for i in range(m)]
        out[rank] = ops
    return out


def _one_f_one_b(pp: int, m: int) -> dict[int, RankActions]:
    """torch ``Schedule1F1B._get_pipeline_order``, commented by phase. torch 2.13 starts the last
    rank's steady state at micro-batch 1 (its ``forward_mb`` starts at 0 without warm-up); here the
    warm-up count is capped at ``m`` and forwards are numbered from 0 on every rank."""
    out = {}
    for rank in range(pp):
        ops: RankActions = [None] * rank
        warmup = min(pp - 1 - rank, m)  # warm-up: forwards that fill the pipeline
        ops += [Action(rank, Op.F, i) for i in range(warmup)]
        ops += [None] * (2 * (pp - 1 - rank))
        fwd, bwd = warmup, 0
        while fwd < m:  # steady state: one forward, one backward
            ops += [Action(rank, Op.F, fwd), Action(rank, Op.B, bwd)]
            fwd, bwd = fwd + 1, bwd + 1
        while bwd < m:  # cool-down: the backwards left, one idle slot between
            ops += [None, Action(rank, Op.B, bwd)]
            bwd += 1
        out[rank] = ops
    return out


def _warmup_ops(rank: int, vpp: int, per_round: int, pp: int, m: int, factor: int) -> int:
    """torch ``_get_warmup_ops``: forwards before the first backward on ``rank``."""
    return min((vpp - 1) * per_round + factor * (pp - 1 - rank), m * vpp)


def _interleaved_rank(rank: int, pp: int, m: int, vpp: int, zero_bubble: bool, per_round: int) -> RankActions:
    """torch ``_get_1f1b_rank_ops`` for one rank of the interleaved / ZB-H1 schedules, ``per_round``
    micro-batches a chunk (Megatron-Core ``get_schedule_table``, ``get_pp_rank_microbatches``)."""
    warmup = _warmup_ops(rank, vpp, per_round, pp, m, 1 if zero_bubble else 2)
    total = m * vpp
    steady = total - warmup

    def fwd_stage(op: int) -> int:
        return (op // per_round) % vpp * pp + rank

    def bwd_stage(op: int) -> int:
        return (vpp - 1 - ((op - warmup) // per_round) % vpp) * pp + rank

    next_mb: dict[tuple[Op, int], int] = defaultdict(int)

    def take(op: Op, stage: int) -> Action:
        mb = next_mb[op, stage]
        next_mb[op, stage] = mb + 1
        return Action(stage, op, mb)

    bwd_op = Op.I if zero_bubble else Op.B
    # idle slots after warm-up so that the first backward lines up with the other ranks
    pad = pp - 1 - rank if zero_bubble else vpp * pp + 2 * (pp - 1 - rank) - warmup - rank
    ops: RankActions = [None] * rank
    backward_ids: list[int] = []
    weights_done = 0
    for op in range(warmup + steady + warmup):
        if op < warmup:  # warm-up: forwards only
            ops.append(take(Op.F, fwd_stage(op)))
            if op == warmup - 1:
                ops += [None] * pad
            continue
        if op < warmup + steady:  # steady state: one forward, one backward
            ops.append(take(Op.F, fwd_stage(op)))
        elif not zero_bubble:  # cool-down keeps step with the other ranks
            ops.append(None)
        ops.append(take(bwd_op, bwd_stage(op)))
        backward_ids.append(op)
        if zero_bubble and op - warmup >= rank:  # ZB-H1: rank r runs W r backwards late
            ops.append(take(Op.W, bwd_stage(backward_ids[weights_done])))
            weights_done += 1
    if zero_bubble:  # cool-down of the weight gradients still owed
        ops += [take(Op.W, bwd_stage(i)) for i in backward_ids[weights_done:]]
    return ops


def _needs_bubble(a: Action, stages: int, seen: set) -> bool:
    """torch's ``need_bubble``: only F and full B wait (I never does in torch 2.13)."""
    if a.op == Op.F:
        return a.stage != 0 and (a.stage - 1, Op.F, a.microbatch) not in seen
    if a.op == Op.B:
        prev = (a.stage, Op.F, a.microbatch) if a.stage == stages - 1 else (a.stage + 1, Op.B, a.microbatch)
        return prev not in seen
    return False


def _add_bubbles(actions: dict[int, RankActions], stages: int) -> dict[int, RankActions]:
    """torch ``ScheduleInterleavedZeroBubble._add_bubbles_to_actions``: insert idle slots
    where a forward's input (or a backward's gradient) is not produced yet in lockstep."""
    seen: set[tuple[int, Op, int]] = set()
    result: dict[int, RankActions] = {r: [] for r in actions}
    nxt = {r: 0 for r in actions}
    while any(nxt[r] < len(actions[r]) for r in actions):
        new = set()
        for r in sorted(actions):
            if nxt[r] >= len(actions[r]):
                continue
            a = actions[r][nxt[r]]
            if a is None:
                result[r].append(None)
                nxt[r] += 1
                continue
            if _needs_bubble(a, stages, seen):
                result[r].append(None)
                continue
            result[r].append(a)
            new.add((a.stage, a.op, a.microbatch))
            nxt[r] += 1
        seen |= new
    return result


def build_schedule(kind: Schedule | str, pp: int, microbatches: int, vpp: int = 1, group: int = 0,
                   paired: bool = False) -> dict[int, RankActions]:
    """Compute-only schedule ``{rank: [Action | None, ...]}`` for ``pp`` ranks, as torch orders it;
    ``group``: interleaved 1F1B's micro-batches a chunk runs in a row (0: torch's rounds rule);
    ``paired``: DualPipeV's overlapped pairs as ``Overlap`` actions (torch's ``pipeline_order``),
    else each as its forward and then its backward (what torch's runtime runs)."""
    kind = Schedule(kind)
    if pp < 1 or microbatches < 1 or vpp < 1:
        raise ValueError(f"pp={pp}, microbatches={microbatches} and vpp={vpp} must all be at least 1")
    if kind == Schedule.DUALPIPE_V:
        dp.check_shape(pp, microbatches, vpp)
        return dp.torch_order(pp, microbatches) if paired else dp.flat_order(pp, microbatches)
    if kind in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
        if vpp != 1:
            raise ValueError(f"parallel.vpp={vpp} needs schedule interleaved-1f1b or zero-bubble, not {kind.value}")
        return _gpipe(pp, microbatches) if kind == Schedule.GPIPE else _one_f_one_b(pp, microbatches)
    zb, rounds = kind == Schedule.ZERO_BUBBLE, torch_rounds(pp, microbatches)
    if group and (zb or microbatches % group or not pp <= group <= microbatches):
        raise ValueError(f"a micro-batch group of {group} needs the interleaved schedule and must divide the "
                         f"{microbatches} micro-batches, at least pp={pp}")
    if not group and microbatches % rounds:
        raise ValueError(f"the {kind.value} schedule needs micro-batches ({microbatches}) to be a multiple "
                         f"of max(1, micro-batches // pp) = {rounds} (torch's rounds rule)")
    out = {r: _interleaved_rank(r, pp, microbatches, vpp, zb, group or microbatches // rounds) for r in range(pp)}
    return _add_bubbles(out, pp * vpp) if zb else out


def fused_p2p(kind: Schedule | str, pp: int, microbatches: int, a: Action) -> tuple[bool, bool]:
    """(its send goes out with the post of a later receive, its own receive was posted early)
    for compute action ``a`` as torch runs schedule ``kind``. ``Schedule1F1B._step_microbatches``
    (torch 2.13) fires a stage's sends and receives in one ``batch_isend_irecv`` in its steady
    phase: with ``w = min(m, pp - stage)`` warm-up forwards, the send of forward ``i >= w - 1``
    goes with the post of backward ``i - w + 1``'s receive, the send of backward ``j < m - w``
    with the post of forward ``j + w``'s. Every other send and receive of it, and of the other
    schedules (GPipe, ``_PipelineScheduleRuntime``'s SEND/RECV), is issued alone, a receive right
    before its wait."""
    if Schedule(kind) != Schedule.ONE_F_ONE_B or pp == 1:
        return False, False
    s, m, w = a.stage, microbatches, min(microbatches, pp - a.stage)
    if a.op == Op.F:
        return s < pp - 1 and a.microbatch >= w - 1, s > 0 and a.microbatch >= w
    if a.op == Op.B:
        return s > 0 and a.microbatch < m - w, s < pp - 1 and a.microbatch <= m - w
    return False, False


# --------------------------------------------------------------------------- lowering passes

def _owners(schedule: dict[int, RankActions]) -> dict[int, int]:
    """Virtual stage -> the rank whose actions run it (v % pp, or DualPipeV's V)."""
    return {x.stage: rank for rank, acts in schedule.items() for a in acts if a is not None for x in leaves(a)}


def _has_comms(a: Action, owner: dict[int, int], stages: int) -> bool:
    if a.op == Op.F:
        return a.stage != stages - 1 and owner[a.stage + 1] != owner[a.stage]
    if a.op in (Op.I, Op.B):
        return a.stage != 0 and owner[a.stage - 1] != owner[a.stage]
    return False


def _ready(a: Action | Overlap | None, done: set[Action], stages: int) -> bool:
    """torch ``_ready_to_schedule``: the input (or output gradient) has arrived or was made here;
    an overlapped pair waits for both of its actions' (torch's ``_add_send_recv``)."""
    if a is None:
        return True
    if isinstance(a, Overlap):
        return all(_ready(x, done, stages) for x in a.subs)
    if a.op == Op.F and a.stage != 0:
        return Action(a.stage, Op.RECV_F, a.microbatch) in done or Action(a.stage - 1, Op.F, a.microbatch) in done
    if a.op in (Op.I, Op.B) and a.stage != stages - 1:
        return (Action(a.stage, Op.RECV_B, a.microbatch) in done
                or Action(a.stage + 1, Op.I, a.microbatch) in done
                or Action(a.stage + 1, Op.B, a.microbatch) in done)
    return True


def add_communication(schedule: dict[int, RankActions], pp: int, vpp: int = 1) -> dict[int, list[Action]]:
    """Lower a compute-only schedule: after each F (I/B) whose consumer stage sits on another
    rank, append ``SEND_F`` (``SEND_B``) here and the matching ``RECV_F`` (``RECV_B``) on the
    consumer's rank (an overlapped pair: after the pair, its forward's first). A port of torch
    ``_add_send_recv``: ranks take turns, and a compute action is placed only once its input has
    been received, so the result cannot deadlock. Idle slots are dropped (the lowered schedule
    is an order, not a timeline). Which rank holds a stage is read off the schedule."""
    stages, owner = pp * vpp, _owners(schedule)
    pending = {r: list(acts) for r, acts in schedule.items() if acts}
    out: dict[int, list[Action]] = {r: [] for r in schedule}
    done: dict[int, set[Action]] = {r: set() for r in schedule}
    while pending:
        progress = False
        for rank in sorted(pending):
            a = pending[rank][0]
            if not _ready(a, done[rank], stages):
                continue
            if a is not None:
                out[rank].append(a)
                for x in leaves(a):
                    done[rank].add(x)
                    if _has_comms(x, owner, stages):
                        fwd = x.op == Op.F
                        send = Action(x.stage, Op.SEND_F if fwd else Op.SEND_B, x.microbatch)
                        peer = x.stage + 1 if fwd else x.stage - 1
                        recv = Action(peer, Op.RECV_F if fwd else Op.RECV_B, x.microbatch)
                        out[rank].append(send)
                        done[rank].add(send)
                        out[owner[peer]].append(recv)
                        done[owner[peer]].add(recv)
            pending[rank].pop(0)
            if not pending[rank]:
                del pending[rank]
            progress = True
        if not progress:
            raise ValueError("malformed schedule: no rank can place its next action (a send/recv deadlock)")
    return out


#: Stages torch keeps unsharded at once on a rank (``_add_unshard_reshard``'s
#: ``max_active_stages``, torch/distributed/pipelining/schedules.py).
MAX_ACTIVE_STAGES = 3


def add_unshard_reshard(actions: RankActions, max_active_stages: int = MAX_ACTIVE_STAGES) -> list[Action]:
    """FSDP lowering of one rank (torch ``_add_unshard_reshard``): before each compute action,
    UNSHARD (all-gather) the next ``max_active_stages`` distinct stages about to compute and
    RESHARD (free) the stages that are not among them; idle slots are dropped."""
    ahead: list[list[int]] = [[] for _ in actions]   # the next distinct stages from each slot on
    nxt: list[int] = []
    for i in range(len(actions) - 1, -1, -1):
        a = actions[i]
        if isinstance(a, Overlap):   # both of its stages, as torch's next_stage_indices takes them
            both = list(dict.fromkeys(x.stage for x in a.subs))
            nxt = both + [s for s in nxt if s not in both][:max(0, max_active_stages - len(both))]
        elif a is not None:
            nxt = [a.stage] + [s for s in nxt if s != a.stage][:max_active_stages - 1]
        ahead[i] = nxt
    active: list[int] = []
    out: list[Action] = []
    for i, a in enumerate(actions):
        if a is None:
            continue
        upcoming = ahead[i]
        for s in [s for s in active if s not in upcoming]:
            active.remove(s)
            out.append(Action(s, Op.RESHARD))
        for s in [s for s in upcoming if s not in active]:
            active.append(s)
            out.append(Action(s, Op.UNSHARD))
        out.append(a)
    out += [Action(s, Op.RESHARD) for s in active]
    return out


def add_reduce_grad(actions: RankActions, microbatches: int) -> RankActions:
    """torch ``_add_reduce_grad``: drop idle slots and put ``REDUCE_GRAD`` (the data-parallel
    gradient reduction of a stage) right after the stage's last B or W."""
    out: RankActions = []
    count: dict[int, int] = defaultdict(int)
    for a in actions:
        if a is None:
            continue
        out.append(a)
        for x in leaves(a):
            if x.op in (Op.B, Op.W):
                count[x.stage] += 1
                if count[x.stage] == microbatches:
                    out.append(Action(x.stage, Op.REDUCE_GRAD))
    return out


def lower(schedule: dict[int, RankActions], pp: int, microbatches: int, vpp: int = 1) -> dict[int, list[Action]]:
    """All of torch's lowering passes, in torch's order (``_prepare_schedule_with_comms``):
    unshard/reshard, reduce-grad, then send/recv."""
    ranks = {r: add_reduce_grad(add_unshard_reshard(acts), microbatches) for r, acts in schedule.items()}
    return add_communication(ranks, pp, vpp)


# --------------------------------------------------------------------------- printing

def format_grid(schedule: dict[int, list], by: str = "rank") -> str:
    """The schedule as a text grid. ``by="rank"``: one row per rank, one column per time
    step (``Rank 0: 0F0 0F1 ... 0B0``). ``by="step"``: torch's ``_format_pipeline_order``
    layout, one row per step and one column per rank."""
    ranks = sorted(schedule)
    steps = max((len(schedule[r]) for r in ranks), default=0)
    cells = [[("" if a is None else str(a)) for a in schedule[r]] + [""] * (steps - len(schedule[r]))
             for r in ranks]
    if by == "rank":
        width = max((len(c) for row in cells for c in row), default=0)
        label = max(len(f"Rank {r}") for r in ranks)
        return "\n".join(f"{f'Rank {r}':<{label}}: " + " ".join(f"{c:<{width}}" for c in row).rstrip()
                         for r, row in zip(ranks, cells)) + "\n"
    if by != "step":
        raise ValueError(f"format_grid by={by!r} must be 'rank' or 'step'")
    labels = ["Step " + str(i).zfill(len(str(steps - 1))) for i in range(steps)]
    # torch sizes column i by the label of *step* i and rank i's actions; kept for identical output
    widths = [max([len(labels[i])] + [len(c) for c in cells[i]]) for i in range(len(ranks))]
    header = " " * (len(labels[0]) + 2) + " ".join(f"{f'Rank {i}':<{widths[i]}}" for i in range(len(ranks)))
    rows = [f"{lab}: " + " ".join(f"{cells[i][t]:<{widths[i]}}" for i in range(len(ranks)))
            for t, lab in enumerate(labels)]
    return header + "\n" + "\n".join(rows) + "\n"
