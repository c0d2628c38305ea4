"""Mixed hardware: pipeline stages on different GPU types, for the event engine.

A cluster that mixes GPU generations (an H100 pod beside an A100 pod) can still run one
pipeline if each stage sits on one kind. The step then waits on the slowest stage: the
event engine shows how. ``mixed_costs`` builds the StepCosts of such a plan: each
pipeline rank's compute (forward, backward, recompute, optimizer) comes from
``step_costs`` of the same plan on its own GPU type; communication keeps the plan's
own figures (the fabric and NVLink domain of the plan's node).
"""
from __future__ import annotations

from dataclasses import replace

from simcore.model.costs import StepCosts
from simcore.model.step_costs import step_costs
from simcore.plan.spec import Plan, PlanError
from topologies.hardware import load_catalog

#: StepCosts fields that are compute on the stage's own GPU (one entry per virtual stage).
COMPUTE_FIELDS = ("forward_s", "backward_input_s", "backward_weight_s", "recompute_s", "optimizer_per_step_s")


def plan_on_gpu(plan: Plan, gpu_name: str) -> Plan:
    """The same plan with every GPU of its nodes replaced by catalog GPU ``gpu_name``."""
    gpus = load_catalog().gpus
    if gpu_name not in gpus:
        raise PlanError(f"unknown GPU '{gpu_name}' (known: {', '.join(sorted(gpus))})")
    node = replace(plan.cluster.node, gpu=gpus[gpu_name])
    return replace(plan, cluster=replace(plan.cluster, node=node))


def mixed_costs(plan: Plan, stage_gpus: dict[int, str]) -> StepCosts:
    """StepCosts of ``plan`` with pipeline rank ``r`` computing on GPU ``stage_gpus[r]``."""
    pp = plan.parallel.pp
    bad = sorted(r for r in stage_gpus if not 0 <= r < pp)
    if bad:
        raise PlanError(f"pipeline stage {bad[0]} does not exist (parallel.pp={pp})")
    base = step_costs(plan)
    variants = {g: step_costs(plan_on_gpu(plan, g)) for g in set(stage_gpus.values())}
    fields = {}
    for name in COMPUTE_FIELDS:
        values = list(getattr(base, name))
        for v in range(len(values)):
            gpu = stage_gpus.get(plan.parallel.stage_rank(v))
            if gpu is not None:
                values[v] = getattr(variants[gpu], name)[v]
        fields[name] = tuple(values)
    notes = base.notes + (f"mixed hardware: pipeline ranks {dict(sorted(stage_gpus.items()))} on other GPU types; "
                          "MFU is against the plan's own GPU peak",)
    return replace(base, notes=notes, **fields)
