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

The batch limits: perf-overview.md v0.14 states none; its build line is ``trtllm-bench build
--dataset``, and trtllm-bench's build of that era (tensorrt_llm/bench/build/build.py, the stored
copy, commit not given by the index) derives max_batch_size and max_num_tokens from a heuristic
of KV memory and the dataset's mean lengths (``tuning.calc_engine_setting``: "a slightly
optimistic upper bound ... TRT-LLM relies on its runtime tuning features to adjust the runtime
max batch size"), so no figure to apply; the doc's sample output (run with 0.12.0) shows
"Max Runtime Batch Size: 4096, Max Runtime Tokens: 8192, Scheduling Policy: Guaranteed No
Evict" -- a scheduler that reserves KV for a request's whole output at admission, unlike vLLM's
(modelled here), a candidate cause of the over-prediction on long outputs, not applied.

Online rows (``--online``; perf-overview.md v0.14 "Online Serving Measurements": Triton
tensorrtllm_backend, 500 requests, BF16; mean TTFT and mean ITL per request rate). ONE rule:
the offline rule's model, hardware and TP, bf16 throughout, Poisson at the row's QPS with 500
requests (QPS INF: offline, all at t = 0), the scheduler defaults. Compared: mean TTFT and mean
TPOT (the doc's mean ITL) at loads below saturation (QPS below the INF row's measured req/s),
and the saturation throughput (the INF row's output tok/s against the offline prediction).

    .venv/bin/python bench/validate_serving.py [--limit N] [--online]
"""
from __future__ import annotations

import argparse
import math
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


def online_doc(row) -> dict | str:
    """The serving plan of one online row (the module docstring's rule), or why it is skipped."""
    doc = plan_doc(row._replace(precision="bf16", num_prompts=500))
    if isinstance(doc, str):
        return doc
    rate = float(row.request_rate)
    doc["traffic"] = ({"arrival": "offline"} if math.isinf(rate) else {"arrival": "poisson", "rate": rate}) | {
        "num_requests": 500, "prompt_len": int(row.input_len), "output_len": int(row.output_len)}
    return doc


def online(d: pd.DataFrame) -> int:
    rows = d[(d.source == SOURCE) & d.notes.str.startswith("scenario=online_poisson")]
    out = []
    for row in rows.itertuples():
        doc = online_doc(row)
        if isinstance(doc, str):
            print(f"  skipped: {doc}")
            continue
        r = simulate_serving(serving_from_dict(doc))
        out.append(dict(gpu=row.gpu, model=row.model, isl=row.input_len, osl=row.output_len, qps=float(row.request_rate),
                        req_s=row.req_s, ttft=row.ttft_mean_ms, ttft_pred=r.ttft_mean * 1e3, itl=row.tpot_mean_ms,
                        tpot_pred=r.tpot_mean * 1e3, out_tok_s=row.output_tok_s, out_pred=r.output_tok_s))
    res = pd.DataFrame(out)
    sat = res[res.qps == float("inf")].set_index(["gpu", "model", "isl", "osl"])
    res["sat_req_s"] = [sat.req_s[(g, m, i, o)] for g, m, i, o in zip(res.gpu, res.model, res.isl, res.osl)]
    below = res[(res.qps < res.sat_req_s)].copy()
    for k, pred in (("ttft", "ttft_pred"), ("itl", "tpot_pred")):
        below[f"{k}_ape"] = (below[pred] / below[k] - 1).abs() * 100
        below[f"{k}_ratio"] = below[pred] / below[k]
    sat = sat.reset_index()
    sat["ape"] = (sat.out_pred / sat.out_tok_s - 1).abs() * 100
    pd.set_option("display.width", 200)
    print(f"{SOURCE} online: {len(res)} rows, {len(below)} below saturation (QPS < the INF row's req/s)")
    print(f"MAPE mean TTFT {below.ttft_ape.mean():.1f}% (median ratio {below.ttft_ratio.median():.2f}); "
          f"mean TPOT/ITL {below.itl_ape.mean():.1f}% (median ratio {below.itl_ratio.median():.2f}); target: within 20%")
    print(f"saturation throughput (INF rows, output tok/s): MAPE {sat.ape.mean():.1f}% over {len(sat)}; target: within 15%")
    cols = ["gpu", "model", "isl", "osl", "qps", "ttft", "ttft_pred", "itl", "tpot_pred"]
    print("\nbelow saturation:\n" + below[cols].round(1).to_string(index=False))
    print("\nsaturation:\n" + sat[["gpu", "model", "isl", "osl", "req_s", "out_tok_s", "out_pred", "ape"]].round(1).to_string(index=False))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="rows at most (0: all)")
    ap.add_argument("--online", action="store_true", help="the online rows (TTFT, ITL over request rates) instead")
    args = ap.parse_args()
    d = pd.read_csv(CSV)
    if args.online:
        return online(d)
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
