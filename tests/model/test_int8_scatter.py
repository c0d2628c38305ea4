"""FSDP2's reduce-scatter with int8 on the wire (``simcore.model.int8_scatter``, the executor's
``executors.int8_hook.Int8ReduceScatter``): where the rules let it run, what each call puts on the
wire and costs, that it cannot win for nothing (with communication free it only adds its kernels),
and the working memory it holds."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import comm_ledger as ledger
from simcore.model import compute as cmp
from simcore.model import ddp_hooks as hooks
from simcore.model import int8_scatter as i8
from simcore.model import memory as mem
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError


def _plan(compression: str = "int8", nodes: int = 2, zero: int = 3, **parallel):
    return plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 2048},
                           "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": {"dp": 8 * nodes, "zero": zero, **parallel},
                           "training": {"global_batch": 16 * nodes, "micro_batch": 1, "flash_attention": True,
                                        "recompute": "full", "grad_compression": compression}})


@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("method, bits", [("int8", 8), ("int4", 4)])
def test_int8_and_int4_run_as_fsdp2_reduce_scatter(zero, method, bits):
    plan = _plan(method, zero=zero)
    wire = {k: v for k, v in ledger.step_bytes(plan).items() if k[0] == "dp"}
    plain = {k: v for k, v in ledger.step_bytes(_plan("none", zero=zero)).items() if k[0] == "dp"}
    assert set(wire) == {("dp", "all_gather"), ("dp", "all_to_all")}
    assert wire["dp", "all_gather"] == plain["dp", "all_gather"]   # the parameters are gathered as before
    # fp32's reduce-scatter against bits / 8 bytes and an fp32 scale a group of at most 8,000 (and padding)
    share = bits / 32
    assert plain["dp", "reduce_scatter"] * share < wire["dp", "all_to_all"] < plain["dp", "reduce_scatter"] * share * 1.002


@pytest.mark.parametrize("fields, why", [
    ({"zero": 1}, "needs parallel.zero=0, not 1"),
    ({"compression": "int8_ef"}, "grad_compression=int8_ef needs parallel.zero=0, not 3"),
    ({"zero_impl": "deepspeed"}, "zero_impl fsdp2"),
])
def test_where_the_int8_reduce_scatter_does_not_run_is_one_sentence(fields, why):
    fields = dict(fields)
    compression, zero = fields.pop("compression", "int8"), fields.pop("zero", 3)
    with pytest.raises(PlanError, match=why):
        _plan(compression, zero=zero, **fields)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_under_hybrid_sharding_the_shard_group_scatters_quantized_and_the_replicas_all_reduce_fp32(method):
    """dp_replicate 2: the quantized all-to-all over the shard group (half the ranks), and FSDP2's own
    all-reduce of each fp32 shard over the replicas, the bytes it moves without compression."""
    hsdp, plain = _plan(method, dp_replicate=2), _plan("none", dp_replicate=2)
    wire, fp32 = ledger.step_bytes(hsdp), ledger.step_bytes(plain)
    axis = ledger.grad_axis(hsdp)
    assert wire["dp_replicate", "all_reduce"] == fp32["dp_replicate", "all_reduce"] > 0
    assert wire[axis, "reduce_scatter"] == 0 and 0 < wire[axis, "all_to_all"] < fp32[axis, "reduce_scatter"]
    assert simulate(hsdp).step_time_s != simulate(_plan(method)).step_time_s


def test_experts_groups_are_refused():
    with pytest.raises(PlanError, match="ep=1"):
        plan_from_dict({"model": {"name": "mixtral-8x7b"}, "cluster": {"node": "dgx-h100", "nodes": 2},
                        "parallel": {"dp": 16, "ep": 2, "zero": 3},
                        "training": {"global_batch": 32, "grad_compression": "int8"}})


@settings(max_examples=300, deadline=None)
@given(world=st.integers(2, 1024), numel=st.integers(1, 10**9))
def test_a_call_moves_a_quarter_of_fp32_and_pays_its_kernels(world, numel):
    """One call over N elements sends W (k g + 4 k) bytes where FSDP2's fp32 reduce-scatter sends 4 N:
    less wherever the chunks hold 4 elements or more, never nothing; its kernels always cost. int4
    sends W (k g / 2 + 4 k), half int8's values and the same scales, and pays more kernels."""
    b, b4 = i8.call_bytes(numel, world), i8.call_bytes(numel, world, 4)
    assert b >= numel > 0 and b4 >= numel / 2
    if numel >= 4 * world:
        assert b < 4 * numel and b4 < b
    dev = cmp.device_model(_plan().cluster.node.gpu, "bf16")
    assert i8.kernels_s(numel, world, dev, 4) > i8.kernels_s(numel, world, dev) >= i8.SCATTER_KERNELS * hooks.op_s(dev) > 0


@settings(max_examples=10, deadline=None)
@given(zero=st.sampled_from([2, 3]), nodes=st.sampled_from([1, 2, 4]), engine=st.sampled_from(["analytic", "des"]),
       method=st.sampled_from(["int8", "int4"]), replicas=st.sampled_from([1, 2]))
def test_it_cannot_win_for_nothing(zero, nodes, engine, method, replicas):
    """With every collective free, the quantized layout is never faster than fp32's: it saves only wire time
    (under hybrid sharding too, where the replicas' all-reduce stays fp32)."""
    t = simulate(_plan(method, zero=zero, nodes=nodes, dp_replicate=replicas), engine=engine).step_time_s
    with pytest.MonkeyPatch.context() as mp:
        for name in ("all_gather_s", "reduce_scatter_s", "all_to_all_s", "all_reduce_s", "ring_bytes_s",
                     "replica_all_reduce_s"):
            mp.setattr(coll, name, lambda *a, **k: 0.0)
        free_none = simulate(_plan("none", zero=zero, nodes=nodes, dp_replicate=replicas), engine=engine).step_time_s
        free_q = simulate(_plan(method, zero=zero, nodes=nodes, dp_replicate=replicas), engine=engine).step_time_s
    assert free_q > free_none and t >= free_none


def test_it_holds_its_working_buffers():
    """Beside FSDP2's own reduce-scatter input, the int8 buffers and the fp32 chunks of the largest layer."""
    plain, int8 = _plan("none"), _plan()
    sp = mem.stage_params(int8)[0]
    extra = mem.comm_buffer_terms(int8, sp)["fsdp_reduce_scatter"] - mem.comm_buffer_terms(plain, sp)["fsdp_reduce_scatter"]
    assert extra == pytest.approx(i8.SCATTER_BUFFER_BYTES * sp.layer_max)
