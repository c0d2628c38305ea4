"""What ``bench/validate_published.py`` prints beyond the in-sample error: the
leave-one-source-out (LOSO) error, the coverage of the intervals built from those residuals,
whether the model orders a publication's layouts as measured, and the noise floor where a
configuration was measured twice.

LOSO: every FITTED figure refitted without the source (``bench/fit.py`` stores the figures in
``validation/fits.yaml``), then the source's rows predicted with them. A source whose error
jumps when it is left out is one whose rows a figure was fitted to alone.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import yaml

import fitting
from simcore.planner import uncertainty as u

FITS = Path(__file__).resolve().parents[1] / "validation" / "fits.yaml"
#: Pairs of runs closer than this (per sequence, measured) are not ranked: the noise floor.
RANK_MIN_GAP = u.RANK_MIN_GAP
#: Coverage is judged for GPU kinds with at least this many rows: on the residuals the planner
#: reads (the row's own among them) from ``uncertainty.EMPIRICAL_MIN_N`` rows on, where the
#: intervals are their empirical quantiles; below it, where they are Student-t prediction
#: intervals for a new draw (which cover their own sample by construction), each row's
#: interval without it (leave-one-out).
COVERAGE_MIN_ROWS = 10


def load_fits(path: Path = FITS) -> dict | None:
    return yaml.safe_load(path.read_text()) if path.exists() else None


def stale(fits: dict | None) -> str | None:
    """Why fits.yaml does not describe the catalog as it stands, or None."""
    if not fits:
        return f"{FITS.name} not found: run bench/fit.py (leave-one-source-out errors need it)"
    stored = fitting.stored_values()
    moved = [k for k, v in stored.items() if fits["figures"].get(k, {}).get("value") != v]   # new figures too
    if moved:
        return f"{FITS.name} is stale (the catalog's {', '.join(moved)} differ): rerun bench/fit.py"
    return None


def loso_predictions(out: pd.DataFrame, frames: dict, fits: dict, predict) -> pd.Series:
    """Each row predicted with the figures fitted without its source; ``predict(row, modern)``
    is validate_published's ``predict_row`` (its step time first)."""
    pred = pd.Series(math.nan, index=out.index)
    for src, grp in out.groupby("source"):
        with fitting.override(fits["leave_one_source_out"].get(src)):
            for i, r in grp.iterrows():
                pred[i] = predict(frames[r.file].loc[r.row], r.file == "dev_modern.csv")
    return pred


def error_table(out: pd.DataFrame) -> pd.DataFrame:
    """Per file and source: rows, in-sample MAPE, LOSO MAPE and the jump between them."""
    d = out.assign(ins=(out.predicted_s / out.measured_s - 1).abs(), loso=(out.loso_s / out.measured_s - 1).abs())
    per_src = d.groupby(["file", "source"]).agg(rows=("ins", "size"), in_sample=("ins", "mean"), loso=("loso", "mean"))
    per_file = d.groupby("file").agg(rows=("ins", "size"), in_sample=("ins", "mean"), loso=("loso", "mean"))
    per_file.index = pd.MultiIndex.from_tuples([(f, "(file)") for f in per_file.index])
    table = pd.concat([per_src, per_file]).sort_index()
    return table.assign(jump=table.loso - table.in_sample)


def residual_tables(out: pd.DataFrame, column: str = "loso_s") -> dict:
    """{kind: {class: {"step_time_s": [ln(measured / predicted)]}}} of ``column``'s predictions."""
    return {kind: u.residual_table([{"class": r["class"], "pred_step_time_s": r[column],
                                     "meas_step_time_s": r["measured_s"]} for r in g.to_dict("records")],
                                   ("step_time_s",))
            for kind, g in out.groupby("kind")}


def interval_coverage(out: pd.DataFrame, column: str = "loso_s", level: float = u.DEFAULT_LEVEL) -> pd.DataFrame:
    """Per GPU kind: the share of rows whose measurement lies in the ``level`` interval of its
    prediction, the interval from ``column``'s residuals of the row's kind and class
    (``covered``: the residuals the planner reads, the row's own among them; ``one_out``: all
    but the row's own; ``held_out``: those of the kind's other sources only, as a publication
    not yet seen would get)."""
    recs = []
    for kind, g in out.groupby("kind"):
        classes = list(g["class"].unique())
        own = _bounds(g, level, classes, column)
        for src, rows in g.groupby("source"):
            held = _bounds(g[g.source != src], level, classes, column)
            for i, r in rows.iterrows():
                x = u.residual(r[column], r["measured_s"])
                recs.append({"kind": kind, "covered": _inside(x, own.get(r["class"])),
                             "one_out": _inside(x, _bounds_without(g, i, level, column)),
                             "held_out": _inside(x, held.get(r["class"]))})
    d = pd.DataFrame(recs).groupby("kind").agg(rows=("covered", "size"), covered=("covered", "mean"),
                                               one_out=("one_out", "mean"), held_out=("held_out", "mean"))
    judged = d.covered.where(d.rows >= u.EMPIRICAL_MIN_N, d.one_out)
    return d.assign(target=[coverage_verdict(n, j) for n, j in zip(d.rows, judged)])


