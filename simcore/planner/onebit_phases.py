"""The steps DeepSpeed's 1-bit optimizers run before the steady state a step prices
(``simcore.model.onebit``), as ``trainplan cost`` charges them (``runcost.run_cost``), each as
DeepSpeed runs it (deepspeedai/DeepSpeed @edaa7221, ``deepspeed/runtime/fp16/onebit/``):

- 1-bit Adam (adam.py): its first ``freeze_step`` steps are Adam over the engine's uncompressed
  all-reduce: Adam's step.
- 1-bit LAMB (lamb.py): its first ``freeze_step`` steps are LAMB over the engine's all-reduce:
  Adam's step and the two norms LAMB adds (``onebit.LAMB_WARMUP_BYTES``).
- 0/1 Adam (zoadam.py): to ``var_freeze_step`` and the step past it (``freeze_key`` flips after
  the step), the gradient is 1-bit all-reduced (1-bit Adam's step) but on the first step and the
  variance updates (``onebit.uncompressed_steps``: Adam's step); then the local steps' interval
  is 1, 2, 4, 8 for ``LOCAL_STEP_SCALER`` steps each before the steady 16: the steady step plus
  what the sync and its passes add at that interval on the rank holding the most parameters
  (they run in the step, after the backward: nothing overlaps them).

``training.onebit_freeze_step`` holds the freeze step of each (0/1 Adam's ``var_freeze_step``).
"""
from __future__ import annotations

from dataclasses import replace

from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import memory as mem
from simcore.model import onebit
from simcore.model.step_costs import plan_device
from simcore.plan.choices import ONEBIT_OPTIMIZERS
from simcore.plan.spec import Optimizer, Plan

#: A phase: (steps, seconds a step).
Phase = tuple[int, float]


def warmup_phases(plan: Plan, prediction, steps: int) -> tuple[list[Phase], str]:
    """The phases of the first ``steps`` steps that do not run at ``prediction``'s step (timed on
    its engine), and the note saying so; ([], '') for any other optimizer."""
    tr = plan.training
    if tr.optimizer not in ONEBIT_OPTIMIZERS:
        return [], ""
    from simcore.engine.predict import simulate

    engine = "des" if getattr(prediction, "source", "analytic") == "des" else "analytic"

    def step_as(optimizer: Optimizer) -> float:
        return simulate(replace(plan, training=replace(tr, optimizer=optimizer)), engine=engine).step_time_s
    steady, freeze = prediction.step_time_s, min(steps, tr.onebit_freeze_step)
    if tr.optimizer == Optimizer.ZERO_ONE_ADAM:
        return _zero_one(plan, steps, steady, step_as)
    if not freeze:
        return [], ""
    t = step_as(Optimizer.ADAM)
    name, run_as = ("1-bit Adam", "Adam") if tr.optimizer == Optimizer.ONEBIT_ADAM else ("1-bit LAMB", "LAMB")
    if tr.optimizer == Optimizer.ONEBIT_LAMB:
        elements, _, dev = _largest_rank(plan)
        t += cmp.stream_s(onebit.LAMB_WARMUP_BYTES * elements, dev)
    return [(freeze, t)], (f"{name}: its first {freeze:,} steps (training.onebit_freeze_step) run as {run_as}, "
                           f"uncompressed, at {t:.3f} s a step; the rest at {steady:.3f} s")


def _largest_rank(plan: Plan) -> tuple[float, coll.GroupNet | None, cmp.DeviceModel]:
    """(parameters of the rank holding the most, its data-parallel group as ``dp_costs`` builds it
    (None on one rank), the device model)."""
    par, dev = plan.parallel, plan_device(plan)
    net = coll.group_net(plan.cluster, dev, par.shard_ranks, par.tp) if par.dp * par.cp > 1 else None
    return max(sp.total for sp in mem.stage_params(plan)), net, dev


def _zero_one(plan: Plan, steps: int, steady: float, step_as) -> tuple[list[Phase], str]:
    """0/1 Adam's phases: the gradient's all-reduces to ``var_freeze_step``, then the local-step ramp."""
    first = min(steps, plan.training.onebit_freeze_step + 1)
    plain = onebit.uncompressed_steps(first)
    phases: list[Phase] = []
    said = []
    if first:
        t_adam, t_one = step_as(Optimizer.ADAM), (step_as(Optimizer.ONEBIT_ADAM) if first > plain else 0.0)
        phases += [(plain, t_adam)] + ([(first - plain, t_one)] if first > plain else [])
        said.append(f"its first {first:,} steps (training.onebit_freeze_step, its var_freeze_step, and the step "
                    f"past it) reduce the gradient, {plain:,} uncompressed (the first step and the variance "
                    f"updates) at {t_adam:.3f} s a step, {first - plain:,} 1-bit at {t_one:.3f} s")
    elements, net, dev = _largest_rank(plan)

    def per_step(interval: int) -> float:   # the sync and the passes around it, a step at this interval
        sync = onebit.sync_s(Optimizer.ZERO_ONE_ADAM, elements, net, dev, interval) if net else 0.0
        return sync + onebit.step_kernel_s(Optimizer.ZERO_ONE_ADAM, elements, dev, interval)
    left, ramp = steps - first, []
    for interval in onebit.local_step_ramp():
        n = min(left, onebit.LOCAL_STEP_SCALER)
        if n <= 0:
            break
        t = steady + per_step(interval) - per_step(onebit.LOCAL_STEP_CLIPPER)
        phases.append((n, t))
        ramp.append(f"{n:,} steps syncing every {interval} at {t:.3f} s")
        left -= n
    if ramp:
        said.append("then local steps: " + ", ".join(ramp))
    if not said:
        return [], ""
    return phases, (f"0/1 Adam, as DeepSpeed runs it: {'; '.join(said)}; the rest at {steady:.3f} s, one "
                    f"1-bit all-reduce in {onebit.LOCAL_STEP_CLIPPER}")
