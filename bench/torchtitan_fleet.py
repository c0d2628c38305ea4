"""Benchmark: torchtitan's own published Llama 3.1 8B throughput on its benchmark fleet,
predicted on the catalog's ``grand-teton-h100`` node (H100 96GB HBM2e at a 500 W limit).

The rows are torchtitan's ``benchmarks/llama3_h100_202412_torchtitan.md`` (@820504e20, end
of 2024): FSDP2 + torch.compile, local batch 2, s = 8192, per-op selective AC, on 8 GPUs
(Table 1) and 128 GPUs (Table 3); and, not fitted to, the same rows without torch.compile. The efficiency factor of ``h100-sxm-96gb-500w`` in
``topologies/catalog/efficiency.yaml`` is FITTED to them; this script prints the fit. The
torchao float8 rows of ``../shared/validation/dev_modern.csv`` (the same team, stack and
fleet) are not used here: ``bench/validate_published.py`` checks the GPU on them.

Attention: SDPA's flash backend, Dao's FlashAttention-2 kernels (``attention_kernel: flash2``):
torch made its cuDNN backend opt-in in 2.5.1 (pytorch/pytorch#138522), so torch 2.5.1 to 2.10 run
FA2 on H100 (pytorch/pytorch#142132 measures SDPA at 329 TFLOP/s against cuDNN's 631 there).

Loss: eager. torchtitan compiles the loss with the model only from bbb1b616e (2025-04-02);
the table predates it.

    .venv/bin/python bench/torchtitan_fleet.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.engine.predict import simulate  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402
from published_modern import TORCHTITAN_FLEET_NODE  # noqa: E402
from simcore.plan.readers import sdpa_attention_kernel  # noqa: E402
from topologies.hardware import load_catalog  # noqa: E402

#: Llama 3.1 8B has Llama 3 8B's architecture: the catalog's entry
LLAMA31_8B = {"name": "llama3-8b", "seq_len": 8192}
#: (table, GPUs, published tokens/s/GPU) of the FSDP + torch.compile rows (bf16, no Float8)
ROWS = (("Table 1", 8, 6667), ("Table 3", 128, 6514))
#: The same tables' FSDP rows without torch.compile (``training.kernels: eager``): not fitted to,
#: a check of ``simcore.model.eager_ops.python_layer_ops`` (what compiling saves).
EAGER_ROWS = (("Table 1", 8, 5762), ("Table 3", 128, 5605))
LOCAL_BATCH = 2


def plan_doc(gpus: int, kernels: str = "fused") -> dict:
    return {"name": f"torchtitan-llama3.1-8b-{gpus}", "model": dict(LLAMA31_8B),
            "cluster": {"node": TORCHTITAN_FLEET_NODE, "nodes": gpus // 8},
            "parallel": {"dp": gpus, "zero": 3},
            "training": {"global_batch": LOCAL_BATCH * gpus, "micro_batch": LOCAL_BATCH, "recompute": "op",
                         "flash_attention": True, "precision": "bf16", "loss": "eager",
                         "attention_kernel": sdpa_attention_kernel(load_catalog().node(TORCHTITAN_FLEET_NODE).gpu),
                         "kernels": kernels}}


def _tps(gpus: int, kernels: str = "fused") -> tuple[float, object]:
    res = simulate(plan_from_dict(plan_doc(gpus, kernels)))
    return LOCAL_BATCH * LLAMA31_8B["seq_len"] / res.step_time_s, res


def main() -> int:
    errors, compiled_tps = [], {}
    for table, gpus, published in ROWS:
        tps, res = _tps(gpus)
        compiled_tps[gpus] = tps
        errors.append(tps / published - 1)
        print(f"{table}: {gpus:4d} GPUs  published {published:6d} tokens/s/GPU  predicted {tps:7.0f}  "
              f"error {tps / published - 1:+.1%}  (step {res.step_time_s:.3f} s, MFU {res.mfu:.1%})")
    print(f"mean |error| {sum(abs(e) for e in errors) / len(errors):.1%} (fitted)")
    for (table, gpus, published), (_, _, compiled) in zip(EAGER_ROWS, ROWS):
        tps, _ = _tps(gpus, "eager")
        print(f"{table} without torch.compile: {gpus:4d} GPUs  published {published:6d}  predicted {tps:7.0f}  "
              f"error {tps / published - 1:+.1%};  compile's gain published {compiled / published:.3f}x, "
              f"predicted {compiled_tps[gpus] / tps:.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
