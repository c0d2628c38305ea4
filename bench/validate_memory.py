"""Predict the peak memory per GPU of every row of ../shared/validation/dev_memory.csv.

    .venv/bin/python bench/validate_memory.py [--validation DIR] [--quiet]

Each row becomes a Plan by the rules of its source (below; nothing per row), ``memory_report``
predicts its bytes per GPU by term, and the figure compared is the statistic the source
reports (the validation README's ``memory_kind``):

- ``reserved`` (``torch.cuda.max_memory_reserved``): the tensors plus the caching
  allocator's margin (``training.allocator_margin``) and what FSDP2's side streams keep
  cached (the report's ``stream_cache``), no CUDA context;
- ``active`` (``memory_stats()['active_bytes.all.peak']``): the tensors alone;
- NVML ``used`` after training: the tensors, the allocator's margin and the CUDA context
  (the report's total).

Error = (predicted - measured) / measured. Target: within 10 % on every row. Rows whose
setting has no Plan field are left out, each with its reason printed. Writes
bench/out/validate_memory.csv.

Rules per source:
- torchao_float8_readme_2025_h100 / _mi300x, torchao_mx_readme_2025_b200 (torchtitan's
  llama3_8b.toml): Llama 3 8B at s = 8192, FSDP2 over 8 GPUs (ZeRO 3), local batch 1,
  per-op SAC (``recompute: op``), SDPA flash attention, bf16 with fp32 master and AdamW
  (FSDP2 MixedPrecisionPolicy), and the loss compiled with the model (torchtitan
  components/loss.py: ``if job_config.training.compile: loss_fn = torch.compile(loss_fn)``,
  so ``loss: fused``) from torchtitan bbb1b616e (2025-04-02) on; the H100 table ran torchtitan
  0.0.2 of March 2025, whose loss is eager (``loss: eager``, ``LOSS_OF_SOURCE``) and whose
  FSDP2 wrapping keeps the root group and the last block unsharded through the loss
  (``parallel.fsdp_root: kept``; the later sources ``output_kept``, ``FSDP_ROOT_OF_SOURCE``).
  Compiled (``--training.compile``, ``kernels: fused``), per-op SAC drops w2's output. torchao's float8 rows keep the bf16 Plan: torchao casts to float8 per
  GEMM (no cached FP8 weights; the sharded parameters, gradients, optimizer states and saved
  matmul outputs stay high precision), and the published peaks of each table differ by
  under 1.5 % across recipes. Nodes: grand-teton-h100 (the README says only H100; the
  torchtitan team's fleet, as bench/published_modern.py ``_node`` reads it; capacity does
  not enter the comparison), mi300x-8, dgx-b200.
- torchtune_readme_optimization_flags: Llama 3.2 3B (28 layers, 3072, 24 heads, 8 KV
  heads, 8192 MLP, vocab 128256, tied), one A100 80GB, batch 2 x 4096 packed, pure bf16
  (``master_weights: false``: torchtune keeps weights, gradients and AdamW states in bf16).
  Cumulative flags: chunked cross entropy is ``loss: chunked``, activation checkpointing
  wraps every layer (``recompute: full``); compile stays ``loss: eager``: the table's own
  rows show the compiled loss still materialising the fp32 logits (chunking it then saves
  8.1 GiB, the 12 - 3.5 bytes per logit of the eager and chunked losses, 8.3 GiB here).
  The rows before ``+ Compile`` run eager PyTorch (``kernels: eager``: torchtune's RMSNorm
  keeps its fp32 upcast and SwiGLU its silu output, 8.75 GiB over 28 layers here; the table
  shows compile saving 9.0 GiB).
  ``+ Fuse optimizer step into backward`` is ``optimizer_in_backward`` (one gradient tensor
  lives at a time: the tied embedding's, through the backward), ``+ 8-bit AdamW`` is
  ``optimizer: adamw8bit``. Left out: the activation-offloading row and the one after it
  (cumulative): no Plan field moves activations to the host.
- hf_perf_train_gpu_one_2022: bert-large-uncased (24 layers, 1024, 16 heads, 4096 MLP,
  vocab 30522, s = 512, learned positions, GeLU), one V100 SXM2 16 GB (dgx1-v100-16gb),
  eager attention (2022), AdamW, gradient checkpointing = ``recompute: full``. ``fp16=True``
  is torch autocast over fp32 parameters (``precision: fp16, autocast: true``): fp32 weights,
  gradients and Adam states, fp32 norms, softmax and residual stream, and every weight's fp16
  copy cached to the forward's end, checkpointed or not. The model is a sequence classifier: its
  2-class head has no vocabulary-wide logits, so the report's loss term is not counted.
  The optimizer is the row's: AdamW, ``adafactor`` (``optim="adafactor"``) or ``adamw8bit``
  (bitsandbytes' Adam8bit: the same 8-bit states). The Trainer of 2022 cleared gradients with
  ``model.zero_grad()``, whose default before torch 2.0 zeroes them in place
  (``set_to_none=False``), so they stay allocated through the forward (``grads_to_none: false``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simcore.model.step_costs import memory_report  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402
from simcore.results import GIB, atomic_write_text  # noqa: E402
from simcore.model.peak import EXPANDABLE_SEGMENTS_MARGIN  # noqa: E402
from published_modern import TORCHTITAN_FLEET_NODE  # noqa: E402

#: ../shared/validation beside the checkout (a worktree under /work/wt/ looks two levels up)
DEFAULT_VALIDATION = next((p / "shared" / "validation" for p in ROOT.parents[:2]
                           if (p / "shared" / "validation").exists()), ROOT.parent / "shared" / "validation")
TORCHTITAN = ("torchao_float8_readme_2025_h100", "torchao_float8_readme_2025_mi300x", "torchao_mx_readme_2025_b200")
#: The loss of each torchtitan source's commit: torchtitan compiles it with the model only from
#: bbb1b616e (2025-04-02, "refactor train_spec.loss_fn to build_loss_fn"); at the H100 table's
#: torchtitan (0.0.2, torchao README @8c81863ba of 2025-03-12; torchtitan 54ef42221 of that day)
#: components/loss.py reads "compiling loss function causes CUDA errors, turning off for now"
#: and upcasts the whole logits eagerly (``pred.flatten(0, 1).float()``).
LOSS_OF_SOURCE = {"torchao_float8_readme_2025_h100": "eager", "torchao_float8_readme_2025_mi300x": "fused",
                  "torchao_mx_readme_2025_b200": "fused"}
#: The torchtitan runs on CUDA ran under expandable segments: torchtitan's run_train.sh launches
#: every job with ``PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True"`` (since a5e57e4a9 of
#: 2024-10-22; so at 54ef42221, 2c8b5947 and 6fc499f6), and torchao's benchmark scripts call it
#: (benchmarks/float8/training/float8_training_benchmark.sh @8c81863ba, llama3.sh @d8bb51f63).
#: ROCm builds of 2025 ignore the setting (torch's expandable segments were CUDA driver API only,
#: ``#if !defined(USE_ROCM)`` in c10/cuda/CUDACachingAllocator.cpp, until pytorch/pytorch#173330,
#: relanded as #177974 in March 2026), so the MI300X run keeps the caching allocator's margin.
EXPANDABLE_SEGMENTS_SOURCES = ("torchao_float8_readme_2025_h100", "torchao_mx_readme_2025_b200")
#: How each source's torchtitan wraps the model in FSDP2 (``parallel.fsdp_root``): at 54ef42221
#: (the H100 table, torch 2.7.0a0) the root group holds embedding, norm and output and is never
#: resharded after forward, nor is the last block (``kept``); at 2c8b5947 and 6fc499f6 the
#: embedding is a group of its own and ``[norm, output]`` one with reshard_after_forward=False
#: (llama3/infra/parallelize.py ``apply_fsdp``: ``output_kept``).
FSDP_ROOT_OF_SOURCE = {"torchao_float8_readme_2025_h100": "kept", "torchao_float8_readme_2025_mi300x": "output_kept",
                       "torchao_mx_readme_2025_b200": "output_kept"}
NODE_OF_SOURCE = {"torchao_float8_readme_2025_h100": TORCHTITAN_FLEET_NODE, "torchao_float8_readme_2025_mi300x": "mi300x-8",
                  "torchao_mx_readme_2025_b200": "dgx-b200", "torchtune_readme_optimization_flags": "dgx-a100-80gb",
                  "hf_perf_train_gpu_one_2022": "dgx1-v100-16gb"}
LLAMA32_3B = {"name": "llama3.2-3b", "layers": 28, "hidden": 3072, "heads": 24, "kv_heads": 8, "ffn_hidden": 8192,
              "vocab": 128256, "seq_len": 4096, "gated_mlp": True, "tied_embeddings": True,
              "position_embedding": "rope", "dropout": 0.0}   # torchtune's llama3_2: attn_dropout 0.0, no other
BERT_LARGE = {"name": "bert-large-uncased", "layers": 24, "hidden": 1024, "heads": 16, "ffn_hidden": 4096,
              "vocab": 30522, "seq_len": 512, "tied_embeddings": True, "position_embedding": "learned",
              "dropout": 0.1}   # BertConfig hidden_dropout_prob, attention_probs_dropout_prob


def statistic(row: pd.Series) -> str:
    """Which statistic the row reports: reserved, active or nvml."""
    kind = str(row["memory_kind"]).lower()
    return "reserved" if kind.startswith("reserved") else "active" if kind.startswith("active") else "nvml"


#: torchtune's "Optimization flags" table adds one technique a row, in this order; a row runs
#: its own and every one above it: (words of the row's name, Plan training fields, or why no
#: Plan field states it).
TORCHTUNE_FLAGS = (("packed", {}), ("compile", {"kernels": "fused"}), ("chunked cross", {"loss": "chunked"}),
                   ("activation checkpointing", {"recompute": "full"}),
                   ("optimizer step into backward", {"optimizer_in_backward": True}),
                   ("activation offloading", {"activation_offload": "all"}),
                   ("8-bit adamw", {"optimizer": "adamw8bit"}))


def _torchtune_flags(notes: str) -> dict | str:
    """The Plan's training fields for a torchtune row (cumulative flags), or why it is left out."""
    name = notes.split("Row '", 1)[-1].split("'", 1)[0].lower()
    last = next(i for i, (words, _) in enumerate(TORCHTUNE_FLAGS) if all(w in name for w in words.split()))
    training = {"master_weights": False, "flash_attention": True, "loss": "eager", "kernels": "eager"}
    for _, fields in TORCHTUNE_FLAGS[:last + 1]:
        if isinstance(fields, str):
            return fields
        training.update(fields)
    return training


