"""The layout search's accounting: what happened to its candidates (``Tally``), and the rules'
verdict on one (``rejected``), counted by kind of rule."""
from __future__ import annotations

from dataclasses import dataclass, field

from simcore.plan.rules import check_plan
from simcore.plan.spec import Plan, PlanError

#: Why a family was left untimed, as the search's sentences say it.
UNTIMED = ("on their compute, blocking communication and bubble alone, the low end of their step's 90% interval "
           "lies above the high end of the best layout's")


@dataclass(slots=True)
class Tally:
    """What happened to the candidates (the search's accounting)."""

    candidates: int = 0
    broke_rule: int = 0
    no_fit: int = 0
    dominated: int = 0
    simulated: int = 0
    near: int = 0
    """Of the simulated, those thin or that may not fit (``headroom.fit_class``)."""
    bounded: int = 0
    """Candidates of families whose step floor (``analytic.step_floor``) is over the search's
    bound (``simcore.planner.bound``): not evaluated further."""
    bounded_values: dict[str, set] = field(default_factory=dict)
    """Per axis (tp, pp, cp), the values of the families left out so."""
    margin_only: int = 0
    """Of those that do not fit, those only the allocator's assumed margin puts over the GPU by
    more than the memory model's error (``peak.ALLOCATOR_MARGIN``: none under expandable segments)."""
    rules: dict[str, int] = field(default_factory=dict)

    def add(self, other: "Tally") -> None:
        self.candidates += other.candidates
        self.broke_rule += other.broke_rule
        self.no_fit += other.no_fit
        self.dominated += other.dominated
        self.simulated += other.simulated
        self.near += other.near
        self.margin_only += other.margin_only
        self.bounded += other.bounded
        for axis, values in other.bounded_values.items():
            self.bounded_values.setdefault(axis, set()).update(values)
        for k, v in other.rules.items():
            self.rules[k] = self.rules.get(k, 0) + v


def _rule_key(message: str) -> str:
    """A PlanError message without its numbers, to count rules broken by kind."""
    return " ".join(w for w in message.split() if not any(ch.isdigit() for ch in w))


def rejected(plan: Plan, tally: Tally, count: int = 1) -> bool:
    """Count (``count`` times) a candidate that breaks a rule of ``check_plan``, or one with a
    communication group the catalog cannot price (``collectives.unpriced_group``: a fabric gap)."""
    from simcore.model.collectives import unpriced_group
    from simcore.model.step_costs import plan_device

    try:
        check_plan(plan)
    except PlanError as exc:
        why = str(exc)
    else:   # a GPU with no device model (a catalog gap) is the cell's refusal, not a rule: it propagates
        why = unpriced_group(plan, plan_device(plan))
    if not why:
        return False
    tally.broke_rule += count
    key = _rule_key(why)
    tally.rules[key] = tally.rules.get(key, 0) + count
    return True


def bounded_sentence(tally) -> str:
    """The tally's clause on the families the bound left, or ''."""
    if not tally.bounded:
        return ""
    return f", {tally.bounded} are left untimed ({UNTIMED})"
