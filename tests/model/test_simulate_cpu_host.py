"""A calibrated CPU host's step costs (``cluster: {node: localhost}``, the committed test
profile): the executor's parameter tensors and host optimizer, pipeline send calls and
hand-over waits, the measured per-chunk, checkpointing and wrapper costs, DDP's lone calls
and its wait for the last rank."""
import dataclasses

import pytest

from simcore.engine import analytic as ana
from simcore.model import collectives as coll
from simcore.model import dp_costs as dpm
from simcore.model import end_comm as ec
from simcore.model import layer_comm as lcm
from simcore.model import layer_times as lt
from simcore.model import step_costs as sim
from simcore.plan.load import plan_from_dict
from tests.model.test_simulate_analytic import plan


def _tiny(**par):
    doc = {"model": {"name": "tiny", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32,
                     "tied_embeddings": False},
           "cluster": {"node": "localhost", "gpus_per_node": 4}, "parallel": {"dp": 1, **par},
           "training": {"global_batch": 8, "micro_batch": 1, "precision": "fp32"}}
    return plan_from_dict(doc)


def test_executor_parameter_tensors_plain_and_dtensor():
    # per layer 2 norms + wq, wk, wv, wo + w1, w2; token and position embeddings; final norm, output
    assert dpm.param_tensors(_tiny(dp=2), 0) == (4 * 8 + 4, 0)
    assert dpm.param_tensors(_tiny(dp=2, zero=3), 0) == (0, 36)            # FSDP2: all DTensor
    assert dpm.param_tensors(_tiny(tp=2), 0) == (4 * 2 + 1 + 1, 4 * 6 + 2)  # TP splits the matrices
    assert dpm.param_tensors(_tiny(tp=2, sequence_parallel=True), 0) == (1, 35)
    assert dpm.param_tensors(_tiny(pp=2), 0) == (2 * 8 + 2, 0)
    assert dpm.param_tensors(_tiny(pp=2), 1) == (2 * 8 + 2, 0)


def test_host_optimizer_is_per_tensor_plus_bytes():
    from simcore.model import compute as cmp
    from simcore.model import memory as mem

    p = _tiny(dp=2)
    dev = cmp.device_model(p.cluster.node.gpu, "fp32")
    sp = mem.stage_params(p)[0]
    want = 36 * dev.optimizer_per_tensor_kernels * dev.host_overhead_s + sp.total * 4 / dev.optimizer_bytes_per_s
    assert dev.optimizer_bytes_per_s > 0
    assert sim.step_costs(p).optimizer_per_step_s[0] == pytest.approx(want)
    z1 = sim.step_costs(_tiny(dp=2, zero=1))   # ZeroRedundancyOptimizer: half the tensors, half the bytes
    assert z1.optimizer_per_step_s[0] == pytest.approx(want / 2)


def test_cpu_pipeline_send_and_hand_over_block_sender_and_receiver():
    from simcore.model import compute as cmp

    p = _tiny(pp=2)
    dev = cmp.device_model(p.cluster.node.gpu, "fp32")
    snd, rcv = dev.p2p_send_s, dev.busy_p2p_latency_s
    assert snd > 0 and rcv > 0   # the calibrated profile has both
    c = sim.step_costs(p)
    # stage 0 sends activations and receives gradients, stage 1 the reverse: per micro-batch
    assert [x for v in (0, 1) for x in c.host_p2p_s(v, True)] == pytest.approx([snd, 0.0, 0.0, rcv])
    assert [x for v in (0, 1) for x in c.host_p2p_s(v, False)] == pytest.approx([0.0, rcv, snd, 0.0])
    assert c.forward_comm_s == pytest.approx((0.0, 0.0))   # no TP: no blocking layer comm
    act = coll.comm_act_bytes(p.training.precision) * 1 * 32 * 64   # fp32 messages
    bus = p.cluster.node.gpu.intra_link_bytes_per_s * dev.nvlink_efficiency
    assert c.p2p_s == pytest.approx(dev.p2p_wake_s + act / bus)
    # interleaved: 4 virtual stages, the first receives no activation and the last sends none
    v = sim.step_costs(_tiny(pp=2, vpp=2, schedule="interleaved-1f1b"))
    assert v.forward_send_s == pytest.approx((snd,) * 3 + (0.0,))
    assert v.forward_recv_wait_s == pytest.approx((0.0,) + (rcv,) * 3)
    assert v.backward_send_s == pytest.approx((0.0,) + (snd,) * 3)
    assert v.backward_recv_wait_s == pytest.approx((rcv,) * 3 + (0.0,))