def row_plan(row: pd.Series):
    """(Plan document, terms not counted) for a row, or a string saying why it is left out."""
    src = row["source"]
    cluster = {"node": NODE_OF_SOURCE[src], "nodes": 1}
    gb, mb = int(row["global_batch_seqs"]), int(row["micro_batch"])
    if src in TORCHTITAN:
        doc = {"model": {"name": "llama3-8b", "seq_len": 8192},
               "parallel": {"dp": 8, "zero": 3, "fsdp_root": FSDP_ROOT_OF_SOURCE[src]},
               "training": {"global_batch": gb, "micro_batch": mb, "recompute": "op", "flash_attention": True,
                            "loss": LOSS_OF_SOURCE[src]}}
        if src in EXPANDABLE_SEGMENTS_SOURCES:
            doc["training"]["allocator_margin"] = EXPANDABLE_SEGMENTS_MARGIN
        return {**doc, "cluster": cluster}, ()
    cluster["gpus_per_node"] = 1
    if src == "torchtune_readme_optimization_flags":
        training = _torchtune_flags(str(row["notes"]))
        if isinstance(training, str):
            return training
        return {"model": LLAMA32_3B, "cluster": cluster, "parallel": {"dp": 1},
                "training": {"global_batch": gb, "micro_batch": mb, **training}}, ()
    if src == "hf_perf_train_gpu_one_2022":
        named = str(row["notes"]).split("optimizer ")[-1][:20]
        optimizer = "adafactor" if "Adafactor" in named else "adamw8bit" if "8-bit Adam" in named else "adamw"
        amp = {"precision": "fp16", "autocast": True} if str(row["precision"]).startswith("fp16") \
            else {"precision": "fp32"}
        training = {"global_batch": gb, "micro_batch": mb, **amp, "optimizer": optimizer,
                    "recompute": "full" if row["recompute"] == "full" else "none", "grads_to_none": False}
        no_lm_head = ("activations_loss", "activations_loss_transient")
        return {"model": BERT_LARGE, "cluster": cluster, "parallel": {"dp": 1}, "training": training}, no_lm_head
    return f"no rule for source {src}"


