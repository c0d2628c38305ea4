"""Serving throughput against published offline measurements (issue 53 target: within 15%).

Source ``trtllm_perf_overview_v0.14`` of ../shared/validation/dev_serving.csv (TensorRT-LLM
perf-overview.md, ``trtllm-bench throughput``, offline: every request queued at once, fixed
input/output lengths; the metric is output tokens/s). ONE rule maps a row into a serving plan:

- model: the catalog's (Llama-3/3.1-70B -> llama3-70b, Llama-3.1-8B -> llama3-8b,
  Llama-3.1-405B -> llama3-405b, Mixtral-8x7B -> mixtral-8x7b); others are skipped (not in the catalog);
- hardware: H100-SXM-80GB -> dgx-h100, H200-SXM-141GB -> hgx-h200, A100-SXM-80GB -> dgx-a100-80gb;
  A100-PCIe and L40S are skipped (no catalog node);
- precision: fp8 rows run FP8 weights, GEMMs and KV cache ("fp8 build => fp8 KV cache" per the
  doc); fp16/bf16 rows 16 bits throughout;
- tp from the row, one replica; rows with pp > 1 are skipped;
- traffic: offline, num_requests = the row's num_prompts, prompt/output = input_len/output_len;
- scheduler: the source states no batch limits (trtllm-bench tunes them per dataset), so the
  serving plan's defaults: max_num_seqs 256, max_num_batched_tokens 8192, chunked prefill,
  block 16, gpu_memory_utilization 0.9.
Nothing is fitted to the rows. Prints MAPE per source, per GPU, per precision and per TP.

    .venv/bin/python bench/validate_serving.py [--limit N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.engine.serving import simulate_serving  # noqa: E402
from simcore.plan.spec import PlanError  # noqa: E402
from simcore.serving.load import serving_from_dict  # noqa: E402

CSV = Path(__file__).resolve().parents[2] / "shared/validation/dev_serving.csv"
SOURCE = "trtllm_perf_overview_v0.14"
MODELS = {"Llama-3-70B": "llama3-70b", "Llama-3.1-70B": "llama3-70b", "Llama-3.1-8B": "llama3-8b",
          "Llama-3.1-405B": "llama3-405b", "Mixtral-8x7B": "mixtral-8x7b"}
NODES = {"H100-SXM-80GB": "dgx-h100", "H200-SXM-141GB": "hgx-h200", "A100-SXM-80GB": "dgx-a100-80gb"}


def plan_doc(row) -> dict | str:
    """The serving plan of one row, or why it is skipped."""
    if row.model not in MODELS:
        return f"model {row.model} not in the catalog"
    if row.gpu not in NODES:
        return f"GPU {row.gpu} has no catalog node"
    if row.pp > 1:
        return "pipeline parallel"
    dt = "fp8" if row.precision == "fp8" else "bf16"
    return {"name": f"{row.model}-{row.gpu}-tp{row.tp}", "model": MODELS[row.model],
            "hardware": {"node": NODES[row.gpu]}, "parallel": {"tp": int(row.tp)},
            "precision": {"weights": dt, "activations": dt, "kv_cache": dt},
            "traffic": {"arrival": "offline", "num_requests": int(row.num_prompts),
                        "prompt_len": int(row.input_len), "output_len": int(row.output_len)}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="rows at most (0: all)")
    args = ap.parse_args()
    d = pd.read_csv(CSV)
    rows = d[(d.source == SOURCE) & d.notes.str.startswith("scenario=offline")]
    out, skipped = [], {}
    for row in rows.itertuples():
        doc = plan_doc(row)
        if isinstance(doc, str):
            skipped[doc] = skipped.get(doc, 0) + 1
            continue
        try:
            r = simulate_serving(serving_from_dict(doc))
        except PlanError as exc:
            skipped[f"does not fit: {exc}"[:90]] = skipped.get(f"does not fit: {exc}"[:90], 0) + 1
            continue
        out.append(dict(gpu=row.gpu, model=row.model, precision=row.precision, tp=row.tp, isl=row.input_len,
                        osl=row.output_len, measured=row.output_tok_s, predicted=r.output_tok_s))
        if args.limit and len(out) >= args.limit:
            break
    res = pd.DataFrame(out)
    res["ape"] = (res.predicted / res.measured - 1).abs() * 100
    res["ratio"] = res.predicted / res.measured
    pd.set_option("display.width", 160)
    print(f"{SOURCE}: {len(res)} offline rows predicted, {sum(skipped.values())} skipped")
    for why, n in sorted(skipped.items(), key=lambda kv: -kv[1]):
        print(f"  skipped {n:4d}: {why}")
    print(f"\nMAPE {SOURCE}: {res.ape.mean():.1f}%  (median APE {res.ape.median():.1f}%, "
          f"within 15%: {(res.ape <= 15).mean():.0%}; target: within 15%)")
    for key in ("gpu", "precision", "tp", "model"):
        g = res.groupby(key).agg(rows=("ape", "size"), mape=("ape", "mean"), median_ratio=("ratio", "median"))
        print(f"\nby {key}:\n{g.round(2).to_string()}")
    g = res.groupby(["isl", "osl"]).agg(rows=("ape", "size"), mape=("ape", "mean"), median_ratio=("ratio", "median"))
    print(f"\nby input/output length:\n{g.round(2).to_string()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
