"""Gradients reduce in the stacks' default dtype, and ZeRO-1's parameter all-gather overlaps
only where the stack overlaps it, at a price.

- 16-bit mixed precision reduces fp32 gradients in Megatron-LM (``--bf16``), Megatron-Bridge,
  torchtitan's FSDP2 and torch DDP under autocast; DeepSpeed reduces the model's dtype; a
  16-bit wire is ``training.grad_compression`` (``collectives.grad_wire_bytes``).
- ``parallel.overlap_param_gather`` (Megatron's ``--overlap-param-gather``) hides the
  distributed optimizer's all-gather behind the next forward, bucket by bucket: never free,
  never dearer than running it after the step.
"""
from __future__ import annotations

import pytest

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import comm_ledger as ledger
from simcore.plan.load import plan_from_dict
from simcore.plan.megatron_reader import split_command
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan

MODEL = {"name": "m", "layers": 16, "hidden": 4096, "heads": 32, "ffn_hidden": 16384, "vocab": 50304,
         "seq_len": 4096}


def _plan(parallel: dict, training: dict | None = None, nodes: int = 4):
    return plan_from_dict({"name": "p", "model": MODEL, "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": {"dp": 8 * nodes // parallel.get("tp", 1), **parallel},
                           "training": {"global_batch": 128, "micro_batch": 1, "precision": "bf16",
                                        "flash_attention": True, **(training or {})}})


@pytest.mark.parametrize("parallel, training, wire", [
    ({"zero": 0}, {}, 4), ({"zero": 1}, {}, 4), ({"zero": 3}, {}, 4),
    ({"zero": 1}, {"grad_compression": "bf16"}, 2), ({"zero": 3}, {"grad_compression": "bf16"}, 2),
    ({"zero": 1, "zero_impl": "deepspeed"}, {}, 2), ({"zero": 1}, {"precision": "fp16"}, 2),
    ({"zero": 1}, {"master_weights": False}, 2), ({"zero": 1}, {"precision": "fp32"}, 4),
])
def test_the_gradient_wire_dtype_is_the_stacks_default(parallel, training, wire):
    p = _plan(parallel, training)
    assert coll.grad_wire_bytes(p) == wire
    # the bytes the model charges per step follow it: a reduce-scatter (or all-reduce) of every
    # gradient this rank holds, at that dtype
    steps = ledger.step_bytes(p, 0)
    reduced = steps.get(("dp", "reduce_scatter"), 0.0) + steps.get(("dp", "all_reduce"), 0.0)
    half = _plan(parallel, {**training, "grad_compression": "bf16"}) if wire == 4 and "precision" not in training \
        else None
    if half is not None:
        h = ledger.step_bytes(half, 0)
        assert reduced == pytest.approx(2 * (h.get(("dp", "reduce_scatter"), 0.0) + h.get(("dp", "all_reduce"), 0.0)))


def test_an_fp32_reduction_costs_time_a_bf16_one_saves():
    for zero in (1, 3):
        fp32 = simulate(_plan({"zero": zero}), engine="analytic")
        bf16 = simulate(_plan({"zero": zero}, {"grad_compression": "bf16"}), engine="analytic")
        assert fp32.step_time_s > bf16.step_time_s, zero


def test_overlapping_the_parameter_gather_is_never_free_nor_dearer():
    after = simulate(_plan({"zero": 1, "tp": 8}, nodes=16), engine="analytic")
    over = simulate(_plan({"zero": 1, "tp": 8, "overlap_param_gather": True}, nodes=16), engine="analytic")
    assert 0 < over.time_s["param_sync"] < after.time_s["param_sync"]
    # at least the slow-down of the forward that hides it (the GPU's interference factor)
    from topologies.hardware import load_catalog
    k = load_catalog().efficiency["h100-sxm"]["comm_compute_interference"]
    assert over.time_s["param_sync"] > after.time_s["param_sync"] * (1 - 1 / k)
    # the event engine charges the same
    des_after = simulate(_plan({"zero": 1, "tp": 8}, nodes=16), engine="des").step_time_s
    des_over = simulate(_plan({"zero": 1, "tp": 8, "overlap_param_gather": True}, nodes=16), engine="des").step_time_s
    assert des_after - des_over == pytest.approx(after.step_time_s - over.step_time_s, rel=0.05)


def test_overlap_param_gather_needs_the_distributed_optimizer():
    for zero in (0, 2, 3):
        with pytest.raises(PlanError, match="parallel.overlap_param_gather needs parallel.zero=1"):
            _plan({"zero": zero, "overlap_param_gather": True})


def test_megatron_flags_round_trip(tmp_path):
    from simcore.plan.interop import import_plan
    p = _plan({"zero": 1, "tp": 2, "overlap_param_gather": True}, {"grad_compression": "bf16"})
    text = export_plan(p, "megatron")
    args = split_command(text)[2]
    assert {"--overlap-param-gather", "--overlap-grad-reduce", "--grad-reduce-in-bf16"} <= set(args)
    (tmp_path / "run.sh").write_text(text)
    doc, _ = import_plan(megatron=str(tmp_path / "run.sh"), cluster="dgx-h100", nodes=4)
    assert doc["parallel"]["overlap_param_gather"] is True and doc["training"]["grad_compression"] == "bf16"


@pytest.mark.parametrize("parallel, asked", [
    ({"zero": 0}, True), ({"zero": 1}, True), ({"zero": 1, "tp": 8, "dp": 1}, False), ({"zero": 3}, False)])
def test_megatron_export_asks_for_the_gradient_overlap_the_model_charges(parallel, asked):
    """Both engines hide the data-parallel reduction behind the last backward; Megatron does so
    only under --overlap-grad-reduce (default off), so the export asks for it wherever DDP or
    the distributed optimizer reduces gradients across replicas (Megatron-FSDP overlaps its own)."""
    p = _plan(parallel, nodes=1 if parallel.get("dp") == 1 else 4)
    args = split_command(export_plan(p, "megatron"))[2]
    assert ("--overlap-grad-reduce" in args) is asked
