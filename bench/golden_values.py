"""Megatron-LM's functional tests predicted on their own hardware (issue 52); nothing is fitted.

    .venv/bin/python bench/golden_values.py [--quiet]

Every case x golden file of ``validation/megatron_golden/cases.yaml`` (NVIDIA/Megatron-LM's
``tests/functional_tests/test_cases``; SOURCES.md there) is imported with trainplan's own
Megatron importer (``simcore.plan.interop.import_plan``) from the test's launch: ``torchrun
--nproc-per-node G --nnodes N <script> <MODEL_ARGS>`` on the catalog node of the golden
file's platform. The analytic path predicts the step time; the memory model the peak.

Compared:
- step time: the golden ``iteration-time`` (median after warm-up) against ``simulate(plan)``'s
  step time.
- peak: the golden ``mem-max-allocated-bytes`` is ``torch.cuda.max_memory_allocated`` on rank
  ``world_size - 1`` (the last pipeline stage): tensors only. The model's figure is the last
  pipeline rank's total of ``memory_report`` less the allocator margin and the CUDA context
  (the terms ``trainplan memory`` lists as included in its total).

A case the Plan cannot state is counted under its reason, never dropped: the importer's or
the Plan's one-sentence refusal (PlanError / UsageError), or before importing, a training
script that is not ``pretrain_gpt.py`` (BERT, T5, hybrid Mamba, LLaVA, RL: the Plan states
decoder-only GPT models, and the importer does not look at the script's name), a golden file
that names no hardware, a case whose nodes x GPUs the repository does not give.

For the stated cases the layout read back (tp, pp, cp, dp, vpp, micro-batch, global batch,
sequence, layers) is checked against the arguments (Megatron's own defaults: dp = world /
(tp*pp*cp), global batch = micro-batch x dp); a difference is an importer finding, printed.

These tests are tiny models on one or two nodes with small batches: kernel launches and
framework overheads dominate their steps, which the model does not try to hold. The figures
are what they are. Exit 0 whatever they are. Writes bench/out/golden_values.csv.
"""
from __future__ import annotations

import argparse
import csv
import shlex
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from simcore.engine.predict import simulate  # noqa: E402
from simcore.model.step_costs import memory_report  # noqa: E402
from simcore.plan.interop import import_plan  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402
from simcore.plan.megatron_shell import options  # noqa: E402
from simcore.plan.spec import PlanError  # noqa: E402
from topologies.components import CatalogError  # noqa: E402
from trainplan.common import UsageError  # noqa: E402

DATA = ROOT / "validation" / "megatron_golden" / "cases.yaml"
OUT = ROOT / "bench" / "out" / "golden_values.csv"
#: the golden file's platform -> the catalog node (Draco-OCI and DGXC are DGX A100 80GB / H100 hosts)
CLUSTER = {"dgx_a100": "dgx-a100-80gb", "dgxa100_dracooci": "dgx-a100-80gb",
           "dgxa100_dracooci-ord": "dgx-a100-80gb", "dgx_h100": "dgx-h100", "dgxh100_dgxc": "dgx-h100",
           "dgx_gb200": "gb200-nvl72"}
#: the hardware a MAPE is reported for
HARDWARE = {"dgx-a100-80gb": "A100", "dgx-h100": "H100", "gb200-nvl72": "GB200"}
GPT_SCRIPT = "pretrain_gpt.py"
GIB = 1024**3


def golden_rows(path: Path = DATA) -> list[dict]:
    """One row per case x golden file, the case's fields with the file's, and ``args``: the
    arguments of the run the file records (MODEL_ARGS_2 for a resume test's second run)."""
    doc = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    rows = []
    for case in doc["cases"]:
        for g in case["golden"]:
            args = case.get("model_args_2") if g["run"] == 2 and case.get("model_args_2") else case["model_args"]
            rows.append({"case": case["case"], "script": case["script"], "test_type": case["test_type"],
                         "commit": doc["commit"], **g, "args": args})
    return rows


def launch(row: dict) -> str:
    return (f"torchrun --nproc-per-node {row['gpus_per_node']} --nnodes {row['nodes']} "
            f"{row['script']} {row['args']}")


