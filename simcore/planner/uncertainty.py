"""Prediction intervals from the residuals measured on validation sets.

A residual is the log ratio ``ln(measured / predicted)`` of one field of one validated
layout: multiplicative errors, so a 10% under-prediction of a 1 s step and of a 100 s
step count alike. The residuals are kept per hardware kind (``cpu-gloo`` for a calibrated
CPU host, the GPU's catalog name otherwise) and per layout class (which parallel axes a
layout uses, e.g. ``dp+pp``) in ``validation/residuals.yaml``, written by the benches
(``bench/validate_local.py``) together with how they were measured.

The interval of a prediction p from residuals r_1..r_n at level L is
p * exp(q), q over the residual distribution:
- n >= EMPIRICAL_MIN_N: the empirical (1-L)/2 and (1+L)/2 quantiles (linear interpolation,
  Hyndman & Fan 1996, type 7, numpy's default);
- 2 <= n < EMPIRICAL_MIN_N: a normal prediction interval in log space,
  mean +- t * sd * sqrt(1 + 1/n), t Student's quantile with n - 1 degrees of freedom (the
  prediction interval of a new draw from a normal sample of n whose spread is estimated from
  it; with the normal quantile z in its place a sample of 5 covered 84%, not 90%).
The residuals of the layout's own class are used when there are at least MIN_CLASS_N of
them, else those of every class on that hardware kind; a published kind's classes are always
pooled (``pooled_classes``); the interval names what it used.
Pure: no torch, no clock; the loader is the only I/O.
"""
from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

#: Where the benches keep the residual tables (relative to the repository root).
RESIDUALS_PATH = Path(__file__).resolve().parents[2] / "validation" / "residuals.yaml"
#: Smallest sample for empirical quantiles; below it the normal form is used.
EMPIRICAL_MIN_N = 20
#: Smallest per-class sample used on its own; below it the hardware kind's pooled sample.
#: A kind whose table says ``pooled_classes`` (published runs, ``bench/validate_published.py``)
#: always pools them: a layout class's residuals come mostly from one publication and carried
#: poorly to the others (held-out coverage a100 72%, h100 83% by class; 91%, 90% pooled).
MIN_CLASS_N = 3
#: The default two-sided level of an interval.
DEFAULT_LEVEL = 0.9
#: The gap between two layouts' times below which the model does not claim their order:
#: ``bench/crossval.py`` checks the order of measured pairs more than this apart (the noise floor
#: of the published runs), and the model orders 96.7% of them as measured (bench/RESULTS.md).
RANK_MIN_GAP = 0.05
#: The residual set of the memory model's peak per GPU on published runs, pooled over GPU kinds
#: (``bench/validate_memory.py --write-residuals``): the planner's memory margin.
MEMORY_KIND = "gpu-peak-memory"
#: Each thing a question takes beyond every published run (a GPU kind none ran on, more GPUs,
#: a precision, a larger parallel degree, a finer MoE than any run has) widens the interval's
#: log half-width by this factor (ASSUMPTION, not fitted: no published run measures the error
#: out there; the leave-one-source-out residuals already carry an unseen publication's).
EXTRAPOLATION_WIDENING = 1.5
#: The parallel axes whose largest published degree bounds a question (``covers`` in residuals.yaml).
COVERED_AXES = ("tp", "pp", "cp", "ep", "dp_replicate")


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    """A two-sided interval around one predicted field, with the residuals it came from."""

    field: str
    """StepResult field, e.g. ``step_time_s``."""
    value: float
    lo: float
    hi: float
    level: float
    """Two-sided coverage, e.g. 0.9."""
    n: int
    """Residuals used."""
    source: str
    """Which residuals: hardware kind, layout class, validation set and how it was measured."""

    def to_json(self) -> dict:
        return {"interval": [self.lo, self.hi], "level": self.level, "n": self.n, "source": self.source}


def residual(predicted: float, measured: float) -> float:
    """ln(measured / predicted); NaN when either is not positive."""
    if predicted <= 0 or measured <= 0:
        return math.nan
    return math.log(measured / predicted)


