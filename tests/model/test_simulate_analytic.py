"""The analytic path: bubbles, MFU convention, overlap, offload, errors, JSON schema
(a calibrated CPU host's costs: test_simulate_cpu_host.py)."""
import dataclasses

import pytest

from simcore.engine import analytic as ana
from simcore.engine.predict import simulate
from simcore.model import step_costs as sim
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError


def plan(**over):
    doc = {"model": "gpt3-175b", "cluster": {"node": "dgx-a100-80gb", "nodes": 192},
           "parallel": {"tp": 8, "pp": 12, "dp": 16, "zero": 1},
           "training": {"global_batch": 1536, "micro_batch": 1, "recompute": "full"}}
    for sec, fields in over.items():
        doc[sec] = {**doc[sec], **fields}
    return plan_from_dict(doc)


def test_json_has_the_contract_fields():
    out = simulate(plan()).to_json()
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu", "hfu",
                "compute_s", "exposed_comm_s", "bubble_s", "offload_s", "memory_per_gpu_gib", "fits", "breakdown"):
        assert key in out
    assert set(out["breakdown"]["memory_bytes"]) == {"weights", "gradients", "optimizer_states", "activations",
                                                     "comm_buffers", "framework"}
    r = simulate(plan())
    assert r.step_time_s == pytest.approx(r.compute_s + r.exposed_comm_s + r.bubble_s + r.offload_s)


def test_mfu_uses_model_flops_and_hfu_recompute():
    r = simulate(plan())
    c = sim.step_costs(plan())
    assert r.mfu == pytest.approx(c.model_flops_per_step / r.step_time_s / 1536 / 312e12)
    assert r.hfu / r.mfu == pytest.approx(c.hardware_flops_per_step / c.model_flops_per_step)
    assert 0.3 < r.mfu < 0.6   # published GPT-3 175B Megatron runs on A100: 40-50% (Narayanan et al.)


def test_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    p = plan(parallel={"zero": 0, "dp": 16})
    c = sim.step_costs(p)
    # strip everything but the uniform stages: no logits, no DP, no p2p
    n = c.stages
    c = dataclasses.replace(c, forward_s=(c.forward_s[0],) * n, backward_input_s=(c.backward_input_s[0],) * n,
                            backward_weight_s=(c.backward_weight_s[0],) * n, p2p_s=0.0,
                            forward_comm_s=(c.forward_comm_s[1],) * n, backward_comm_s=(c.backward_comm_s[1],) * n,
                            grad_reduce_per_step_s=(0.0,) * n, optimizer_per_step_s=(0.0,) * n)
    r = ana.analytic(c)
    m, pp = p.num_microbatches, 12
    assert r.bubble_s / (r.step_time_s - r.offload_s) == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-9)


def test_interleaving_shrinks_the_bubble_by_vpp():
    a = simulate(plan(parallel={"pp": 12}))
    b = simulate(plan(parallel={"pp": 12, "vpp": 2, "schedule": "interleaved-1f1b"}))
    assert b.bubble_s == pytest.approx(a.bubble_s / 2, rel=0.05)


def test_zero_bubble_beats_1f1b():
    a = simulate(plan())
    z = simulate(plan(parallel={"schedule": "zero-bubble"}))
    assert z.bubble_s < a.bubble_s


def test_recompute_costs_time_and_saves_memory():
    full = simulate(plan())
    sel = simulate(plan(training={"recompute": "selective"}))
    assert sel.step_time_s < full.step_time_s
    assert sel.memory_per_gpu_gib > full.memory_per_gpu_gib


def test_slower_fabric_exposes_more_dp_comm():
    fast = simulate(plan(parallel={"tp": 8, "pp": 1, "dp": 192, "zero": 0}, training={"micro_batch": 8,
                                                                                           "global_batch": 1536}))
    slow = simulate(plan(cluster={"fabric": "eth-100"}, parallel={"tp": 8, "pp": 1, "dp": 192, "zero": 0},
                             training={"micro_batch": 8}))
    assert slow.exposed_comm_s > fast.exposed_comm_s


def test_grad_compression_cuts_exposed_dp_comm():
    base = dict(cluster={"fabric": "eth-100"}, parallel={"tp": 8, "pp": 1, "dp": 192, "zero": 0})
    plain = simulate(plan(**base))
    comp = simulate(plan(**base, training={"grad_compression": "bf16"}))
    assert comp.time_s["dp_comm"] < plain.time_s["dp_comm"]


