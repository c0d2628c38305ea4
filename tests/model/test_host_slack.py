"""Host-bound layers on a GPU: the time the GPU waits for its host to issue the next kernel
holds the NCCL kernels that do not stop the host (TP, CP), never EP's all-to-alls (their
dispatcher synchronises the host), and never on a CPU host, whose gloo calls block."""
from __future__ import annotations

import dataclasses
import unittest.mock as um

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import compute as cmp
from simcore.model import layer_comm as lcm
from simcore.model import layer_times as lt
from simcore.model import step_costs as sim
from simcore.model import workload as wl
from simcore.plan.load import plan_from_dict
from topologies.hardware import load_catalog


def _gpt(hidden=1024, layers=12, tp=4, micro_batch=1, **training):
    """vTrain's small GPTs: Megatron-DeepSpeed, eager, full recompute (host-bound at tp >= 2)."""
    return plan_from_dict({
        "model": {"name": "small", "layers": layers, "hidden": hidden, "heads": 16, "ffn_hidden": 4 * hidden,
                  "vocab": 50304, "seq_len": 1024, "gated_mlp": False, "position_embedding": "learned"},
        "cluster": {"node": "dgx-a100-80gb", "nodes": 1},
        "parallel": {"tp": tp, "dp": 8 // tp},
        "training": {"global_batch": 64, "micro_batch": micro_batch, "precision": "fp16", "recompute": "full",
                     "flash_attention": False, **training}})


def _dev(plan):
    return cmp.device_model(plan.cluster.node.gpu, plan.training.precision.value)


def _ops(plan):
    m, tr, par = plan.model, plan.training, plan.parallel
    return wl.layer_forward_ops(m, b=tr.micro_batch, s=m.seq_len, tp=par.tp, flash=tr.flash_attention)


def test_slack_is_the_host_time_beyond_the_device_time():
    plan = _gpt()
    dev, ops = _dev(plan), _ops(plan)
    f, bi, bw = cmp.ops_time_s(ops, dev)
    sf, sb = cmp.ops_host_slack_s(ops, dev)
    kernels = sum(o.kernels for o in ops)
    assert sf > 0 and sb > 0
    assert f == pytest.approx(kernels * dev.host_overhead_s)   # host-bound: the phase is the host's
    device = sum(cmp.op_forward_s(o, dev) for o in ops) + kernels * dev.kernel_overhead_s
    assert f == pytest.approx(device + sf)


def test_a_device_bound_layer_has_no_slack():
    plan = plan_from_dict({"model": "gpt3-175b", "cluster": {"node": "dgx-a100-80gb", "nodes": 1},
                           "parallel": {"tp": 8}, "training": {"global_batch": 8, "micro_batch": 1}})
    assert cmp.ops_host_slack_s(_ops(plan), _dev(plan)) == (0.0, 0.0)


def test_a_cpu_host_has_no_slack():
    """A serial device (a CPU host: the thread that issues a kernel runs it) never waits for its
    host, whatever the per-kernel costs: its gloo collectives block."""
    dev = cmp.device_model(load_catalog().gpus["h100-sxm"], "bf16")
    serial = dataclasses.replace(dev, dispatch_s=1e-4)
    assert cmp.ops_host_slack_s(_ops(_gpt()), dev) != (0.0, 0.0)
    assert cmp.ops_host_slack_s(_ops(_gpt()), serial) == (0.0, 0.0)


@pytest.mark.parametrize("hidden,tp,micro_batch", [(1024, 2, 1), (1024, 4, 2), (2048, 4, 2), (1024, 8, 1)])
def test_tp_comm_is_exposed_only_beyond_the_hosts_wait(hidden, tp, micro_batch):
    plan = _gpt(hidden=hidden, tp=tp, micro_batch=micro_batch)
    dev, m, par, tr = _dev(plan), plan.model, plan.parallel, plan.training
    lc = lcm.layer_comm(plan, dev)
    sf, sb, sr = lt.layer_slack(m, tr.micro_batch, m.seq_len, par.tp, 1, 1, False, False, tr.recompute, dev)
    assert sf > 0 and lc["tp_f"] > 0
    costs = sim.step_costs(plan)
    with um.patch.object(lt, "layer_slack", return_value=(0.0, 0.0, 0.0)):
        additive = sim.step_costs(plan)
    # forward: TP's two all-reduces; backward: its two and the recomputed forward's two (full recompute)
    hidden_f = additive.forward_comm_s[0] - costs.forward_comm_s[0]
    hidden_b = additive.backward_comm_s[0] - costs.backward_comm_s[0]
    assert hidden_f == pytest.approx(m.layers * min(lc["tp_f"], sf))
    assert hidden_b == pytest.approx(m.layers * min(lc["tp_b"] + lc["tp_f"], sb + sr))
    assert simulate(plan).exposed_comm_s < ana_exposed(additive)


def ana_exposed(costs) -> float:
    from simcore.engine import analytic as ana
    return ana.analytic(costs).exposed_comm_s


@settings(max_examples=25, deadline=None)
@given(hidden=st.sampled_from([1024, 2048, 4096]), tp=st.sampled_from([2, 4, 8]),
       micro_batch=st.sampled_from([1, 2, 4, 8]), layers=st.sampled_from([4, 12, 24]))
def test_tp_comm_never_makes_a_step_faster_nor_costs_more_than_additive(hidden, tp, micro_batch, layers):
    """Hiding in the host's wait is bounded both ways: no faster than the same plan with TP's
    collectives priced at nothing, no slower than device time plus every collective."""
    plan = _gpt(hidden=hidden, layers=layers, tp=tp, micro_batch=micro_batch)
    step = simulate(plan).step_time_s
    real = lcm.layer_comm

    def no_tp(p, d):
        return {**real(p, d), "tp_f": 0.0, "tp_b": 0.0}

    with um.patch.object(lcm, "layer_comm", no_tp):
        free = simulate(plan).step_time_s
    with um.patch.object(lt, "layer_slack", return_value=(0.0, 0.0, 0.0)):
        additive = simulate(plan).step_time_s
    assert free * (1 - 1e-9) <= step <= additive * (1 + 1e-9)


def test_ep_all_to_alls_are_never_hidden_in_the_hosts_wait():
    plan = plan_from_dict({"model": "mixtral-8x7b", "cluster": {"node": "dgx-h100", "nodes": 1},
                           "parallel": {"tp": 1, "ep": 8, "dp": 8}, "training": {"global_batch": 8}})
    dev = _dev(plan)
    lc = lcm.layer_comm(plan, dev)
    assert lc["ep_f"] > 0
    with um.patch.object(lt, "layer_slack", return_value=(1.0, 1.0, 1.0)):   # a wait longer than any collective
        costs = sim.step_costs(plan)
    assert costs.forward_comm_s[0] >= plan.layers_per_stage[0] * lc["ep_f"] * (1 - 1e-9)
