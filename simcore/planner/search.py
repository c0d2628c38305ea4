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
   time), and tries optimizer offload only where nothing fits without it;
3. ranks the survivors by the analytic path (``simulate(engine="analytic")``);
4. re-simulates the top K on the event engine (``engine="des"``) and re-ranks them;
5. returns the table, the Pareto front of time against cost, the best Plan and why the
   runners-up lose.

Sequence parallelism is switched on with every tp > 1 by default (it moves the same bytes
as TP's all-reduces and divides the activations by tp, Korthikanti et al. 2022, Sec.
4.2.2); ``SearchSpace.sequence_parallel`` can search it too.
"""
from __future__ import annotations

import functools
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import product

import pandas as pd

from simcore.model import memory as mem
from simcore.plan.spec import (Offload, Plan, PlanError, Recompute, Schedule, ZeroStage, check_plan, even_split,
                          plan_from_dict)

#: Candidate values of the axes the search does not derive from the model.
MICRO_BATCHES = (1, 2, 4, 8)
CONTEXT_PARALLEL = (1, 2, 4, 8, 16)
VIRTUAL_STAGES = (2, 3, 4, 6, 8)
RECOMPUTE_ORDER = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
OFFLOAD_ORDER = (Offload.NONE, Offload.OPTIMIZER)
SECONDS_PER_DAY = 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """The values each axis may take; ``derive_space`` fills it for a model and cluster."""

    tp: tuple[int, ...]
    pp: tuple[int, ...]
    cp: tuple[int, ...]
    ep: tuple[int, ...] = (1,)
    vpp: tuple[int, ...] = VIRTUAL_STAGES
    zero: tuple[ZeroStage, ...] = tuple(ZeroStage)
    micro_batch: tuple[int, ...] = MICRO_BATCHES
    schedule: tuple[Schedule, ...] = (Schedule.ONE_F_ONE_B, Schedule.INTERLEAVED_1F1B, Schedule.ZERO_BUBBLE)
    """GPipe is left out by default: the same bubble as 1F1B with all m micro-batches in
    flight instead of p (Narayanan et al. 2021, Sec. 2.2.1), so 1F1B dominates it."""
    recompute: tuple[Recompute, ...] = RECOMPUTE_ORDER
    offload: tuple[Offload, ...] = OFFLOAD_ORDER
    sequence_parallel: tuple[bool, ...] = (True,)
    """Sequence parallelism with tp > 1 (where the sequence splits over tp)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Layout:
    """One point of the search: the fields of a Plan the search changes."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    zero: ZeroStage
    schedule: Schedule
    micro_batch: int
    recompute: Recompute = Recompute.NONE
    offload: Offload = Offload.NONE
    sequence_parallel: bool = False

    def apply(self, base: Plan, explicit_stages: bool = False) -> Plan:
        """The Plan of this layout. ``explicit_stages`` writes the default even split into
        ``stage_layers`` (the same Plan, with the split computed once: faster to evaluate)."""
        stages = _split(base.model.layers, self.pp * self.vpp) if explicit_stages else None
        par = replace(base.parallel, tp=self.tp, pp=self.pp, dp=self.dp, cp=self.cp, ep=self.ep,
                      vpp=self.vpp, zero=self.zero, schedule=self.schedule, stage_layers=stages,
                      sequence_parallel=self.sequence_parallel)
        tr = replace(base.training, micro_batch=self.micro_batch, recompute=self.recompute,
                     offload=self.offload)
        cluster = base.cluster
        gpus = self.tp * self.pp * self.dp * self.cp
        if gpus < cluster.gpus and gpus % cluster.gpus_per_node == 0:   # a smaller booking
            cluster = replace(cluster, nodes=gpus // cluster.gpus_per_node)
        return replace(base, cluster=cluster, parallel=par, training=tr, name=self.label())

    def label(self) -> str:
        sched = self.schedule.value + (f"x{self.vpp}" if self.vpp > 1 else "")
        return (f"tp{self.tp}-pp{self.pp}-dp{self.dp}-cp{self.cp}" + (f"-ep{self.ep}" if self.ep > 1 else "")
                + ("-sp" if self.sequence_parallel else "") + f"-z{int(self.zero)}-mb{self.micro_batch}-{sched}-rc:{self.recompute.value}"
                + (f"-off:{self.offload.value}" if self.offload != Offload.NONE else ""))


@functools.lru_cache(maxsize=1024)
def _split(layers: int, stages: int) -> tuple[int, ...]:
    return even_split(layers, stages)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def derive_space(base: Plan, *, uneven_pp: bool = False, max_tp: int | None = None) -> SearchSpace:
    """tp: divisors of heads, KV heads and FFN width up to the GPUs of a node; pp:
    divisors of the layers (every count up to the layers with ``uneven_pp``); cp: powers
    of two dividing the sequence; ep: divisors of the experts (MoE only)."""
    m = base.model
    g = math.gcd(m.heads, math.gcd(m.kv_heads, m.ffn_hidden))
    limit = max_tp or base.cluster.gpus_per_node
    pp = tuple(range(1, m.layers + 1)) if uneven_pp else tuple(_divisors(m.layers))
    return SearchSpace(
        tp=tuple(d for d in _divisors(g) if d <= limit),
        pp=pp,
        cp=tuple(c for c in CONTEXT_PARALLEL if m.seq_len % c == 0),
        ep=tuple(_divisors(m.experts)) if m.moe else (1,),
    )


def _schedules(space: SearchSpace, pp: int, layers: int) -> list[tuple[Schedule, int]]:
    """(schedule, vpp) pairs for ``pp`` stages: with pp = 1 the schedule does not matter."""
    if pp == 1:
        return [(Schedule.ONE_F_ONE_B, 1)]
    out = [(s, 1) for s in space.schedule if s != Schedule.INTERLEAVED_1F1B]
    if Schedule.INTERLEAVED_1F1B in space.schedule:
        out += [(Schedule.INTERLEAVED_1F1B, v) for v in space.vpp if layers % (pp * v) == 0]
    return out


def families(base: Plan, space: SearchSpace, gpus: int) -> list[Layout]:
    """Every layout with recompute / offload left open (``evaluate_family`` picks them)."""
    m, gb = base.model, base.training.global_batch
    out = []
    for tp, pp, cp in product(space.tp, space.pp, space.cp):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        eps = [e for e in space.ep if (dp * cp) % e == 0]
        zeros = space.zero if dp * cp > 1 else (ZeroStage.NONE,)
        sps = sorted({s and tp > 1 and (m.seq_len // cp) % tp == 0 for s in space.sequence_parallel})
        for ep, zero, mb, (sched, vpp), sp in product(eps, zeros, space.micro_batch,
                                                      _schedules(space, pp, m.layers), sps):
            if gb % (dp * mb):
                continue
            out.append(Layout(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, zero=zero, schedule=sched,
                              micro_batch=mb, sequence_parallel=sp))
    return out


# --------------------------------------------------------------------------- pruning

def _peak_ranks(plan: Plan) -> list[int]:
    """Pipeline ranks that can hold the most bytes: the first (embedding, most micro-batches
    in flight), the last (logits, output layer), the first with the most layers."""
    pp, stages = plan.parallel.pp, plan.layers_per_stage
    layers = [sum(stages[v] for v in range(r, len(stages), pp)) for r in range(pp)]
    return sorted({0, pp - 1, layers.index(max(layers))})


def _activation_key(plan: Plan) -> tuple:
    """What a rank's activation bytes depend on (``memory.activation_bytes``): not the ZeRO
    stage, the offload or the recompute (a key of its own), so layouts share them. Within
    one search every plan holds the base plan's model object, hence its id."""
    par, tr = plan.parallel, plan.training
    interleaved = par.vpp > 1 or par.schedule == Schedule.GPIPE    # memory.in_flight_chunks' cases
    return (id(plan.model), par.tp, par.pp, par.cp, par.vpp, par.schedule if interleaved else None,
            par.sequence_parallel, tr.micro_batch, tr.flash_attention, plan.num_microbatches, plan.layers_per_stage)


