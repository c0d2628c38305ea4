"""DualPipeV as data: the order torch's ``ScheduleDualPipeV`` gives each pipeline rank.

DualPipe (DeepSeek-V3, arXiv 2412.19437 Sec. 3.2.1; github.com/deepseek-ai/DualPipe) feeds
micro-batches from both ends of the pipeline and pairs one micro-batch's forward with another's
backward; DualPipeV is its "cut-in-half" form, one pipeline folded into a V: 2 pp stages, rank r
holding stages r and 2 pp - 1 - r (``ParallelSpec.rank_stages``), so rank 0 holds the embedding
and the loss. Its bubble is (pp - 1)(F&B + B - 3W) in chunk times (the DualPipe README's table,
PP/2 - 1 with PP stages), its activations pp + 1 chunks on rank 0.

``torch_order`` ports ``ScheduleDualPipeV._calculate_single_rank_operations`` (torch 2.13,
torch/distributed/pipelining/schedules.py), step by step: F0 warm-up, F0F1, I1W1F1 (zero bubble),
the main (F0;B1)(F1;B0) overlapped pairs, B1 with (F1;B0), B1B0 with the second half's backward
split into I and W, W0B0, W0. The overlapped pairs are ``Overlap`` actions; ``build_schedule``
gives them flattened (forward, then backward), as torch's runtime performs them one after the
other (``actions.Overlap``). Every rank's list is an order: torch's has no idle slots.
"""
from __future__ import annotations

from collections import defaultdict

from simcore.model.actions import Action, Op, Overlap, leaves


class _Rank:
    """One rank's list and torch's counters: the next micro-batch of (stage, F) and of
    (stage, I) (a full B counts on I's counter, and on W's), the weight gradients owed."""

    def __init__(self):
        self.out: list[Action | Overlap] = []
        self.count: dict[tuple[int, Op], int] = defaultdict(int)
        self.owed: list[tuple[int, int]] = []

    def _backward(self, stage: int, full: bool) -> Action:
        mb = self.count[stage, Op.I]
        self.count[stage, Op.I] += 1
        if full:
            self.count[stage, Op.W] += 1
        else:
            self.owed.append((stage, mb))
        return Action(stage, Op.B if full else Op.I, mb)

    def forward(self, stage: int) -> Action:
        mb = self.count[stage, Op.F]
        self.count[stage, Op.F] += 1
        return Action(stage, Op.F, mb)

    def add(self, stage: int, op: Op) -> None:
        """torch's ``add_action``: F, full B or I (whose W is queued)."""
        self.out.append(self.forward(stage) if op == Op.F else self._backward(stage, op == Op.B))

    def overlap(self, forward_stage: int, backward_stage: int) -> None:
        """torch's ``add_overlap_f_b``: a forward paired with a full backward."""
        self.out.append(Overlap(self.forward(forward_stage), self._backward(backward_stage, True)))

    def weight(self) -> None:
        """torch's ``add_weight_action_if_pending``: the oldest owed W, if any."""
        if self.owed:
            stage, mb = self.owed.pop(0)
            self.count[stage, Op.W] += 1
            self.out.append(Action(stage, Op.W, mb))


def _rank_order(rank: int, pp: int, m: int) -> list[Action | Overlap]:
    """``ScheduleDualPipeV._calculate_single_rank_operations`` for ``rank``: its steps 1-8."""
    s0, s1 = rank, 2 * pp - 1 - rank
    r = _Rank()
    for _ in range(2 * (pp - rank - 1)):          # 1: F0
        r.add(s0, Op.F)
    for _ in range(rank + 1):                     # 2: F0 F1
        r.add(s0, Op.F)
        r.add(s1, Op.F)
    for _ in range(pp - rank - 1):                # 3: I1 W1 F1
        r.add(s1, Op.I)
        r.weight()
        r.add(s1, Op.F)
    for i in range(m - 2 * pp + rank + 1):        # 4: (F0;B1) (F1;B0); the last rank's first pair not overlapped
        if i == 0 and rank == pp - 1:
            r.add(s0, Op.F)
            r.add(s1, Op.B)
        else:
            r.overlap(s0, s1)
        r.overlap(s1, s0)
    for _ in range(pp - rank - 1):                # 5: B1 (F1;B0)
        r.add(s1, Op.B)
        r.overlap(s1, s0)
    split = False
    for i in range(rank + 1):                     # 6: B1 B0, the second half's backward split
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        r.add(s1, Op.I if split else Op.B)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        r.add(s0, Op.I if split else Op.B)
    for _ in range(pp - rank - 1):                # 7: W0 B0
        r.weight()
        r.add(s0, Op.I if split else Op.B)
    for _ in range(rank + 1):                     # 8: W0
        r.weight()
    return r.out


def check_shape(pp: int, m: int, vpp: int) -> None:
    """What torch's constructor refuses: other than 2 stages a rank, fewer micro-batches than stages."""
    if vpp != 2:
        raise ValueError(f"the dualpipev schedule needs parallel.vpp=2, not {vpp} (torch's ScheduleDualPipeV "
                         "runs exactly 2 stages per rank)")
    if m < 2 * pp:
        raise ValueError(f"the dualpipev schedule needs at least as many micro-batches per step ({m}) as stages "
                         f"({2 * pp}: 2 x parallel.pp)")


def torch_order(pp: int, m: int) -> dict[int, list[Action | Overlap]]:
    """Every rank's ``pipeline_order`` as torch's ``ScheduleDualPipeV`` builds it, pairs included."""
    check_shape(pp, m, 2)
    return {rank: _rank_order(rank, pp, m) for rank in range(pp)}


def flat_order(pp: int, m: int) -> dict[int, list[Action]]:
    """``torch_order`` with each pair as its forward, then its backward: what the runtime runs."""
    return {rank: [x for a in acts for x in leaves(a)] for rank, acts in torch_order(pp, m).items()}


def paired_forwards(pp: int, m: int) -> frozenset[Action]:
    """The forwards torch pairs with a backward: their activation leaves after that backward."""
    return frozenset(a.forward for acts in torch_order(pp, m).values() for a in acts if isinstance(a, Overlap))
