"""DDP's buckets and communication hooks as torch runs them (simcore/model/ddp_hooks.py): by hand,
against the step model, and that a hook cannot win for nothing: with communication free it only
adds its kernels, and no hook beats free communication."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import collective_plan as cp
from simcore.model import ddp_hooks as hooks
from simcore.plan.load import plan_from_dict

MIB = 1024 * 1024


def test_buckets_by_hand():
    sizes = [MIB // 2, MIB // 2, 3, 20 * MIB, 5 * MIB, 7]
    assert hooks.bucket_members(sizes) == [[0, 1], [2, 3, 4], [5]]
    assert cp.ddp_buckets(sizes) == [MIB, 3 + 25 * MIB, 7]


def test_what_powersgd_compresses_by_hand():
    """torch's ``_should_compress``: (n + m) r x 2 < n m; a 1-D tensor is sent whole."""
    assert hooks.compressed((64, 64), 1) == (64, 64)
    assert hooks.compressed((4, 4), 1) is None            # 8 x 2 = 16 is not below 16
    assert hooks.compressed((64,), 1) is None
    assert hooks.compressed((8, 4, 4), 2) == (16, 32)     # viewed as 8 x 16, rank 2
    assert hooks.bucket_calls("powersgd", [(64, 64), (64,)], 1, 4) == [4 * 64, 4 * 64, 4 * 64]
    assert hooks.bucket_calls("powersgd", [(64, 64)], 1, 4) == [0, 4 * 64, 4 * 64]   # an empty all-reduce too
    assert hooks.bucket_calls("fp16", [(64, 64), (64,)], 1, 4) == [2 * (4096 + 64)]


def _plan(compression: str, nodes: int = 2, model: str = "llama3-8b"):
    return plan_from_dict({"model": {"name": model, "seq_len": 2048}, "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": {"dp": 8 * nodes, "zero": 0},
                           "training": {"global_batch": 16 * nodes, "micro_batch": 1, "flash_attention": True,
                                        "recompute": "full", "grad_compression": compression}})


@settings(max_examples=10, deadline=None)
@given(compression=st.sampled_from(["fp16", "bf16", "powersgd", "int8", "int8_ef", "int4"]), nodes=st.sampled_from([1, 2, 4]))
def test_a_hook_cannot_win_for_nothing(compression, nodes):
    t = simulate(_plan(compression, nodes)).step_time_s
    with pytest.MonkeyPatch.context() as mp:
        for name in ("all_gather_s", "reduce_scatter_s", "all_to_all_s", "all_reduce_s", "ring_bytes_s"):
            mp.setattr(coll, name, lambda *a, **k: 0.0)
        free_none = simulate(_plan("none", nodes)).step_time_s
        free_hook = simulate(_plan(compression, nodes)).step_time_s
    assert free_hook >= free_none * (1 - 1e-12) and t >= free_none * (1 - 1e-12)


def test_powersgd_puts_less_on_the_wire_and_pays_kernels():
    import math

    shapes = [(4096, 4096), (14336, 4096), (4096,)] * 4
    ar = lambda nbytes: nbytes * 1e-9   # noqa: E731  one byte a nanosecond
    from simcore.model import compute as cmp
    dev = cmp.device_model(_plan("none").cluster.node.gpu, "bf16")
    comm_plain, _ = hooks.hook_costs("fp16", shapes, 1, dev, ar)
    comm_psgd, kernels = hooks.hook_costs("powersgd", shapes, 1, dev, ar)
    assert comm_psgd < comm_plain / 100 and kernels > 0
    assert comm_plain == pytest.approx(2 * sum(math.prod(s) for s in shapes) * 1e-9)


def test_the_executor_refuses_powersgd_over_several_gloo_buckets():
    from executors.support import check_executable

    big = {"name": "big", "layers": 12, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn_hidden": 512, "vocab": 256,
           "seq_len": 32, "gated_mlp": True, "position_embedding": "rope", "tied_embeddings": False}
    plan = plan_from_dict({"model": big, "cluster": {"node": "localhost", "gpus_per_node": 2}, "parallel": {"dp": 2},
                           "training": {"global_batch": 4, "precision": "fp32", "grad_compression": "powersgd"}})
    with pytest.raises(ValueError, match="needs the gradients in one DDP bucket .*fill 3"):
        check_executable(plan, "cpu")


@settings(max_examples=200, deadline=None)
@given(world=st.integers(2, 1024), numel=st.integers(1, 10**9))
def test_int8_puts_a_quarter_of_fp32_on_the_wire_and_never_nothing(world, numel):
    """Per bucket the int8 hook's two calls (each W (k g + 4 k) bytes, ``int8_layout``) move, per
    rank, (W-1)/W of each, against a ring all-reduce's 2 (W-1)/W of fp32's 4 bytes an element:
    less wherever the bucket holds at least 4 elements a rank (a smaller one pays its padding
    and scales), never zero, and no more than int8 plus a scale a group and a group's padding."""
    k, g = hooks.int8_layout(numel, world)
    assert k * g * world >= numel and g <= hooks.INT8_GROUP and (k * g - 1) * world < numel + world * k
    b = hooks.int8_call_bytes(numel, world)
    assert b >= numel + hooks.SCALE_BYTES * world > 0
    if numel >= 4 * world:
        assert 2 * b < 2 * hooks.FP32 * numel
    assert b <= numel + world * k * (1 + hooks.SCALE_BYTES)


