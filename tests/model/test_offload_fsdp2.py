"""FSDP2's CPU offload pays its host-device copies per call, not per step: under gradient
accumulation every micro-batch's all-gathers upload the host's shards and every reduce-scatter
downloads a gradient that the host then accumulates (measured on an H100: validation/gpu_runs.csv)."""
import pytest

from simcore.engine.predict import simulate
from simcore.plan.load import plan_from_dict


def _doc(micro_batches: int, zero: int = 3, impl: str = "fsdp2", dp: int = 8) -> dict:
    return {"name": "offload", "model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 1},
            "parallel": {"dp": dp, "zero": zero, "zero_impl": impl},
            "training": {"global_batch": dp * micro_batches, "micro_batch": 1, "offload": "optimizer+params"}}


def _plan(micro_batches: int, **kw):
    return plan_from_dict(_doc(micro_batches, **kw))


def _copies(plan):
    from simcore.model.step_costs import step_costs

    return sum(step_costs(plan).offload_per_step_s)


def test_fsdp2_offload_copies_grow_with_the_micro_batches():
    # uploads for each gather (forward and, ZeRO-3, backward), a download per reduce-scatter
    assert _copies(_plan(8)) == pytest.approx(8 * _copies(_plan(1)), rel=1e-6)


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_fsdp2_offload_is_charged_in_series_by_both_engines(engine):
    one, eight = simulate(_plan(1), engine=engine), simulate(_plan(8), engine=engine)
    assert eight.offload_s - one.offload_s >= _copies(_plan(8)) - _copies(_plan(1))   # and seven host accumulations
    plain = simulate(plan_from_dict({**_doc(8), "training": {**_doc(8)["training"], "offload": "none"}}), engine=engine)
    assert eight.step_time_s > plain.step_time_s + _copies(_plan(8))


def test_deepspeed_offload_keeps_its_once_per_step_copies():
    assert _copies(_plan(8, impl="deepspeed")) == pytest.approx(_copies(_plan(1, impl="deepspeed")), rel=1e-6)
