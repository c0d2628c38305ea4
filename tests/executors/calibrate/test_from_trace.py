"""``trainplan calibrate --from-trace``: the fitting arithmetic with hand-worked numbers, the real
HolisticTraceAnalysis trace (tests/runlogs/fixtures/kineto, SOURCES.md there), a two-rank trace
written here with GEMM shapes and NCCL calls whose figures are known, and the refusals."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from executors.calibrate.from_trace import (CollectiveCall, attention_flops, bus_bytes, envelope, fit_alpha_beta,
                                            gemm_flops, judge)
from simcore.model.compute import device_model
from simcore.plan.load import plan_from_dict
from topologies.hardware import load_catalog
from topologies.profile import load_profile
from trainplan.cli import main
from trainplan.commands_calibrate_trace import calibrate_from_traces
from trainplan.common import UsageError

KINETO = Path(__file__).parents[2] / "runlogs" / "fixtures" / "kineto"
A100_BF16 = 312e12


def plan(gpus=2, **parallel):
    return plan_from_dict({"name": "traced", "model": "llama3-8b",
                           "cluster": {"node": "dgx-a100-40gb", "nodes": 1, "gpus_per_node": gpus},
                           "parallel": parallel or {"dp": gpus},
                           "training": {"global_batch": gpus, "micro_batch": 1, "precision": "bf16"}}, KINETO)


def test_bus_factors_are_nccl_performance_md():
    assert bus_bytes("all_reduce", 4, 1000) == 1500          # 2(n-1)/n
    assert bus_bytes("reduce_scatter", 4, 1000) == 750       # (n-1)/n of the full input
    assert bus_bytes("all_gather", 4, 1000) == 3000          # the shard is 1/n of the buffer: (n-1)/n x 4000
    assert bus_bytes("broadcast", 4, 1000) == 1000


def test_alpha_beta_fit_by_hand():
    # t = 10 us + x / (100 GB/s): 1 MB -> 20 us, 2 MB -> 30 us, 4 MB -> 50 us
    a, c, res = fit_alpha_beta([(1e6, 20e-6), (2e6, 30e-6), (4e6, 50e-6)])
    assert a == pytest.approx(10e-6) and 1 / c == pytest.approx(100e9) and res < 1e-9
    # one 20% high point of three: the fit moves, and says so in its residual
    assert fit_alpha_beta([(1e6, 20e-6), (2e6, 36e-6), (4e6, 50e-6)])[2] > 0.05


def test_a_call_counts_with_its_last_arriving_rank_and_a_size_with_its_fastest_call():
    calls = [CollectiveCall("all_reduce", (0, 1), 0, "ProfilerStep#1", 0, 4e6, 2e-3),   # rank 0 waited
             CollectiveCall("all_reduce", (0, 1), 1, "ProfilerStep#1", 0, 4e6, 60e-6),
             CollectiveCall("all_reduce", (0, 1), 0, "ProfilerStep#2", 0, 4e6, 70e-6)]
    assert envelope(calls) == [(4e6, 60e-6)]   # bus bytes of 2 ranks: 2(n-1)/n = 1


def test_judge_refuses_wait_small_messages_and_scatter():
    pts = [(8e6, 2.5e-3), (3e7, 2.7e-3)]
    lat, bw, why = judge(pts, 2.0e-3, 2e-11, 0.05, model_latency_s=40e-6, link_bytes_per_s=300e9, largest_bytes=3e7)
    assert not lat and not bw and "wait" in why[0] and "mostly latency or wait" in why[1]
    lat, bw, why = judge([(424, 7.6e-6), (2e5, 30e-6)], 7.6e-6, 1e-10, 0.0, model_latency_s=35e-6,
                         link_bytes_per_s=300e9, largest_bytes=2e5)
    assert lat and not bw and "below the 16 MiB" in why[0]
    assert judge(pts, 1e-5, 1e-11, 0.4, model_latency_s=40e-6, link_bytes_per_s=300e9, largest_bytes=3e7)[:2] \
        == (False, False)


def test_gemm_and_attention_flops_from_input_dims():
    assert gemm_flops("aten::mm", [[4096, 1024], [1024, 2048]]) == 2 * 4096 * 1024 * 2048
    assert gemm_flops("aten::addmm", [[2048], [4096, 1024], [1024, 2048], [], []]) == 2 * 4096 * 1024 * 2048
    assert gemm_flops("aten::bmm", [[8, 128, 64], [8, 64, 256]]) == 2 * 8 * 128 * 64 * 256
    assert gemm_flops("aten::mm", [[4, 5], [6, 7]]) == 0.0
    q = [2, 16, 2048, 128]
    causal = 4 * 2 * 16 * 2048 * 2048 * 128 / 2
    assert attention_flops("aten::_scaled_dot_product_flash_attention", [q, q, q]) == ("forward", causal)
    full = attention_flops("aten::_scaled_dot_product_flash_attention", [q, q, q], ["", "", "", "0.", "False"])
    assert full == ("forward", 2 * causal)
    assert attention_flops("aten::_scaled_dot_product_flash_attention_backward",
                           [q, q, q, q]) == ("backward", 2.5 * causal)


def test_the_hta_ddp_trace_determines_no_figure_and_says_why():
    """The real trace: rank 0 of 2 (A100, DDP). Its all-reduces take 2.0-6.0 ms whatever their size
    (8-32 MB): its kernels hold the wait for rank 1, whose trace is not there."""
    prof = calibrate_from_traces(plan(), KINETO / "hta_nccl_ddp")
    ft = prof["from_trace"]
    assert ft["fitted"] == {}
    fits = {f["collective"]: f for f in ft["collective_fits"]}
    ar, bc = fits["all_reduce"], fits["broadcast"]
    assert (ar["kernels"], ar["sizes"], ar["ranks_traced"]) == (10, 5, 1)
    assert ar["latency_s"] == pytest.approx(2.069e-3, rel=1e-3) and ar["residual"] == pytest.approx(0.0771, abs=1e-3)
    assert not ar["latency_determined"] and not ar["bandwidth_determined"]
    assert (bc["kernels"], bc["sizes"]) == (4, 2) and bc["latency_determined"] and not bc["bandwidth_determined"]
    assert bc["latency_s"] == pytest.approx(7.605e-6, rel=1e-3)
    assert "wait" in ft["kept_from_catalog"]["efficiency.collective.base_latency_us"]
    assert "broadcast on 2 ranks 7.6 us" in ft["kept_from_catalog"]["efficiency.collective.base_latency_us"]
    assert "Input Dims" in ft["kept_from_catalog"]["efficiency.matmul.points"]
    assert prof["efficiency"] == load_catalog().efficiency["a100-40gb"]


# ---- a trace written here: two ranks, GEMMs with shapes, NCCL all-reduces at 80% of NVLink ----

def _trace(rank: int, world: int = 2, group=(0, 1), wait_s: float = 0.0, gemms=True) -> dict:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1e6}]
    xid = 100

    def launch(name, dur_us, args, ts):
        nonlocal xid
        xid += 1
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2,
                       "args": {"correlation": xid, "External id": xid}})
        events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts + 5, "dur": dur_us,
                       "args": {"correlation": xid, "External id": xid, "stream": 7, **args}})
        return xid

    ts = 10.0
    for m, eff in ((4096, 0.6), (1024, 0.3)) if gemms else ():
        flops = 2.0 * m ** 3
        x = launch("sm80_xmma_gemm_bf16bf16_bf16f32", flops / (eff * A100_BF16) * 1e6, {}, ts)
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": ts - 1, "dur": 4,
                       "args": {"External id": x, "Input Dims": [[m, m], [m, m]],
                                "Input type": ["c10::BFloat16", "c10::BFloat16"]}})
        ts += 2000
    for nbytes in (4096, 32 * 2**20, 64 * 2**20, 128 * 2**20):   # t = 20 us + bytes / (0.8 x 300 GB/s)
        t = 20e-6 + nbytes / 240e9 + wait_s
        launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", t * 1e6,
               {"Collective name": "allreduce", "In msg nelems": nbytes // 2, "dtype": "BFloat16",
                "Process Group Ranks": str(list(group))}, ts)
        ts += 5000
    return {"traceEvents": events, "distributedInfo": {"rank": rank, "world_size": world},
            "deviceProperties": [{"name": "NVIDIA A100-SXM4-40GB"}]}


def _write(tmp_path, docs) -> Path:
    d = tmp_path / "traces"
    d.mkdir()
    for r, doc in enumerate(docs):
        (d / f"rank-{r}.json").write_text(json.dumps(doc))
    return d


def test_known_figures_come_back_and_the_profile_loads(tmp_path):
    d = _write(tmp_path, [_trace(0, wait_s=3e-3), _trace(1)])   # rank 0 waited 3 ms on every call
    prof = calibrate_from_traces(plan(), d)
    fitted = prof["from_trace"]["fitted"]
    assert fitted["efficiency.collective.nvlink_efficiency"]["value"] == pytest.approx(0.8, rel=1e-3)
    lat = fitted["efficiency.collective.base_latency_us"]
    assert lat["value"] == pytest.approx(20 - 2 * 3.4, rel=1e-3) and lat["kernels"] == 8 and lat["residual"] < 1e-6
    mm = fitted["efficiency.matmul.points"]
    assert mm["kernels"] == 4 and mm["residual"] < 1e-6
    points = dict(map(tuple, mm["value"]))
    assert points[2.0 * 4096 ** 3] == pytest.approx(0.6) and points[2.0 * 1024 ** 3] == pytest.approx(0.3)
    assert 1e6 in points and 1e12 in points   # the catalog's, outside the range seen
    out = tmp_path / "a100.yaml"
    out.write_text(yaml.safe_dump(prof))
    cat = load_catalog()
    node = load_profile(out, cat.nodes["localhost"], cat.gpus)
    dev = device_model(node.gpu, "bf16")
    assert dev.nvlink_efficiency == pytest.approx(0.8, rel=1e-3) and dev.peak_flops == A100_BF16
    assert dev.matmul.at(2.0 * 4096 ** 3) == pytest.approx(0.6)
    assert dev.kernel_overhead_s == cat.efficiency["a100-40gb"]["kernel_overhead_us"] * 1e-6   # kept


def test_a_trace_of_another_layout_is_refused_in_one_sentence(tmp_path):
    d = _write(tmp_path, [_trace(0, world=4, group=(0, 1, 2), gemms=False)])
    with pytest.raises(UsageError, match=r"not a run of --plan traced's layout: a group of ranks \[0, 1, 2\]"):
        calibrate_from_traces(plan(4, tp=2, dp=2), d)
    with pytest.raises(UsageError, match="is a run of 4 ranks, not of --plan traced's 2 GPUs"):
        calibrate_from_traces(plan(), d)


def test_cli_writes_the_profile_and_refuses_a_log(tmp_path, capsys):
    d = _write(tmp_path, [_trace(0), _trace(1)])
    pfile = tmp_path / "plan.yaml"
    pfile.write_text(yaml.safe_dump({"name": "traced", "model": "llama3-8b",
                                     "cluster": {"node": "dgx-a100-40gb", "nodes": 1, "gpus_per_node": 2},
                                     "parallel": {"dp": 2},
                                     "training": {"global_batch": 2, "micro_batch": 1, "precision": "bf16"}}))
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "--from-trace", str(d), "--plan", str(pfile), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fitted efficiency.collective.nvlink_efficiency: 0.76 -> 0.8" in text and out.exists()
    assert "kept efficiency.kernel_overhead_us" in text
    for argv, said in ((["--from-log", "x.log", "--plan", str(pfile)], "determine no single figure"),
                       (["--from-trace", str(d)], "needs --plan"),
                       (["--from-trace", str(d), "--from-run", "r.json", "--plan", str(pfile)], "give one")):
        assert main(["calibrate", *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1


def test_a_fitted_profile_runs_on_the_catalog_node_of_its_gpu(tmp_path):
    """The profile a cluster's traces give is a Plan's ``cluster.profile`` on the catalog's node of
    that GPU, at any size: its fitted figures price the plan, the datasheet and links stay the
    catalog's; a profile of another GPU, or none at the path, is one sentence."""
    from simcore.engine.predict import simulate
    from simcore.plan.spec import PlanError

    out = tmp_path / "a100.yaml"
    out.write_text(yaml.safe_dump(calibrate_from_traces(plan(), _write(tmp_path, [_trace(0), _trace(1)]))))
    doc = {"name": "cluster", "model": "llama3-8b", "cluster": {"node": "dgx-a100-40gb", "nodes": 4},
           "parallel": {"tp": 8, "dp": 4}, "training": {"global_batch": 32, "micro_batch": 1, "precision": "bf16"}}
    catalog_plan = plan_from_dict(doc, tmp_path)
    fitted_plan = plan_from_dict({**doc, "cluster": {**doc["cluster"], "profile": str(out)}}, tmp_path)
    dev, cat_dev = device_model(fitted_plan.cluster.node.gpu, "bf16"), device_model(catalog_plan.cluster.node.gpu, "bf16")
    assert dev.nvlink_efficiency == pytest.approx(0.8, rel=1e-3) != cat_dev.nvlink_efficiency
    assert dev.matmul.at(2.0 * 4096 ** 3) == pytest.approx(0.6) and dev.peak_flops == cat_dev.peak_flops
    assert fitted_plan.cluster.node.gpu.intra_link_bytes_per_s == catalog_plan.cluster.node.gpu.intra_link_bytes_per_s
    assert simulate(fitted_plan).step_time_s != pytest.approx(simulate(catalog_plan).step_time_s, rel=1e-6)
    again = tmp_path / "again"
    again.mkdir()
    traced = plan_from_dict({"name": "traced", "model": "llama3-8b", "parallel": {"dp": 2},
                             "cluster": {"node": "dgx-a100-40gb", "nodes": 1, "gpus_per_node": 2, "profile": str(out)},
                             "training": {"global_batch": 2, "micro_batch": 1, "precision": "bf16"}}, tmp_path)
    refit = calibrate_from_traces(traced, _write(again, [_trace(0), _trace(1)]))   # a plan on it refits from the catalog
    assert refit["from_trace"]["fitted"]["efficiency.collective.nvlink_efficiency"]["catalog"] == \
        load_catalog().efficiency["a100-40gb"]["collective"]["nvlink_efficiency"]
    with pytest.raises(PlanError, match=r"is of GPU a100-40gb, not of the node's h100-sxm"):
        plan_from_dict({**doc, "cluster": {"node": "dgx-h100", "nodes": 4, "profile": str(out)}}, tmp_path)
    with pytest.raises(PlanError, match="does not exist"):
        plan_from_dict({**doc, "cluster": {**doc["cluster"], "profile": str(tmp_path / "none.yaml")}}, tmp_path)
