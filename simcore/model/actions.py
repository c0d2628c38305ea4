"""Pipeline actions in torch's notation (``torch/distributed/pipelining/schedules.py``, torch
2.13, ``_Action``): ``"2F0"`` is stage 2, forward, micro-batch 0; ``"1SEND_B3"``; ``"0UNSHARD"``
(no micro-batch); ``"(0F5;5B2)OVERLAP_F_B"`` a forward and a backward DualPipeV pairs.
``simcore.model.schedules`` orders them."""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Op(str, enum.Enum):
    """Computation types, spelled as torch's ``_ComputationType`` values."""

    F = "F"
    I = "I"  # noqa: E741  (torch's name: backward w.r.t. the stage input)
    W = "W"
    B = "B"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    UNSHARD = "UNSHARD"
    RESHARD = "RESHARD"
    REDUCE_GRAD = "REDUCE_GRAD"


COMPUTE_OPS = (Op.F, Op.I, Op.W, Op.B)
_ACTION_RE = re.compile(r"(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")


@dataclass(frozen=True, slots=True)
class Action:
    """One step of a rank's work: ``stage`` (virtual stage), ``op``, ``microbatch``."""

    stage: int
    op: Op
    microbatch: int | None = None

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.op.value}{mb}"

    __repr__ = __str__

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_OPS

    @staticmethod
    def from_str(text: str) -> Action | Overlap | None:
        """Parse torch's notation (``"2F0"``, ``"1UNSHARD"``, ``"(0F5;5B2)OVERLAP_F_B"``); an empty
        string is an idle slot."""
        text = text.strip()
        if not text:
            return None
        if text.startswith("(") and text.endswith(")OVERLAP_F_B"):
            forward, backward = (Action.from_str(t) for t in text[1:-len(")OVERLAP_F_B")].split(";"))
            return Overlap(forward, backward)
        match = _ACTION_RE.match(text)
        if match is None:
            raise ValueError(f"action {text!r} is not [stage][op][microbatch], e.g. 2F0")
        stage, op, mb = match.groups()
        return Action(int(stage), Op(op), int(mb) if mb else None)


RankActions = list[Action | None]


@dataclass(frozen=True, slots=True)
class Overlap:
    """torch's ``OVERLAP_F_B`` (an ``_Action`` with ``sub_actions``): a forward and a backward of
    two micro-batches that DualPipeV pairs on one rank. torch 2.13's runtime performs them one
    after the other on the one stream (``_PipelineScheduleRuntime._step_microbatches``: ``for sub_a
    in action.sub_actions: _perform_action(sub_a)``, where no custom function is registered for
    OVERLAP_F_B, as torchtitan 0.3 registers none) and sends both results after the pair
    (``_add_send_recv`` places the sends after the whole action)."""

    forward: Action
    backward: Action

    @property
    def subs(self) -> tuple[Action, Action]:
        return self.forward, self.backward

    @property
    def is_compute(self) -> bool:
        return True

    def __str__(self) -> str:
        return f"({self.forward};{self.backward})OVERLAP_F_B"

    __repr__ = __str__


def leaves(a: Action | Overlap) -> tuple[Action, ...]:
    """The actions ``a`` runs: an overlap's forward and backward, or ``a`` itself."""
    return a.subs if isinstance(a, Overlap) else (a,)
