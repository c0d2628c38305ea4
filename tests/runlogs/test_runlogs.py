"""The log readers on real excerpts (tests/runlogs/fixtures/SOURCES.md) and `trainplan compare`."""
from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from simcore.runlogs import LogError, parse_path, summarize
from simcore.runlogs.torchtitan import mesh_layout
from trainplan.cli import main

FIX = Path(__file__).parent / "fixtures"
PLAN = str(Path(__file__).resolve().parents[2] / "plans" / "llama3-8b-fsdp-h100.yaml")


def one(name):
    logs = parse_path(FIX / name)
    assert len(logs) == 1
    return logs[0], summarize(logs[0])


def test_golden_values_median_by_hand():
    log, s = one("golden_values_dev_dgx_h100.json")
    # steps 1 and 5 dropped (<= 10% of step 50); the median of steps 10..50 by hand
    kept = [0.08878, 0.08692, 0.08664, 0.0863, 0.08732, 0.08763, 0.08674, 0.087, 0.08652]
    assert s["kept"] == 9 and s["step_s"] == statistics.median(kept) == 0.08692
    assert s["peak_memory_bytes"] == 3637371904.0


def test_megatron_text_log_and_arguments():
    log, s = one("megatron_swift_qwen2_0.5b.log")
    assert s["entries"] == 12 and s["kept"] == 11     # iteration 10 (8195.9 ms, the first) dropped
    assert s["step_s"] == pytest.approx(0.7198)       # median of 786.2 ... 717.2 ms
    assert s["peak_memory_bytes"] == pytest.approx(7959.9697265625 * 2**20)
    assert log.layout == {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": 2, "vpp": 1, "micro_batch": 1,
                          "global_batch": 8, "seq_len": 128, "layers": 24, "gpus": 2}


def test_megatron_throughput_line():
    _, s = one("megatron_issue756_mixtral.log")
    assert s["step_s"] == pytest.approx((5.4707 + 5.8299) / 2)
    assert s["tflops_per_gpu"] == pytest.approx((238.7 + 224.0) / 2)


def test_torchtitan_metrics_and_colours():
    log, s = one("torchtitan_pr1287.log")
    assert s["tokens_per_s_per_gpu"] == 5864 and s["mfu"] == pytest.approx(0.3434)
    assert s["peak_memory_bytes"] == pytest.approx(49.66 * 2**30)


def test_torchtitan_colour_codes_stripped(tmp_path):
    text = (FIX / "torchtitan_pr1287.log").read_text()
    coloured = text.replace("step:", "\x1b[31mstep:").replace("tps:", "\x1b[34mtps:").replace("%", "%\x1b[39m")
    (tmp_path / "c.log").write_text(coloured)
    assert summarize(parse_path(tmp_path / "c.log")[0])["tokens_per_s_per_gpu"] == 5864


def test_torchtitan_mesh_line():
    assert mesh_layout("pp=1, dp_replicate=1, dp_shard=8, cp=1, tp=2, ep=1, etp=1") == \
        {"pp": 1, "cp": 1, "tp": 2, "ep": 1, "dp": 8}
    # HSDP: the replicas are kept, so that compare checks them against the Plan's dp_replicate
    assert mesh_layout("pp=1, dp_replicate=2, dp_shard=4, cp=1, tp=1, ep=1, etp=1")["dp_replicate"] == 2
    assert "dp_replicate" not in mesh_layout("pp=1, dp_replicate=8, dp_shard=1, cp=1, tp=1")   # DDP


def test_compare_names_a_replica_count_the_plan_lacks():
    from simcore.plan.load import plan_from_dict
    from trainplan.commands_compare import layout_differences
    plan = plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                           "parallel": {"dp": 8, "zero": 3}, "training": {"global_batch": 8, "micro_batch": 1}})
    assert layout_differences(plan, {"dp": 8, "dp_replicate": 2}) == ["dp_replicate: log 2, plan 1"]


def test_deepspeed_timer_and_megatron_deepspeed():
    log, s = one("deepspeed_issue1825.log")
    assert s["samples_per_s"] == pytest.approx((83.48609168106144 + 83.73838805358588) / 2)
    assert s["peak_memory_bytes"] == pytest.approx(9.02 * 2**30)
    log, s = one("deepspeed_issue3742.log")
    assert log.stack == "Megatron-DeepSpeed" and s["step_s"] == pytest.approx(4.1031)
    assert s["tflops_per_gpu"] == 112.9 and s["peak_memory_bytes"] == pytest.approx(63.31 * 2**30)


def test_hf_trainer_results():
    _, s = one("hf_train_results.json")
    assert s["step_s"] == pytest.approx(1 / 0.081) and s["samples_per_s"] == 10.388


def test_mlperf_blocks():
    log, s = one("mlperf_v4.0_nvidia_eos_n64_gpt3_result_0.txt")
    assert log.layout == {"global_batch": 2304, "seq_len": 2048}
    assert s["entries"] == 6 and s["kept"] == 5
    assert 10.8 < s["step_s"] < 11.0
    assert any("run_start..run_stop" in n for n in log.notes)


