"""The planner checked against the teams: does the search find what they ran, at their scale?

    .venv/bin/python bench/frontier.py [--validation DIR] [--min-gpus 256] [--source NAME ...] [--jobs N] [--quiet]

Every published run of ``--min-gpus`` GPUs or more in ../shared/validation whose layout is
stated (dev_runs, vtrain_runs, dev_modern; and the rows of dev_accelerators that
validate_published predicts: TPU, Trainium) becomes its Plan by validate_published's rules
(one rule per source; blanks filled by the fastest choice that fits, as the authors tuned).
A chip with its own stack is searched for it, as ``trainplan plan`` does (a TPU for MaxText:
``stacks.hardware_stack``), a run whose source names a stack trainplan exports for that stack
(NeuronX Distributed's Trainium rows: ``--stack nxd``), one whose stack trainplan does not export over
every layout (neuronx-nemo-megatron's Trainium rows: ``--stack any``), and its published layout is looked
for in that stack's space.
Runs of the same model, GPUs, batch, sequence and precision form one question, which the
search answers once, with the same stack switches (TP overlap, overlapped parameter gather,
the MoE dispatcher, the gradient dtype, the allocator's setting, the attention kernel) and
the layout left open. Per question it prints whether each published layout is in the search
space (the same tp, pp, dp, cp, ep, schedule, virtual stages, split of the layers,
micro-batch, ZeRO stage and a recompute the search tries), whether it is predicted to fit
and with what headroom, its predicted step time, the planner's best, and the best over the
published prediction and over the fastest measurement.

Targets (issue 50): every published layout in the search space and predicted to fit; the
planner's best never slower than the published layout's prediction and at most 1.15x the
published measurement. Exit code 0 whatever the figures (a benchmark prints; the tests
assert); writes bench/out/frontier.csv.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import published_modern as modern  # noqa: E402
import validate_published as vp  # noqa: E402
from simcore.engine.predict import simulate  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402
from simcore.plan.spec import Plan  # noqa: E402
from simcore.planner.search import search  # noqa: E402
from simcore.planner.space import SWITCHES, base_plan, derive_space, families  # noqa: E402
from simcore.planner.stacks import exporter_check, hardware_stack, stack_space  # noqa: E402
from simcore.results import GIB  # noqa: E402
from topologies.hardware import load_catalog  # noqa: E402

#: The Plan's training fields a layout sets (the search chooses them); the rest is the stack's.
LAYOUT_TRAINING = ("micro_batch", "recompute", "recompute_method", "recompute_layers", "offload", "activation_offload")
TARGET_RATIO = 1.15


def published_rows(validation: Path, min_gpus: int, sources: tuple[str, ...] = ()) -> pd.DataFrame:
    """Rows of ``min_gpus`` GPUs or more with a stated layout (of ``sources`` only, where given), each with its
    Plan doc and measurement."""
    catalog, out = load_catalog(), []
    for name in vp.FILES:
        df = pd.read_csv(validation / name)
        modern_file = name == "dev_modern.csv"
        for i, row in df.iterrows():
            if int(row.num_gpus) < min_gpus or pd.isna(row.tp) or pd.isna(row.pp):
                continue
            if sources and row.source not in sources:
                continue
            if modern_file and modern.skip_reason(row):
                continue
            _, doc, _ = vp.predict_row(row, catalog, modern_file)
            measured = modern.measured_step_s(row) if modern_file else vp.measured_step_s(row)
            out.append({"file": name, "row": i, "source": row.source, "model": row.model, "gpus": int(row.num_gpus),
                        "doc": doc, "measured_s": measured, "stack": None})
    accel = validation / vp.ACCEL
    for i, row in (pd.read_csv(accel).iterrows() if accel.exists() else ()):
        if int(row.num_chips) < min_gpus or sources and row.source not in sources or vp.acc.refusal(row, catalog):
            continue
        _, doc, _ = vp.predict_row(row, catalog)
        out.append({"file": vp.ACCEL, "row": i, "source": row.source, "model": row.model, "gpus": int(row.num_chips),
                    "doc": doc, "measured_s": vp.acc.measured_step_s(row),
                    "stack": "nxd" if vp.acc.nxd_row(row) else ("any" if row.source == vp.acc.NEURON else None)})
    return pd.DataFrame(out)


def question_key(doc: dict, stack: str | None = None) -> str:
    """What the search is asked: the model, cluster, batch and the stack (not the layout)."""
    training = {k: v for k, v in doc["training"].items() if k not in LAYOUT_TRAINING}
    switches = {k: v for k, v in doc["parallel"].items() if k in SWITCHES}
    return json.dumps([doc["model"], doc["cluster"], training, switches, stack], sort_keys=True, default=str)


def _same_layout(searched: Plan, published: Plan) -> bool:
    """The same layout, or the searched one with sequence parallelism where the published ran TP
    without it: the search turns it on with every tp > 1, as it moves the same bytes as TP's
    all-reduces and divides the activations by tp (Korthikanti et al. 2022, Sec. 4.2.2). A ZeRO stage over
    one data-parallel rank shards nothing (MindSpeed's Mistral 7B passes --use-distributed-optimizer at dp 1):
    any stage is that layout."""
    pa, pb = searched.parallel, published.parallel
    fields = ("tp", "pp", "dp", "cp", "ep", "vpp", "schedule", "etp", "zero_impl", "kv_replicator")
    sp = pa.sequence_parallel == pb.sequence_parallel or (pa.sequence_parallel and pb.tp > 1)
    zero = pa.zero == pb.zero or pb.dp * pb.cp == 1
    return (sp and zero and all(getattr(pa, f) == getattr(pb, f) for f in fields)
            and searched.layers_per_stage == published.layers_per_stage
            and searched.training.micro_batch == published.training.micro_batch)


def in_space(base: Plan, published: Plan, stack: str | None = None) -> tuple[bool, str]:
    """Whether the search proposes ``published`` (and, if not, what is missing): in the space of
    ``stack``, or of the stack a search on its chip ranks for (``stacks.hardware_stack``; every layout
    where none)."""
    stack, _ = hardware_stack(base, stack)
    space = stack_space(derive_space(base), stack, base)
    if stack and (why := exporter_check(stack)(published)):   # the search keeps only what the stack runs
        return False, why
    tr = published.training
    if tr.recompute not in space.recompute or tr.offload not in space.offload:
        return False, f"recompute {tr.recompute.value} / offload {tr.offload.value} not searched"
    for fam in families(base, space, published.parallel.gpus):
        if fam.tp == published.parallel.tp and fam.pp == published.parallel.pp and \
                _same_layout(fam.apply(base, True), published):
            return True, ""
    par = published.parallel
    return False, (f"no tp{par.tp}-pp{par.pp}-dp{par.dp}-cp{par.cp}-ep{par.ep}-vpp{par.vpp} family with split "
                   f"{list(published.layers_per_stage)} and micro-batch {tr.micro_batch}")


def answer(args: tuple[str, list[dict]]) -> list[dict]:
    """The search's answer to one question, held against each published run of it."""
    key, runs = args
    doc = runs[0]["doc"]
    training = {k: v for k, v in doc["training"].items() if k not in LAYOUT_TRAINING and k != "global_batch"}
    switches = {k: v for k, v in doc["parallel"].items() if k in SWITCHES}
    gb = doc["training"]["global_batch"]
    stack = runs[0]["stack"]
    result = search(doc["model"], doc["cluster"], gb, training=training, parallel=switches, top_k=0,
                    progress=False, explain=0, stack=stack)
    best = result.table.iloc[0]
    base = base_plan(doc["model"], doc["cluster"], gb, training, switches)
    fastest = min(r["measured_s"] for r in runs)
    out = []
    for r in runs:
        published = plan_from_dict(r["doc"])
        res = simulate(published)
        found, why = in_space(base, published, stack)
        hbm = published.cluster.node.gpu.hbm_bytes / GIB
        out.append({"question": key, "source": r["source"], "model": r["model"], "gpus": r["gpus"], "row": r["row"],
                    "published": _short(published), "in_space": found, "why": why,
                    "fits": res.fits, "headroom_gib": hbm - res.memory_per_gpu_gib, "predicted_s": res.step_time_s,
                    "measured_s": r["measured_s"], "fastest_measured_s": fastest, "best": best["layout"],
                    "best_s": best["step_time_s"], "best_headroom_gib": hbm - best["memory_per_gpu_gib"],
                    "best_over_predicted": best["step_time_s"] / res.step_time_s,
                    "best_over_measured": best["step_time_s"] / fastest})
    return out


def _short(plan: Plan) -> str:
    par, tr = plan.parallel, plan.training
    split = "" if len(set(plan.layers_per_stage)) == 1 else f" split {_runs(plan.layers_per_stage)}"
    return (f"tp{par.tp}-pp{par.pp}-dp{par.dp}-cp{par.cp}" + (f"-ep{par.ep}" if par.ep > 1 else "")
            + f"-z{int(par.zero)}-mb{tr.micro_batch}-{par.schedule.value}" + (f"x{par.vpp}" if par.vpp > 1 else "")
            + f"-rc:{tr.recompute.value}{split}")


def _runs(stages: tuple[int, ...]) -> str:
    """7,8x14,7 for (7, 8, ..., 8, 7)."""
    out, i = [], 0
    while i < len(stages):
        j = i
        while j < len(stages) and stages[j] == stages[i]:
            j += 1
        out.append(f"{stages[i]}x{j - i}" if j - i > 1 else str(stages[i]))
        i = j
    return ",".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=vp.DEFAULT_VALIDATION)
    ap.add_argument("--min-gpus", type=int, default=256)
    ap.add_argument("--source", action="append", default=[],
                    help="only this source's rows (repeatable), e.g. mindspeed_llm_readme_2024 with --min-gpus 8")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--quiet", action="store_true", help="print only the summary")
    args = ap.parse_args(argv)
    if not (args.validation / vp.FILES[0]).exists():
        print(f"frontier: {args.validation / vp.FILES[0]} not found; pass --validation DIR", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = published_rows(args.validation, args.min_gpus, tuple(args.source))
    questions: dict[str, list[dict]] = {}
    for r in rows.to_dict("records"):
        r["stack"] = r["stack"] if isinstance(r["stack"], str) else None   # a DataFrame reads None back as NaN
        questions.setdefault(question_key(r["doc"], r["stack"]), []).append(r)
    items = list(questions.items())
    print(f"{len(rows)} published runs of {args.min_gpus}+ GPUs with a stated layout, {len(items)} questions",
          file=sys.stderr)
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            answers = list(pool.map(answer, items))
    else:
        answers = [answer(q) for q in items]
    out = pd.DataFrame([a for group in answers for a in group])
    report(out, args.quiet)
    print(f"({len(out)} runs, {len(items)} searches in {time.perf_counter() - t0:.0f} s)")
    dest = ROOT / "bench" / "out" / "frontier.csv"
    dest.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(dest, index=False)
    return 0


def report(out: pd.DataFrame, quiet: bool) -> None:
    pd.set_option("display.width", 250)
    pd.set_option("display.max_colwidth", 70)
    pd.set_option("display.max_rows", 500)
    if not quiet:
        cols = ["source", "model", "gpus", "published", "in_space", "fits", "headroom_gib", "predicted_s",
                "measured_s", "best", "best_s", "best_over_predicted", "best_over_measured"]
        print(out[cols].to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    missing = out[~out.in_space]
    unfit = out[~out.fits]
    slower = out[out.best_over_predicted > 1 + 1e-9]
    per_q = out.groupby("question").best_over_measured.first()   # one answer a question
    far = per_q[per_q > TARGET_RATIO]
    first = out.groupby("question").first()
    print(f"\npublished layouts in the search space: {len(out) - len(missing)}/{len(out)} (target: all)")
    for r in missing.itertuples():
        print(f"  not in the space: {r.source} {r.model} {r.gpus} GPUs {r.published}: {r.why}")
    print(f"published layouts predicted to fit: {len(out) - len(unfit)}/{len(out)} (target: all)")
    for r in unfit.itertuples():
        print(f"  does not fit: {r.source} {r.model} {r.gpus} GPUs {r.published} ({r.headroom_gib:+.1f} GiB)")
    print(f"planner's best no slower than the published layout's prediction: {len(out) - len(slower)}/{len(out)}")
    for r in slower.itertuples():
        print(f"  slower: {r.source} {r.model} {r.gpus} GPUs: best {r.best} {r.best_s:.3f} s against "
              f"{r.published} {r.predicted_s:.3f} s")
    print(f"questions whose best is at most {TARGET_RATIO}x the fastest published measurement: "
          f"{len(per_q) - len(far)}/{len(per_q)}; worst {per_q.max():.3f}x")
    for question, ratio in far.items():
        q = first.loc[question]
        print(f"  {ratio:.3f}x: {q.source} {q.model} {q.gpus} GPUs, best {q.best} {q.best_s:.3f} s against the fastest "
              f"measured {q.fastest_measured_s:.3f} s")


if __name__ == "__main__":
    raise SystemExit(main())