def predicted_gib(report: dict, stat: str, skip: tuple[str, ...]) -> float:
    """The report's figure for ``stat`` on its most loaded rank, without the ``skip`` terms."""
    rank = max(report["ranks"], key=lambda r: r["total"])
    terms = rank["terms"]
    tensors = sum(v for k, v in terms.items() if k not in ("allocator_margin", "cuda_context") + skip)
    if stat == "active":
        return tensors / GIB
    value = tensors * (1 + report["allocator_margin"]) + rank["stream_cache"]
    return (value + (terms["cuda_context"] if stat == "nvml" else 0.0)) / GIB


def validate(path: Path) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    rows, left_out = [], []
    for i, row in pd.read_csv(path).iterrows():
        mapped = row_plan(row)
        label = f"{i:>2} {row['source']} {row['model']} {str(row['precision'])[:28]}"
        if isinstance(mapped, str):
            left_out.append((label, mapped))
            continue
        doc, skip = mapped
        report = memory_report(plan_from_dict(doc))
        stat = statistic(row)
        pred, meas = predicted_gib(report, stat, skip), float(row["measured_peak_mem_gib"])
        rows.append({"row": i, "source": row["source"], "precision": str(row["precision"])[:28], "statistic": stat,
                     "measured_gib": meas, "predicted_gib": pred, "error": (pred - meas) / meas})
    return pd.DataFrame(rows), left_out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--write-residuals", action="store_true",
                    help="store ln(measured/predicted) of every row in validation/residuals.yaml: the planner's "
                         "memory margin (what 'fits', 'thin' and 'may not fit' mean) comes from them")
    args = ap.parse_args(argv)
    path = args.validation / "dev_memory.csv"
    if not path.exists():
        print(f"{path} not found")
        return 2
    out, left_out = validate(path)
    if not args.quiet:
        with pd.option_context("display.width", 200, "display.max_rows", 100):
            print(out.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for label, why in left_out:
        print(f"left out: {label}: {why}")
    worst = out["error"].abs().max()
    within = (out["error"].abs() <= 0.10).sum()
    print(f"dev_memory: {len(out)} rows predicted, {len(left_out)} left out; mean |error| "
          f"{out['error'].abs().mean():.1%}, max {worst:.1%}; {within}/{len(out)} within 10% (target: all)")
    for src, grp in out.groupby("source"):
        print(f"  {src}: mean |error| {grp['error'].abs().mean():.1%}, max {grp['error'].abs().max():.1%}")
    target = ROOT / "bench" / "out" / "validate_memory.csv"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, out.to_csv(index=False))
    if args.write_residuals:
        write_residuals(out)
    return 0