def not_stated(row: dict) -> str | None:
    """Why a row is not imported at all (before the importer), or None."""
    if row["hardware"] not in CLUSTER:
        return "the golden file names no hardware (legacy golden_values_{dev,lts}.json)"
    if not row["nodes"]:
        return "no CI recipe in the repository gives the case's nodes x GPUs (release runs)"
    script = row["script"].rsplit("/", 1)[-1]
    if script != GPT_SCRIPT:
        return f"{script} does not train a decoder-only GPT (the Plan states GPT decoders)"
    return None


def state(row: dict):
    """The row's Plan and the importer's warnings; PlanError/UsageError/CatalogError as raised."""
    doc, warnings = import_plan(megatron=launch(row), cluster=CLUSTER[row["hardware"]], nodes=row["nodes"])
    return plan_from_dict(doc), warnings


def expected_layout(row: dict) -> dict:
    """The layout the arguments give, by Megatron's own defaults."""
    opts = options(shlex.split(row["args"]), "megatron")
    one = lambda name, default=None: int(opts[name][0]) if opts.get(name) else default  # noqa: E731
    tp, pp = one("--tensor-model-parallel-size", 1), one("--pipeline-model-parallel-size", 1)
    cp = one("--context-parallel-size", 1)
    world = row["nodes"] * row["gpus_per_node"]
    dp = world // (tp * pp * cp)
    micro = one("--micro-batch-size", 1)
    layers = one("--num-layers")
    vpp = one("--num-virtual-stages-per-pipeline-rank")
    if vpp is None and one("--num-layers-per-virtual-pipeline-stage") and layers:
        vpp = layers // (pp * one("--num-layers-per-virtual-pipeline-stage"))
    return {"tp": tp, "pp": pp, "cp": cp, "dp": dp, "vpp": vpp or 1, "micro_batch": micro,
            "global_batch": one("--global-batch-size", micro * dp), "seq_len": one("--seq-length"),
            "layers": layers}


def read_back(plan) -> dict:
    p, t, m = plan.parallel, plan.training, plan.model
    return {"tp": p.tp, "pp": p.pp, "cp": p.cp, "dp": p.dp, "vpp": p.vpp, "micro_batch": t.micro_batch,
            "global_batch": t.global_batch, "seq_len": m.seq_len, "layers": m.layers}


def layout_name(plan) -> str:
    p = plan.parallel
    parts = [f"tp{p.tp}", f"pp{p.pp}", f"dp{p.dp}"] + [f"{k}{v}" for k, v in (("cp", p.cp), ("ep", p.ep),
                                                                               ("vpp", p.vpp)) if v > 1]
    return "-".join(parts) + f" mb{plan.training.micro_batch} gb{plan.training.global_batch}"


def predict(plan) -> tuple[float, float]:
    """Step seconds (analytic) and the last pipeline rank's tensor bytes (no allocator
    margin, no CUDA context: what torch.cuda.max_memory_allocated counts)."""
    step = simulate(plan).step_time_s
    last = memory_report(plan)["ranks"][-1]
    tensors = last["total"] - last["terms"]["allocator_margin"] - last["terms"]["cuda_context"]
    return step, tensors


def _err(pred, gold):
    return (pred - gold) / gold if pred is not None and gold else None


def evaluate(rows: list[dict]) -> tuple[list[dict], Counter, list[str]]:
    """Per-row results, refusals by reason, importer findings."""
    results, refused, findings = [], Counter(), []
    for row in rows:
        res = {k: row[k] for k in ("case", "file", "hardware", "nodes", "gpus_per_node", "layout_from", "test_type")}
        res.update(cluster=CLUSTER.get(row["hardware"], ""), stated=False, reason="", layout="",
                   golden_step_s=row["iteration_time_s"], golden_peak_bytes=row["mem_max_allocated_bytes"],
                   pred_step_s=None, pred_peak_bytes=None, step_err=None, peak_err=None)
        reason = not_stated(row)
        if reason is None:
            try:
                plan, _ = state(row)
                step, tensors = predict(plan)
            except (PlanError, UsageError, CatalogError) as exc:
                reason = f"{type(exc).__name__}: {exc}"
            else:
                want, got = expected_layout(row), read_back(plan)
                for key in want:
                    if want[key] is not None and want[key] != got[key]:
                        findings.append(f"{row['case']} ({row['file']}): {key} is {want[key]} in the arguments, "
                                        f"{got[key]} in the Plan")
                res.update(stated=True, layout=layout_name(plan), pred_step_s=step, pred_peak_bytes=tensors,
                           step_err=_err(step, row["iteration_time_s"]),
                           peak_err=_err(tensors, row["mem_max_allocated_bytes"]))
        if reason:
            refused[reason] += 1
            res["reason"] = reason
        results.append(res)
    return results, refused, findings


