"""Plan -> StepResult: the one entry point of a prediction, by either engine."""
from __future__ import annotations

from simcore.engine.analytic import analytic
from simcore.model.step_costs import step_costs
from simcore.plan.spec import Plan
from simcore.results import StepResult


def simulate(plan: Plan, engine: str = "analytic", **kwargs) -> StepResult:
    """Predict one training step of ``plan`` by the analytic closed forms or the event engine."""
    if engine == "analytic":
        return analytic(step_costs(plan))
    if engine == "des":
        try:
            from simcore.engine.des import simulate_des
        except ImportError as exc:
            raise ValueError(f"the event engine is not available (simcore.engine.des: {exc})") from None
        return simulate_des(step_costs(plan), **kwargs)
    raise ValueError(f"unknown engine {engine!r} (known: analytic, des)")