def test_offload_reports_host_time_and_memory():
    p = plan(parallel={"zero": 1}, training={"offload": "optimizer"})
    r = simulate(p)
    assert r.offload_s > 0 and r.memory_bytes["optimizer_states"] == 0
    rep = sim.memory_report(p)
    assert rep["host_offload_bytes_per_node"] > 0 and len(rep["ranks"]) == 12


def test_memory_report_fits_and_hbm():
    rep = sim.memory_report(plan())
    assert rep["fits"] and rep["hbm_bytes"] == 80 * 1024**3
    assert rep["ranks"][0]["activations"] > rep["ranks"][-2]["activations"]


def test_localhost_without_profile_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(tmp_path / "missing.yaml"))
    p = plan_from_dict({"model": {"name": "t", "layers": 2, "hidden": 64, "heads": 4, "vocab": 100, "seq_len": 32},
                        "cluster": {"node": "localhost", "nodes": 1}, "parallel": {"dp": 1},
                        "training": {"global_batch": 1}})
    with pytest.raises(PlanError, match="calibrate"):
        simulate(p)
    with pytest.raises(PlanError, match="calibrate"):
        sim.memory_report(p)


def test_unknown_engine():
    with pytest.raises(ValueError, match="engine"):
        simulate(plan(), engine="magic")


def test_step_costs_shapes():
    c = sim.step_costs(plan(parallel={"pp": 4, "vpp": 3, "schedule": "interleaved-1f1b"}))
    assert c.stages == 12 and sum(c.layers) == 96
    assert c.forward_s[-1] > c.forward_s[0]       # logits on the last virtual stage
    assert c.recompute_s[0] == pytest.approx(c.forward_s[0], rel=0.01)


def test_hidden_fsdp_comm_costs_compute_by_the_interference_factor():
    """FSDP gathers hidden behind compute still cost T (1 - 1/k) of it (k = comm_compute_interference)."""
    p = plan(parallel={"tp": 1, "pp": 1, "dp": 1536, "zero": 3})
    c = sim.step_costs(p)
    k = c.time_detail_s["comm_compute_interference"]
    assert k > 1.0
    none = dataclasses.replace(c, time_detail_s={**c.time_detail_s, "comm_compute_interference": 1.0})
    m = p.num_microbatches
    # per micro-batch: every block's gathers and reduce-scatters and the root group's
    ag, bg, rs = c.forward_gather_s[0], c.backward_gather_s[0], c.grad_reduce_per_step_s[0] / m
    assert ag == pytest.approx(c.layers[0] * c.time_detail_s["fsdp_layer_all_gather_s"], rel=0.05)
    f = c.forward_s[0]
    bwd = c.backward_s(0) + c.recompute_s[0]
    hidden = min(ag, f) + min(bg + rs, bwd)
    extra = ana.analytic(c).exposed_comm_s - ana.analytic(none).exposed_comm_s
    assert extra == pytest.approx(m * hidden * (1 - 1 / k), rel=1e-6)


def test_catalog_pipeline_keeps_asynchronous_sends_and_hop_latency():
    from simcore.model import collectives as coll
    from simcore.model import compute as cmp
    from simcore.model import workload as wl

    p = plan(parallel={"tp": 1, "pp": 12, "dp": 16, "zero": 1})
    dev = cmp.device_model(p.cluster.node.gpu, "bf16")
    assert dev.p2p_send_s == 0.0 and dev.busy_p2p_latency_s == 0.0 and dev.p2p_wake_s == 0.0
    c = sim.step_costs(p)
    assert c.forward_comm_s[-1] == 0.0 and c.backward_comm_s[0] == 0.0   # no TP and no sends
    net = coll.group_net(p.cluster, dev, 2, p.parallel.dp)
    act = wl.ACT_BYTES * 2048 * 12288
    hop = net.inter_hop_s if net.nodes > 1 else net.intra_hop_s
    assert c.p2p_s == pytest.approx(hop + act / net.bus_bytes_per_s)


def test_context_parallel_exchanges_kv_whatever_the_tensor_parallel_size():
    """Ring attention sends the local K/V cp - 1 times a layer, 1/tp of them per rank: with
    tp > 1 too (the TP branch once overwrote the micro-batch size, so cp traffic was 0)."""
    def cp_comm(tp, micro_batch=1):
        plan = plan_from_dict({"model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 2},
                               "parallel": {"tp": tp, "cp": 2, "dp": 8 // tp},
                               "training": {"global_batch": 64, "micro_batch": micro_batch}})
        return sim.step_costs(plan).time_detail_s["cp_comm_per_layer_s"]
    assert cp_comm(1) > 0 and cp_comm(2) > 0 and cp_comm(4) > 0
    assert cp_comm(2, micro_batch=2) > cp_comm(2)