def unread_scripts(rows: list[dict]) -> Counter:
    """Non-GPT training scripts the importer takes as GPT without a word (a finding): script ->
    rows it imported."""
    taken = Counter()
    for row in rows:
        script = row["script"].rsplit("/", 1)[-1]
        if row["hardware"] in CLUSTER and row["nodes"] and script != GPT_SCRIPT:
            try:
                state(row)
            except (PlanError, UsageError, CatalogError):
                continue
            taken[script] += 1
    return taken


def mape(errs) -> float | None:
    errs = [abs(e) for e in errs if e is not None]
    return statistics.fmean(errs) if errs else None


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.0%}"


def _fmt(x, scale=1.0, digits=3) -> str:
    return "-" if x is None else f"{x / scale:.{digits}f}"


def report(results: list[dict], refused: Counter, findings: list[str], taken: Counter, quiet: bool) -> None:
    stated = [r for r in results if r["stated"]]
    if not quiet:
        print(f"{'case':<78} {'hardware':<20} {'layout':<30} {'step s pred/gold':>17} {'err':>6} "
              f"{'peak GiB pred/gold':>19} {'err':>6}")
        for r in stated:
            where = f"{r['hardware']} {r['nodes']}x{r['gpus_per_node']}"
            print(f"{r['case'][:78]:<78} {where:<20} "
                  f"{r['layout'][:30]:<30} {_fmt(r['pred_step_s']):>8}/{_fmt(r['golden_step_s']):<8} "
                  f"{_pct(r['step_err']):>6} {_fmt(r['pred_peak_bytes'], GIB, 2):>9}/"
                  f"{_fmt(r['golden_peak_bytes'], GIB, 2):<9} "
                  f"{_pct(r['peak_err']):>6}")
        print()
    print(f"{len(results)} golden files of {len({r['case'] for r in results})} cases: {len(stated)} stated "
          f"({len({r['case'] for r in stated})} cases), {sum(refused.values())} not stated")
    print("\nper hardware (stated files; MAPE = mean |pred - golden| / golden; median signed error):")
    by = defaultdict(list)
    for r in stated:
        by[HARDWARE[r["cluster"]]].append(r)
    for hw in ("A100", "H100", "GB200"):
        rs = by.get(hw, [])
        steps = [r["step_err"] for r in rs if r["step_err"] is not None]
        peaks = [r["peak_err"] for r in rs if r["peak_err"] is not None]
        med = lambda xs: f"{statistics.median(xs):+.0%}" if xs else "-"  # noqa: E731
        print(f"  {hw:<6} {len(rs):>4} files  step time MAPE {_pct(mape(steps)).lstrip('+'):>6} over {len(steps):>3} "
              f"(median {med(steps)})   peak allocated MAPE {_pct(mape(peaks)).lstrip('+'):>6} over {len(peaks):>3} "
              f"(median {med(peaks)})")
    print("\nnot stated, by reason:")
    for reason, n in refused.most_common():
        print(f"  {n:>4}  {reason}")
    print("\nimporter findings:")
    for script, n in sorted(taken.items()):
        print(f"  {script}: imported as a GPT decoder in {n} golden files (the importer does not read the "
              "training script's name)")
    for line in sorted(set(findings)):
        print(f"  {line}")
    if not taken and not findings:
        print("  none")


def write_csv(results: list[dict], path: Path = OUT) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, list(results[0]))
        w.writeheader()
        w.writerows(results)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quiet", action="store_true", help="no per-case table")
    args = ap.parse_args(argv)
    rows = golden_rows()
    results, refused, findings = evaluate(rows)
    report(results, refused, findings, unread_scripts(rows), args.quiet)
    write_csv(results)
    print(f"\nwrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