def test_int8_moves_less_than_fp32_and_pays_kernels():
    import math

    shapes = [(4096, 4096), (14336, 4096), (4096,)] * 4
    ar = lambda nbytes: nbytes * 1e-9   # noqa: E731  one byte a nanosecond
    call = lambda kind, nbytes: nbytes * 1e-9   # noqa: E731
    from simcore.model import compute as cmp
    dev = cmp.device_model(_plan("none").cluster.node.gpu, "bf16")
    comm_fp32, k_fp32 = hooks.hook_costs("none", shapes, 1, dev, ar)
    comm_int8, kernels = hooks.hook_costs("int8", shapes, 1, dev, ar, 16, call)
    n = sum(math.prod(s) for s in shapes)
    assert comm_fp32 == pytest.approx(4 * n * 1e-9) and k_fp32 == 0
    assert 2 * n * 1e-9 < comm_int8 < 2 * n * 1e-9 * 1.01   # two calls of ~n bytes each
    # every bucket's 22 kernels and its passes: at least the 55 bytes an element they stream
    assert kernels > hooks.INT8_PASS_BYTES * n / (dev.hbm_bytes_per_s * dev.memory_efficiency)


def test_int8_plans_move_fewer_bytes_than_fp32_and_cost_kernels():
    from simcore.model import comm_ledger as ledger

    plain, int8 = _plan("none"), _plan("int8")
    wire = {k: v for k, v in ledger.step_bytes(int8).items() if k[0] == "dp"}
    assert set(wire) == {("dp", "all_to_all"), ("dp", "all_gather")}
    fp32 = ledger.step_bytes(plain)["dp", "all_reduce"]
    assert 0 < wire["dp", "all_to_all"] < fp32 / 3.9 and wire["dp", "all_to_all"] == wire["dp", "all_gather"]
    costs = [simulate(p, engine=e) for p in (plain, int8) for e in ("analytic", "des")]
    assert all(c.step_time_s > 0 for c in costs)


@pytest.mark.parametrize("zero", [1])
def test_int8_needs_zero_0(zero):   # or FSDP2's zero 2-3 (tests/model/test_int8_scatter.py)
    from simcore.plan.spec import PlanError

    with pytest.raises(PlanError, match=f"training.grad_compression=int8 needs parallel.zero=0, not {zero}: it is a "
                                        "DDP communication hook"):
        plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                        "parallel": {"dp": 8, "zero": zero},
                        "training": {"global_batch": 16, "grad_compression": "int8"}})


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_the_exporters_refuse_int8_in_one_sentence(method):
    """No stack the exporters write has the hook (as for powersgd); trainplan's own executor runs it."""
    from simcore.plan.writers import export_plan

    plan = _plan(method)
    for to in ("megatron", "slurm", "deepspeed", "torchtitan", "torchtitan-0.2", "maxtext"):
        with pytest.raises(ValueError, match=f"training.grad_compression.*{method}") as err:
            export_plan(plan, to)
        assert err.value.args[0].count(". ") == 0 and "\n" not in err.value.args[0], err.value.args[0]
    assert "trainplan" in export_plan(plan, "slurm-trainplan")


def test_error_feedback_costs_kernels_and_memory_and_moves_the_same_bytes():
    """int8_ef is int8 plus its errors: the same calls, more kernel time, 4 bytes a parameter and 4 / W
    more kept (``ddp_hooks.ef_error_bytes``, ``memory.comm_buffer_terms``); it cannot be faster."""
    from simcore.model.params import param_counts

    plain, fed = _plan("int8", 2), _plan("int8_ef", 2)
    a, b = simulate(plain), simulate(fed)
    assert b.step_time_s > a.step_time_s and b.memory_per_gpu_gib > a.memory_per_gpu_gib
    extra = b.memory_bytes["comm_buffers"] - a.memory_bytes["comm_buffers"]   # no TP or PP: every parameter
    assert extra == pytest.approx(4 * param_counts(plain.model).total * (1 + 1 / 16), rel=1e-6)
    assert hooks.bucket_collectives("int8_ef", [(10_000,)], 1, 4, 4) == hooks.bucket_collectives("int8", [(10_000,)], 1, 4, 4)
    k, g = hooks.int8_layout(10_000, 4)
    assert hooks.ef_error_bytes(10_000, 4) == 4 * (4 * k * g + k * g)
