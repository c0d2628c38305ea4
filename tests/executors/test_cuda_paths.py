"""The executor's CUDA paths on a real GPU (nccl, the fp16 grad scaler, FSDP2's CPU offload,
torchao's float8 linear layers, torch's allocator statistics). They need a CUDA device, which
CI does not have: they skip there, and ran on an H100 (validation/gpu_runs.csv, bench/RESULTS.md)."""
import math

import pytest
import torch

from simcore.plan.load import plan_from_dict

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device: nccl, the fp16 grad scaler, FSDP2 CPU offload and torchao float8 run only there")]

MODEL = {"name": "cuda-tiny", "layers": 2, "hidden": 512, "heads": 8, "vocab": 1024, "seq_len": 256,
         "gated_mlp": True, "ffn_hidden": 1024, "position_embedding": "rope", "tied_embeddings": False}


def _run(training=None, parallel=None):
    from executors.launch import run

    doc = {"name": "cuda", "model": MODEL, "cluster": {"node": "dgx-h100", "nodes": 1, "gpus_per_node": 1},
           "parallel": parallel or {}, "training": {"global_batch": 8, "micro_batch": 4, "precision": "bf16",
                                                    "flash_attention": True, **(training or {})}}
    return run(plan_from_dict(doc), steps=4, warmup=1, start_method="spawn", timeout_s=240)


def _check(m):
    assert m.step_time_s > 0 and math.isfinite(m.extra["loss_last"])
    assert "cuda" in m.notes[0]
    assert 0 < m.extra["cuda_memory.max_allocated"] <= m.extra["cuda_memory.max_reserved"]
    # the phases are the kernels' time (spans synchronise on a GPU): they fill the recorded step
    recorded = m.step_time_s * (1 + m.extra.get("recorder_overhead", 0.0))
    assert 0.5 * recorded < sum(m.time_s.get(k, 0.0) for k in ("forward", "backward", "optimizer")) <= recorded * 1.01


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_amp_precisions_train_on_cuda(precision):
    m = _run({"precision": precision})
    _check(m)
    assert m.extra["loss_last"] < m.extra["loss_first"]


def test_cpu_offload_keeps_the_optimizer_states_off_the_gpu():
    plain, off = _run(parallel={"zero": 3}), _run({"offload": "optimizer+params"}, {"zero": 3})
    _check(off)
    assert off.extra["cuda_memory.max_allocated"] < plain.extra["cuda_memory.max_allocated"]


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_float8_trains_on_cuda(recipe):
    pytest.importorskip("torchao", reason="FP8 runs through torchao's float8 training")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores need compute capability 8.9 or later")
    m = _run({"precision": "fp8", "fp8_recipe": recipe})
    _check(m)
    assert m.extra["loss_last"] < m.extra["loss_first"]


def test_activation_offload_moves_the_first_blocks_to_pinned_host_memory():
    plain, off = _run(), _run({"activation_offload": 1})
    _check(off)
    assert off.extra["activation_offload.host_peak"] > 0
    assert off.extra["cuda_memory.max_allocated"] < plain.extra["cuda_memory.max_allocated"]
    assert off.extra["loss_first"] == pytest.approx(plain.extra["loss_first"], rel=1e-3)