def memory_table(plan: Plan, offloads, recomputes, cache: dict | None = None,
                 ) -> dict[tuple[Offload, Recompute], tuple[float, float]]:
    """(GPU bytes of the fullest rank, host offload bytes per node) of ``plan`` under each
    offload x recompute setting: ``memory.memory_per_rank``'s sums, evaluated once for
    the parts the settings share and only on the ranks that can be fullest. ``cache``
    (one per batch of layouts of one base plan) keeps the activation bytes for the next
    layout that differs only in ZeRO stage or schedule twin."""
    params, ranks, stages = mem.stage_params(plan), _peak_ranks(plan), plan.layers_per_stage
    buffers = {r: mem.comm_buffer_bytes(plan, params[r]) for r in ranks}
    framework, fragmentation, count_buffers = mem.framework_terms(plan)
    acts = {}
    for rc in recomputes:
        key = (_activation_key(plan), rc, tuple(ranks)) if cache is not None else None
        if key is None or key not in cache:
            p_rc = replace(plan, training=replace(plan.training, recompute=rc))
            terms = mem._activation_terms(p_rc)
            value = {r: mem.activation_bytes(p_rc, r, stages, terms) for r in ranks}
            if key is None:
                acts[rc] = value
                continue
            cache[key] = value
        acts[rc] = cache[key]
    out = {}
    for off in offloads:
        p_off = replace(plan, training=replace(plan.training, offload=off))
        states = {r: mem.model_state_bytes(p_off, params[r]) for r in ranks}
        host = max(states[r]["host"] for r in ranks) * plan.cluster.gpus_per_node
        for rc in recomputes:
            peak = max((states[r]["weights"] + states[r]["gradients"] + states[r]["optimizer_states"]
                        + acts[rc][r] + (buffers[r] if count_buffers else 0.0)) * (1 + fragmentation)
                       for r in ranks)
            out[off, rc] = (peak + framework, host)
    return out