def write_residuals(out: pd.DataFrame) -> None:
    """The rows' residuals, pooled over GPU kinds (the memory model counts bytes alike on every
    GPU), as the kind ``uncertainty.MEMORY_KIND`` of validation/residuals.yaml."""
    import datetime
    import subprocess

    import yaml

    from simcore.planner.uncertainty import MEMORY_KIND, load_residuals, merge_residuals, residual_table

    path = ROOT / "validation" / "residuals.yaml"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()
    table = residual_table([{"class": "all", "pred_memory_per_gpu_gib": r["predicted_gib"],
                             "meas_memory_per_gpu_gib": r["measured_gib"]} for r in out.to_dict("records")],
                           ("memory_per_gpu_gib",))
    sources = ", ".join(f"{src} ({n})" for src, n in out.groupby("source").size().items())
    doc = merge_residuals({"kinds": load_residuals(path)}, MEMORY_KIND, table, {
        "set": f"published peak memory (dev_memory.csv): {sources}", "when": datetime.date.today().isoformat(),
        "how": f"bench/validate_memory.py: the memory model's peak per GPU against the statistic each source "
               f"reports (commit {commit})", "residual": "ln(measured / predicted)"})
    header = ("# Residuals ln(measured/predicted) per hardware kind and layout class, written by the benches\n"
              "# (bench/validate_local.py, bench/validate_published.py --write-residuals,\n"
              "# bench/validate_memory.py --write-residuals);\n"
              "# simcore/planner/uncertainty.py turns them into prediction intervals.\n")
    atomic_write_text(path, header + yaml.safe_dump(doc, sort_keys=False))
    print(f"residuals written to {path}")


if __name__ == "__main__":
    raise SystemExit(main())