def test_cpu_pipeline_receive_wait_is_bubble_and_the_send_call_is_comm():
    # the executor does not draw receives: a rank waiting for its input is idle (bubble);
    # the sender's blocking send call is drawn as pipeline comm. The simulator counts both
    # alike, on both paths, and the wait still takes time.
    from simcore.engine.des import simulate_des

    p = _tiny(pp=2)
    c = sim.step_costs(p)
    snd, rcv = c.host_p2p_s(0, True)[0], c.host_p2p_s(1, True)[1]
    m = p.num_microbatches
    for res in (ana.analytic(c), simulate_des(c)):
        assert res.time_s["pp_wait"] == pytest.approx(m * rcv)      # each rank receives m messages
        assert res.bubble_s >= m * rcv
        without = dataclasses.replace(c, forward_recv_wait_s=(), backward_recv_wait_s=())
        again = ana.analytic(without) if res.source == "analytic" else simulate_des(without)
        assert res.step_time_s > again.step_time_s
        if res.source == "analytic":
            assert res.exposed_comm_s == pytest.approx(again.exposed_comm_s)
        else:   # the shifted timeline overlaps the transfers differently, but the waits are not comm
            assert res.exposed_comm_s < again.exposed_comm_s + m * rcv / 2
    des = simulate_des(c)
    waits = [s for s in des.spans if s.stream == "wait"]
    assert waits and all(s.kind == "recv" for s in waits)
    sends = [s for s in des.spans if s.stream == "pp" and s.kind == "send" and s.duration_s == pytest.approx(snd)]
    assert len(sends) == 2 * m                                     # one blocking call per message


def test_analytic_moves_a_fused_receive_post_from_the_wait_to_pipeline_comm():
    # 1F1B, pp=2, m=8: stage 0 sends F1..F7 with the posts of B0..B6's receives, stage 1
    # B0..B6 with F1..F7's (schedules.fused_p2p): 7 posts a step on each rank, each taken
    # off a receive wait. The closed form adds no overlap, so the step does not move.
    p = _tiny(pp=2)
    c = sim.step_costs(p)
    wait = c.host_p2p_s(1, True)[1]   # one receive's hand-over wait
    post = 0.25 * wait
    base, fused = ana.analytic(c), ana.analytic(dataclasses.replace(c, p2p_post_s=post))
    assert p.num_microbatches == 8
    assert fused.time_s["pp_comm"] == pytest.approx(base.time_s["pp_comm"] + 7 * post)
    assert fused.time_s["pp_wait"] == pytest.approx(base.time_s["pp_wait"] - 7 * post)
    assert fused.step_time_s == pytest.approx(base.step_time_s)
    # a post longer than the wait it belongs to takes only the wait off
    big = ana.analytic(dataclasses.replace(c, p2p_post_s=2 * wait))
    assert big.time_s["pp_wait"] == pytest.approx(base.time_s["pp_wait"] - 7 * wait)
    # GPipe posts every receive alone
    g = sim.step_costs(_tiny(pp=2, schedule="gpipe"))
    assert ana.analytic(dataclasses.replace(g, p2p_post_s=post)).time_s == pytest.approx(ana.analytic(g).time_s)