def fits_memory(plan: Plan, peak_bytes: float, host_bytes_per_node: float) -> bool:
    node = plan.cluster.node
    return peak_bytes <= node.gpu.hbm_bytes and host_bytes_per_node <= node.host_memory_bytes


@dataclass(slots=True)
class Tally:
    """What happened to the candidates (the search's accounting)."""

    candidates: int = 0
    broke_rule: int = 0
    no_fit: int = 0
    dominated: int = 0
    simulated: int = 0
    rules: dict[str, int] = field(default_factory=dict)

    def add(self, other: "Tally") -> None:
        self.candidates += other.candidates
        self.broke_rule += other.broke_rule
        self.no_fit += other.no_fit
        self.dominated += other.dominated
        self.simulated += other.simulated
        for k, v in other.rules.items():
            self.rules[k] = self.rules.get(k, 0) + v


def _rule_key(message: str) -> str:
    """A PlanError message without its numbers, to count rules broken by kind."""
    return " ".join(w for w in message.split() if not any(ch.isdigit() for ch in w))


def _valid(plan: Plan) -> bool:
    try:
        check_plan(plan)
    except PlanError:
        return False
    return True


def _rejected(plan: Plan, tally: Tally, count: int = 1) -> bool:
    """Count (``count`` times) a candidate that breaks a rule of ``check_plan``."""
    try:
        check_plan(plan)
    except PlanError as exc:
        tally.broke_rule += count
        key = _rule_key(str(exc))
        tally.rules[key] = tally.rules.get(key, 0) + count
        return True
    return False


def _twin(family: Layout) -> Layout | None:
    """The 1F1B layout whose StepCosts a zero-bubble layout shares: ``step_costs`` reads the
    schedule only through the stages and the memory model's in-flight chunks, which are the
    same for 1F1B and ZB-H1 with one chunk per rank (``memory.in_flight_chunks``); only the
    analytic path's pipeline term tells them apart."""
    if family.schedule == Schedule.ZERO_BUBBLE and family.vpp == 1:
        return replace(family, schedule=Schedule.ONE_F_ONE_B)
    return None


