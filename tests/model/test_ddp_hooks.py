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
@given(compression=st.sampled_from(["fp16", "bf16", "powersgd"]), nodes=st.sampled_from([1, 2, 4]))
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
