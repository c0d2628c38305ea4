"""1-bit Adam (``training.optimizer: onebit_adam``) as DeepSpeed runs its compression stage
(simcore/model/onebit.py): the signs it puts on the wire, its kernels and error buffers, its
rules, its ds_config round trip, and that it cannot win for nothing: with communication free it
only adds kernels, and it never beats Adam with free communication."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import onebit
from simcore.model.dp_costs import rank_costs
from simcore.model.step_costs import memory_report
from simcore.model.workload import param_counts
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.readers import read_deepspeed
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan


def _plan(optimizer="onebit_adam", nodes=4, fabric="eth-100", model="llama2-7b", **par):
    cluster = {"node": "dgx-h100", "nodes": nodes, **({"fabric": fabric} if fabric else {})}
    return plan_from_dict({"model": {"name": model, "seq_len": 2048}, "cluster": cluster,
                           "parallel": {"dp": 8 * nodes, "zero": 0, **par},
                           "training": {"global_batch": 8 * nodes, "micro_batch": 1, "precision": "fp16",
                                        "optimizer": optimizer, "flash_attention": True, "recompute": "full"}})


def _dp(plan) -> dict:
    dev = cmp.device_model(plan.cluster.node.gpu, plan.training.precision.value)
    return rank_costs(plan, dev)[1][0][0]


def test_the_wire_is_the_packed_signs_and_the_scales():
    plan = _plan()
    dev = cmp.device_model(plan.cluster.node.gpu, "fp16")
    net = coll.group_net(plan.cluster, dev, 32, 1)
    n = 6.7e9
    assert onebit.compressed_allreduce_s(n, net) == pytest.approx(
        coll.all_to_all_s(n / 8, net) + coll.all_gather_s(n / 8, net) + 2 * coll.all_gather_s(4 * 32, net))
    d = _dp(plan)
    assert d["grad"] == 0.0 and d["sync"] > 0     # no gradient all-reduce; the momentum's after the backward


def test_on_a_slow_network_it_shortens_the_step_on_both_engines():
    adam, one = _plan("adam"), _plan()
    for engine in ("analytic", "des"):
        assert simulate(one, engine=engine).step_time_s < 0.7 * simulate(adam, engine=engine).step_time_s


def test_it_keeps_its_error_buffers():
    n = param_counts(_plan().model).total
    terms = lambda plan: memory_report(plan)["ranks"][0]["terms"]   # noqa: E731
    assert "onebit_errors" not in terms(_plan("adam"))
    assert terms(_plan())["onebit_errors"] == pytest.approx(onebit.error_bytes(n, 32), rel=1e-3)
    assert onebit.error_bytes(1000, 32) == 4 * (1024 + 32)   # rounded up to 32 x lcm(32, 8), and 1/32 of it


@pytest.mark.parametrize("par, training, words", [
    ({"zero": 1}, {}, "1bit-Adam is not compatible with ZeRO"),
    ({}, {"grad_compression": "fp16"}, "training.grad_compression=none"),
])
def test_rules_name_the_field(par, training, words):
    with pytest.raises(PlanError, match=words):
        plan_from_dict({"model": "llama2-7b", "cluster": {"node": "dgx-h100", "nodes": 2},
                        "parallel": {"dp": 16, "zero": 0, **par},
                        "training": {"global_batch": 16, "optimizer": "onebit_adam", **training}})


def test_ds_config_round_trip_and_the_executor_and_collectives_refuse():
    cfg = json.loads(export_plan(_plan(), "deepspeed"))
    assert cfg["optimizer"] == {"type": "OneBitAdam", "params": {"freeze_step": 100_000}}
    assert cfg["zero_optimization"]["stage"] == 0
    assert read_deepspeed(json.dumps(cfg)).fields["training.optimizer"] == "onebit_adam"
    bf16 = plan_from_dict({**plan_to_dict(_plan()), "training": {**plan_to_dict(_plan())["training"],
                                                                  "precision": "bf16"}})
    for target in ("megatron", "torchtitan"):   # neither stack has it
        with pytest.raises(ValueError, match="training.optimizer=onebit_adam"):
            export_plan(bf16, target)
    from executors.support import check_executable
    from simcore.model.collective_plan import expected_calls
    with pytest.raises(ValueError, match="onebit_adam is priced, not run"):
        check_executable(_plan(nodes=1, fabric=None), "cuda")
    with pytest.raises(ValueError, match="priced .* not listed"):
        expected_calls(_plan(), 0)


def _free(monkeypatch):
    for name in ("all_gather_s", "reduce_scatter_s", "all_to_all_s", "all_reduce_s"):
        monkeypatch.setattr(coll, name, lambda *a, **k: 0.0)


@settings(max_examples=8, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4]), fabric=st.sampled_from([None, "eth-100", "ib-hdr"]),
       model=st.sampled_from(["llama2-7b", "gpt-1.7b"]))
def test_it_cannot_win_for_nothing(nodes, fabric, model):
    """With communication free 1-bit Adam only adds its kernels (never faster than Adam), and it
    never beats Adam with free communication."""
    t_one = simulate(_plan("onebit_adam", nodes, fabric, model)).step_time_s
    with pytest.MonkeyPatch.context() as mp:
        _free(mp)
        free_adam = simulate(_plan("adam", nodes, fabric, model)).step_time_s
        free_one = simulate(_plan("onebit_adam", nodes, fabric, model)).step_time_s
    assert free_one >= free_adam * (1 - 1e-12)
    assert t_one >= free_adam * (1 - 1e-12)


def test_cost_charges_the_warm_up_as_adam():
    """DeepSpeed runs 1-bit Adam's first freeze_step steps as Adam; the run's time is theirs at
    Adam's step plus the rest at the compressed one."""
    from simcore.planner.runcost import run_cost

    adam, one = _plan("adam"), _plan()
    t_adam, t_one = simulate(adam).step_time_s, simulate(one).step_time_s
    tokens = 300_000 * one.training.global_batch * one.model.seq_len
    rc = run_cost(one, simulate(one), tokens, failures=False, monte_carlo=0)
    assert rc.useful_s == pytest.approx(100_000 * t_adam + 200_000 * t_one, rel=1e-6)
    assert any("first 100,000 steps" in n for n in rc.notes)
    doc = {"model": {"name": "llama2-7b", "seq_len": 2048},
           "cluster": {"node": "dgx-h100", "nodes": 4, "fabric": "eth-100"}, "parallel": {"dp": 32, "zero": 0}}
    none = plan_from_dict({**doc, "training": {"global_batch": 32, "precision": "fp16", "optimizer": "onebit_adam",
                                               "onebit_freeze_step": 0, "flash_attention": True, "recompute": "full"}})
    assert run_cost(none, simulate(none), tokens, failures=False, monte_carlo=0).useful_s == pytest.approx(
        300_000 * t_one, rel=1e-6)
    with pytest.raises(PlanError, match="onebit_freeze_step is 1-bit Adam's warm-up"):
        plan_from_dict({**doc, "training": {"global_batch": 32, "onebit_freeze_step": 10}})
    cfg = json.loads(export_plan(none, "deepspeed"))
    assert cfg["optimizer"]["params"]["freeze_step"] == 0
    assert read_deepspeed(json.dumps(cfg)).fields["training.onebit_freeze_step"] == 0