def test_ddp_under_pipelining_holds_the_send_only_where_the_executor_runs():
    # trainplan's executor (torch.distributed.pipelining + DDP) sends a stage's last input
    # gradient after DDP's reduction: modelled on a calibrated profile, for DDP layouts
    assert sim.step_costs(_tiny(dp=2, pp=2)).grad_sync_holds_send
    assert sim.step_costs(_tiny(dp=2, pp=2, zero=1)).grad_sync_holds_send
    assert not sim.step_costs(_tiny(dp=2, pp=2, zero=2)).grad_sync_holds_send   # FSDP2
    assert not sim.step_costs(_tiny(pp=2)).grad_sync_holds_send                # nothing to reduce
    assert not sim.step_costs(_tiny(dp=2)).grad_sync_holds_send                # no pipeline
    # catalog hardware keeps the reduction off the pipeline, as the published Megatron-LM runs do
    assert not sim.step_costs(plan(parallel={"tp": 8, "pp": 12, "dp": 16})).grad_sync_holds_send
    c = sim.step_costs(_tiny(dp=2, pp=2))
    free = dataclasses.replace(c, grad_sync_holds_send=False)
    tail = ana._reduce_tail_s(c, 1)          # stage 1's reduction left after its last backward
    assert tail > 0
    assert ana.analytic(c).step_time_s == pytest.approx(ana.analytic(free).step_time_s + tail)


def test_cpu_pipeline_chunk_cost_is_added_per_virtual_stage():
    from simcore.model import compute as cmp

    p = _tiny(pp=2)
    dev = cmp.device_model(p.cluster.node.gpu, "fp32")
    cf, cb = dev.parallel_extra_s("pipeline_chunk")
    m, tr = p.model, p.training
    f, bi, _, _, _ = lt.layer_times(m, 1, 32, 1, 1, 1, False, tr.flash_attention, tr.recompute, dev)
    c = sim.step_costs(p)
    assert c.forward_s[0] == pytest.approx(2 * f + cf)          # two layers and one chunk's bookkeeping
    assert c.backward_input_s[0] == pytest.approx(2 * bi + cb)
    one = sim.step_costs(_tiny(dp=2))                               # no pipeline: no chunk cost
    dev2 = cmp.device_model(_tiny(dp=2).cluster.node.gpu, "fp32")
    f2 = lt.layer_times(m, 1, 32, 1, 1, 1, False, tr.flash_attention, tr.recompute, dev2)[0]
    assert one.forward_s[0] == pytest.approx(4 * f2 + lt.logits_times(m, 1, 32, 1, dev2)[0])


def test_cpu_checkpointing_host_cost_is_added_per_layer():
    import dataclasses

    from simcore.model import compute as cmp
    from simcore.plan.spec import Recompute

    plain = _tiny(dp=2)
    dev = cmp.device_model(plain.cluster.node.gpu, "fp32")
    for mode in (Recompute.FULL, Recompute.SELECTIVE):
        p = dataclasses.replace(plain, training=dataclasses.replace(plain.training, recompute=mode))
        af, ab = dev.parallel_extra_s(f"recompute_{mode.value}")
        assert af > 0 and ab > 0     # the shipped test profile measured both
        m, tr = p.model, p.training
        rc = lt.layer_times(m, 1, 32, 1, 1, 1, False, tr.flash_attention, mode, dev)[3]
        c, c0 = sim.step_costs(p), sim.step_costs(plain)
        assert c.forward_s[0] == pytest.approx(c0.forward_s[0] + 4 * af)     # four layers, one stage
        assert c.recompute_s[0] == pytest.approx(4 * (rc + ab))