#: The coverage band a 90% interval is held to, and the chance below which a share outside it is
#: not put down to sampling: a kind of n rows can only show shares k/n (10 rows: 80, 90 or 100%).
COVERAGE_BAND, SAMPLING_P = (0.85, 0.95), 0.05


def coverage_verdict(rows: int, share: float) -> str:
    """``met`` where the share lies in the band; ``consistent`` where it lies outside by no more than
    n rows' sampling can put it (the binomial chance of a share at least as far out, were the true
    coverage the band's nearer end, is at least ``SAMPLING_P``: 10 of 10 has 0.95^10 = 0.60);
    ``MISSED`` else; ``-`` below ``COVERAGE_MIN_ROWS`` rows."""
    if rows < COVERAGE_MIN_ROWS or math.isnan(share):
        return "-"
    lo, hi = COVERAGE_BAND
    if lo <= share <= hi:
        return "met"
    k = round(share * rows)
    tail = (sum(_binomial(rows, i, hi) for i in range(k, rows + 1)) if share > hi
            else sum(_binomial(rows, i, lo) for i in range(k + 1)))
    return f"consistent (p={tail:.2f})" if tail >= SAMPLING_P else "MISSED"


def _binomial(n: int, k: int, p: float) -> float:
    """P(X = k) for X ~ Binomial(n, p), in logs (n in the thousands)."""
    return math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                    + k * math.log(p) + (n - k) * math.log1p(-p))


def _bounds_without(g: pd.DataFrame, i, level: float, column: str):
    """The bounds ``uncertainty.pick_residuals`` would give row ``i`` without it: its kind's
    residuals, the classes pooled (``pooled_classes``)."""
    rest = g.drop(i)
    rs = [u.residual(p, m) for p, m in zip(rest[column], rest.measured_s)]
    return u.log_bounds(rs, level) if len(rs) >= 2 else None


def _bounds(g: pd.DataFrame, level: float, classes, column: str = "loso_s") -> dict:
    """{class: (lo, hi)} for each of ``classes`` as ``uncertainty.pick_residuals`` picks them
    from ``g``'s residuals (its own class, or the kind's pooled ones)."""
    if g.empty:
        return {}
    kind = g.kind.iloc[0]
    tables = {kind: {"residuals": residual_tables(g, column)[kind], "pooled_classes": True}}
    out = {}
    for cls in classes:
        picked = u.pick_residuals(tables, kind, cls, "step_time_s")
        if picked:
            out[cls] = u.log_bounds(picked[0], level)
    return out


def _inside(x: float, bounds) -> float:
    if bounds is None:
        return math.nan
    return float(bounds[0] <= x <= bounds[1])