def test_composer_console_blocks():
    """llm-foundry on 2 x 8 MI300X (a ROCm blog's log): the step is the batch's samples (4096 over
    4 batches) over the samples per second, not one over the 4-decimal batches per second (0.0027:
    370 s, 1.2% off); the layout from the Config block and the counters."""
    log, s = one("composer_rocm_blog_mpt30b_2x8.log")
    assert log.stack == "Composer/llm-foundry"
    assert s["step_s"] == pytest.approx(1024 / 2.7330) and abs(s["step_s"] - 1 / 0.0027) > 4
    assert s["tokens_per_s_per_gpu"] == 1255.1776 and s["peak_memory_bytes"] is None
    assert log.layout == {"gpus": 16, "micro_batch": 8, "global_batch": 1024}


def test_composer_without_counters_and_the_old_memory_monitor():
    """Composer's 2023 block (its PR 1884): no batch counters, so one over the batches per second;
    FLOP/s and MFU per device; ``memory/allocated_mem`` (bytes allocated so far) is not a peak."""
    log, s = one("composer_pr1884.log")
    assert s["step_s"] == pytest.approx(1 / 0.0503)
    assert s["tflops_per_gpu"] == pytest.approx(77.6516617245) and s["mfu"] == 0.2489
    assert s["peak_memory_bytes"] is None and log.layout == {"micro_batch": 1}


def test_composer_peak_memory_in_gigabytes(tmp_path):
    text = (FIX / "composer_rocm_blog_mpt30b_2x8.log").read_text()
    (tmp_path / "c.log").write_text(text.replace("         Train trainer/", "         Train memory/peak_allocated_mem:"
                                                 " 61.234\n         Train trainer/"))
    assert summarize(parse_path(tmp_path / "c.log")[0])["peak_memory_bytes"] == pytest.approx(61.234e9)


@pytest.mark.parametrize("content, words", [
    ("", "is empty"),
    ("just a README\nwith no numbers\n", "no per-iteration timing lines"),
])
def test_errors_one_sentence(tmp_path, content, words):
    f = tmp_path / "x.log"
    f.write_text(content)
    with pytest.raises(LogError, match=words):
        parse_path(f)


def test_truncated_files(tmp_path):
    gold = (FIX / "golden_values_dev_dgx_h100.json").read_text()
    (tmp_path / "g.json").write_text(gold[:len(gold) // 2])
    with pytest.raises(LogError, match="cut-off or broken JSON"):
        parse_path(tmp_path / "g.json")
    text = (FIX / "megatron_swift_qwen2_0.5b.log").read_text()
    (tmp_path / "m.log").write_text(text[:text.index(" [2024-07-15 15:26:21]")])
    with pytest.raises(LogError, match="no per-iteration timing lines"):
        parse_path(tmp_path / "m.log")


def test_directory_of_rank_logs(tmp_path):
    (tmp_path / "rank0.log").write_text("NCCL INFO init\n")
    (tmp_path / "rank1.log").write_text((FIX / "megatron_swift_qwen2_0.5b.log").read_text())
    logs = parse_path(tmp_path)
    assert [Path(log.path).name for log in logs] == ["rank1.log"]


def test_compare_end_to_end(capsys):
    assert main(["compare", PLAN, "--log", str(FIX / "megatron_swift_qwen2_0.5b.log")]) == 0
    out = capsys.readouterr().out
    assert "median of 11" in out
    assert "step time: measured 719.8 ms" in out
    assert "peak memory: measured 7.77 GiB" in out
    assert "layout differs: global_batch: log 8, plan 64" in out
    assert "layout differs: seq_len: log 128, plan 8192" in out


def test_compare_foreign_file_exit_2(capsys, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello\n")
    assert main(["compare", PLAN, "--log", str(f)]) == 2
    err = capsys.readouterr().err
    assert "no per-iteration timing lines" in err and "Traceback" not in err


def test_compare_a_composer_log_end_to_end(capsys, tmp_path):
    """The ROCm blog's MPT-30B fine-tune (FSDP over 2 x 8 MI300X, micro-batch 8, batch 1024) as a
    Plan: the log's layout is the Plan's, and its step is set beside the prediction."""
    plan = tmp_path / "mpt30b.yaml"
    plan.write_text("name: mpt-30b-mi300x\n"
                    "model: {name: mpt-30b, layers: 48, hidden: 7168, heads: 64, ffn_hidden: 28672, vocab: 50432,"
                    " seq_len: 8192, position_embedding: learned, tied_embeddings: true}\n"
                    "cluster: {node: mi300x-8, nodes: 2}\nparallel: {dp: 16, zero: 3}\n"
                    "training: {global_batch: 1024, micro_batch: 8, precision: fp16, flash_attention: true,"
                    " recompute: full}\n")
    assert main(["compare", str(plan), "--log", str(FIX / "composer_rocm_blog_mpt30b_2x8.log")]) == 0
    out = capsys.readouterr().out
    assert "Composer/llm-foundry" in out and "step time: measured 374.680 s" in out
    assert "layout: the log's global_batch, gpus, micro_batch match the Plan" in out
