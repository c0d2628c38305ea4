"""Weight-only int8 and int4 (W8A16, W4A16): the weights are read at their width (int4 with its
group scales and zero points), the GEMMs still run in 16 bits, so quantized weights speed a
memory-bound decode and never a compute-bound prefill; the KV cache and activations refuse them."""
from __future__ import annotations

import pytest

from simcore.planner.serving_search import capacity_search
from simcore.serving.cost import decode_s, prefill_s, replica_cost, weight_bytes_per_param
from simcore.serving.load import serving_from_dict
from simcore.serving.spec import PlanError, SloSpec


def plan(weights="bf16", model="llama3-70b", tp=4, **precision):
    return serving_from_dict({"model": model, "hardware": {"node": "dgx-h100"}, "parallel": {"tp": tp},
                              "precision": {"weights": weights, **precision},
                              "traffic": {"arrival": "offline", "num_requests": 10, "prompt_len": 1024,
                                          "output_len": 64}})


def test_int4_weights_are_half_a_byte_and_their_groups_scales_and_zeros():
    assert weight_bytes_per_param(plan("int4")) == 0.5 + (2 + 0.5) / 128
    assert weight_bytes_per_param(plan("int4", group_size=64)) == 0.5 + (2 + 0.5) / 64
    assert weight_bytes_per_param(plan("int8")) == 1.0


def test_weight_only_speeds_decode_and_never_a_compute_bound_prefill():
    rcs = {w: replica_cost(plan(w)) for w in ("bf16", "int8", "int4")}
    for seqs in (1, 16, 64):
        steps = [decode_s(rcs[w], seqs, 2048) for w in ("bf16", "int8", "int4")]
        assert steps == sorted(steps, reverse=True) and steps[2] < steps[0]
    # 8k prompt tokens: compute-bound, and the GEMMs are the same 16-bit GEMMs
    assert prefill_s(rcs["int4"], 8192) == pytest.approx(prefill_s(rcs["bf16"], 8192), rel=1e-12)
    assert rcs["int4"].kv_blocks > rcs["int8"].kv_blocks > rcs["bf16"].kv_blocks   # the room the weights free


@pytest.mark.parametrize("precision, sentence", [
    ({"weights": "bf16", "activations": "int8"},
     "precision.activations=int8 is a weight-only format; activations take bf16, fp16 or fp8"),
    ({"weights": "bf16", "kv_cache": "int4"},
     "precision.kv_cache=int4 is a weight-only format; kv_cache take bf16, fp16 or fp8"),
    ({"weights": "int4", "activations": "fp8"},
     "precision.weights=int4 is weight-only (W4A16): precision.activations must be bf16 or fp16"),
])
def test_a_weight_only_format_elsewhere_is_one_sentence(precision, sentence):
    with pytest.raises(PlanError) as exc:
        plan(**precision)
    assert str(exc.value) == sentence


def test_a_group_that_does_not_divide_the_inputs_is_refused():
    with pytest.raises(PlanError, match=r"precision.group_size=96 does not divide model.hidden = 8192"):
        plan("int4", group_size=96)


def test_the_capacity_search_ranks_weight_only_only_when_named():
    base = plan(model="llama3-8b", tp=1)
    kw = dict(slo=SloSpec(tpot_s=0.05), rate=2.0, gpus=["h100-sxm"], tps=[1])
    assert {o.precision for o in capacity_search(base, **kw).options} == {"bf16", "fp8"}
    named = capacity_search(base, precisions=["bf16", "w4a16"], **kw)
    assert {o.precision for o in named.options} == {"bf16", "w4a16"} and all(o.met for o in named.options)