def evaluate_family(base: Plan, family: Layout, space: SearchSpace, tally: Tally,
                    cache: dict | None = None) -> list[dict]:
    """Rows for one layout: for each offload setting, the lightest recompute that fits
    (heavier recompute only adds time). Offload is tried only when nothing fits without
    it. The rules of ``check_plan`` do not depend on recompute, so each offload setting
    is checked once. ``cache`` (per batch of layouts) reuses activation bytes and a
    zero-bubble layout's 1F1B twin's StepCosts (``_twin``): the same numbers, fewer calls."""
    from simcore.engine.analytic import analytic
    from simcore.model.step_costs import step_costs

    cache = {} if cache is None else cache
    nrc = len(space.recompute)
    tally.candidates += nrc * len(space.offload)
    valid = []
    for off in space.offload:
        plan = replace(family, offload=off, recompute=space.recompute[0]).apply(base, True)
        if not _rejected(plan, tally, nrc):
            valid.append(off)
    if not valid:
        return []
    table = memory_table(plan, valid, space.recompute, cache)
    for k, off in enumerate(valid):
        for i, rc in enumerate(space.recompute):
            lay = replace(family, recompute=rc, offload=off)
            if not fits_memory(base, *table[off, rc]):
                tally.no_fit += 1
                continue
            tally.simulated += 1
            tally.dominated += nrc - i - 1 + nrc * (len(valid) - k - 1)
            plan = lay.apply(base, True)
            twin = _twin(lay)
            costs = cache.pop(("costs", twin), None) if twin is not None else None
            costs = step_costs(plan) if costs is None else replace(costs, plan=plan)
            if lay.schedule == Schedule.ONE_F_ONE_B and lay.vpp == 1 and lay.pp > 1:
                cache["costs", lay] = costs
            return [_row(lay, analytic(costs))]
    return []


def _row(lay: Layout, res) -> dict:
    return {"layout": lay.label(), "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "ep": lay.ep,
            "vpp": lay.vpp, "zero": int(lay.zero), "schedule": lay.schedule.value,
            "micro_batch": lay.micro_batch, "sequence_parallel": lay.sequence_parallel, "recompute": lay.recompute.value, "offload": lay.offload.value,
            "gpus": lay.tp * lay.pp * lay.dp * lay.cp,
            "step_time_s": res.step_time_s, "tokens_per_s": res.tokens_per_s, "mfu": res.mfu,
            "compute_s": res.compute_s, "exposed_comm_s": res.exposed_comm_s, "bubble_s": res.bubble_s,
            "offload_s": res.offload_s, "memory_per_gpu_gib": res.memory_per_gpu_gib, "fits": res.fits}


def _evaluate_chunk(args) -> tuple[list[dict], Tally]:
    base, chunk, space = args
    tally, rows, cache = Tally(), [], {}
    for fam in chunk:
        rows += evaluate_family(base, fam, space, tally, cache)
    return rows, tally


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


def base_plan(model, cluster_doc, global_batch: int, training: dict | None = None) -> Plan:
    """The Plan every layout derives from: ``model`` is a catalog name, a Plan ``model``
    section or a ModelSpec; ``cluster_doc`` a Plan ``cluster`` section (or a ClusterSpec)."""
    from simcore.plan.spec import ClusterSpec, ModelSpec

    model_doc = {"name": model} if isinstance(model, str) else model
    spec = None
    if isinstance(model, ModelSpec):
        spec, model_doc = model, {"name": "gpt-1.7b"}
    cluster = None
    if isinstance(cluster_doc, ClusterSpec):
        cluster, cluster_doc = cluster_doc, {"node": cluster_doc.node.name, "nodes": 1}
    doc = {"model": model_doc, "cluster": cluster_doc, "parallel": {"tp": 1, "pp": 1, "dp": 1},
           "training": {"global_batch": global_batch, "flash_attention": True, **(training or {})}}
    plan = plan_from_dict(doc)
    if spec is not None:
        plan = replace(plan, model=spec)
    if cluster is not None:
        plan = replace(plan, cluster=cluster)
    return plan


def _gpu_counts(plan: Plan, allow_fewer_gpus: bool) -> list[int]:
    """All the cluster's GPUs, or also halves of the nodes down to one node."""
    cl = plan.cluster
    if not allow_fewer_gpus:
        return [cl.gpus]
    nodes, out = cl.nodes, []
    while nodes >= 1:
        out.append(nodes * cl.gpus_per_node)
        if nodes % 2:
            break
        nodes //= 2
    return out


def _price(plan: Plan) -> float:
    from simcore.planner.runcost import resolve_prices

    return resolve_prices(plan).on_demand_usd


def _add_cost(df: pd.DataFrame, plan: Plan, tokens: float | None) -> pd.DataFrame:
    """Days and on-demand $ of the run (useful time only: `trainplan cost` adds
    checkpoints and failures), or $ per million tokens without ``tokens``."""
    price = _price(plan)
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
                  offload=Offload(row["offload"]), sequence_parallel=bool(row["sequence_parallel"]))