def test_cpu_model_ends_wrapper_cost_sits_on_the_stages_holding_them():
    # TP splits the embedding and the output projection too; FSDP2 shards each pipeline
    # rank's model as one root group: the calibrated per-micro-batch cost of each end is
    # added once, to the virtual stage that holds it, beside the per-layer TP cost (its
    # communication share as blocking comm; the rest is host compute, tested below)
    from simcore.model import compute as cmp

    def ends(p):
        dev = cmp.device_model(p.cluster.node.gpu, "fp32")
        c, lc = sim.step_costs(p), lcm.layer_comm(p, dev)
        f = [x - n * lc["tp_f"] for x, n in zip(c.forward_comm_s, c.layers)]
        b = [x - n * lc["tp_b"] for x, n in zip(c.backward_comm_s, c.layers)]
        return dev, f, b

    def comm(dev, mode):   # the measured cost's comm share, and the ends' collectives' bytes (end_comm)
        (f, b), part = dev.parallel_split_s(mode)[0], mode.rsplit("_", 1)[1]
        if part not in ("embed", "head"):
            return f, b
        wire = ec.tp_ends_s(plans[-1], dev)[part == "head"]
        return f + wire[0], b + wire[1]

    plans = [_tiny(tp=2)]
    dev, f, b = ends(plans[-1])
    for mode in ("tp", "tp_sp"):
        for part in ("embed", "head"):
            assert sum(dev.parallel_extra_s(f"{mode}_{part}")) > 0   # the shipped test profile measured it
    (ef, eb), (hf, hb) = comm(dev, "tp_embed"), comm(dev, "tp_head")
    assert f == pytest.approx([ef + hf]) and b == pytest.approx([eb + hb])
    plans.append(_tiny(tp=2, sequence_parallel=True))
    dev, f, b = ends(plans[-1])
    (ef, eb), (hf, hb) = comm(dev, "tp_sp_embed"), comm(dev, "tp_sp_head")
    assert f == pytest.approx([ef + hf]) and b == pytest.approx([eb + hb])
    # two stages: the embedding's cost on the first, the head's on the last
    plans.append(_tiny(tp=2, pp=2))
    dev, f, b = ends(plans[-1])
    (ef, eb), (hf, hb) = comm(dev, "tp_embed"), comm(dev, "tp_head")
    assert f == pytest.approx([ef, hf]) and b == pytest.approx([eb, hb])
    # FSDP2: ZeRO-3's root group once per micro-batch, ZeRO-2's its own; plain DP adds none
    for zero, mode in ((3, "fsdp_zero3_root"), (2, "fsdp_zero2_root")):
        p = _tiny(dp=2, zero=zero)
        dev = cmp.device_model(p.cluster.node.gpu, "fp32")
        lf, lb = comm(dev, mode.replace("_root", ""))
        rf, rb = comm(dev, mode)
        assert rf + rb > 0
        c = sim.step_costs(p)
        assert c.forward_comm_s == pytest.approx((4 * lf + rf,))
        assert c.backward_comm_s == pytest.approx((4 * lb + rb,))
    assert sim.step_costs(_tiny(dp=2)).forward_comm_s == pytest.approx((0.0,))


@pytest.mark.parametrize("over", [dict(tp=2), dict(tp=2, sequence_parallel=True), dict(dp=2, zero=2),
                                  dict(dp=2, zero=3), dict(tp=2, pp=2)])
