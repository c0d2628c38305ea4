"""DualPipeV against 1F1B, interleaved 1F1B and zero-bubble on two published-scale questions,
on the analytic closed forms and the event engine (issue 50).

    .venv/bin/python bench/schedules.py

- Llama 3 70B, 8k tokens, on 64 DGX H100 (512 GPUs): tp 8, pp 8, dp 8, ZeRO-1, selective
  recompute, global batch 512 (64 micro-batches a pipeline).
- DeepSeek-V3 (examples/hf/deepseek-v3/config.json), 4k tokens, on 256 DGX H100 (2,048 GPUs,
  DeepSeek's H800 count): pp 16, ep 64, dp 128, ZeRO-1, FP8 GEMMs, selective recompute, Adam's
  moments in BF16, global batch 16,384 (128 micro-batches a pipeline); DeepSeek trained it with
  DualPipe on 16 pipeline ranks (arXiv 2412.19437 Sec. 3.2, 3.3).

Each schedule runs the layout's own stages: 1F1B and zero-bubble one a rank, interleaved 2 (the
same 2 pp stages DualPipeV runs) and DualPipeV 2 placed as a V. Per row: step time, bubble and
the fullest rank's memory, on both engines.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simcore.engine.analytic import analytic  # noqa: E402
from simcore.engine.des import simulate_des  # noqa: E402
from simcore.model.step_costs import step_costs  # noqa: E402
from simcore.plan.interop import import_plan  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402

SCHEDULES = (("1f1b", 1), ("interleaved-1f1b", 2), ("zero-bubble", 1), ("dualpipev", 2))


def llama3_70b() -> dict:
    return {"name": "llama3-70b-pp8", "model": {"name": "llama3-70b", "seq_len": 8192},
            "cluster": {"node": "dgx-h100", "nodes": 64},
            "parallel": {"tp": 8, "pp": 8, "dp": 8, "zero": 1, "sequence_parallel": True},
            "training": {"global_batch": 512, "micro_batch": 1, "precision": "bf16", "recompute": "selective",
                         "flash_attention": True}}


def deepseek_v3() -> dict:
    doc, _ = import_plan(hf="examples/hf/deepseek-v3/config.json", cluster="dgx-h100", nodes=256, seq_len=4096,
                         base_dir=str(ROOT))
    doc["name"] = "deepseek-v3-pp16"
    doc["parallel"] = {"tp": 1, "pp": 16, "dp": 128, "ep": 64, "zero": 1}
    doc["training"] = {"global_batch": 16384, "micro_batch": 1, "precision": "fp8", "recompute": "selective",
                       "optimizer_state_dtype": "bf16", "flash_attention": True}
    return doc


def rows(doc: dict) -> list[str]:
    out = []
    for schedule, vpp in SCHEDULES:
        plan = plan_from_dict({**doc, "parallel": {**doc["parallel"], "schedule": schedule, "vpp": vpp}}, str(ROOT))
        costs = step_costs(plan)
        a, d = analytic(costs), simulate_des(costs)
        out.append(f"| {plan.name} | {schedule} (vpp {vpp}) | {plan.num_microbatches} | {a.step_time_s:.3f} | "
                   f"{a.bubble_s:.3f} | {d.step_time_s:.3f} | {d.bubble_s:.3f} | {a.memory_per_gpu_gib:.1f} |")
    return out


def main() -> None:
    print("| question | schedule | micro-batches | step s (analytic) | bubble s (analytic) | step s (event) "
          "| bubble s (event) | fullest GPU GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for doc in (llama3_70b(), deepseek_v3()):
        print("\n".join(rows(doc)))


if __name__ == "__main__":
    main()
