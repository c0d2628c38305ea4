"""The Plan's public names, re-exported from the modules that hold them: the value types
from ``simcore.plan.values``, ``check_plan`` from ``simcore.plan.rules``, and reading and
writing Plan documents from ``simcore.plan.load``.
"""
from __future__ import annotations

from simcore.plan.load import (
    dump_plan, hf_config_fields, load_plan, plan_from_dict, plan_to_dict, read_yaml_file,
)
from simcore.plan.rules import check_plan
from simcore.plan.values import (
    ClusterSpec, GradCompression, ModelSpec, Offload, Optimizer, ParallelSpec, Plan, PlanError, PositionEmbedding,
    Precision, Recompute, Schedule, TrainingSpec, ZeroStage, even_split,
)

__all__ = [
    "ClusterSpec", "GradCompression", "ModelSpec", "Offload", "Optimizer", "ParallelSpec", "Plan", "PlanError",
    "PositionEmbedding", "Precision", "Recompute", "Schedule", "TrainingSpec", "ZeroStage", "check_plan", "dump_plan",
    "even_split", "hf_config_fields", "load_plan", "plan_from_dict", "plan_to_dict", "read_yaml_file",
]
