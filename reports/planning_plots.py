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


def gpus_text(row) -> str:
    """' (512 GPUs)' where the row counts its GPUs and the label does not: a node is 4 GPUs of one
    kind and 8 of another, so node counts alone compare unlike clusters."""
    gpus = row.get("gpus") if hasattr(row, "get") else None
    return f" ({int(gpus):,} GPUs)" if gpus is not None and pd.notna(gpus) else ""


def _label(row: pd.Series, axes: list[str] | None = None) -> str:
    if axes:
        return ", ".join(f"{a}={row[a]}" for a in axes) + ("" if "gpus" in axes else gpus_text(row))
    if "layout" in row and isinstance(row["layout"], str) and "gpu" not in row:
        return row["layout"]
    parts = [str(row[c]) for c in ("gpu", "nodes") if c in row]
    return " x ".join(parts) if parts else str(row.name)


def money_axis(axis) -> None:
    """$ ticks as $1.2M, $800M, $1.1B: no offset text ("1e8") a reader could misread."""
    from matplotlib.ticker import FuncFormatter

    from simcore.planner.formatting import money

    axis.set_major_formatter(FuncFormatter(lambda v, _pos: money(v)))


#: The Pareto figure shows times up to this multiple of the front's slowest point: dominated
#: layouts far beyond it would squash the region where the choice is made.
PARETO_X_SPAN = 1.5


