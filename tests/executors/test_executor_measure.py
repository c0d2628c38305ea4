"""Recording and measurement (executors/record.py, executors/measure.py), launch and
checkpoint (executors/launch.py, executors/checkpoint.py): hand-worked spans and bytes,
then the tiny plan end to end."""
from __future__ import annotations

import gc
import json
import os
import time

import pytest
import torch
import torch.testing  # noqa: F401  (imported before ranks fork)

from executors import launch, measure, parallel, procs, record  # noqa: F401
from executors.model import build_model
from simcore.plan.load import load_plan, plan_from_dict
from simcore.results import GIB, Span, split_step

PLAN = "plans/tiny-localhost.yaml"


def test_blocking_collectives_are_cut_out_of_compute():
    rec = record.Recorder(rank=0)
    rec.spans = [("compute", "forward", "F0", 0.0, 1.0, 0.0), ("tp", "all_reduce", "ar", 0.2, 0.5, 64.0),
                 ("dp", "all_reduce", "ar", 0.9, 1.4, 64.0)]
    rec.blocking = [(0.2, 0.5)]
    spans = rec.step_spans()
    assert [(s.stream, s.start_s, s.end_s) for s in spans] == [
        ("compute", 0.0, 0.2), ("compute", 0.5, 1.0), ("tp", 0.2, 0.5), ("dp", 0.9, 1.4)]
    # compute 0.7, exposed: the blocking TP 0.3 and the DP tail 0.4; idle 1.4..1.5 is bubble
    parts = split_step(spans, 0, 0.0, 1.5)
    assert parts == pytest.approx({"compute_s": 0.7, "exposed_comm_s": 0.7, "offload_s": 0.0, "bubble_s": 0.1})


def test_the_awaited_tail_of_asynchronous_collectives_is_cut_out_of_compute():
    # DDP issues a bucket's all-reduce as its gradients are ready and backward waits for all
    # of them before it returns: the host waits from the last call to the last completion
    rec = record.Recorder(rank=0)
    rec.spans = [("compute", "backward", "B0", 0.0, 1.0, 0.0), ("compute", "optimizer", "opt", 1.3, 1.5, 0.0)]
    rec.comm("all_reduce", "dp", 64.0, 0.3, 0.5, blocking=False)    # bucket 1, done while computing
    rec.comm("all_reduce", "dp", 64.0, 0.8, 0.95, blocking=False)   # the last bucket: awaited
    rec.comm("send", "pp", 64.0, 0.6, 0.7, blocking=False)          # a pipeline send is never awaited here
    rec.comm("all_reduce", "dp", 64.0, 0.9, 1.2, blocking=False)    # outlives the span: not awaited by it
    assert rec.awaited() == [(0.8, 0.95)]
    compute = [(s.start_s, s.end_s) for s in rec.step_spans() if s.stream == "compute"]
    assert compute == [(0.0, 0.8), (0.95, 1.0), (1.3, 1.5)]
    parts = split_step(rec.step_spans(), 0, 0.0, 1.5)
    # exposed: the awaited 0.15 and the all-reduce that ran past backward, 1.0..1.2
    assert parts == pytest.approx({"compute_s": 1.05, "exposed_comm_s": 0.35, "offload_s": 0.0, "bubble_s": 0.1})


def test_parameters_the_tracker_does_not_own_are_kept_apart_from_activations():
    # FSDP2's unsharded parameters are not the (sharded) parameters the tracker was given;
    # a linear saves the transposed view of one: counted under unsharded_peak, not peak
    owned, unsharded = torch.nn.Parameter(torch.randn(8)), torch.nn.Parameter(torch.randn(16, 8))
    acts = measure.SavedActivations([owned])
    x = torch.randn(4, 8, requires_grad=True)
    with acts.hooks():
        loss = torch.nn.functional.linear(x, unsharded).sum()
    assert (acts.peak, acts.unsharded_peak) == (4 * 8 * 4, 16 * 8 * 4)
    loss.backward()
    del loss
    assert acts.current["unsharded"] == 0 and acts.current["activations"] == 0


def test_saved_activations_peak_and_release():
    w = torch.nn.Parameter(torch.randn(8, 8))
    acts = measure.SavedActivations([w])
    x = torch.randn(4, 8, requires_grad=True)
    with acts.hooks():
        y = torch.exp(x @ w)  # matmul saves x (128 B) and w (a parameter: not counted); exp saves y (128 B)
        loss = y.sum()
    assert acts.peak == 2 * 4 * 8 * 4
    loss.backward()
    del loss, y
    assert sum(acts.current.values()) == 0