def quantile(xs: list[float], q: float) -> float:
    """Type-7 sample quantile (linear interpolation between order statistics)."""
    s = sorted(xs)
    h = (len(s) - 1) * q
    lo = math.floor(h)
    return s[lo] + (h - lo) * (s[min(lo + 1, len(s) - 1)] - s[lo])


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile at probability ``p``: exact for 1 and 2 degrees of freedom, else the
    Cornish-Fisher expansion in the normal quantile (Abramowitz & Stegun 1964, 26.7.5), within
    0.2% of the table from 3 degrees of freedom at the levels used here."""
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    g = ((z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
         (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
         (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(gk / dof ** (k + 1) for k, gk in enumerate(g))


def log_bounds(residuals: list[float], level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """(lower, upper) log-ratio bounds of a ``level`` interval from the residuals (kept per set:
    a search asks for the same few sets' bounds for each of its layout classes)."""
    return _log_bounds(tuple(residuals), level)


@lru_cache(maxsize=256)
def _log_bounds(residuals: tuple[float, ...], level: float) -> tuple[float, float]:
    rs = [r for r in residuals if math.isfinite(r)]
    if len(rs) < 2:
        raise ValueError(f"an interval needs at least 2 residuals, got {len(rs)}")
    if not 0 < level < 1:
        raise ValueError(f"level={level} must lie strictly between 0 and 1")
    if len(rs) >= EMPIRICAL_MIN_N:
        return quantile(rs, (1 - level) / 2), quantile(rs, (1 + level) / 2)
    mu, sd = statistics.mean(rs), statistics.stdev(rs)
    half = t_quantile((1 + level) / 2, len(rs) - 1) * sd * math.sqrt(1 + 1 / len(rs))
    return mu - half, mu + half


def interval(value: float, residuals: list[float], level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """(lo, hi) around ``value``: value * exp(log bounds)."""
    lo, hi = log_bounds(residuals, level)
    return value * math.exp(lo), value * math.exp(hi)


def layout_class(parallel) -> str:
    """The parallel axes a layout uses, joined in a fixed order (``single`` for none):
    e.g. ``dp``, ``dp+pp``, ``tp+pp``, ``zero3`` (FSDP-style sharding), ``dp+recompute``."""
    parts = [axis for axis in ("tp", "cp", "ep") if getattr(parallel, axis, 1) > 1]
    if getattr(parallel, "dp", 1) > 1:
        parts.insert(0, "zero3" if int(getattr(parallel, "zero", 0)) >= 3 else "dp")
    if getattr(parallel, "pp", 1) > 1:
        parts.append("pp")
    return "+".join(parts) or "single"


def hardware_kind(node) -> str:
    """``cpu-gloo`` for a calibrated CPU host, else the GPU's name (catalog or profile)."""
    gpu = node.gpu
    return "cpu-gloo" if getattr(gpu, "vendor", "") == "cpu" or gpu.name.startswith("cpu-") else gpu.name


def residual_kind(cluster) -> str:
    """Whose residuals a plan on ``cluster`` reads: its hardware kind, or ``<kind> over <fabric>`` where its
    chips span torus domains joined by a fabric whose figures are judgements (Google's DCN: the published
    multislice runs carry an error one slice's do not, ``bench/multislice.py``); the kind's own where none."""
    fab, kind = getattr(cluster, "fabric", None), hardware_kind(cluster.node)
    return f"{kind} over {fab.name}" if fab is not None and fab.judged_between(cluster.gpus, cluster.nvlink_domain) \
        else kind


def load_residuals(path: str | os.PathLike | None = None) -> dict:
    """The residual tables (empty when the file does not exist yet); read once per version
    of the file (its path, size and modification time)."""
    path = Path(path) if path else RESIDUALS_PATH
    if not path.exists():
        return {}
    stat = path.stat()
    return _read_residuals(str(path), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _read_residuals(path: str, _mtime_ns: int, _size: int) -> dict:
    doc = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"residuals file {path} must be a mapping of hardware kind -> tables")
    return doc.get("kinds", {})


def pick_residuals(tables: dict, kind: str, cls: str, field: str) -> tuple[list[float], str] | None:
    """The residuals for (kind, class, field), or the kind's pooled ones, with a description."""
    entry = tables.get(kind) or tables.get(kind.split(" over ")[0])   # (``residual_kind``: the kind's own)
    if not entry:
        return None
    by_class = entry.get("residuals") or {}
    how = entry.get("measured", {})
    where = f"{how.get('set', 'validation set')}, {how.get('when', 'date unknown')}"
    own = [r for r in (by_class.get(cls) or {}).get(field, []) if math.isfinite(r)]
    if len(own) >= MIN_CLASS_N and not entry.get("pooled_classes"):
        return own, f"{len(own)} residuals of {field} on {kind}, layout class {cls} ({where})"
    pooled = [r for c in by_class.values() for r in (c or {}).get(field, []) if math.isfinite(r)]
    if len(pooled) >= 2:
        why = "as for every published kind" if entry.get("pooled_classes") else f"class {cls} has {len(own)}"
        return pooled, f"{len(pooled)} residuals of {field} on {kind}, all layout classes pooled ({why}) ({where})"
    return None


def prediction_interval(plan, value: float, field: str = "step_time_s", level: float = DEFAULT_LEVEL,
                        tables: dict | None = None) -> Interval | None:
    """The ``level`` interval of ``value`` (a predicted ``field`` of ``plan``), or None when
    no residuals exist for the plan's hardware kind."""
    tables = load_residuals() if tables is None else tables
    kind, cls = residual_kind(plan.cluster), layout_class(plan.parallel)
    picked = pick_residuals(tables, kind, cls, field)
    if picked is None:
        return None
    rs, source = picked
    lo, hi = interval(value, rs, level)
    return Interval(field=field, value=value, lo=lo, hi=hi, level=level, n=len(rs), source=source)


def memory_log_bounds(level: float = DEFAULT_LEVEL, tables: dict | None = None) -> tuple[float, float, int, str]:
    """(lower, upper) log-ratio bounds of a true peak memory over its prediction, from the
    published peaks' residuals (``MEMORY_KIND``), with their count and source; (0, 0) where
    the residuals file holds none."""
    tables = load_residuals() if tables is None else tables
    picked = pick_residuals(tables, MEMORY_KIND, "all", "memory_per_gpu_gib")
    if picked is None:
        return 0.0, 0.0, 0, f"no residuals of {MEMORY_KIND} in {RESIDUALS_PATH.name}: no margin"
    lo, hi = log_bounds(picked[0], level)
    return lo, hi, len(picked[0]), picked[1]


def residual_table(rows: list[dict], fields: tuple[str, ...]) -> dict:
    """{layout class: {field: [residuals]}} from rows with ``class`` and
    ``pred_<field>`` / ``meas_<field>`` keys (one row per validated layout)."""
    out: dict = {}
    for row in rows:
        for f in fields:
            r = residual(row[f"pred_{f}"], row[f"meas_{f}"])
            if math.isfinite(r):
                out.setdefault(row["class"], {}).setdefault(f, []).append(round(r, 5))
    return out


def merge_residuals(doc: dict, kind: str, table: dict, measured: dict, pooled_classes: bool = False) -> dict:
    """A residuals document with ``kind``'s tables replaced by ``table`` (new dict); ``pooled_classes``:
    its intervals pool the layout classes (``MIN_CLASS_N``)."""
    kinds = dict(doc.get("kinds", {}))
    kinds[kind] = {"measured": dict(measured), "residuals": table, **({"pooled_classes": True} if pooled_classes else {})}
    return {**doc, "kinds": kinds}


def interval_fields(plan, prediction, level: float = DEFAULT_LEVEL, tables: dict | None = None) -> dict:
    """The JSON fields ``trainplan simulate`` prints: ``interval_s`` ([lo, hi] of the step
    time, or None), ``interval_level``, ``interval_source`` (which residuals, or why none) and
    ``extrapolated`` (``extrapolation``'s line, or None): an interval widened for what the
    question takes beyond the published runs, from every published GPU kind's residuals where
    its own kind has none."""
    tables = load_residuals() if tables is None else tables
    kind, cls = residual_kind(plan.cluster), layout_class(plan.parallel)
    factor, line = extrapolation(plan, tables)
    picked = pick_residuals(tables, kind, cls, "step_time_s") or (pooled_published(tables) if line else None)
    if picked is None:
        return {"interval_s": None, "interval_level": level, "extrapolated": line,
                "interval_source": f"no validation residuals for hardware kind {kind} (layout class {cls})"}
    lo, hi = widen(*log_bounds(picked[0], level), factor)
    value = prediction.step_time_s
    source = picked[1] + (f", widened {factor:.2g}x: {line}" if line else "")
    return {"interval_s": [value * math.exp(lo), value * math.exp(hi)], "interval_level": level,
            "interval_source": source, "extrapolated": line}


def interval_columns(df, node, columns: tuple[str, ...] = ("step_time_s", "days", "usd"),
                     level: float = DEFAULT_LEVEL, tables: dict | None = None, plan=None):
    """``df`` (a search or what-if table: a row per layout) with ``<col>_lo`` / ``<col>_hi`` for each of
    ``columns`` present (days and $ scale with the step), from the step-time residuals of each row's layout
    class on ``node``'s kind (``plan``'s ``residual_kind``), and ``interval_source``; NaN where none exist.
    With ``plan`` (the search's base), intervals widen where a layout goes beyond the published runs."""
    tables = load_residuals() if tables is None else tables
    kind = residual_kind(plan.cluster) if plan is not None else hardware_kind(node)
    out = df.copy()
    bounds, picked = {}, []
    for row in out.itertuples(index=False):
        key = _class_key(row, plan)
        if key not in bounds:
            bounds[key] = _class_bounds(tables, kind, key, row, plan, level)
        picked.append(bounds[key])
    factors, sources, lines = (list(x) for x in zip(*picked)) if picked else ([], [], [])
    if plan is not None:
        out["extrapolated"] = lines
    for col in columns:
        if col in out:
            out[col + "_lo"] = [v * math.exp(lo) for v, (lo, _) in zip(out[col], factors)]
            out[col + "_hi"] = [v * math.exp(hi) for v, (_, hi) in zip(out[col], factors)]
    out["interval_source"] = sources
    return out


def interval_key(row) -> tuple:
    """What a layout's step interval depends on in a search: its layout class and its degree of
    each axis an interval widens for (``COVERED_AXES``)."""
    return (layout_class(row), *(int(getattr(row, a, 1) or 1) for a in COVERED_AXES))


def _class_key(row, plan) -> tuple:
    return (layout_class(row),) if plan is None else interval_key(row)


def class_log_bounds(tables: dict, kind: str, row, plan, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
    """The log bounds (lo, hi) of ``row``'s step interval as ``interval_columns`` gives them (NaN where
    no residuals exist)."""
    return _class_bounds(tables, kind, _class_key(row, plan), row, plan, level)[0]


def _class_bounds(tables: dict, kind: str, key: tuple, row, plan, level: float) -> tuple:
    """((lo, hi) log bounds, source, extrapolated line) of one layout class (and degrees)."""
    cls, line, factor = key[0], None, 1.0
    if plan is not None:
        axes = {a: int(getattr(row, a, 1) or 1) for a in COVERED_AXES}
        factor, line = extrapolation(plan, tables, axes)
    picked = pick_residuals(tables, kind, cls, "step_time_s") or (pooled_published(tables) if line else None)
    if picked is None:
        return (math.nan, math.nan), f"no validation residuals for {kind} (layout class {cls})", line
    source = picked[1] + (f", widened {factor:.2g}x: {line}" if line else "")
    return widen(*log_bounds(picked[0], level), factor), source, line


def published_covers(tables: dict) -> dict:
    """{GPU kind: what its published runs cover} (``covers`` of residuals.yaml, written by
    ``bench/validate_published.py``: most GPUs, precisions, each axis's largest degree, MoE)."""
    return {k: e["measured"]["covers"] for k, e in tables.items()
            if isinstance(e, dict) and isinstance(e.get("measured"), dict) and e["measured"].get("covers")}


def pooled_published(tables: dict, field: str = "step_time_s") -> tuple[list[float], str] | None:
    """Every published GPU kind's residuals pooled: the interval of a GPU no run was published on."""
    kinds = sorted(published_covers(tables))
    rs = [r for k in kinds for c in (tables[k].get("residuals") or {}).values() for r in (c or {}).get(field, [])
          if math.isfinite(r)]
    if len(rs) < 2:
        return None
    return rs, f"{len(rs)} residuals of {field} of every published GPU kind pooled ({', '.join(kinds)})"


def _merged(covers: dict) -> dict:
    """What any published run covers: the most GPUs, every precision, each axis's largest
    degree, the finest MoE (most experts, largest top-k, narrowest expert)."""
    cs = list(covers.values())
    moe = [c for c in cs if c.get("experts")]
    return {"gpus": max(c["gpus"] for c in cs), "precisions": sorted({p for c in cs for p in c["precisions"]}),
            **{a: max(c.get(a, 1) for c in cs) for a in COVERED_AXES},   # dp_replicate: recorded since 2026-11-28
            "experts": max((c["experts"] for c in moe), default=0), "top_k": max((c["top_k"] for c in moe), default=0),
            "expert_width": min((c["expert_width"] for c in moe), default=0.0)}


def extrapolated(kind: str, gpus: int, precision: str, axes: dict, moe: tuple | None, tables: dict) -> list[str]:
    """What a question takes beyond every published run, one phrase each: a GPU kind none ran
    on; more GPUs, a precision, a larger parallel degree or a finer MoE than any run has. None
    where no published coverage is recorded, or the kind has residuals of its own without one
    (a calibrated host or GPU: its own runs measured it); a kind whose only published runs fitted
    its figures (``in_sample_only``) is as one none ran on. ``moe``: (experts, top-k, expert
    width / hidden) of an MoE model."""
    covers = published_covers(tables)
    in_sample = ((tables.get(kind) or {}).get("measured") or {}).get("in_sample_only")
    if not covers or (kind in tables and kind not in covers and not in_sample):
        return []
    c = _merged(covers)
    out = [] if kind in covers else [f"{kind}: its published runs fitted its figures, none is out of sample"
                                     if in_sample else f"{kind}: no published run on this GPU"]
    if gpus > c["gpus"]:
        out.append(f"{gpus} GPUs (published runs reach {c['gpus']})")
    if precision.split("/")[0] not in c["precisions"]:
        out.append(f"precision {precision} (published runs: {', '.join(c['precisions'])})")
    out += [f"{a} {axes[a]} (published runs reach {c[a]})" for a in COVERED_AXES if axes.get(a, 1) > c[a]]
    if moe:
        experts, top_k, width = moe
        if not c["experts"]:
            out.append(f"MoE ({experts} experts, top-{top_k}): no published run is MoE")
        elif experts > c["experts"] or top_k > c["top_k"] or width < c["expert_width"]:
            out.append(f"MoE granularity {experts} experts, top-{top_k}, expert width {width:.3g} x hidden "
                       f"(published runs reach {c['experts']}, top-{c['top_k']}, {c['expert_width']:.3g})")
    return out


def extrapolation(plan, tables: dict | None = None, axes: dict | None = None) -> tuple[float, str | None]:
    """(the factor an interval's log half-width widens by, one line saying what is
    extrapolated, or None) for ``plan`` (``axes``: the parallel degrees, where they differ
    from the plan's, as a search's layouts do)."""
    tables = load_residuals() if tables is None else tables
    if not published_covers(tables):
        return 1.0, None
    par, m = plan.parallel, plan.model
    axes = axes or {a: int(getattr(par, a, 1)) for a in COVERED_AXES}
    moe = (m.experts, m.top_k, m.ffn_hidden / m.hidden) if m.experts > 0 else None
    precision = plan.training.precision.value
    items = extrapolated(hardware_kind(plan.cluster.node), plan.cluster.gpus, precision, axes, moe, tables)
    variants = (("Gated DeltaNet layers", m.linear_attention), ("DeepSeek Sparse Attention", m.sparse_attention))
    items += [f"{what}: no published run has it" for what, on in variants if on]
    if not items:
        return 1.0, None
    return EXTRAPOLATION_WIDENING ** len(items), "extrapolated: " + "; ".join(items)


def widen(lo: float, hi: float, factor: float) -> tuple[float, float]:
    """Log bounds (lo, hi) with their half-width times ``factor`` about their middle."""
    mid, half = (lo + hi) / 2, (hi - lo) / 2 * factor
    return mid - half, mid + half