def _des(args) -> dict:
    from simcore.engine.predict import simulate

    base, lay = args
    res = simulate(lay.apply(base, True), engine="des")
    return {"des_step_time_s": res.step_time_s, "des_mfu": res.mfu, "des_compute_s": res.compute_s,
            "des_exposed_comm_s": res.exposed_comm_s, "des_bubble_s": res.bubble_s, "des_offload_s": res.offload_s}


def _chunks(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def _run(fn, args: list, jobs: int, progress: bool, desc: str, weights: list[int] | None = None) -> list:
    """``map(fn, args)`` in ``jobs`` processes, with a tqdm bar (weights: units per item)."""
    from tqdm import tqdm

    weights = weights or [1] * len(args)
    out = []
    with tqdm(total=sum(weights), desc=desc, unit="layout", disable=not progress, leave=False) as bar:
        if jobs > 1 and len(args) > 1:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                for w, res in zip(weights, pool.map(fn, args)):
                    out.append(res)
                    bar.update(w)
        else:
            for w, a in zip(weights, args):
                out.append(fn(a))
                bar.update(w)
    return out


def search(model, cluster_doc, global_batch: int, *, objective: str = "time", top_k: int = 10, jobs: int = 1,
           tokens: float | None = None, progress: bool = True, training: dict | None = None,
           space: SearchSpace | None = None, allow_fewer_gpus: bool = False, uneven_pp: bool = False,
           explain: int = 5) -> SearchResult:
    """Every valid layout of ``model`` on the cluster, ranked by ``objective`` (time | cost
    | pareto); the top ``top_k`` re-simulated on the event engine (0: none)."""
    if objective not in ("time", "cost", "pareto"):
        raise ValueError(f"objective={objective!r} is not one of: time, cost, pareto")
    if jobs < 1:
        raise ValueError(f"jobs={jobs} must be at least 1")
    base = base_plan(model, cluster_doc, global_batch, training)
    space = space or derive_space(base, uneven_pp=uneven_pp)
    fams = [f for g in _gpu_counts(base, allow_fewer_gpus) for f in families(base, space, g)]
    chunks = _chunks(fams, max(8, len(fams) // (20 * jobs) + 1))
    results = _run(_evaluate_chunk, [(base, c, space) for c in chunks], jobs, progress, "analytic",
                   [len(c) for c in chunks])
    tally, rows = Tally(), []
    for r, t in results:
        rows += r
        tally.add(t)
    if not rows:
        raise PlanError(f"no layout of {base.model.name} fits {base.cluster.gpus} x {base.cluster.node.gpu.name} "
                        f"with training.global_batch={global_batch} ({_tally_sentence(tally)})")
    df = _objective_order(_add_cost(pd.DataFrame(rows), base, tokens), objective).reset_index(drop=True)
    df = _engine_rerank(df, base, top_k, jobs, progress, objective)
    df.insert(0, "rank", range(1, len(df) + 1))
    best = _layout_of(df.iloc[0]).apply(base)
    best = replace(best, name=f"{base.model.name}-{best.cluster.node.name}x{best.cluster.nodes}-{best.name}")
    return SearchResult(table=df, pareto=pareto_front(df), best=best, objective=objective, tally=tally,
                        explanations=explain_ranking(df, tally, explain))


def _engine_rerank(df: pd.DataFrame, base: Plan, top_k: int, jobs: int, progress: bool,
                   objective: str) -> pd.DataFrame:
    """Re-simulate the first ``top_k`` rows on the event engine and re-rank them by its step
    time (their days and $ scale with it); the rest keep the analytic order. ``step_time_s``
    stays the analytic figure; ``des_*`` columns hold the engine's."""
    if top_k <= 0:
        return df
    head = df.iloc[:top_k].copy()
    des = _run(_des, [(base, _layout_of(r)) for _, r in head.iterrows()], jobs, progress, "event engine")
    for col in des[0]:
        head[col] = [d[col] for d in des]
    scale = head["des_step_time_s"] / head["step_time_s"]
    for col in ("days", "gpu_hours", "usd", "usd_per_mtok"):
        if col in head:
            head[col] = head[col] * scale
    key = {"time": ["des_step_time_s"], "cost": [_cost_column(head), "des_step_time_s"]}.get(objective)
    if key:
        head = head.sort_values(key, kind="stable")
    return pd.concat([head, df.iloc[top_k:]]).reset_index(drop=True)


# --------------------------------------------------------------------------- explanations

_PARTS = (("compute_s", "compute"), ("exposed_comm_s", "exposed communication"), ("bubble_s", "pipeline bubble"),
          ("offload_s", "offload stall"))


def _time_col(row, best) -> str:
    both = "des_step_time_s" in row and pd.notna(row.get("des_step_time_s")) and pd.notna(best.get("des_step_time_s"))
    return "des_" if both else ""


def why_slower(row, best) -> str:
    """One sentence: how ``row`` compares with ``best`` in time (and cost, and GPUs when they
    differ) and which parts of the step grow."""
    pre = _time_col(row, best)
    t, t0 = row[pre + "step_time_s"], best[pre + "step_time_s"]
    deltas = sorted(((row[pre + c] - best[pre + c], name) for c, name in _PARTS), reverse=True)
    grow = [f"{name} {d:+.3g} s" for d, name in deltas if d > 0.005 * t0][:2]
    shrink = [f"{name} {d:+.3g} s" for d, name in deltas[::-1] if d < -0.005 * t0][:1]
    why = ", ".join(grow) or "no single part (a tie within 0.5%)"
    extra = f" (it saves {shrink[0]})" if shrink else ""
    cost_col = next((c for c in ("usd", "usd_per_mtok") if c in row), None)
    cost = f", cost {100 * (row[cost_col] / best[cost_col] - 1):+.1f}%" if cost_col else ""
    gpus = f" on {row['gpus']} GPUs (best: {best['gpus']})" if row["gpus"] != best["gpus"] else ""
    engine = "event engine" if pre else "analytic"
    return (f"{row['layout']}: {t:.3g} s per step{gpus}, time {100 * (t / t0 - 1):+.1f}%{cost} on the best "
            f"({engine}); its step differs by {why}{extra}; {row['memory_per_gpu_gib']:.1f} GiB per GPU")


def _tally_sentence(tally: Tally) -> str:
    common = max(tally.rules.items(), key=lambda kv: kv[1])[0] if tally.rules else ""
    return (f"{tally.candidates} candidates: {tally.broke_rule} break a rule"
            + (f" (most often: {common})" if common else "")
            + f", {tally.no_fit} do not fit in memory, {tally.dominated} are dominated "
            f"(heavier recompute than needed, or offload where none is needed), {tally.simulated} simulated")


def explain_ranking(df: pd.DataFrame, tally: Tally, explain: int = 5) -> list[str]:
    """Why the runners-up lose: the top ``explain`` after the best, then the best layout of
    each tp and pp value that is not among them."""
    best = df.iloc[0]
    out = [_tally_sentence(tally), f"best: {best['layout']} at {best['step_time_s']:.2f} s per step (analytic), "
                                   f"MFU {best['mfu']:.1%}, {best['memory_per_gpu_gib']:.1f} GiB per GPU"]
    shown = set(range(1, min(len(df), explain + 1)))
    out += [f"#{i + 1} {why_slower(df.iloc[i], best)}" for i in sorted(shown)]
    for axis in ("tp", "pp", "cp"):
        for value, idx in df.groupby(axis).head(1).set_index(axis)["rank"].items() if "rank" in df else ():
            i = int(idx) - 1
            if i > 0 and i not in shown:
                shown.add(i)
                out.append(f"best with {axis}={value} is #{i + 1}: {why_slower(df.iloc[i], best)}")
    return out


#: Columns the CLI prints for ``trainplan plan`` (the table has more).
TABLE_COLUMNS = ("rank", "tp", "pp", "dp", "cp", "vpp", "zero", "recompute", "micro_batch", "schedule", "offload",
                 "step_time_s", "des_step_time_s", "mfu", "memory_per_gpu_gib", "days", "usd", "usd_per_mtok")


def summary_table(result: SearchResult, rows: int = 20) -> str:
    """The first ``rows`` of the ranked table, in the columns a reader needs."""
    cols = [c for c in TABLE_COLUMNS if c in result.table]
    return result.table[cols].head(rows).to_string(index=False, float_format=lambda v: f"{v:,.3f}")
