"""Kineto traces: the reader, the axis map and the per-step breakdown, on real HTA test traces
(tests/runlogs/fixtures/kineto/SOURCES.md) and on broken files."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from simcore.plan.load import plan_from_dict
from simcore.runlogs.base import LogError
from simcore.runlogs.kineto import classify, collective_kind, parse_trace, parse_traces
from reports.trace_steps import AxisMap, measure, measured_result

KINETO = Path(__file__).parent / "fixtures" / "kineto"
DDP = KINETO / "hta_nccl_ddp"
SAMPLED = KINETO / "hta_sampled"


def ddp_plan(**parallel):
    """The DDP trace's job as well as it allows: 2 ranks, A100; model, batch and precision guessed."""
    return plan_from_dict({"name": "hta-ddp", "model": "llama3-8b",
                           "cluster": {"node": "dgx-a100-40gb", "nodes": 1, "gpus_per_node": 2},
                           "parallel": {"dp": 2, "zero": 1, **parallel},
                           "training": {"global_batch": 2, "micro_batch": 1, "precision": "bf16"}}, KINETO)


def sampled_plan():
    """The sampled job: 128 ranks on A100s (from the trace); 16 x 8 GPUs, pure DP and the model guessed."""
    return plan_from_dict({"name": "hta-sampled", "model": "llama3-8b",
                           "cluster": {"node": "dgx-a100-80gb", "nodes": 16},
                           "parallel": {"dp": 128, "zero": 1},
                           "training": {"global_batch": 128, "micro_batch": 1, "precision": "bf16"}}, KINETO)


def test_classes_follow_hta():
    assert classify("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)") == "comm"
    assert classify("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)") == "comm"
    assert classify("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy") == "memory"
    assert classify("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "gemm"
    assert classify("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>(Flash_fwd_params)") == "attention"
    assert classify("void split_embedding_codegen_forward_unweighted_kernel<fbgemm_gpu::FixedDivisor>") == "other"
    assert collective_kind("_allgather_base") == "all_gather"
    assert collective_kind("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)") == "send_recv"
    assert collective_kind("reduce_scatter_tensor_coalesced") == "reduce_scatter"


def test_ddp_trace_kernels_steps_and_groups():
    (t,) = parse_traces(DDP)
    assert (t.rank, t.world, t.device) == (0, 2, "NVIDIA A100-PG509-200")
    assert [s[0] for s in t.steps] == ["ProfilerStep#5", "ProfilerStep#6"]
    comm = [k for k in t.kernels if k.klass == "comm"]
    assert {(k.collective, k.group) for k in comm} == {("all_reduce", (0, 1)), ("broadcast", (0, 1))}
    assert all(k.step for k in t.kernels)
    assert sum(k.klass == "gemm" for k in t.kernels) == 362


def test_ddp_breakdown_adds_up_and_maps_dp():
    traces = parse_traces(DDP)
    rows, spans, axes = measure(traces, ddp_plan())
    assert [r["step"] for r in rows] == ["ProfilerStep#5", "ProfilerStep#6"]
    for r in rows:
        assert r["compute_s"] + r["exposed_comm_s"] + r["bubble_s"] + r["offload_s"] == pytest.approx(r["step_s"])
        assert r["host_gaps_s"] + r["pipeline_idle_s"] == pytest.approx(r["bubble_s"])
        assert r["dp_comm_s"] == pytest.approx(r["dp_exposed_s"] + r["hidden_comm_s"], abs=1e-9)
        assert 0.2 < r["step_s"] < 0.23   # ProfilerStep#5/#6 run 220-225 ms on the CPU
    assert not axes.notes   # every group came with its ranks
    assert {s.stream for s in spans} == {"compute", "dp", "copy"}
    res = measured_result(ddp_plan(), rows, spans, [])
    assert res.source == "measured" and res.time_s["dp_comm"] > 0 and "bubble" in res.time_s


def test_groups_map_to_the_plans_axes():
    plan = plan_from_dict({"name": "g", "model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 2},
                           "parallel": {"tp": 2, "cp": 2, "dp": 2, "pp": 2},
                           "training": {"global_batch": 16, "micro_batch": 1}}, KINETO)
    axes = AxisMap(plan)   # rank = ((pp * dp + dp) * cp + cp) * tp + tp
    assert axes.axis((4, 5), 4, "all_reduce") == "tp"
    assert axes.axis((4, 6), 4, "all_gather") == "cp"
    assert axes.axis((0, 4), 0, "reduce_scatter") == "dp"
    assert axes.axis((1, 9), 1, "send_recv") == "pp"
    assert axes.axis((0, 2, 4, 6), 0, "all_reduce") == "dp"   # dp x cp
    assert not axes.notes
    assert axes.axis(None, 0, "send_recv") == "pp" and len(axes.notes) == 1


def test_two_ranks_without_groups_are_guessed_and_noted():
    traces = parse_traces(SAMPLED)
    assert [t.rank for t in traces] == [0, 1] and traces[0].world == 128
    rows, spans, axes = measure(traces, sampled_plan())
    assert len(rows) == 4 and {s.rank for s in spans} == {0, 1}
    (note,) = axes.notes
    assert "no process group" in note
    res = measured_result(sampled_plan(), rows, spans, [])
    slow = max(r["step_s"] for r in rows if r["step"] == "ProfilerStep#552")
    assert res.step_time_s == pytest.approx((slow + max(r["step_s"] for r in rows if r["step"] == "ProfilerStep#551")) / 2)


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name,data,words", [
    ("empty.json", b"", "empty"),
    ("cut.json", b'{"traceEvents": [{"ph": "X", "name": "ProfilerStep#1", "ts": 1', "truncated"),
    ("foreign.json", b'{"name": "not a trace", "steps": [1, 2]}', "traceEvents"),
    ("prose.json", b"hello, world", "not JSON"),
    ("nosteps.json", json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2}]}).encode(),
     "ProfilerStep"),
    ("cpu.json", json.dumps({"traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1",
                                              "ts": 1, "dur": 2}]}).encode(), "no GPU kernel"),
])
def test_broken_files_get_one_sentence(tmp_path, name, data, words):
    with pytest.raises(LogError) as exc:
        parse_trace(_write(tmp_path / name, data))
    msg = str(exc.value)
    assert words in msg and "\n" not in msg and "Traceback" not in msg


def test_truncated_gzip(tmp_path):
    blob = (DDP / "rank-0.json.gz").read_bytes()
    with pytest.raises(LogError, match="gzip stream is truncated"):
        parse_trace(_write(tmp_path / "cut.json.gz", blob[: len(blob) // 3]))
    assert gzip.decompress(blob)   # the fixture itself is whole


def test_directory_without_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(LogError, match="no \\*.json"):
        parse_traces(tmp_path)
