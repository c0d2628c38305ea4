"""FSDP2 under a pipeline reduces once, after the stage's last backward (torch's
``perform_reduce_grad``): its reduce-scatter buffers and the activations never peak together."""
import pytest

from simcore.model import memory as mem
from simcore.model import peak as pk
from simcore.plan.load import plan_from_dict


def plan(pp=4, zero=2, seq_len=4096, layers=16, **training):
    return plan_from_dict({
        "model": {"name": "t", "layers": layers, "hidden": 4096, "heads": 32, "vocab": 32000, "seq_len": seq_len},
        "cluster": {"node": "dgx-h100", "nodes": 4},
        "parallel": {"tp": 1, "pp": pp, "dp": 32 // pp, "zero": zero, "schedule": "1f1b"},
        "training": {"global_batch": 64, "micro_batch": 1, "recompute": "none", **training}})


def _fullest(p):
    rows = mem.rank_breakdown(p)
    return max(rows, key=lambda r: r[0]["total"])


def _states(p, rank=0):
    sp = mem.stage_params(p)[rank]
    return mem.model_state_bytes(p, sp), mem.comm_buffer_terms(p, sp)


def test_only_fsdp2_under_a_pipeline_defers_its_reduction():
    assert pk.reduce_deferred(plan())
    assert not pk.reduce_deferred(plan(pp=1))          # no pipeline: a reduce-scatter every micro-batch
    assert not pk.reduce_deferred(plan(zero=1))        # Megatron's buckets are views of its gradient buffer
    assert not pk.reduce_deferred(plan(pp=32, layers=32))   # no data parallel, no reduction


def test_the_reduce_scatter_buffer_is_not_charged_on_top_of_the_pipelined_activations():
    p = plan()
    mem_row, terms = _fullest(p)
    states, buffers = _states(p)
    assert buffers["fsdp_reduce_scatter"] > 0
    assert sum(v for k, v in terms.items() if k.startswith("activations_")) > buffers["fsdp_reduce_scatter"]
    assert terms["fsdp_reduce_scatter"] == 0.0
    # the peak is the steady state: every other term as before, the reduction's buffer left out
    others = sum(buffers.values()) - buffers["fsdp_reduce_scatter"]
    assert mem_row["comm_buffers"] == pytest.approx(others)
    assert mem_row["total"] == pytest.approx(sum(terms.values()))


def test_where_the_reduction_outweighs_the_activations_it_is_the_peak():
    # short sequences, wide layers: one layer's gradient buffers outweigh what the stage keeps
    p = plan(seq_len=128, layers=4, pp=2)
    mem_row, terms = _fullest(p)
    _, buffers = _states(p)
    assert terms["fsdp_reduce_scatter"] == pytest.approx(buffers["fsdp_reduce_scatter"])
    assert all(v == 0.0 for k, v in terms.items() if k.startswith("activations_"))
    assert mem_row["total"] == pytest.approx(sum(terms.values()))


def test_the_deferred_peak_is_the_larger_of_the_two_moments_and_never_more_than_both_together():
    for p in (plan(), plan(seq_len=128, layers=4, pp=2), plan(zero=3), plan(pp=8)):
        states, buffers = _states(p)
        acts = mem.activation_bytes(p, 0)
        rs = buffers["fsdp_reduce_scatter"]
        base = states["weights"] + states["gradients"] + states["optimizer_states"] + sum(buffers.values()) - rs
        got = pk.peak_tensor_bytes({**states, "deferred": rs}, acts, sum(buffers.values()), True)
        assert got == pytest.approx(base + max(acts, rs))
        assert got < base + acts + rs


def test_without_a_pipeline_the_buffer_meets_the_activations_as_before():
    p = plan(pp=1)
    _, terms = _fullest(p)
    _, buffers = _states(p)
    assert buffers["fsdp_reduce_scatter"] > 0
    assert terms["fsdp_reduce_scatter"] == pytest.approx(buffers["fsdp_reduce_scatter"])
    assert sum(v for k, v in terms.items() if k.startswith("activations_")) > 0


def test_rank_totals_agree_with_the_rows_rank_by_rank():
    # the totals without a row per rank (interpolated where affine) equal the rows
    for p in (plan(), plan(pp=8), plan(seq_len=512, layers=32, pp=8)):
        totals, _, _ = mem.rank_totals(p)
        assert totals == pytest.approx([r["total"] for r in mem.memory_per_rank(p)])