def test_state_bytes_of_adamw_are_exact():
    model = build_model(plan_from_dict({"model": {"name": "m", "layers": 1, "hidden": 8, "heads": 2, "vocab": 16,
                                                  "seq_len": 4}, "cluster": {"node": "localhost"}, "parallel": {"dp": 1},
                                        "training": {"global_batch": 1}}).model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    got = measure.state_bytes([model], opt)
    # fp32 weights and grads; AdamW keeps exp_avg and exp_avg_sq (fp32) and a 4-byte step per tensor
    assert got == {"weights": 4 * n, "gradients": 4 * n, "optimizer_states": 8 * n + 4 * tensors}


def _record(rank, durations, spans):
    return {"rank": rank, "losses": [1.0] * len(durations), "device": "cpu", "host": "h",
            "memory_bytes": {"weights": 100.0 * (rank + 1), "activations": 10.0},
            "steps": [{"duration_s": d, "spans": s, "counts": {("all_reduce", "dp"): 1}}
                      for d, s in zip(durations, spans)]}


def test_summarise_takes_the_slowest_rank_of_each_measured_step():
    plan = load_plan(PLAN)
    f = lambda r, a, b: Span(r, "compute", "forward", "F0", a, b - a)  # noqa: E731
    r0 = _record(0, [9.0, 1.0, 2.0], [[f(0, 0, 9)], [f(0, 0.0, 1.0)], [f(0, 0.0, 1.0)]])
    r1 = _record(1, [9.0, 0.5, 4.0], [[f(1, 0, 9)], [f(1, 0.0, 0.5)], [f(1, 0.0, 3.0)]])
    m = measure.summarise(plan, [r0, r1], warmup=1)
    assert m.step_time_s == pytest.approx((1.0 + 4.0) / 2)  # warm-up step 0 discarded
    assert m.compute_s == pytest.approx((1.0 + 3.0) / 2) and m.bubble_s == pytest.approx(0.5)
    assert m.compute_s + m.exposed_comm_s + m.bubble_s + m.offload_s == pytest.approx(m.step_time_s)
    assert m.memory_bytes["weights"] == 200.0 and m.memory_per_gpu_gib == pytest.approx(210 / GIB)
    assert m.extra["calls.all_reduce.dp"] == 2.0  # both ranks, one step
    assert m.tokens_per_s == pytest.approx(8 * 32 / 2.5)


def test_summarise_times_the_bare_steps_and_scales_the_recorded_phases_to_them():
    # measured steps alternate recorded (spans) and bare (none): the step time is the bare
    # steps', the phases the recorded steps' scaled to it, so they still add up to the step
    plan = load_plan(PLAN)
    f = lambda r, a, b: Span(r, "compute", "forward", "F0", a, b - a)  # noqa: E731
    recs = []
    for r in range(2):
        rec = _record(r, [9.0, 2.2, 2.0, 1.8, 2.0], [[f(r, 0, 9)], [f(r, 0, 1.1)], [], [f(r, 0, 0.9)], []])
        for i, st in enumerate(rec["steps"]):
            st["instrumented"] = i in (0, 1, 3)
        recs.append(rec)
    m = measure.summarise(plan, recs, warmup=1)
    assert m.step_time_s == pytest.approx(2.0)              # the bare steps 2 and 4
    assert m.compute_s == pytest.approx(1.0 * 2.0 / 2.0) and m.bubble_s == pytest.approx(1.0)
    assert m.compute_s + m.exposed_comm_s + m.bubble_s + m.offload_s == pytest.approx(m.step_time_s)
    assert m.time_s["forward"] == pytest.approx(1.0)        # the spans themselves are not scaled
    assert m.extra["recorder_overhead"] == pytest.approx(0.0)
    recs[0]["steps"][1]["duration_s"] = recs[1]["steps"][1]["duration_s"] = 2.6   # recording cost 10%
    m = measure.summarise(plan, recs, warmup=1)
    assert m.extra["recorder_overhead"] == pytest.approx(0.1) and m.step_time_s == pytest.approx(2.0)
    assert "2 bare give the step time" in m.notes[0]


def _sleepy(rank, world, device):
    if rank == 1:
        time.sleep(60)
    return rank


def _broken(rank, world, device):
    if rank == 1:
        raise RuntimeError("disk on fire")
    torch.distributed.barrier()  # rank 0 waits for rank 1 forever: the launcher must end it


def test_a_hung_or_failed_rank_ends_the_run_with_its_name():
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 stopped making progress: no heartbeat for \d+ s"):
        procs.spawn(_sleepy, 2, timeout_s=3, start_method="fork")
    assert time.monotonic() - t < 55   # ended by the watchdog, not by the end of its 60 s sleep
    # the failed rank is named at once: left to the 30 s timeout, the watchdog would name rank 0
    with pytest.raises(RuntimeError, match="rank 1 failed: RuntimeError: disk on fire"):
        procs.spawn(_broken, 2, timeout_s=30, start_method="fork")


class _FuturelessWork:
    """A work whose ``get_future`` raises, as gloo's point-to-point works do."""
    asked = 0

    def get_future(self):
        type(self).asked += 1
        raise RuntimeError("Work::getFuture not implemented.")


def test_a_work_kind_without_futures_is_asked_once():
    done = []
    for i in range(3):
        record._on_done(_FuturelessWork(), lambda i=i: done.append(i), ("p2p", "a test backend"))
    assert done == [0, 1, 2] and _FuturelessWork.asked == 1   # each send done at once, asked once
    fut = torch.futures.Future()

    class Work:
        def get_future(self):
            return fut
    record._on_done(Work(), lambda: done.append("later"), ("p2p", "a test backend with futures"))
    assert done == [0, 1, 2]
    fut.set_result(None)
    assert done == [0, 1, 2, "later"]


_INHERITED = [["a container the ranks inherit"]]


def _collector_view(rank, world, device):
    """Whether this rank's garbage collector tracks (and so walks) an object of its parent."""
    return gc.get_freeze_count(), any(o is _INHERITED for o in gc.get_objects())


def test_forked_ranks_leave_the_inherited_heap_to_the_parent():
    # a full collection in a forked rank would walk (and copy) the whole inherited heap:
    # 260-300 ms stalls inside measured steps on the 2-core host
    assert gc.get_freeze_count() == 0 and any(o is _INHERITED for o in gc.get_objects())
    for frozen, tracked in procs.spawn(_collector_view, 2, timeout_s=60, start_method="fork"):
        assert frozen > 0 and not tracked
    assert gc.get_freeze_count() == 0   # the parent's objects are collectable again


def _transport_policies(rank, world, device, plan):
    """The scheduling policy of each gloo transport thread and of the rank's own thread,
    after the rank joined the default group and built the plan's mesh."""
    parallel.build_mesh(plan, device.type)
    return [os.sched_getscheduler(t) for t in procs.gloo_transport_threads()], os.sched_getscheduler(0)


def test_gloo_transport_threads_run_only_on_free_cores():
    plan = plan_from_dict({"model": {"name": "m", "layers": 2, "hidden": 32, "heads": 2, "vocab": 64, "seq_len": 8},
                           "cluster": {"node": "localhost", "gpus_per_node": 2},
                           "parallel": {"dp": 1, "pp": 2}, "training": {"global_batch": 2}})
    for transport, own in procs.spawn(_transport_policies, 2, (plan,), timeout_s=60, start_method="fork"):
        # one thread for the default group and one per mesh group, none left at the default policy
        assert len(transport) >= 2 and set(transport) == {os.SCHED_IDLE}
        assert own == os.SCHED_OTHER


def _trainer_transport_policies(rank, world, device, plan):
    """The same after the rank also built its trainer, which makes the layout's groups beyond
    the mesh (dp x cp flattened, the embedding group, the expert groups)."""
    mesh = parallel.build_mesh(plan, device.type)
    parallel.build_trainer(plan, mesh, device)
    return [os.sched_getscheduler(t) for t in procs.gloo_transport_threads()]


@pytest.mark.parametrize("layout", [{"parallel": {"dp": 2, "ep": 2}, "model": {"experts": 4, "top_k": 2}},
                                    {"parallel": {"dp": 1, "pp": 2}, "model": {"tied_embeddings": True}}],
                         ids=["ep2-dp2", "tied-pp2"])
def test_the_layouts_own_groups_leave_the_cores_to_the_ranks_too(layout):
    # the expert and embedding groups are made after the mesh: their transport threads left
    # at the default policy polled a core away from the ranks (ep2-dp2 measured 76-86 ms a
    # step with them, 39-43 ms without, on the 2-core host)
    model = {"name": "m", "layers": 2, "hidden": 32, "heads": 2, "vocab": 64, "seq_len": 8,
             "tied_embeddings": False, **layout["model"]}
    plan = plan_from_dict({"model": model, "cluster": {"node": "localhost", "gpus_per_node": 2},
                           "parallel": layout["parallel"], "training": {"global_batch": 4}})
    for transport in procs.spawn(_trainer_transport_policies, 2, (plan,), timeout_s=60, start_method="fork"):
        assert len(transport) >= 3 and set(transport) == {os.SCHED_IDLE}


@pytest.mark.slow
def test_tiny_plan_end_to_end(tmp_path):
    plan = load_plan(PLAN)
    trace = tmp_path / "measured.json"
    m = launch.run(plan, steps=4, warmup=1, trace_path=trace, timeout_s=120, start_method="fork")
    assert m.source == "measured" and m.step_time_s > 0
    assert m.compute_s + m.exposed_comm_s + m.bubble_s + m.offload_s == pytest.approx(m.step_time_s, rel=1e-9)
    assert m.compute_s > 0 and m.bubble_s > 0  # two pipeline stages: stage 1 waits for stage 0
    # 4 micro-batches per data-parallel rank: each stage sends 4 tensors per step
    assert m.extra["calls.send.pp"] == 4 * 4 and m.extra["calls.all_reduce.dp"] == 4
    # DDP's one bucket all-reduce per rank is awaited inside the last backward: the compute
    # span stops where it is called (the host's wait is exposed comm, not compute)
    for rank in range(4):
        (ar,) = [s for s in m.spans if s.rank == rank and s.kind == "all_reduce"]
        assert ar.start_s in {s.end_s for s in m.spans if s.rank == rank and s.stream == "compute"}
    # pipeline stage 0 holds tok (256x64) + pos (32x64) + 2 blocks of 49280 parameters, fp32
    assert m.memory_bytes["weights"] == 4 * (256 * 64 + 32 * 64 + 2 * 49280)
    assert m.memory_bytes["gradients"] == m.memory_bytes["weights"]
    assert m.memory_bytes["activations"] > 0 and len(m.memory_per_rank_gib) == 4
    assert {s.rank for s in m.spans} == {0, 1, 2, 3}
    names = {s.name for s in m.spans if s.rank == 0 and s.stream == "compute"}
    assert {"0F0", "0F3", "0B0", "0B3", "optimizer"} <= names
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in events) == len(m.spans)


