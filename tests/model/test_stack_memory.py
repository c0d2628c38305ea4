"""Memory at scale as the stacks allocate it (issue 50): the micro-batches Megatron's interleaved
schedule keeps in flight with its micro-batch groups, FP8 primary weights, 16-bit Adam moments.

- ``parallel.microbatch_group`` (Megatron-Core ``--microbatch-group-size-per-virtual-pipeline-stage``,
  Llama 3's tunable N): a chunk runs N micro-batches in a row; rank r warms up with
  (v-1)N + 2(p-1-r) forwards (``get_pp_rank_microbatches``), the schedule as data, the closed form
  and the event engine run the same order.
- ``training.fp8_param_gather`` (``--fp8-param-gather``): the linear weights are FP8 tensors, no
  16-bit copy and no cached FP8 copy beside them, and the distributed optimizer gathers FP8.
- ``training.optimizer_state_dtype`` (``--use-precision-aware-optimizer --exp-avg-dtype bf16
  --exp-avg-sq-dtype bf16``): Adam's moments in 16 bits beside the fp32 master weights.
"""
from __future__ import annotations

import pytest

from executors.support import check_executable
from simcore.engine.predict import simulate
from simcore.model import activations as acts
from simcore.model import comm_ledger as ledger
from simcore.model import memory as mem
from simcore.model.schedules import Op, build_schedule
from simcore.model.step_costs import memory_report
from simcore.plan.load import plan_from_dict
from simcore.plan.megatron_reader import split_command
from simcore.plan.spec import PlanError, Schedule
from simcore.plan.writers import export_plan

MODEL = {"name": "m", "layers": 16, "hidden": 4096, "heads": 32, "ffn_hidden": 16384, "vocab": 50304,
         "seq_len": 4096, "gated_mlp": True, "position_embedding": "rope", "tied_embeddings": False}


def _plan(parallel: dict | None = None, training: dict | None = None, nodes: int = 4):
    return plan_from_dict({"name": "p", "model": MODEL, "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": {"tp": 2, "dp": 4 * nodes, "zero": 1, "sequence_parallel": True,
                                        **(parallel or {})},
                           "training": {"global_batch": 128, "flash_attention": True, **(training or {})}})


