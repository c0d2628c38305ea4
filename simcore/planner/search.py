"""Layout search: enumerate, prune, rank analytically, re-simulate the best on the engine.

The layouts of a model on a cluster are the products of the ParallelSpec and
TrainingSpec choices (tp, pp, cp, ep, vpp, ZeRO stage, schedule, micro-batch,
recompute, offload) with tp*pp*dp*cp = the cluster's GPUs. The search, as the
Megatron-LM paper does by hand (Narayanan et al. 2021, Sec. 3, "takeaways": TP within
a node, PP across nodes, then DP), and as the automatic planners do by exhaustion
(Alpa, Zheng et al. OSDI'22; the Calculon search, Isaev et al. SC'23):

1. builds each candidate from the divisibility rules (tp divides the heads, KV heads and
   FFN width and stays inside a node; pp divides the layers; cp divides the sequence;
   dp is what is left; the micro-batches divide the global batch), then lets
   ``check_plan`` have the final word (a PlanError rejects a candidate);
2. prunes by memory (``simcore.model.memory``) before any timing, and by dominance: for a
   given layout it keeps only the lightest recompute that fits (recompute only adds
   time), and tries optimizer offload only where nothing fits without it; without a
   pipeline, where recompute or offload was needed, it also times the layout with the
   fewest layers' activations offloaded to host memory that fit without recomputing
   (``evaluate._offloaded``: cheap over NVLink-C2C, dear over PCIe);
3. ranks the survivors by the analytic path (``simulate(engine="analytic")``);
4. re-simulates the top K on the event engine (``engine="des"``) and re-ranks them;
5. returns the table, the Pareto front of time against cost, the best Plan and why the
   runners-up lose.

The space and its candidates live in ``simcore.planner.space``; the rules, the pruning
and the analytic timing of each candidate in ``simcore.planner.evaluate``; this module
runs them (in ``jobs`` processes), ranks, re-simulates the top K and explains.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pandas as pd

from simcore.plan.choices import NoLayoutFits
from simcore.plan.spec import Offload, Plan, Recompute, Schedule, ZeroStage
from simcore.planner.prices import ranking_price
from simcore.planner.bound import bound_of, log_ends, split_sample
from simcore.planner.evaluate import Tally, _evaluate_chunk
from simcore.planner.ranking import display_table, explain_ranking, summary_table, tally_sentence  # noqa: F401
from simcore.planner.space import Layout, SearchSpace, _gpu_counts, base_plan, derive_space, families, precision_axis

SECONDS_PER_DAY = 86400.0


# --------------------------------------------------------------------------- the search

@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    table: pd.DataFrame
    """Every simulated layout, best first (``rank`` 1 is ``best``)."""
    pareto: pd.DataFrame
    """Layouts no other beats on both time and cost, fastest first."""
    best: Plan
    explanations: list[str]
    tally: Tally
    objective: str


def _add_cost(df: pd.DataFrame, price: float, tokens: float | None) -> pd.DataFrame:
    """Days and on-demand $ of the run (useful time only: `trainplan cost` adds
    checkpoints and failures), or $ per million tokens without ``tokens``."""
    hours_per_token = 1.0 / df["tokens_per_s"] / 3600.0
    if tokens:
        df["days"] = tokens / df["tokens_per_s"] / SECONDS_PER_DAY
        df["gpu_hours"] = tokens * hours_per_token * df["gpus"]
        df["usd"] = df["gpu_hours"] * price
    else:
        df["usd_per_mtok"] = 1e6 * hours_per_token * df["gpus"] * price
    return df


def _cost_column(df: pd.DataFrame) -> str:
    return "usd" if "usd" in df else "usd_per_mtok"


def pareto_front(df: pd.DataFrame, time_col: str = "step_time_s", cost_col: str | None = None) -> pd.DataFrame:
    """Rows no other row beats on both ``time_col`` and ``cost_col`` (lower is better), fastest first."""
    cost_col = cost_col or _cost_column(df)
    ordered = df.sort_values([time_col, cost_col], kind="stable")
    keep, best_cost = [], math.inf
    for idx, cost in zip(ordered.index, ordered[cost_col]):
        if cost < best_cost:
            keep.append(idx)
            best_cost = cost
    return ordered.loc[keep]


#: Significant digits to which two layouts' step time and memory are the same answer: the
#: model's own arithmetic agrees to far more; the published runs it is checked against, to
#: a few per cent (bench/RESULTS.md).
TIE_DIGITS = 6


def _complexity(df: pd.DataFrame) -> pd.DataFrame:
    """What makes a layout harder to run, most important first: a compression method (it changes
    the numbers trained on), parallel dimensions in use, ZeRO stage, activation offload, then the
    context-parallel, virtual-stage, expert, tensor and pipeline sizes."""
    axes = sum((df[a] > 1).astype(int) for a in ("tp", "pp", "dp", "cp", "ep")) + (df["vpp"] > 1).astype(int)
    offload = df["activation_offload"] if "activation_offload" in df else 0
    lossy = (df["compression"].fillna("") != "").astype(int) if "compression" in df else 0
    return pd.DataFrame({"lossy": lossy, "axes": axes, "zero": df["zero"], "offload": offload, "cp": df["cp"], "vpp": df["vpp"],
                         "ep": df["ep"], "tp": df["tp"], "pp": df["pp"], "micro_batch": df["micro_batch"]},
                        index=df.index)


def merge_ties(df: pd.DataFrame) -> pd.DataFrame:
    """Layouts whose predictions are the same answer (step time and memory to ``TIE_DIGITS``
    significant digits, on the same GPUs) are one row: the simplest of them (``_complexity``),
    with ``ties`` (how many others) and ``tied_with`` (their names). Rows keep their order."""
    key = pd.DataFrame({c: df[c].map(lambda x: float(f"{x:.{TIE_DIGITS}g}")) for c in
                        ("step_time_s", "memory_per_gpu_gib")}).assign(gpus=df["gpus"])
    group = key.groupby(list(key.columns), sort=False).ngroup()
    cx = _complexity(df)
    simple = cx.assign(_g=group).sort_values(["_g", *cx.columns], kind="stable")
    keep = simple.groupby("_g", sort=False).head(1).index
    names: dict[int, list[str]] = {}
    for g, lay in zip(group, df["layout"]):
        names.setdefault(g, []).append(lay)
    out = df[df.index.isin(keep)].copy()
    out["ties"] = [len(names[g]) - 1 for g in group[out.index]]
    out["tied_with"] = [", ".join(n for n in names[g] if n != lay) for g, lay in zip(group[out.index], out["layout"])]
    return out


def _objective_order(df: pd.DataFrame, objective: str) -> pd.DataFrame:
    if objective == "time":
        return df.sort_values(["step_time_s", "memory_per_gpu_gib"], kind="stable")
    if objective == "cost":
        return df.sort_values([_cost_column(df), "step_time_s"], kind="stable")
    # pareto: the front first, ordered by time x cost (its knee first), then the rest by time
    front = pareto_front(df)
    knee = front.assign(_k=front["step_time_s"] * front[_cost_column(df)]).sort_values("_k").drop(columns="_k")
    return pd.concat([knee, df.drop(index=front.index).sort_values("step_time_s", kind="stable")])


def _layout_of(row) -> Layout:
    return Layout(tp=int(row["tp"]), pp=int(row["pp"]), dp=int(row["dp"]), cp=int(row["cp"]), ep=int(row["ep"]),
                  vpp=int(row["vpp"]), zero=ZeroStage(int(row["zero"])), schedule=Schedule(row["schedule"]),
                  micro_batch=int(row["micro_batch"]), recompute=Recompute(row["recompute"]),
                  offload=Offload(row["offload"]), sequence_parallel=bool(row["sequence_parallel"]),
                  activation_offload=int(row.get("activation_offload", 0)), autocast=bool(row.get("autocast", False)),
                  split=str(row.get("split", "even")), expert_tp=int(row.get("expert_tp", 0)),
                  recompute_layers=int(row.get("recompute_layers", 0)), precision=str(row.get("precision", "")),
                  fp8_recipe=str(row.get("fp8_recipe", "")), dp_replicate=int(row.get("dp_replicate", 1)),
                  compression=c if isinstance(c := row.get("compression", ""), str) else "",
                  kv_replicator=int(row.get("kv_replicator", 1)))


#: The most layouts the event engine re-simulates in one search: each takes it up to a few
#: seconds (``simcore.plan.bounds.EVENT_PASSES``), so more would run for minutes; the analytic
#: ranking covers the rest.
MAX_TOP_K = 32
_DES_KEYS = ("des_step_time_s", "des_mfu", "des_compute_s", "des_exposed_comm_s", "des_bubble_s", "des_offload_s")


def _des(args) -> dict:
    """The event engine's figures of one layout; NaN (``des_skipped``) where its step holds more
    passes than the engine plays within seconds."""
    from simcore.engine.predict import simulate
    from simcore.plan.bounds import EVENT_PASSES, event_passes

    base, lay = args
    plan = lay.apply(base, True)
    if event_passes(plan) > EVENT_PASSES:
        return {**dict.fromkeys(_DES_KEYS, math.nan), "des_skipped": True}
    res = simulate(plan, engine="des")
    return {**dict(zip(_DES_KEYS, (res.step_time_s, res.mfu, res.compute_s, res.exposed_comm_s, res.bubble_s,
                                   res.offload_s))), "des_skipped": False}


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _run(fn, args: list, jobs: int, progress: bool, desc: str, weights: list[int] | None = None) -> list:
    """``map(fn, args)`` in up to ``jobs`` processes (``simcore.planner.workers``: they end with
    the command, whatever stops it), with a tqdm bar (weights: units per item)."""
    from tqdm import tqdm

    from simcore.planner.workers import imap

    weights = weights or [1] * len(args)
    out = []
    results = imap(fn, args, jobs)
    try:
        with tqdm(total=sum(weights), desc=desc, unit="layout", disable=not progress, leave=False) as bar:
            for w, res in zip(weights, results):
                out.append(res)
                bar.update(w)
    finally:
        results.close()
    return out


def _evaluate(base: Plan, fams: list[Layout], space: SearchSpace, jobs: int, progress: bool, bound: tuple,
              tally: Tally, rows: list[dict]) -> None:
    """``fams`` evaluated in batches (``evaluate._evaluate_chunk``, in ``jobs`` processes) under
    ``bound`` (``simcore.planner.bound``); their rows added to ``rows``, their counts to ``tally``."""
    chunks = _chunks(fams, max(8, len(fams) // (20 * jobs) + 1))
    for r, t in _run(_evaluate_chunk, [(base, c, space, bound) for c in chunks], jobs, progress, "analytic",
                     [len(c) for c in chunks]):
        rows += r
        tally.add(t)


def _bounded(base: Plan, fams: list[Layout], space: SearchSpace, jobs: int, progress: bool, objective: str,
             min_headroom_gib: float, stack: str | None, refuses) -> tuple[Tally, list[dict]]:
    """The tally and rows of ``fams``: a sample first, then the others under the bound its best
    gives (``simcore.planner.bound``: the best that leaves the headroom asked and that ``stack``
    runs)."""
    from simcore.planner.formatting import hbm_gib

    first, rest = split_sample(fams)
    tally, rows = Tally(), []
    _evaluate(base, first, space, jobs, progress, (math.inf, False, {}), tally, rows)
    runs = None
    if stack:
        from simcore.planner.stacks import exporter_check
        refused = refuses or exporter_check(stack)
        runs = lambda row: refused(_layout_of(row).apply(base)) is None  # noqa: E731
    _evaluate(base, rest, space, jobs, progress,
              bound_of(rows, objective, hbm_gib(base) - max(0.0, min_headroom_gib), log_ends(base, fams), runs),
              tally, rows)
    return tally, rows


def search(model, cluster_doc, global_batch: int, *, objective: str = "time", top_k: int = 10, jobs: int = 1,
           tokens: float | None = None, progress: bool = True, training: dict | None = None,
           space: SearchSpace | None = None, allow_fewer_gpus: bool = False, uneven_pp: bool = True,
           explain: int = 5, min_headroom_gib: float = 0.0, activation_offload: bool = True,
           stack: str | None = None, refuses=None, parallel: dict | None = None,
           precisions: list[str] | None = None, hybrid: bool = False,
           compressions: list[str] | None = None) -> SearchResult:
    """Every valid layout of ``model`` on the cluster, ranked by ``objective`` (time | cost
    | pareto); the top ``top_k`` re-simulated on the event engine (0: none). With
    ``min_headroom_gib`` only layouts that leave that much GPU memory are ranked; without
    ``activation_offload`` none offloads activations; with ``stack`` only layouts that stack
    runs (``stacks.STACKS``: its exporter writes them; ``refuses(plan)``, where given, says
    why a layout cannot run instead); ``parallel`` holds the stack's switches each layout takes
    where it can (``space.SWITCHES``); pipelines of every depth unless ``uneven_pp`` is False
    (then only those whose stages divide the layers); ``precisions`` the training precisions to
    search (``['all']``: every one the GPU has a peak for; default: the base plan's); ``hybrid``
    also hybrid sharding, the shard group one NVLink domain (``SearchSpace.hybrid``); ``compressions``
    the communication compression methods to try beside none (``simcore.planner.compression``)."""
    from simcore.planner.compression import absent_notes
    from simcore.planner.formatting import hbm_gib
    from simcore.planner.headroom import headroom_note, keep_roomy, recommended_first

    if objective not in ("time", "cost", "pareto"):
        raise ValueError(f"objective={objective!r} is not one of: time, cost, pareto")
    if jobs < 1:
        raise ValueError(f"jobs={jobs} must be at least 1")
    if tokens is not None:
        from simcore.plan.bounds import check_tokens

        tokens = check_tokens(tokens)
    if top_k < 0:
        raise ValueError(f"top_k={top_k} must be 0 or more (the layouts re-simulated on the event engine)")
    if top_k > MAX_TOP_K:
        raise ValueError(f"top_k={top_k} is over {MAX_TOP_K}: the event engine takes up to a few seconds a layout, "
                         "and the analytic ranking covers the rest")
    base = base_plan(model, cluster_doc, global_batch, training, parallel)
    space = _space_for(base, space or derive_space(base, uneven_pp=uneven_pp), precisions, activation_offload,
                       hybrid, compressions)
    from simcore.planner.stacks import hardware_stack, stack_base, stack_space

    stack, chosen = hardware_stack(base, stack)
    space, base = stack_space(space, stack, base), stack_base(base, stack)
    fams = [f for g in _gpu_counts(base, allow_fewer_gpus) for f in families(base, space, g)]
    tally, rows = _bounded(base, fams, space, jobs, progress, objective, min_headroom_gib, stack, refuses)
    if not rows:
        raise NoLayoutFits(f"no layout of {base.model.name} fits {base.cluster.gpus} x {base.cluster.node.gpu.name} "
                        f"with training.global_batch={global_batch} ({tally_sentence(tally)})")
    price, unpriced = ranking_price(base, objective)
    df = _objective_order(merge_ties(_add_cost(pd.DataFrame(rows), price, tokens)), objective).reset_index(drop=True)
    what = f"{base.model.name} on {base.cluster.gpus} x {base.cluster.node.gpu.name}"
    df = keep_roomy(df, hbm_gib(base), min_headroom_gib, what)
    left_out = ""
    if stack:
        from simcore.planner.stacks import exporter_check, keep_runnable
        df, left_out = keep_runnable(df, lambda row: _layout_of(row).apply(base), refuses or exporter_check(stack),
                                     stack, what)
    # the recommendation among the layouts re-simulated (it joins them where it ranked lower)
    df = recommended_first(_engine_rerank(recommended_first(df), base, top_k, jobs, progress, objective))
    df, squeezed = _lossless(df, base, top_k, jobs, progress, objective)
    df.insert(0, "rank", range(1, len(df) + 1))
    df = _with_intervals_and_headroom(df, base)
    best = _layout_of(df.iloc[0]).apply(base)
    best = replace(best, name=f"{base.model.name}-{best.cluster.node.name}x{best.cluster.nodes}-{best.name}")
    explanations = explain_ranking(df, tally, explain)
    explanations[2:2] = headroom_note(df, hbm_gib(base))   # right after the best layout's line
    explanations[1:1] = [s for s in (chosen, left_out) if s]
    explanations += [unpriced] if unpriced else []
    explanations += ([squeezed] if squeezed else []) + absent_notes(space.compression, df["compression"])
    if isinstance(wide := df.iloc[0].get("extrapolated"), str) and wide:   # uncertainty.extrapolation's line
        explanations.append(f"The best layout's interval is widened for what no published run covers: {wide}.")
    explanations += _skipped(df)
    return SearchResult(table=df, pareto=pareto_front(df), best=best, objective=objective, tally=tally,
                        explanations=explanations + _overlap(df))


def _lossless(df: pd.DataFrame, base: Plan, top_k: int, jobs: int, progress: bool, objective: str):
    """``compression.lossless_first`` on the ranked table (and its sentence), the recommendation
    re-simulated on the event engine where it came from beyond the layouts that were."""
    from simcore.planner.compression import lossless_first

    df, squeezed = lossless_first(df, "step_time_s" if objective != "cost" else _cost_column(df))
    if top_k and squeezed and pd.isna(df.iloc[0].get("des_step_time_s")):
        df = _engine_rerank(df, base, 1, jobs, progress, objective)
    return df, squeezed


def _space_for(base: Plan, space: SearchSpace, precisions, activation_offload: bool, hybrid: bool,
               compressions) -> SearchSpace:
    """``space`` with ``search``'s options: the precisions, activation offload, hybrid sharding and
    the compression methods beside none (``simcore.planner.compression``)."""
    if precisions:
        space = replace(space, precision=precision_axis(precisions, base.cluster.node.gpu))
    if not activation_offload:
        space = replace(space, activation_offload=(False,))
    if hybrid:
        space = replace(space, hybrid=(False, True))
    if compressions:
        from simcore.planner.compression import check_methods

        space = replace(space, compression=check_methods(["none", *compressions], "compression"))
    return space


def _with_intervals_and_headroom(df: pd.DataFrame, base: Plan) -> pd.DataFrame:
    """The step-time residuals' interval on every time, day and $ column (``*_lo``/``*_hi``)
    and the memory headroom (``formatting.headroom_gib``)."""
    from simcore.planner.formatting import hbm_gib, headroom_gib
    from simcore.planner.uncertainty import interval_columns

    df = interval_columns(df, base.cluster.node, ("step_time_s", "days", "usd", "usd_per_mtok", "des_step_time_s",
                                                  "des_days", "des_usd", "des_usd_per_mtok"), plan=base)
    df.insert(df.columns.get_loc("memory_per_gpu_gib") + 1, "headroom_gib",
              headroom_gib(hbm_gib(base), df["memory_per_gpu_gib"]))
    return df


def _overlap(df: pd.DataFrame) -> list[str]:
    """A sentence when the best layout's interval overlaps the next ones' (first five)."""
    from simcore.planner.formatting import ranking_overlap

    col = "des_step_time_s" if "des_step_time_s_lo" in df and pd.notna(df.iloc[0].get("des_step_time_s")) \
        else "step_time_s"
    head = df.head(5)
    if col == "des_step_time_s":
        head = head[head["des_step_time_s"].notna()]
    line = ranking_overlap([(r["layout"], r[col + "_lo"], r[col + "_hi"]) for _, r in head.iterrows()])
    return [line[0].upper() + line[1:] + "."] if line else []


def _engine_rerank(df: pd.DataFrame, base: Plan, top_k: int, jobs: int, progress: bool,
                   objective: str) -> pd.DataFrame:
    """Re-simulate the first ``top_k`` rows on the event engine and re-rank them by its step
    time (or its $); the rest keep the analytic order. ``step_time_s``, ``days``, ``usd`` stay
    the analytic figures; ``des_*`` columns hold the engine's (its days and $ scale with its
    step), one engine per column (``simcore.planner.ranking``)."""
    if top_k <= 0:
        return df
    head = df.iloc[:top_k].copy()
    des = _run(_des, [(base, _layout_of(r)) for _, r in head.iterrows()], jobs, progress, "event engine")
    for col in des[0]:
        head[col] = [d[col] for d in des]
    scale = head["des_step_time_s"] / head["step_time_s"]
    for col in ("days", "gpu_hours", "usd", "usd_per_mtok"):
        if col in head:
            head["des_" + col] = head[col] * scale
    key = {"time": ["des_step_time_s"], "cost": ["des_" + _cost_column(head), "des_step_time_s"]}.get(objective)
    if key:   # a layout the engine could not play keeps its analytic place after those it did
        head = head.sort_values(key, kind="stable", na_position="last")
    return pd.concat([head, df.iloc[top_k:]]).reset_index(drop=True)


def _skipped(df: pd.DataFrame) -> list[str]:
    """A sentence where layouts meant for the event engine were left to the analytic path."""
    from simcore.plan.bounds import EVENT_PASSES

    n = int(df["des_skipped"].fillna(False).astype(bool).sum()) if "des_skipped" in df else 0
    return [f"{n} of the layouts ranked first {'was' if n == 1 else 'were'} not re-simulated on the event engine: "
            f"a step of {'it' if n == 1 else 'each'} holds more than {EVENT_PASSES:,} micro-batch passes (pp x vpp x "
            "micro-batches), which the engine plays one by one; their figures are the analytic path's."] if n else []