@pytest.mark.slow
def test_resume_continues_the_same_loss_trajectory(tmp_path):
    doc = {"model": {"name": "r", "layers": 2, "hidden": 32, "heads": 4, "vocab": 64, "seq_len": 16,
                     "tied_embeddings": False},
           "cluster": {"node": "localhost", "gpus_per_node": 2}, "training": {"global_batch": 4}}
    for parallel_ in ({"dp": 2, "zero": 1}, {"dp": 2, "zero": 3}, {"pp": 2}):
        plan = plan_from_dict({**doc, "parallel": parallel_})
        whole = launch.launch_ranks(plan, launch.RunOptions(steps=4, warmup=0), "fork")[0]["losses"]
        ckpt = tmp_path / "-".join(map(str, parallel_.values()))
        first = launch.launch_ranks(plan, launch.RunOptions(steps=2, warmup=0, checkpoint_dir=str(ckpt)), "fork")
        second = launch.launch_ranks(plan, launch.RunOptions(steps=2, warmup=0, checkpoint_dir=str(ckpt),
                                                             resume=True), "fork")
        assert (ckpt / "latest").read_text().strip() == "step-4"
        assert [s["step"] for s in second[0]["steps"]] == [2, 3]
        assert first[0]["losses"] + second[0]["losses"] == pytest.approx(whole, rel=1e-6), parallel_
        assert whole[3] < whole[0]


def test_dp_sync_wait_is_the_mean_ranks_wait_for_the_last():
    from executors.measure import dp_sync_wait_s
    from simcore.results import Span

    def ar(rank, dur):   # a dp-axis all-reduce span from this rank's launch to the common end
        return Span(rank, "dp", "all_reduce", "all_reduce dp", 1.0 - dur, dur)

    comp = Span(0, "compute", "backward", "B3", 0.0, 0.9)
    # rank 1 arrived last (its call took 1 ms, the transfer alone); rank 0 waited 5 ms more
    assert dp_sync_wait_s([[comp, ar(0, 6e-3)], [ar(1, 1e-3)]]) == pytest.approx(2.5e-3)
    # four ranks: the mean call 4 ms, the shortest 1 ms
    assert dp_sync_wait_s([[ar(r, d)] for r, d in enumerate((1e-3, 3e-3, 5e-3, 7e-3))]) == pytest.approx(3e-3)
    assert dp_sync_wait_s([[comp], [comp]]) == 0.0 and dp_sync_wait_s([[ar(0, 1e-3)]]) == 0.0
