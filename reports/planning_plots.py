"""Figures of the planner: Pareto front of cost against time, what-if heat maps, step breakdowns.

Each function takes a pandas DataFrame (the ``table`` of ``simcore.planner.search.SearchResult`` or
of ``simcore.planner.whatif.WhatIfResult``) and returns a ``matplotlib.figure.Figure`` built
without pyplot (``Figure()`` directly), so it works under any backend, Agg included, and
leaves no global state behind.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

#: Columns of the step breakdown, in stacking order, with their legend names.
BREAKDOWN = (("compute_s", "compute"), ("exposed_comm_s", "exposed communication"),
             ("bubble_s", "pipeline bubble"), ("offload_s", "offload stall"))


def _time_cost_columns(df: pd.DataFrame) -> tuple[str, str]:
    time_col = "days" if "days" in df else "step_time_s"
    cost_col = next(c for c in ("usd", "usd_per_mtok") if c in df)
    return time_col, cost_col


def _front_mask(times: np.ndarray, costs: np.ndarray) -> np.ndarray:
    """True where no other point is at least as good on both axes and better on one."""
    order = np.lexsort((costs, times))
    mask = np.zeros(len(times), dtype=bool)
    best = np.inf
    for i in order:
        if costs[i] < best:
            mask[i] = True
            best = costs[i]
    return mask


def _label(row: pd.Series) -> str:
    if "layout" in row and isinstance(row["layout"], str) and "gpu" not in row:
        return row["layout"]
    parts = [str(row[c]) for c in ("gpu", "nodes") if c in row]
    return " x ".join(parts) if parts else str(row.name)


def pareto_figure(df: pd.DataFrame, *, annotate: int = 8) -> Figure:
    """Cost against time, every row a point, the Pareto front joined and labelled."""
    time_col, cost_col = _time_cost_columns(df)
    times, costs = df[time_col].to_numpy(float), df[cost_col].to_numpy(float)
    front = _front_mask(times, costs)
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    ax.scatter(times[~front], costs[~front], s=14, color="0.6", label="dominated")
    order = np.argsort(times[front])
    ax.plot(times[front][order], costs[front][order], "o-", color="C3", label="Pareto front")
    for _, row in df[front].sort_values(time_col).head(annotate).iterrows():
        ax.annotate(_label(row), (row[time_col], row[cost_col]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xlabel({"days": "days to train", "step_time_s": "step time (s)"}[time_col])
    ax.set_ylabel({"usd": "cost ($, on-demand)", "usd_per_mtok": "$ per million tokens"}[cost_col])
    ax.set_title("Cost against time")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def _axes_of(df: pd.DataFrame) -> tuple[str, str | None]:
    """The heat map's rows and columns: GPU type x node count when present."""
    rows = "gpu" if "gpu" in df and df["gpu"].nunique() > 1 else None
    cols = "nodes" if "nodes" in df and df["nodes"].nunique() > 1 else None
    candidates = [c for c in df.columns if c not in ("gpu", "nodes") and df[c].dtype == object
                  and 1 < df[c].nunique() < len(df) and c not in ("layout", "note", "node")]
    rows = rows or (candidates.pop(0) if candidates else None)
    cols = cols or (candidates.pop(0) if candidates else None)
    if rows is None:
        rows, cols = cols, None
    if rows is None:
        rows = "layout" if "layout" in df else df.columns[0]
    return rows, cols


def whatif_heatmap(df: pd.DataFrame, value: str) -> Figure:
    """``value`` (e.g. days or usd) over GPU type x node count (or the sweep's first two axes)."""
    if value not in df:
        raise ValueError(f"column '{value}' is not in the table (columns: {', '.join(df.columns)})")
    rows, cols = _axes_of(df)
    grid = df.pivot_table(index=rows, columns=cols, values=value, aggfunc="min") if cols \
        else df.groupby(rows)[[value]].min()
    data = grid.to_numpy(float)
    fig = Figure(figsize=(1.6 + 1.3 * data.shape[1], 1.2 + 0.7 * data.shape[0]))
    ax = fig.add_subplot()
    im = ax.imshow(data, cmap="viridis_r", aspect="auto")
    ax.set_xticks(range(data.shape[1]), [str(c) for c in grid.columns] if cols else [value])
    ax.set_yticks(range(data.shape[0]), [str(i) for i in grid.index])
    ax.set_xlabel(cols or "")
    ax.set_ylabel(rows)
    finite = data[np.isfinite(data)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (i, j), v in np.ndenumerate(data):
        text = "n/a" if not np.isfinite(v) else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if v > mid else "black")
    fig.colorbar(im, ax=ax, label=value)
    ax.set_title(f"{value} by {rows}" + (f" x {cols}" if cols else ""))
    fig.tight_layout()
    return fig


def breakdown_bars(df: pd.DataFrame, *, top: int = 10) -> Figure:
    """Stacked step-time breakdown (compute, exposed comm, bubble, offload) of the first ``top`` rows."""
    head = df.head(top)
    labels = [_label(r) for _, r in head.iterrows()]
    fig = Figure(figsize=(8, 0.9 + 0.4 * len(head)))
    ax = fig.add_subplot()
    left = np.zeros(len(head))
    y = np.arange(len(head))
    for col, name in BREAKDOWN:
        if col in head:
            values = head[col].to_numpy(float)
            ax.barh(y, values, left=left, label=name)
            left += values
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step")
    ax.set_title("Where the step goes")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def save_figure_atomic(fig: Figure, path: str | os.PathLike, dpi: int = 120) -> Path:
    """Write the figure to a temporary file beside ``path`` and rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}{path.suffix}")
    try:
        fig.savefig(tmp, dpi=dpi)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def whatif_figures(result) -> dict:
    """name -> Figure for a what-if result (``simcore.planner.whatif.WhatIfResult``): heat maps
    of days and $ over the first two axes, and cost against time with the Pareto front."""
    ok = result.table[result.table["fits"]]
    if ok.empty:
        return {}
    return {"heatmap_days": whatif_heatmap(ok, "days"), "heatmap_usd": whatif_heatmap(ok, "usd"),
            "pareto": pareto_figure(ok)}


def write_whatif(result, out_dir: str | os.PathLike) -> list[Path]:
    """table.csv, summary.md and one PNG per figure of a what-if result under ``out_dir``
    (each written whole)."""
    from simcore.results import atomic_write_text

    out = Path(out_dir)
    written = [out / "table.csv", out / "summary.md"]
    atomic_write_text(written[0], result.table.to_csv(index=False))
    atomic_write_text(written[1], result.summary_markdown())
    for name, fig in whatif_figures(result).items():
        written.append(save_figure_atomic(fig, out / f"{name}.png"))
    return written