def rankings(out: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per source: pairs of runs of one model, sequence, GPU kind, GPU count and precision in
    different layouts whose measured time per sequence differs by more than RANK_MIN_GAP, and
    how many the predictions (``column``) order the same way."""
    d = out.assign(meas=out.measured_s / out.global_batch, pred=out[column] / out.global_batch)
    recs = []
    keys = ["file", "source", "model", "seq_len", "kind", "gpus", "precision"]
    for key, g in d.groupby(keys):
        rows = g.to_dict("records")
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                if a["layout"] == b["layout"] or abs(a["meas"] / b["meas"] - 1) <= RANK_MIN_GAP:
                    continue
                recs.append({"file": key[0], "source": key[1],
                             "agree": (a["pred"] - b["pred"]) * (a["meas"] - b["meas"]) > 0})
    if not recs:
        return pd.DataFrame(columns=["pairs", "agree"])
    r = pd.DataFrame(recs)
    return r.groupby(["file", "source"]).agree.agg(pairs="size", agree="mean")


def noise_floor(out: pd.DataFrame) -> pd.DataFrame:
    """Configurations published more than once (across or within sources): their measured
    times and spread, (max - min) / min."""
    keys = ["kind", "gpus", "layers", "hidden", "ffn_hidden", "seq_len", "global_batch", "layout", "precision"]
    recs = []
    for key, g in out.groupby(keys):
        if len(g) < 2:
            continue
        searched = sorted(set(g.source[~g.mb_published]))
        note = f" (micro-batch not published by {', '.join(searched)}: searched)" if searched else ""
        recs.append({"config": f"{g.model.iloc[0]} on {key[1]} x {key[0]}, {key[7]}, s {key[5]}{note}",
                     "sources": ", ".join(f"{s} row {r}" for s, r in zip(g.source, g.row)),
                     "measured_s": ", ".join(f"{x:.4g}" for x in g.measured_s),
                     "spread": g.measured_s.max() / g.measured_s.min() - 1})
    return pd.DataFrame(recs)


def coverage_summary(out: pd.DataFrame) -> dict:
    """What the published runs cover per GPU kind (``uncertainty.extrapolation`` reads it):
    most GPUs, the precisions, each parallel axis's largest degree, the MoE shapes."""
    summary = {}
    for kind, g in out.groupby("kind"):
        moe = g[g.experts > 0]
        summary[kind] = {"rows": int(len(g)), "gpus": int(g.gpus.max()),
                         "precisions": sorted({p.split("/")[0] for p in g.precision}),
                         **{axis: int(g[axis].max()) for axis in u.COVERED_AXES},
                         "experts": int(moe.experts.max()) if len(moe) else 0,
                         "top_k": int(moe.top_k.max()) if len(moe) else 0,
                         "expert_width": round(float((moe.ffn_hidden / moe.hidden).min()), 4) if len(moe) else 0.0}
    return summary


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}%"


def report(out: pd.DataFrame, frames: dict, predict, fits: dict | None) -> pd.DataFrame:
    """Print the LOSO errors, the interval coverage, the rankings and the noise floor; ``out``
    with its ``loso_s`` column (the in-sample prediction where fits.yaml is missing or stale)."""
    why = stale(fits)
    if why:
        print(f"\nleave-one-source-out: not computed, {why}")
        out = out.assign(loso_s=out.predicted_s)
    else:
        out = out.assign(loso_s=loso_predictions(out, frames, fits, predict))
        t = error_table(out)
        print("\nMAPE in sample and leave-one-source-out (every FITTED figure refitted without the source;"
              " target: LOSO within 2 points of in-sample and at most 8% per file):")
        print(t.to_string(formatters={c: _pct for c in ("in_sample", "loso")} | {"jump": lambda x: f"{100 * x:+.1f}"}))
        jumps = t[(t.jump > 0.02) & (t.index.get_level_values(1) != "(file)")]
        for (f, src), r in jumps.iterrows():
            print(f"  {src}: {100 * r.jump:+.1f} points when left out (the figures it moves: "
                  f"{_moved(fits, src) or 'none'})")
    cov = interval_coverage(out)
    print(f"\n{u.DEFAULT_LEVEL:.0%} interval coverage of the LOSO residuals per GPU kind (target 85-95% for kinds "
          f"with {COVERAGE_MIN_ROWS}+ rows, judged on one_out below {u.EMPIRICAL_MIN_N}; consistent: outside the band "
          f"by no more than the kind's rows' sampling (binomial p >= {SAMPLING_P}); one_out: each row's "
          f"interval without it; held_out: from the kind's other sources only):")
    print(cov.to_string(formatters={"covered": _pct, "one_out": _pct, "held_out": _pct}))
    for col, name in (("predicted_s", "in sample"), ("loso_s", "LOSO")):
        r = rankings(out, col)
        total = (r.pairs * r.agree).sum() / r.pairs.sum() if len(r) else math.nan
        print(f"\nlayouts ordered as measured ({name}; pairs of one model, GPU count and precision more than "
              f"{RANK_MIN_GAP:.0%} apart per sequence; target 90%): {_pct(total)} of {int(r.pairs.sum())} pairs")
        if col == "predicted_s":
            print(r.to_string(formatters={"agree": _pct}))
    nf = noise_floor(out)
    print("\nthe noise floor: configurations published twice" + (":" if len(nf) else ": none"))
    if len(nf):
        print(nf.to_string(index=False, formatters={"spread": _pct}))
    return out


def _moved(fits: dict, src: str) -> str:
    figs = fits["figures"]
    return ", ".join(f"{k} {f['value']:g} -> {f['leave_one_source_out'][src]:g}"
                     + (" (its prior: no other source's rows fit it)"
                        if src in f.get("prior_when_left_out", ()) else "")
                     for k, f in figs.items() if f["leave_one_source_out"].get(src, f["value"]) != f["value"])