def _grouped(group: int, m: int = 16):
    return _plan({"pp": 4, "dp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "microbatch_group": group},
                 {"global_batch": 2 * m})


@pytest.mark.parametrize("pp, m, v, group", [(4, 8, 2, 4), (4, 8, 2, 8), (4, 16, 2, 8), (4, 12, 3, 6),
                                             (2, 8, 3, 4), (8, 16, 2, 16), (4, 8, 4, 8)])
def test_micro_batch_groups_keep_megatrons_warm_up_in_flight(pp, m, v, group):
    """Megatron-Core's get_pp_rank_microbatches: warm-up (v-1)N + 2(p-1-r), +1 at the peak, all
    m*v where the warm-up reaches it; the closed form is what the schedule counts."""
    flights, owed = acts.counted_peaks(Schedule.INTERLEAVED_1F1B, pp, m, v, group)
    assert acts.schedule_peaks(Schedule.INTERLEAVED_1F1B, pp, m, v, group) == (flights, owed)
    assert list(flights) == [min(m * v, (v - 1) * group + 2 * (pp - 1 - r) + 1) for r in range(pp)]


@pytest.mark.parametrize("pp, m, v, group", [(4, 8, 2, 8), (4, 12, 3, 6), (2, 8, 2, 4)])
def test_a_grouped_schedule_runs_each_chunk_in_megatrons_table_order(pp, m, v, group):
    """Forwards follow Megatron's get_schedule_table (groups of N micro-batches, chunk by chunk),
    each stage runs each micro-batch once, a backward after its forward."""
    table = [(mb, c) for start in range(0, m, group) for c in range(v) for mb in range(start, start + group)]
    for rank, actions in build_schedule(Schedule.INTERLEAVED_1F1B, pp, m, v, group).items():
        forwards = [(a.microbatch, a.stage // pp) for a in actions if a is not None and a.op == Op.F]
        assert forwards == table and all(a.stage % pp == rank for a in actions if a is not None)
        seen = set()
        for a in (a for a in actions if a is not None):
            assert a.op == Op.F or (a.stage, Op.F, a.microbatch) in seen
            seen.add((a.stage, a.op, a.microbatch))
        assert len(seen) == 2 * m * v


def test_larger_groups_hold_more_and_the_default_is_pp():
    default, pp_group, bigger = _grouped(0), _grouped(4), _grouped(8)
    assert memory_report(default)["max_gpu_bytes"] == memory_report(pp_group)["max_gpu_bytes"]
    assert memory_report(bigger)["max_gpu_bytes"] > memory_report(pp_group)["max_gpu_bytes"]
    assert [mem.in_flight_chunks(bigger, r) for r in range(4)] == [15, 13, 11, 9]
    for plan in (pp_group, bigger):   # the event engine runs the grouped schedule to its end
        assert simulate(plan, engine="des").step_time_s > 0


@pytest.mark.parametrize("parallel, match", [
    ({"vpp": 2, "schedule": "interleaved-1f1b", "microbatch_group": 2}, "at least parallel.pp=4"),
    ({"vpp": 2, "schedule": "interleaved-1f1b", "microbatch_group": 12}, "must divide"),
    ({"schedule": "1f1b", "microbatch_group": 8}, "interleaved-1f1b"),
    ({"vpp": 2, "schedule": "interleaved-1f1b", "microbatch_group": 8, "zero": 3}, "parallel.zero <= 1"),
])
def test_a_bad_group_is_one_sentence_naming_the_field(parallel, match):
    with pytest.raises(PlanError, match=match) as exc:
        _plan({"pp": 4, "dp": 2, **parallel}, {"global_batch": 32})
    assert "parallel.microbatch_group" in str(exc.value) and str(exc.value).count(". ") == 0


def test_fp8_primary_weights_drop_the_16_bit_copy_and_gather_in_fp8():
    """Without --fp8-param-gather a Hopper GPU holds the 16-bit weight, its FP8 copy and the copy's
    transpose (2 + 1 + 1 B); with it, the FP8 weight and its transpose (1 + 1 B)."""
    base, fp8w = (_plan({"pp": 2, "dp": 8}, {"precision": "fp8", "fp8_param_gather": g}) for g in (False, True))
    sp = mem.stage_params(base)[1]
    linear = sp.total - sp.ends
    t0, t1 = (memory_report(p)["ranks"][1]["terms"] for p in (base, fp8w))
    assert t0["weights"] - t1["weights"] == pytest.approx(linear)
    assert t0["fp8_weights"] - t1["fp8_weights"] == pytest.approx(linear)
    gathered = [ledger.step_bytes(p, 1)["dp", "all_gather"] for p in (base, fp8w)]
    assert gathered[1] == pytest.approx(gathered[0] - linear)
    assert simulate(fp8w).step_time_s <= simulate(base).step_time_s


def test_sixteen_bit_moments_keep_half_of_adams_states():
    fp32, bf16 = (_plan(training={"optimizer_state_dtype": d}) for d in ("fp32", "bf16"))
    sp = mem.stage_params(fp32)[0]
    nd = fp32.parallel.dp
    o0, o1 = (mem.model_state_bytes(p, sp)["optimizer_states"] for p in (fp32, bf16))
    assert o0 == pytest.approx((4 + 8) * sp.total / nd) and o1 == pytest.approx((4 + 4) * sp.total / nd)


@pytest.mark.parametrize("training, match", [
    ({"fp8_param_gather": True}, "training.precision=fp8"),
    ({"precision": "fp8", "fp8_param_gather": True, "zero": 0}, "parallel.zero=1"),
    ({"optimizer_state_dtype": "bf16", "optimizer": "sgd"}, "adamw or adam"),
    ({"optimizer_state_dtype": "fp8"}, "is not one of"),
])
def test_bad_precision_fields_are_one_sentence(training, match):
    zero = training.pop("zero", 1)
    with pytest.raises(PlanError, match=match):
        _plan({"zero": zero}, training)


def test_megatron_reads_and_writes_the_three_fields(tmp_path):
    from simcore.plan.interop import import_plan
    plan = _plan({"pp": 4, "dp": 2, "vpp": 2, "schedule": "interleaved-1f1b", "microbatch_group": 8},
                 {"global_batch": 32, "precision": "fp8", "fp8_recipe": "current", "fp8_param_gather": True,
                  "optimizer_state_dtype": "bf16"})
    text = export_plan(plan, "megatron")
    args = split_command(text)[2]
    for flag, value in (("--microbatch-group-size-per-virtual-pipeline-stage", "8"), ("--exp-avg-dtype", "bf16"),
                        ("--exp-avg-sq-dtype", "bf16")):
        assert args[flag] == [value]
    assert {"--fp8-param-gather", "--use-precision-aware-optimizer"} <= set(args)
    (tmp_path / "run.sh").write_text(text)
    doc, _ = import_plan(megatron=str(tmp_path / "run.sh"), cluster="dgx-h100", nodes=4)
    assert doc["parallel"]["microbatch_group"] == 8 and doc["training"]["fp8_param_gather"] is True
    assert doc["training"]["optimizer_state_dtype"] == "bf16"


def test_the_executor_refuses_what_it_does_not_run():
    for plan, field in ((_grouped(8), "parallel.microbatch_group"),
                        (_plan(training={"optimizer_state_dtype": "bf16"}), "training.optimizer_state_dtype")):
        with pytest.raises(ValueError, match=field):
            check_executable(plan, "cpu")
