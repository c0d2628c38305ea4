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
- scheduler: TensorRT-LLM's as ``trtllm-bench`` sets it (``trtllm_bench_scheduler``): the
  guaranteed-no-evict capacity policy (the doc's sample output prints "Scheduling Policy:
  Guaranteed No Evict"; ``simcore.serving.spec``), chunked context, and the batch limits that
  ``trtllm-bench build --dataset`` (the doc's build line) derives from the dataset's lengths:
  ``tensorrt_llm/bench/build/tuning.py`` ``calc_engine_setting``/``finetune_setting`` (the
  earliest stored copy, index id 5900118795, of the llmapi-era build.py that calls it for FP8 and
  unquantized engines; the index gives no commit): KV requests = 0.95 x (GPU GiB x TP - params
  x bytes / 1e9) / (KV GiB a token x (ISL + OSL)), the batch rounded up (at least 64) and the
  tokens = batch x (1 + ISL/OSL) rounded up (at least 2048). The KV cache holds 0.95 of the
  memory left after weights and activations (``free_memory_fraction``, the heuristic's own
  ``kv_cache_gpu_mem_fraction``; the doc's 0.12 sample printed 99%, later ones 95% and 90%).
Nothing is fitted to the rows. Prints MAPE per source, per GPU, per precision and per TP.

Online rows (``--online``; perf-overview.md v0.14 "Online Serving Measurements": Triton
tensorrtllm_backend, 500 requests, BF16; mean TTFT and mean ITL per request rate). ONE rule:
the offline rule's model, hardware and TP, bf16 throughout, Poisson at the row's QPS with 500
requests (QPS INF: offline, all at t = 0), the scheduler defaults. Compared: mean TTFT and mean
TPOT (the doc's mean ITL) at loads below saturation (QPS below the INF row's measured req/s),
and the saturation throughput (the INF row's output tok/s against the offline prediction).

Static-batch rows (``--static``; source ``trtllm_perf_md_v0.6.1``, TensorRT-LLM performance.md
v0.6.1: ``gptSessionBenchmark`` runs one batch of the stated size, its whole context in one
forward, then its generation steps). ONE rule: LLaMA-7B/70B as the methodology's Llama-2
(llama2-7b, llama2-70b; GPT-J and Falcon are not in the catalog), H100 -> dgx-h100 with FP8
weights, GEMMs and KV cache, A100 -> dgx-a100-80gb in FP16; the capacity policy ``static_batch``
with the row's batch as ``max_num_seqs`` and as many requests, a token budget of the whole
batch's prompts, no chunking, the KV cache 0.95 of the memory left. The H100 header counts
output tok/s per GPU (``output_tok_s_per_gpu`` in the notes, times TP); the A100 header does not,
so its values are taken as written (SOURCES.md: the A100 TP4 70B ones look per GPU). The
batch-1 first-token rows (v0.5) are compared as TTFT of one request with one output token.

LMDeploy rows (``--lmdeploy``; source ``lmdeploy_a100_fp16_v0.1.0a1``, TurboMind on A100-80G in
FP16, profile_generation): ONE rule. ``profile_throughput`` runs ``concurrency`` threads, each
sending ``test_round`` = 10 requests one after another (InternLM/lmdeploy
``benchmark/profile_generation.py``, the stored copy of that era, index id 1413997435): a closed
loop of the row's batch, 10 requests a client, fixed lengths. Llama-2 7B/13B/70B as the
catalog's llama2 models (InternLM-20B is not in the catalog) on dgx-a100-80gb, TP from the row;
the scheduler: at most 128 requests (the benchmark script's max_batch_size), prompts whole in
one iteration (no chunked prefill in TurboMind v0.1). Compared: output tok/s, mean first-token
latency, per-token latency p50 (the doc's 50%).

vLLM CI latency rows (``--vllm``; source ``vllm_perf_ci_buildkite_9515``, H200, vLLM's
``benchmark_latency``: one batch of 8 prompts of 32 tokens, 128 output tokens each, end-to-end
latency; the version and dtype are not stated, so vLLM's default, bf16 for these models): ONE
rule, a static batch of 8 on hgx-h200 at the row's TP, the whole batch's prompts in one
iteration. The rows' ShareGPT throughput tests are skipped (the prompts' lengths are not stated).

    .venv/bin/python bench/validate_serving.py [--limit N] [--online | --static | --lmdeploy | --vllm]
"""
from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simcore.engine.serving import simulate_serving  # noqa: E402
from simcore.model.params import param_counts  # noqa: E402
from simcore.plan.spec import PlanError  # noqa: E402
from simcore.serving.load import serving_from_dict  # noqa: E402
from simcore.serving.spec import ServingPlan  # noqa: E402

CSV = Path(__file__).resolve().parents[2] / "shared/validation/dev_serving.csv"
SOURCE = "trtllm_perf_overview_v0.14"
STATIC = "trtllm_perf_md_v0.6.1"
STATIC_MODELS = {"LLaMA-7B": "llama2-7b", "LLaMA-70B": "llama2-70b"}
MODELS = {"Llama-3-70B": "llama3-70b", "Llama-3.1-70B": "llama3-70b", "Llama-3.1-8B": "llama3-8b",
          "Llama-3.1-405B": "llama3-405b", "Mixtral-8x7B": "mixtral-8x7b"}
NODES = {"H100-SXM-80GB": "dgx-h100", "H200-SXM-141GB": "hgx-h200", "A100-SXM-80GB": "dgx-a100-80gb"}


def trtllm_bench_scheduler(plan: ServingPlan) -> dict:
    """The scheduler ``trtllm-bench`` runs for a dataset of fixed lengths (module docstring)."""
    m, tp, t, gib = plan.model, plan.tp, plan.traffic, 2 ** 30
    fp8 = plan.precision.weights.value == "fp8"
    kv_token = 2 * m.layers * max(tp, m.kv_heads) * m.head_dim * (1 if fp8 else 2) / gib
    engine = param_counts(m).total / 1e9 * (1 if fp8 else 2)
    requests = 0.95 * (plan.cluster.node.gpu.hbm_bytes / gib * tp - engine) / (kv_token * (t.prompt_len + t.output_len))
    raw_bs = min(requests, 4096)
    raw_tok = min(raw_bs * (1 + t.prompt_len / t.output_len), 32768)
    bs = (max(64, 32 * math.ceil(raw_bs / 32)) if raw_bs < 256 else
          128 * math.ceil(raw_bs / 128) if raw_bs < 1024 else 256 * math.ceil(raw_bs / 256))
    tok = (max(2048, 256 * math.ceil(raw_tok / 256)) if raw_tok < 4096 else
           512 * math.ceil(raw_tok / 512) if raw_tok < 8192 else 1024 * math.ceil(raw_tok / 1024))
    return {"max_num_seqs": min(bs, tok), "max_num_batched_tokens": tok, "chunked_prefill": True,
            "capacity_policy": "guaranteed_no_evict"}


def trtllm_bench_plan(doc: dict) -> ServingPlan:
    """The row's serving plan with the scheduler and KV share trtllm-bench gives it."""
    doc = {**doc, "kv_cache": {"free_memory_fraction": 0.95}}
    return serving_from_dict({**doc, "scheduler": trtllm_bench_scheduler(serving_from_dict(doc))})


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


def static_doc(row) -> dict | str:
    """The serving plan of one static-batch row (the module docstring's rule), or why it is skipped."""
    if row.model not in STATIC_MODELS:
        return f"model {row.model} not in the catalog"
    if row.gpu not in NODES:
        return f"GPU {row.gpu} has no catalog node"
    dt = "fp8" if row.precision == "fp8" else "fp16"
    b, isl, osl = int(row.concurrency), int(row.input_len), int(row.output_len)
    return {"name": f"{row.model}-{row.gpu}-tp{row.tp}-b{b}", "model": STATIC_MODELS[row.model],
            "hardware": {"node": NODES[row.gpu]}, "parallel": {"tp": int(row.tp)},
            "precision": {"weights": dt, "activations": dt, "kv_cache": dt},
            "scheduler": {"max_num_seqs": b, "max_num_batched_tokens": b * isl, "chunked_prefill": False,
                          "capacity_policy": "static_batch"},
            "kv_cache": {"free_memory_fraction": 0.95},
            "traffic": {"arrival": "offline", "num_requests": b, "prompt_len": isl, "output_len": osl}}


def static(d: pd.DataFrame) -> int:
    out = []
    for row in d[d.source == STATIC].itertuples():
        doc = static_doc(row)
        if isinstance(doc, str):
            continue
        try:
            r = simulate_serving(serving_from_dict(doc))
        except PlanError as exc:
            print(f"  {doc['name']}: {exc}")
            continue
        if "first_token" in row.notes:
            out.append(dict(kind="TTFT ms", case=doc["name"], isl=row.input_len, osl=row.output_len,
                            measured=row.ttft_mean_ms, predicted=r.ttft_mean * 1e3))
            continue
        per_gpu = re.search(r"output_tok_s_per_gpu=([\d.]+)", row.notes)
        measured = float(per_gpu.group(1)) * row.tp if per_gpu else row.output_tok_s
        out.append(dict(kind="out tok/s", case=doc["name"], isl=row.input_len, osl=row.output_len,
                        measured=measured, predicted=r.output_tok_s))
    res = pd.DataFrame(out)
    res["ratio"] = res.predicted / res.measured
    res["ape"] = (res.ratio - 1).abs() * 100
    pd.set_option("display.width", 160)
    print(f"{STATIC}: {len(res)} rows (static batches of a stated size; batch-1 first-token latency)")
    for kind, g in res.groupby("kind"):
        print(f"MAPE {kind}: {g.ape.mean():.1f}% over {len(g)} rows (median ratio {g.ratio.median():.2f})")
    print("\n" + res.round(2).to_string(index=False))
    return 0


LMDEPLOY = "lmdeploy_a100_fp16_v0.1.0a1"
LMDEPLOY_MODELS = {"Llama-2-7B": "llama2-7b", "Llama-2-13B": "llama2-13b", "Llama-2-70B": "llama2-70b"}


def lmdeploy(d: pd.DataFrame) -> int:
    out = []
    rows = d[(d.source == LMDEPLOY) & d.notes.str.startswith("scenario=static_batch")]
    for row in rows.itertuples():
        if row.model not in LMDEPLOY_MODELS:
            continue
        c, isl, osl = int(row.concurrency), int(row.input_len), int(row.output_len)
        doc = {"name": f"{row.model}-tp{row.tp}-c{c}", "model": LMDEPLOY_MODELS[row.model],
               "hardware": {"node": "dgx-a100-80gb"}, "parallel": {"tp": int(row.tp)},
               "precision": {"weights": "fp16", "activations": "fp16", "kv_cache": "fp16"},
               "scheduler": {"max_num_seqs": 128, "max_num_batched_tokens": max(128, isl * min(c, 128) + c),
                             "chunked_prefill": False},
               "traffic": {"arrival": "concurrency", "concurrency": c, "num_requests": 10 * c,
                           "prompt_len": isl, "output_len": osl}}
        r = simulate_serving(serving_from_dict(doc))
        out.append(dict(case=doc["name"], isl=isl, osl=osl, tok_s=row.output_tok_s, tok_s_pred=r.output_tok_s,
                        ttft=row.ttft_mean_ms, ttft_pred=r.ttft_mean * 1e3, tpot=row.tpot_p50_ms,
                        tpot_pred=r.tpot[0] * 1e3))
    res = pd.DataFrame(out)
    pd.set_option("display.width", 180)
    print(f"{LMDEPLOY}: {len(res)} static rows (closed loops of the row's batch)")
    for k in ("tok_s", "ttft", "tpot"):
        ratio = res[f"{k}_pred"] / res[k]
        print(f"  {k}: MAPE {((ratio - 1).abs() * 100).mean():.1f}%, median ratio {ratio.median():.2f}")
    print("\n" + res.round(1).to_string(index=False))
    return 0


VLLM = "vllm_perf_ci_buildkite_9515"


def vllm(d: pd.DataFrame) -> int:
    out = []
    for row in d[(d.source == VLLM) & d.notes.str.startswith("scenario=static_batch_latency")].itertuples():
        b, isl, osl = int(row.concurrency), int(row.input_len), int(row.output_len)
        doc = {"name": f"{row.model}-tp{row.tp}", "model": MODELS[row.model], "hardware": {"node": "hgx-h200"},
               "parallel": {"tp": int(row.tp)}, "precision": {"weights": "bf16"},
               "scheduler": {"max_num_seqs": b, "max_num_batched_tokens": max(b * isl, b), "chunked_prefill": False,
                             "capacity_policy": "static_batch"},
               "traffic": {"arrival": "offline", "num_requests": b, "prompt_len": isl, "output_len": osl}}
        r = simulate_serving(serving_from_dict(doc))
        out.append(dict(case=doc["name"], measured_ms=row.e2e_mean_ms, predicted_ms=r.e2e[0] * 1e3))
    res = pd.DataFrame(out)
    res["ratio"] = res.predicted_ms / res.measured_ms
    print(f"{VLLM}: {len(res)} latency rows (batch 8, 32 in, 128 out); MAPE {((res.ratio - 1).abs() * 100).mean():.1f}%")
    print(res.round(2).to_string(index=False))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limit", type=int, default=0, help="rows at most (0: all)")
    ap.add_argument("--online", action="store_true", help="the online rows (TTFT, ITL over request rates) instead")
    ap.add_argument("--static", action="store_true", help="the static-batch rows of TensorRT-LLM v0.6.1 instead")
    ap.add_argument("--lmdeploy", action="store_true", help="LMDeploy's A100 profile_generation rows instead")
    ap.add_argument("--vllm", action="store_true", help="vLLM CI's H200 latency rows instead")
    args = ap.parse_args()
    d = pd.read_csv(CSV)
    if args.vllm:
        return vllm(d)
    if args.lmdeploy:
        return lmdeploy(d)
    if args.online:
        return online(d)
    if args.static:
        return static(d)
    rows = d[(d.source == SOURCE) & d.notes.str.startswith("scenario=offline")]
    out, skipped = [], {}
    for row in rows.itertuples():
        doc = plan_doc(row)
        if isinstance(doc, str):
            skipped[doc] = skipped.get(doc, 0) + 1
            continue
        try:
            r = simulate_serving(trtllm_bench_plan(doc))
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
