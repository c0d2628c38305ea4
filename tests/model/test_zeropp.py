"""ZeRO++ (``parallel.zero_quantized_weights``, ``zero_hpz_partition_size``, ``zero_quantized_gradients``)
as DeepSpeed runs it (simcore/model/zeropp.py): what it puts on the wire, the kernels and bytes it
adds, the rules, its ds_config round trip, and that it cannot win for nothing: with communication
free it only adds kernels, and it never beats free communication."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import zeropp as zpp
from simcore.model.dp_costs import rank_costs
from simcore.model.step_costs import memory_report
from simcore.plan.load import plan_from_dict
from simcore.plan.readers import read_deepspeed
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan

ALL = {"zero_quantized_weights": True, "zero_hpz_partition_size": 8, "zero_quantized_gradients": True}


def _plan(nodes=8, fabric=None, model="llama2-13b", **zpp_fields):
    cluster = {"node": "dgx-h100", "nodes": nodes, **({"fabric": fabric} if fabric else {})}
    return plan_from_dict({"model": {"name": model, "seq_len": 4096}, "cluster": cluster,
                           "parallel": {"dp": 8 * nodes, "zero": 3, "zero_impl": "deepspeed", **zpp_fields},
                           "training": {"global_batch": 16 * nodes, "micro_batch": 1, "flash_attention": True,
                                        "recompute": "full"}})


def _dp(plan) -> dict:
    dev = cmp.device_model(plan.cluster.node.gpu, plan.training.precision.value)
    return rank_costs(plan, dev)[1][0][0]


def test_each_switch_cuts_what_it_names_on_a_slow_network():
    """On 100 GbE (the DeepSpeed blog's low-bandwidth case) each switch shortens the step, and all
    three together most; qwZ shortens the forward gathers, hpZ the backward's (inside the node),
    qgZ the reduction."""
    base = _dp(_plan(fabric="eth-100"))
    qw, hp, qg = (_dp(_plan(fabric="eth-100", **{k: v})) for k, v in ALL.items())
    assert qw["layer_ag"] < base["layer_ag"] and qw["layer_rs"] == base["layer_rs"]
    assert hp["layer_ag_b"] < base["layer_ag_b"] and hp["layer_ag"] == base["layer_ag"]
    assert qg["layer_rs"] < base["layer_rs"] and qg["layer_ag"] == base["layer_ag"]
    steps = [simulate(_plan(fabric="eth-100", **f)).step_time_s for f in ({}, *({k: v} for k, v in ALL.items()), ALL)]
    assert all(s < steps[0] for s in steps[1:]) and steps[-1] == min(steps)
    des = [simulate(_plan(fabric="eth-100", **f), engine="des").step_time_s for f in ({}, ALL)]
    assert des[1] == pytest.approx(steps[-1], rel=0.15) and des[1] < 0.6 * des[0]   # the event engine alike


def test_qwz_moves_int8_and_a_scale_per_8000():
    assert zpp.qwz_wire_bytes() == pytest.approx(1 + 4 / 8000)
    assert zpp.gather_bytes(2.0, False) == 2.0


def test_hpz_keeps_a_secondary_partition_in_memory():
    """The secondary copy: the parameters over the hpZ group, 16-bit, or int8 with a scale per
    8,000 with qwZ; what ``trainplan memory`` shows as its ``zeropp`` term."""
    from simcore.model.workload import param_counts

    n = param_counts(_plan().model).total
    term = lambda plan: memory_report(plan)["ranks"][0]["terms"]["zeropp"]   # noqa: E731
    assert term(_plan()) == 0.0
    assert term(_plan(zero_hpz_partition_size=8)) == pytest.approx(2 * n / 8)
    assert term(_plan(zero_hpz_partition_size=8, zero_quantized_weights=True)) == pytest.approx(
        n / 8 * (1 + 4 / 8000) + zpp.buffer_bytes(n / _plan().model.layers, True, False), rel=0.05)
    assert zpp.secondary_bytes(n, 2.0, 1, True) == 0.0


@pytest.mark.parametrize("fields, words", [
    ({"zero_quantized_weights": True, "zero_impl": "fsdp2"}, "needs parallel.zero=3 with parallel.zero_impl=deepspeed"),
    ({"zero_quantized_gradients": True, "zero": 2}, "needs parallel.zero=3"),
    ({"zero_hpz_partition_size": 3}, "does not divide the 64 GPUs"),
])
def test_rules_name_the_field(fields, words):
    with pytest.raises(PlanError, match=words):
        plan_from_dict({"model": "llama2-13b", "cluster": {"node": "dgx-h100", "nodes": 8},
                        "parallel": {"dp": 64, "zero": 3, "zero_impl": "deepspeed", **fields},
                        "training": {"global_batch": 64}})


def test_model_parallelism_and_part_nodes_are_refused():
    with pytest.raises(PlanError, match="needs parallel.tp=pp=cp=1"):
        plan_from_dict({"model": "llama2-13b", "cluster": {"node": "dgx-h100", "nodes": 8},
                        "parallel": {"tp": 2, "dp": 32, "zero": 3, "zero_impl": "deepspeed",
                                     "zero_quantized_weights": True}, "training": {"global_batch": 64}})
    with pytest.raises(PlanError, match="needs whole nodes"):
        plan_from_dict({"model": "llama2-13b", "cluster": {"node": "dgx-h100", "nodes": 2},
                        "parallel": {"dp": 12, "zero": 3, "zero_impl": "deepspeed", "zero_quantized_gradients": True},
                        "training": {"global_batch": 12}})


def test_ds_config_round_trip():
    cfg = json.loads(export_plan(_plan(**ALL), "deepspeed"))
    assert {k: cfg["zero_optimization"][k] for k in ALL} == ALL
    fields = read_deepspeed(json.dumps(cfg)).fields
    assert {k: fields[f"parallel.{k}"] for k in ALL} == ALL
    assert not set(ALL) & set(json.loads(export_plan(_plan(), "deepspeed"))["zero_optimization"])


def test_collectives_say_they_do_not_list_it():
    from simcore.model.collective_plan import expected_calls
    with pytest.raises(ValueError, match="priced .* not listed"):
        expected_calls(_plan(zero_quantized_weights=True), 0)


def _free(monkeypatch):
    for name in ("all_gather_s", "reduce_scatter_s", "all_to_all_s", "all_reduce_s"):
        monkeypatch.setattr(coll, name, lambda *a, **k: 0.0)


@settings(max_examples=12, deadline=None)
@given(nodes=st.sampled_from([2, 4, 8]), fabric=st.sampled_from([None, "eth-100", "ib-hdr"]),
       qw=st.booleans(), hp=st.sampled_from([1, 2, 8, 16]), qg=st.booleans())
def test_it_cannot_win_for_nothing(nodes, fabric, qw, hp, qg):
    """With communication free ZeRO++ only adds its kernels (never faster than ZeRO-3), and it
    never beats ZeRO-3 with free communication; it never saves memory."""
    fields = {"zero_quantized_weights": qw, "zero_hpz_partition_size": hp, "zero_quantized_gradients": qg}
    base, z = _plan(nodes, fabric), _plan(nodes, fabric, **fields)
    t_z = simulate(z).step_time_s
    assert memory_report(z)["max_gpu_bytes"] >= memory_report(base)["max_gpu_bytes"]
    with pytest.MonkeyPatch.context() as mp:
        _free(mp)
        free_base = simulate(_plan(nodes, fabric)).step_time_s
        free_z = simulate(_plan(nodes, fabric, **fields)).step_time_s
    assert free_z >= free_base * (1 - 1e-12)
    assert t_z >= free_base * (1 - 1e-12)
