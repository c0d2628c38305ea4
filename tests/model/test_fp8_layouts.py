"""FP8 GEMM layouts: Hopper's FP8 GEMMs take only TN operands, so Transformer Engine writes a
transposed copy of each per-tensor FP8 tensor (the cast-transpose, the cached weight's
transpose); Blackwell's take any layout and TE keeps the data alone
(transformer_engine/pytorch/utils.py ``is_non_tn_fp8_gemm_supported``, compute capability
10.x-11.x and 13.x on). Block-scaled formats keep both directions everywhere."""
from __future__ import annotations

import pytest

from simcore.model import compute as cmp
from simcore.model import memory as mem
from simcore.model import workload as wl
from simcore.model.layer_comm import layer_comm
from simcore.plan.load import plan_from_dict
from topologies.hardware import load_catalog


def test_which_catalog_gpus_take_any_fp8_layout():
    gpus = load_catalog().gpus
    assert {n for n, g in gpus.items() if g.non_tn_fp8} == {"b200", "gb200", "b300", "gb300"}
    assert gpus["h100-sxm"].compute_capability == 9.0 and gpus["b200"].compute_capability == 10.0
    assert gpus["mi300x"].compute_capability == 0.0   # not a CUDA device


def _plan(node: str, precision: str, recipe: str = "delayed"):
    training = {"global_batch": 64, "micro_batch": 1, "precision": precision}
    if precision == "fp8":
        training["fp8_recipe"] = recipe
    return plan_from_dict({"model": "llama3-70b", "cluster": {"node": node, "nodes": 1},
                           "parallel": {"tp": 8, "dp": 1, "sequence_parallel": True}, "training": training})


@pytest.mark.parametrize("recipe,copies_on_blackwell", [("delayed", 1), ("current", 1), ("tensorwise", 2)])
def test_blackwell_caches_no_fp8_weight_transpose(recipe, copies_on_blackwell):
    hopper, blackwell = _plan("dgx-h100", "fp8", recipe), _plan("dgx-b200", "fp8", recipe)
    held = [mem.stage_params(p)[0] for p in (hopper, blackwell)]
    weights = [mem.comm_buffer_terms(p, sp)["fp8_weights"] for p, sp in zip((hopper, blackwell), held)]
    amax = weights[0] - 2 * (held[0].total - held[0].ends)   # the amax history, the same on both
    assert weights[1] - amax == pytest.approx(copies_on_blackwell * (held[1].total - held[1].ends))
    # MXFP8 keeps its rowwise and columnwise block-scaled copies on Blackwell too
    mx = _plan("dgx-b200", "mxfp8")
    sp = mem.stage_params(mx)[0]
    assert mem.comm_buffer_terms(mx, sp)["fp8_weights"] == pytest.approx(
        2 * wl.quantized_bytes("mxfp8") * (sp.total - sp.ends))


def test_blackwell_casts_write_no_transpose():
    catalog = load_catalog().gpus
    assert not cmp.device_model(catalog["b200"], "fp8", fp8_recipe="current").fp8_transpose
    assert cmp.device_model(catalog["h100-sxm"], "fp8", fp8_recipe="current").fp8_transpose
    assert cmp.device_model(catalog["b200"], "fp8", fp8_recipe="tensorwise").fp8_transpose   # torchao casts as before
    # read 16-bit (2 B), write FP8 once or twice (1 B each), plus the amax pass (2 B): in 16-bit passes
    assert wl.cast_passes("fp8", True, transpose=False) == pytest.approx((2 + 1 + 2) / 2)
    assert wl.cast_passes("fp8", True, transpose=True) == pytest.approx((2 + 2 + 2) / 2)
    assert wl.cast_passes("mxfp8", False, transpose=False) == wl.cast_passes("mxfp8", False, transpose=True)


@pytest.mark.parametrize("precision,recipe,element", [("fp8", "current", 1.0), ("fp8", "delayed", 1.0),
                                                       ("mxfp8", "delayed", 1 + 1 / 32), ("bf16", "delayed", 2.0),
                                                       ("fp8", "tensorwise", 1.0), ("fp8", "rowwise", 2.0)])
def test_sequence_parallel_gathers_quantized_under_transformer_engine(precision, recipe, element):
    # TE's Linear all-gathers its input (and its output gradient) through its quantizer, and
    # torchao's Float8ColwiseParallel casts tensorwise float8 before its all-gather; the
    # reduce-scatters stay 16-bit; torchao's rowwise recipe gathers 16-bit
    from simcore.model import collectives as coll

    plan = _plan("dgx-h100" if precision == "fp8" else "dgx-b200", precision, recipe)
    dev = cmp.device_model(plan.cluster.node.gpu, precision, fp8_recipe=recipe)
    net = coll.group_net(plan.cluster, dev, 8, 1)
    tokens = plan.training.micro_batch * plan.model.seq_len * plan.model.hidden
    assert coll.sp_gather_element_bytes(plan) == pytest.approx(element)
    want = 2 * (coll.all_gather_s(element * tokens, net) + coll.reduce_scatter_s(2 * tokens, net))
    assert layer_comm(plan, dev)["tp_f"] == pytest.approx(want)
