"""torch's own tracker on the executor's model under fake tensors, against the analytic model."""
from __future__ import annotations

import pytest

from executors.memory_trace import TraceError, compare, one_microbatch, trace_peak
from simcore.model.step_costs import memory_report
from simcore.plan.load import plan_from_dict

#: A Llama-shaped model small enough to trace in a second or two (fake tensors allocate nothing).
SMALL = {"name": "small-llama", "layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn_hidden": 5632,
         "vocab": 32000, "seq_len": 2048, "gated_mlp": True, "tied_embeddings": False, "position_embedding": "rope"}


def _plan(zero=3, recompute="op", **par):
    return plan_from_dict({"model": SMALL, "cluster": {"node": "dgx-h100", "nodes": 1},
                           "parallel": {"dp": 4, "zero": zero, **par},
                           "training": {"global_batch": 8, "micro_batch": 2, "flash_attention": True,
                                        "recompute": recompute}})


@pytest.mark.parametrize("zero, recompute", [(3, "op"), (3, "full"), (3, "layer:2"), (2, "op")])
def test_model_states_match_torch_and_the_total_is_close(zero, recompute):
    plan = _plan(zero, recompute)
    traced = trace_peak(one_microbatch(plan))
    terms = memory_report(one_microbatch(plan))["ranks"][0]["terms"]
    # FSDP2's fp32 shards (the master copy) and AdamW's two fp32 states per shard; ZeRO-2
    # (reshard_after_forward=False) also keeps every 16-bit parameter gathered
    weights = traced["Sharded Param"] + (traced["Unsharded Param"] if zero == 2 else 0.0)
    assert weights == pytest.approx(terms["weights"], rel=0.01)
    assert traced["OptState"] == pytest.approx(terms["optimizer_states"], rel=0.01)
    # the whole peak: the analytic model within 15% of torch's count (RESULTS.md has the grid)
    assert compare(plan)["difference"] == pytest.approx(0.0, abs=0.15)


def test_more_recompute_holds_less_in_torch_too():
    peaks = [trace_peak(one_microbatch(_plan(3, rc)))["Activation"] for rc in ("none", "layer:2", "op", "full")]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > 2 * peaks[-1]


@pytest.mark.parametrize("dp, tp, zero", [(2, 2, 3), (1, 4, 0)])
def test_tensor_parallel_traces_with_the_model_states_sharded_over_tp(dp, tp, zero):
    """TP (DTensor, sequence parallel) alone and under FSDP2: every rank holds 1/(dp x tp) of
    the parameters and AdamW's states (the whole peak differs by the loss and the eager
    executor's intermediates: bench/RESULTS.md has the grid)."""
    plan = _plan(zero, "op", tp=tp, dp=dp, sequence_parallel=True)
    traced = trace_peak(one_microbatch(plan))
    alone = trace_peak(one_microbatch(_plan(3, "op")))   # dp 4: the same 1/4 of every parameter
    params = traced.get("Sharded Param", traced.get("Parameter"))
    assert params == pytest.approx(alone["Sharded Param"], rel=0.01)
    assert traced.get("OptState", traced.get("Optstate")) == pytest.approx(alone["OptState"], rel=0.01)


def test_sequence_parallel_holds_fewer_activations_in_torch_too():
    peaks = [trace_peak(one_microbatch(_plan(0, "none", tp=4, dp=1, sequence_parallel=sp)))["Activation"]
             for sp in (False, True)]
    assert peaks[1] < peaks[0]


def test_layouts_it_cannot_trace_are_one_sentence():
    with pytest.raises(TraceError, match="parallel.pp=2"):
        trace_peak(_plan(3, "op", pp=2, dp=2))
    with pytest.raises(TraceError, match="parallel.zero=1"):
        trace_peak(_plan(1, "op"))