def test_cpu_wrapper_cost_splits_into_comm_and_host_compute_as_a_run_measures_it(over, monkeypatch):
    # the profile's comm_share says how much of a wrapper's extra time a run's recorder sees
    # inside collectives; the rest (DTensor dispatch, FSDP2's hooks) is host compute. The
    # split moves time between compute and exposed comm, never the step time.
    from simcore.model import compute as cmp

    p = _tiny(**over)
    dev = cmp.device_model(p.cluster.node.gpu, "fp32")
    mode = "tp_sp" if over.get("sequence_parallel") else "tp" if "tp" in over else f"fsdp_zero{over['zero']}"
    (cf, cb), (hf, hb) = dev.parallel_split_s(mode)
    (tf, tb), share = dev.parallel_extra_s(mode), dict((n, (x, y)) for n, x, y in dev.parallel_comm_share)[mode]
    assert 0 < share[0] < 1 and 0 < share[1] < 1          # the shipped test profile measured one
    assert (cf, cb, hf, hb) == pytest.approx((tf * share[0], tb * share[1], tf * (1 - share[0]), tb * (1 - share[1])))
    assert dev.parallel_split_s(f"{mode}_{'root' if 'fsdp' in mode else 'head'}")[0][0] == pytest.approx(
        dev.parallel_extra_s(f"{mode}_{'root' if 'fsdp' in mode else 'head'}")[0] * share[0])   # an end takes its wrapper's
    all_comm = dataclasses.replace(dev, parallel_comm_share=())
    assert all_comm.parallel_split_s(mode) == ((tf, tb), (0.0, 0.0))   # no share measured: all comm

    split = sim.step_costs(p)
    monkeypatch.setattr(cmp, "device_model", lambda *a, **k: all_comm)
    whole = sim.step_costs(p)
    for v in range(len(split.layers)):
        moved_f = whole.forward_comm_s[v] - split.forward_comm_s[v]
        moved_b = whole.backward_comm_s[v] - split.backward_comm_s[v]
        assert moved_f > 0 and moved_b > 0
        assert split.forward_s[v] - whole.forward_s[v] == pytest.approx(moved_f)
        assert split.backward_input_s[v] - whole.backward_input_s[v] == pytest.approx(moved_b)
    from simcore.engine.des import simulate_des

    for run in (ana.analytic, simulate_des):
        a, b = run(split), run(whole)
        assert a.step_time_s == pytest.approx(b.step_time_s)
        assert a.compute_s > b.compute_s and a.exposed_comm_s < b.exposed_comm_s


def test_cpu_ddp_all_reduce_and_zero1_broadcasts_are_lone_calls():
    # on a calibrated CPU host DDP's gradient all-reduce is one lone call per bucket (gloo's
    # threads wake for it) plus the ring's bytes; ZeRO-1 keeps DDP and adds one lone
    # broadcast per rank and the broadcast bytes
    import math

    from simcore.model import compute as cmp
    from simcore.model import memory as mem

    p = _tiny(dp=2)
    dev = cmp.device_model(p.cluster.node.gpu, "fp32")
    assert dev.lone_all_reduce_s > 0 and dev.lone_broadcast_s > 0   # the shipped test profile measured both
    params = mem.stage_params(p)[0].total
    net = coll.group_net(p.cluster, dev, 2, 1)
    wire = 4 * params / net.bus_bytes_per_s          # 2 (n-1)/n of the fp32 gradients, n = 2
    buckets = math.ceil(4 * params / mem.DDP_BUCKET_BYTES)
    def dp_costs(q):
        return dpm.dp_costs(q, dev, mem.stage_params(q)[0], sum(mem.layer_params_per_gpu(q)))

    assert dp_costs(p)["grad"] == pytest.approx(buckets * dev.lone_all_reduce_s + wire)
    assert dp_costs(_tiny(dp=2, zero=1))["grad"] == pytest.approx(dp_costs(p)["grad"])
    z1 = sim.step_costs(_tiny(dp=2, zero=1))
    assert z1.param_sync_per_step_s[0] == pytest.approx(2 * dev.lone_broadcast_s + 0.5 * 4 * params / net.bus_bytes_per_s)