def pareto_figure(df: pd.DataFrame, *, annotate: int = 8, label_axes: list[str] | None = None) -> Figure:
    """Cost against time, every row a point, the Pareto front joined and labelled (with every
    axis in ``label_axes``); the x range stops at PARETO_X_SPAN x the front's slowest time."""
    time_col, cost_col = _time_cost_columns(df)
    df = df[np.isfinite(df[time_col].to_numpy(float)) & np.isfinite(df[cost_col].to_numpy(float))]
    times, costs = df[time_col].to_numpy(float), df[cost_col].to_numpy(float)
    front = _front_mask(times, costs)
    limit = PARETO_X_SPAN * times[front].max()
    shown = times <= limit
    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    ax.scatter(times[~front & shown], costs[~front & shown], s=14, color="0.6", label="dominated")
    order = np.argsort(times[front])
    ax.plot(times[front][order], costs[front][order], "o-", color="C3", label="Pareto front")
    for _, row in df[front].sort_values(time_col).head(annotate).iterrows():
        ax.annotate(_label(row, label_axes), (row[time_col], row[cost_col]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    hidden = int((~shown).sum())
    ax.set_xlabel({"days": "days to train", "step_time_s": "step time (s)"}[time_col]
                  + (f" ({hidden} slower dominated layouts beyond the range not shown)" if hidden else ""))
    ax.set_ylabel({"usd": "cost (on-demand)", "usd_per_mtok": "$ per million tokens"}[cost_col])
    if cost_col == "usd":
        money_axis(ax.yaxis)
    ax.set_title("Cost against time")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
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


def _cell_text(v: float, value: str) -> str:
    from simcore.planner.formatting import money

    if not np.isfinite(v):
        return "infeasible"
    if value.startswith("usd"):
        return money(v)
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _draw_grid(ax, grid: pd.DataFrame, value: str, rows: str, cols: str | None, vmin: float, vmax: float,
               gpus: pd.DataFrame | None = None):
    """The grid's values as coloured cells, each with its figure and (``gpus``) its GPU count."""
    data = grid.to_numpy(float)
    counts = gpus.reindex(index=grid.index, columns=grid.columns).to_numpy(float) if gpus is not None else None
    im = ax.imshow(data, cmap="viridis_r", aspect="auto", vmin=vmin, vmax=vmax)
    ax.set_xticks(range(data.shape[1]), [str(c) for c in grid.columns] if cols else [value])
    ax.set_yticks(range(data.shape[0]), [str(i) for i in grid.index])
    ax.set_xlabel(cols or "")
    ax.set_ylabel(rows)
    mid = (vmin + vmax) / 2
    for (i, j), v in np.ndenumerate(data):
        n = counts[i, j] if counts is not None else np.nan
        ax.text(j, i, _cell_text(v, value) + (f"\n{int(n):,} GPUs" if np.isfinite(n) else ""), ha="center",
                va="center", fontsize=8, color="white" if np.isfinite(v) and v > mid else "black")
    return im


#: Axis and heading names of the what-if figures' values.
VALUE_LABELS = {"days": "days to train", "usd": "cost (on-demand)"}


def whatif_heatmap(df: pd.DataFrame, value: str, axes: list[str] | None = None) -> Figure:
    """``value`` (e.g. days or usd) over the sweep's first two ``axes`` (rows x columns), one
    panel per combination of the other axes, so every axis of the grid is visible; without
    ``axes``, GPU type x node count (or the table's first two varying columns)."""
    if value not in df:
        raise ValueError(f"column '{value}' is not in the table (columns: {', '.join(df.columns)})")
    if axes:
        rows, cols, facets = axes[0], (axes[1] if len(axes) > 1 else None), list(axes[2:])
    else:
        (rows, cols), facets = _axes_of(df), []
    groups = list(df.groupby(facets, sort=False)) if facets else [((), df)]
    finite = df[value].to_numpy(float)
    finite = finite[np.isfinite(finite)]
    vmin, vmax = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    shape = (df[rows].nunique(), df[cols].nunique() if cols else 1)
    fig = Figure(figsize=(1.6 + 1.4 * shape[1] * len(groups), 1.6 + 0.7 * shape[0]), layout="constrained")
    panels = fig.subplots(1, len(groups), squeeze=False)[0]
    for ax, (key, part) in zip(panels, groups):
        grid = part.pivot_table(index=rows, columns=cols, values=value, aggfunc="min", dropna=False) if cols \
            else part.groupby(rows)[[value]].min()
        gpus = None
        if "gpus" in part and "gpus" not in (rows, cols):   # the cells compare clusters: say how many GPUs each is
            gpus = part.pivot_table(index=rows, columns=cols, values="gpus", aggfunc="max", dropna=False) if cols \
                else part.groupby(rows)[["gpus"]].max().rename(columns={"gpus": value})
        im = _draw_grid(ax, grid, value, rows, cols, vmin, vmax, gpus)
        key = key if isinstance(key, tuple) else (key,)
        ax.set_title(", ".join(f"{a}={k}" for a, k in zip(facets, key)) or f"{VALUE_LABELS.get(value, value)} by "
                     f"{rows}" + (f" x {cols}" if cols else ""), fontsize=9)
    bar = fig.colorbar(im, ax=list(panels), label=VALUE_LABELS.get(value, value))
    if value.startswith("usd"):
        money_axis(bar.ax.yaxis)
    if facets:
        fig.suptitle(f"{VALUE_LABELS.get(value, value)} by {rows}" + (f" x {cols}" if cols else "")
                     + f", one panel per {', '.join(facets)}")
    return fig


def breakdown_bars(df: pd.DataFrame, *, top: int = 10) -> Figure:
    """Stacked step-time breakdown (compute, exposed comm, bubble, offload) of the first ``top`` rows."""
    head = df.head(top)
    labels = [_label(r) for _, r in head.iterrows()]
    fig = Figure(figsize=(9, 0.9 + 0.4 * len(head)), layout="constrained")
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
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))   # beside the bars, never over them
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
    of days and $ over every axis of the grid (panels for the axes past the first two), and
    cost against time with the Pareto front, each point labelled with every axis."""
    ok = result.table[result.table["fits"]]
    if ok.empty:
        return {}
    axes = [a for a in result.sweep.grid if a in ok]
    return {"heatmap_days": whatif_heatmap(ok, "days", axes), "heatmap_usd": whatif_heatmap(ok, "usd", axes),
            "pareto": pareto_figure(ok, label_axes=axes)}
