"""The procedure that fits the catalog's FITTED figures (``fitting.FIGURES``) to named rows
of ../shared/validation: the rows as Plans, their predictions, the objective and the search.

Objective. A block's loss is the mean over its sources of each source's mean squared log
error, ln(predicted / measured)^2 over its rows: every source weighs the same, so vTrain's
1,440 single-node runs do not outvote a ten-row table. The FP8 ratios are fitted to pairs (an
FP8 run and its BF16 twin of the same publication and configuration), whose error is that
of the speed-up, ln(predicted speed-up / published speed-up): what the pair shares cancels.

Search. The figures fitted to the rows (the GEMM plateaus, the framework's per-kernel times,
the interference, the Triton kernel's ratio) are one block, fitted jointly on every row; the
FP8 ratios are fitted to their pairs and the 500 W H100's clock to torchtitan's own tables;
the blocks are fitted in turn until a full round moves none. Within a block a
pattern search moves one figure at a time on the grid of the digits the catalog stores,
within the figure's bounds: a step either way (then two figures a step each), doubled while
the loss falls, until no such step lowers it. It starts at each figure's prior; a block whose rows are all left out keeps
its priors. Deterministic: the same rows give the same figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

import fitting as F
from simcore.engine.predict import simulate
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError
from topologies.hardware import load_catalog

FILES = ("dev_runs.csv", "vtrain_runs.csv", "dev_modern.csv", F.ACCELERATOR_ROWS)


@dataclass(slots=True)
class Row:
    """One published run: its candidate Plans (a source's blank fields searched) and its time."""

    file: str
    index: int
    source: str
    model: str
    measured_s: float
    plans: list = field(default_factory=list)
    gpu: str = ""
    precision: str = "bf16"
    """bf16, or fp8/<recipe>, mxfp8, nvfp4 (the first plan's)."""
    triton: bool = False
    twin: int | None = None
    """The row (index in the list) of this FP8 run's BF16 twin, where the publication has one."""


def load_rows(validation: Path) -> list[Row]:
    """Every row ``bench/validate_published.py`` predicts, as Plans (rows it leaves out are
    left out here too)."""
    import published_modern as modern
    import validate_published as vp

    catalog, rows = load_catalog(), []
    for name in FILES[:3]:
        df, modern_file = pd.read_csv(validation / name), name == "dev_modern.csv"
        for i, r in df.iterrows():
            if modern_file and modern.skip_reason(r):
                continue
            docs = modern.choices(r, modern.base_doc(r)) if modern_file else vp._choices(r, vp.base_doc(r))
            plans = []
            for doc in docs:
                try:
                    plans.append(plan_from_dict(doc, catalog=catalog))
                except PlanError:
                    continue
            t = plans[0].training
            prec = t.precision.value + (f"/{t.fp8_recipe.value}" if t.precision.value == "fp8" else "")
            meas = modern.measured_step_s(r) if modern_file else vp.measured_step_s(r)
            rows.append(Row(name, int(i), r.source, str(r.model), float(meas), plans, plans[0].cluster.node.gpu.name,
                            prec, t.attention_kernel == "triton"))
    _pair_twins(rows, validation)
    rows += accelerator_rows(validation, catalog)
    return rows


def accelerator_rows(validation: Path, catalog) -> list[Row]:
    """The rows of dev_accelerators.csv that validate_published predicts (``published_accelerators
    .refusal`` None), as Plans by their source's rule."""
    import published_accelerators as acc

    path, out = validation / F.ACCELERATOR_ROWS, []
    if not path.exists():
        return out
    for i, r in pd.read_csv(path).iterrows():
        if acc.refusal(r, catalog):
            continue
        plans = [plan_from_dict(doc, catalog=catalog) for doc in acc.choices(r, acc.base_doc(r))]
        out.append(Row(F.ACCELERATOR_ROWS, int(i), r.source, str(r.model), float(acc.measured_step_s(r)), plans,
                       plans[0].cluster.node.gpu.name, plans[0].training.precision.value))
    return out


def _pair_twins(rows: list[Row], validation: Path) -> None:
    """Link each FP8 row to its BF16 twin: same publication family (the source without its
    _bf16/_fp8 suffix), model, sequence, GPUs, micro-batch and batch."""
    df = pd.read_csv(validation / "dev_modern.csv")
    keys = {}
    for k, row in enumerate(rows):
        if row.file != "dev_modern.csv":
            continue
        r = df.loc[row.index]
        family = row.source.removesuffix("_bf16").removesuffix("_fp8")
        keys[k] = (family, r.model, int(r.seq_len), int(r.num_gpus), r.micro_batch, int(r.global_batch_seqs))
    bf16 = {key: k for k, key in keys.items() if rows[k].precision == "bf16"}
    for k, key in keys.items():
        if rows[k].precision.startswith("fp8/") and key in bf16:
            rows[k].twin = bf16[key]


def predict(row: Row) -> float:
    """The row's predicted step: the fastest of its Plans that fits (validate_published's rule)."""
    best = min((not res.fits, res.step_time_s) for res in (simulate(p) for p in row.plans))
    return best[1]


def relevant(row: Row) -> tuple[str, ...]:
    """The fitted figures a row's prediction reads (a prediction is cached on their values)."""
    for block, (_, family) in F.PLATEAUS.items():   # a family's own figures only, no GPU framework figure
        if row.gpu in family:
            return tuple(f.name for f in F.FIGURES if f.block == block)
    out = ["kernel_overhead_us", "host_overhead_us", "comm_compute_interference"]
    if row.gpu in F.A100:
        out.append("a100_plateau")
    if row.gpu in (*F.H100, F.H100_500W, *F.B200_FAMILY):
        out.append("h100_plateau")
    if row.triton and row.gpu in (*F.H100, F.H100_500W):
        out.append("triton_ratio")
    if row.gpu in F.HOPPER_FP8 and row.precision in ("fp8/delayed", "fp8/current", "fp8/tensorwise"):
        out.append("fp8_matmul_ratio")
    if row.gpu in F.HOPPER_FP8 and row.precision == "fp8/rowwise":
        out.append("fp8_rowwise")
    if row.gpu == F.H100_500W:
        out.append("h100_500w_clock")
    return tuple(out)


def predictions(rows: list[Row], idx, values: dict, cache: dict) -> dict[int, float]:
    """{row: predicted step} for rows ``idx`` with the fitted figures at ``values``; ``cache``
    keeps each row's prediction per value of the figures it reads."""
    keys = {k: (k, tuple(values[n] for n in relevant(rows[k]))) for k in idx}
    missing = [k for k, key in keys.items() if key not in cache]
    if missing:
        with F.override(values):
            for k in missing:
                cache[keys[k]] = predict(rows[k])
    return {k: cache[key] for k, key in keys.items()}


def block_rows(rows: list[Row], block: str) -> list[int]:
    """The rows (indices) a block is fitted to (``fitting.Figure.rows`` in words)."""
    if block == "rows":   # every GPU row; the accelerators' rows fit their own family's figures only
        return [k for k, r in enumerate(rows) if r.file != F.ACCELERATOR_ROWS]
    if block in F.PLATEAUS:   # one accelerator family's rows of dev_accelerators.csv
        family = F.PLATEAUS[block][1]
        return [k for k, r in enumerate(rows) if r.file == F.ACCELERATOR_ROWS and r.gpu in family]
    if block == "fp8":
        return [k for k, r in enumerate(rows) if r.twin is not None and r.precision in ("fp8/delayed", "fp8/tensorwise")
                and r.gpu in F.HOPPER_FP8]
    if block == "rowwise":
        return [k for k, r in enumerate(rows) if r.twin is not None and r.precision == "fp8/rowwise"]
    return []   # clock500: torchtitan's own tables (``fleet_loss``), not rows of ../shared/validation


def prior_blocks(rows: list[Row], exclude: str) -> list[str]:
    """The blocks with rows that have none left once source ``exclude`` is left out: their
    figures refitted without it are their priors (a family published by one source alone)."""
    return [b for b in F.BLOCKS if b != "clock500" and (idx := block_rows(rows, b))
            and all(rows[k].source == exclude for k in idx)]


def _by_source(errors: list[tuple[str, float]]) -> float:
    per: dict[str, list[float]] = {}
    for src, e in errors:
        per.setdefault(src, []).append(e * e)
    return sum(sum(v) / len(v) for v in per.values()) / len(per) if per else 0.0


def loss(rows: list[Row], idx: list[int], block: str, values: dict, cache: dict) -> float:
    """The block's loss over rows ``idx`` with the fitted figures at ``values``."""
    if block == "clock500":
        with F.override(values):
            return fleet_loss()
    if block in ("fp8", "rowwise"):   # pairs: the log error of the speed-up over the BF16 twin
        p = predictions(rows, idx + [rows[k].twin for k in idx], values, cache)
        errs = [(rows[k].source, math.log((p[rows[k].twin] / p[k]) / (rows[rows[k].twin].measured_s
                                                                      / rows[k].measured_s))) for k in idx]
    else:
        p = predictions(rows, idx, values, cache)
        errs = [(rows[k].source, math.log(p[k] / rows[k].measured_s)) for k in idx]
    return _by_source(errs)


def fleet_loss() -> float:
    """The 500 W H100's loss: torchtitan's Llama 3.1 8B FSDP2 + compile tables on its fleet
    (``bench/torchtitan_fleet.py`` ROWS), the log error of tokens/s."""
    import torchtitan_fleet as tf

    errs = []
    for table, gpus, published in tf.ROWS:
        step = simulate(plan_from_dict(tf.plan_doc(gpus))).step_time_s
        errs.append((table, math.log(published / (tf.LOCAL_BATCH * tf.LLAMA31_8B["seq_len"] / step))))
    return _by_source(errs)


def _steps(figs) -> list[tuple]:
    """The moves tried: one figure a step either way, then two figures a step each (a valley
    along two figures that trade against each other, as the per-kernel GPU and host times do)."""
    single = [((f, s),) for f in figs for s in (1, -1)]
    pairs = [((f, s), (g, t)) for i, f in enumerate(figs) for g in figs[i + 1:] for s in (1, -1) for t in (1, -1)]
    return single + pairs


def fit_block(rows, block: str, values: dict, exclude: str | None, cache: dict) -> dict:
    """``values`` with the block's figures moved to a local minimum of its loss: no single or
    paired step on the grid lowers it (a move that lowers it is repeated, doubled, while it does)."""
    figs = [f for f in F.FIGURES if f.block == block]
    idx = [k for k in block_rows(rows, block) if rows[k].source != exclude]
    if block != "clock500" and not idx:
        return {**values, **{f.name: f.prior for f in figs}}
    values, moves = dict(values), _steps(figs)
    best = loss(rows, idx, block, values, cache)
    moved = True
    while moved:
        moved = False
        for move in moves:
            mult = 1
            while True:
                trial = {**values, **{f.name: F.on_grid(f, values[f.name] + s * mult * f.step) for f, s in move}}
                if trial == values:
                    break
                got = loss(rows, idx, block, trial, cache)
                if got >= best - 1e-12:
                    break
                values, best, moved, mult = trial, got, True, mult * 2
            if moved and len(move) == 2:
                break   # back to the single steps from the new point
    return values


def fit(rows: list[Row], exclude: str | None = None, start: dict | None = None, log=None,
        cache: dict | None = None) -> dict:
    """Every fitted figure, from its prior (or ``start``), with the rows of source ``exclude``
    left out; the blocks in turn until a round moves none."""
    values = dict(start) if start else {f.name: f.prior for f in F.FIGURES}
    cache = {} if cache is None else cache
    for _ in range(10):
        before = dict(values)
        for block in F.BLOCKS:
            values = fit_block(rows, block, values, exclude, cache)
        if log:
            log(f"  round: {values}")
        if values == before:
            break
    return values