def test_cpu_ddp_sync_waits_for_the_last_rank_by_the_measured_fraction():
    import dataclasses
    import json

    from simcore.model import compute as cmp

    p = _tiny(dp=2)
    dev = cmp.device_model(p.cluster.node.gpu, "fp32")
    assert dev.dp_sync_wait > 0   # the shipped test profile measured it for 2 ranks
    # the same plan with the wait taken out of its profile
    eff = json.loads(p.cluster.node.gpu.efficiency_json)
    eff["dp_sync_wait"] = 0.0
    gpu = dataclasses.replace(p.cluster.node.gpu, efficiency_json=json.dumps(eff))
    q = dataclasses.replace(p, cluster=dataclasses.replace(p.cluster, node=dataclasses.replace(p.cluster.node, gpu=gpu)))
    c, c0 = sim.step_costs(p), sim.step_costs(q)
    busy = p.num_microbatches * (c.forward_s[0] + c.backward_s(0) + c.forward_comm_s[0] + c.backward_comm_s[0]) \
        + c.optimizer_per_step_s[0]
    assert c.grad_reduce_per_step_s[0] == pytest.approx(c0.grad_reduce_per_step_s[0] + dev.dp_sync_wait * busy)
    # FSDP2 (ZeRO-3) syncs every layer inside its measured wrapper cost: no step-level wait
    z3 = _tiny(dp=2, zero=3)
    from simcore.model import memory as mem

    root_rs = ec.fsdp_root_s(z3, dev, mem.stage_params(z3)[0])[1]   # the root group's bytes (its calls: measured)
    assert sim.step_costs(z3).grad_reduce_per_step_s[0] == pytest.approx(
        z3.num_microbatches * (4 * sim.step_costs(z3).time_detail_s["fsdp_layer_reduce_scatter_s"] + root_rs))


def test_cpu_ring_exchange_is_not_charged_twice():
    # the ring probe's measured layer cost holds each exchange's latency: with it, the model adds
    # only the bytes' term; without it, a point-to-point hop (never a collective's base latency)
    from simcore.model import compute as cmp
    from simcore.model import workload as wl

    p = _tiny(cp=2)
    dev = cmp.device_model(p.cluster.node.gpu, "fp32")
    probed = dataclasses.replace(dev, parallel_kernels=(*dev.parallel_kernels, ("cp", 40.0, 60.0)))
    bare = dataclasses.replace(dev, parallel_kernels=tuple(k for k in dev.parallel_kernels if k[0] != "cp"))
    net = coll.group_net(p.cluster, dev, 2, 1)
    kv = 2 * coll.comm_act_bytes(p.training.precision) * 1 * 16 * wl.kv_width(p.model)
    assert lcm.cp_comm(p, probed, 1, 16)["cp"] == pytest.approx(kv / net.bus_bytes_per_s)
    assert lcm.cp_comm(p, bare, 1, 16)["cp"] == pytest.approx(net.intra_hop_s + kv / net.bus_bytes_per_s)
    assert net.base_latency_s > net.intra_hop_s   # the collective's alpha would have been the larger charge


def test_cpu_expert_all_to_all_is_not_charged_twice():
    # the EP probe's measured layer cost holds its four all-to-alls' latency and dispatch: with
    # it, the model adds only their bytes' term; without it (a GPU), the whole all-to-all
    from simcore.model import compute as cmp

    p = plan_from_dict({"model": {"name": "tiny-moe", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256,
                                  "seq_len": 32, "tied_embeddings": False, "experts": 4, "top_k": 2},
                        "cluster": {"node": "localhost", "gpus_per_node": 4}, "parallel": {"dp": 2, "ep": 2},
                        "training": {"global_batch": 8, "micro_batch": 1, "precision": "fp32"}})
    dev = cmp.device_model(p.cluster.node.gpu, "fp32")
    probed = dataclasses.replace(dev, parallel_kernels=(*dev.parallel_kernels, ("ep", 40.0, 60.0)))
    bare = dataclasses.replace(dev, parallel_kernels=tuple(k for k in dev.parallel_kernels if k[0] != "ep"))
    net = coll.group_net(p.cluster, dev, 2, 1)
    routed = coll.comm_act_bytes(p.training.precision) * 32 * 64 * p.model.top_k * p.model.capacity_factor
    assert lcm.layer_comm(p, probed)["ep_f"] == pytest.approx(2 * 0.5 * routed / net.bus_bytes_per_s)
    assert lcm.layer_comm(p, bare)["ep_f"] == pytest.approx(2 * coll.all_to_all_s(routed, net))
    assert lcm.layer_comm(p, bare)["ep_f"] > 2 * net.base_latency_s   # what the probe's cost holds already
