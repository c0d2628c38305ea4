"""FSDP2's float8 all-gather (``training.fp8_param_gather`` under zero 2-3: torchao's
``enable_fsdp_float8_all_gather`` with ``precompute_float8_dynamic_scale_for_fsdp``, as torchtitan
sets it): the blocks' linear weights gathered at one byte, their amax computed after the step;
the gathered layer one byte an element in memory; a 16-bit gather without it."""
from __future__ import annotations

import pytest

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model.dp_costs import rank_costs
from simcore.model.step_costs import memory_report
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan


def _plan(gather: bool, recipe: str = "tensorwise", zero: int = 3, nodes: int = 4):
    return plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 4096},
                           "cluster": {"node": "dgx-h100", "nodes": nodes}, "parallel": {"dp": 8 * nodes, "zero": zero},
                           "training": {"global_batch": 8 * nodes, "precision": "fp8", "fp8_recipe": recipe,
                                        "fp8_param_gather": gather, "flash_attention": True, "recompute": "full"}})


def _dp(plan) -> dict:
    return rank_costs(plan, cmp.device_model(plan.cluster.node.gpu, "fp8", fp8_recipe="tensorwise"))[1][0][0]


def test_the_blocks_gather_at_one_byte():
    bf16, fp8 = _dp(_plan(False)), _dp(_plan(True))
    assert fp8["layer_ag"] < 0.6 * bf16["layer_ag"] and fp8["layer_rs"] == bf16["layer_rs"]
    assert fp8["sync"] > bf16["sync"]            # the amax pass and its all-reduce after the step
    term = lambda plan: memory_report(plan)["ranks"][0]["terms"]["fsdp_all_gather"]   # noqa: E731
    assert term(_plan(True)) == pytest.approx(term(_plan(False)) / 2)


def test_rules():
    with pytest.raises(PlanError, match="training.fp8_recipe=tensorwise"):
        _plan(True, recipe="rowwise")
    with pytest.raises(PlanError, match="training.fp8_param_gather needs"):
        _plan(True, zero=0)


def test_it_cannot_beat_free_communication():
    t = simulate(_plan(True, nodes=8)).step_time_s
    with pytest.MonkeyPatch.context() as mp:
        for name in ("all_gather_s", "reduce_scatter_s", "all_to_all_s", "all_reduce_s"):
            mp.setattr(coll, name, lambda *a, **k: 0.0)
        free = simulate(_plan(False, nodes=8)).step_time_s
    assert t >= free * (1 - 1e-12) and t <= simulate(_plan(False, nodes=8)).step_time_s


def test_torchtitan_round_trip(tmp_path):
    plan = _plan(True)
    toml = export_plan(plan, "torchtitan-0.2")   # 0.3 sets float8 in its config registry, not the command
    assert "enable_fsdp_float8_all_gather = true" in toml and "precompute_float8_dynamic_scale_for_fsdp = true" in toml
    (tmp_path / "job.toml").write_text(toml)
    doc, _ = import_plan(torchtitan=str(tmp_path / "job.toml"), cluster="dgx-h100", nodes=4)
    assert doc["training"]["fp8_param_gather"] is True and doc["parallel"]["zero"] == 3
