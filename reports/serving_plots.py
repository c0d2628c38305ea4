"""Pictures of a serving run: its iterations as a Chrome trace, and one figure of the KV cache
and the running requests over time beside the latency distributions."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from simcore.engine.serving import ServingTimeline, per_token

#: Iterations a trace holds at most (about 150 bytes each in the file); past it, the first ones.
TRACE_MAX_ITERATIONS = 200_000
#: Points a replica's time series is drawn with at most (its iterations thinned evenly).
PLOT_MAX_POINTS = 4_000


def serving_chrome_trace(timeline: ServingTimeline, name: str,
                         max_iterations: int = TRACE_MAX_ITERATIONS) -> tuple[dict, int]:
    """Chrome trace JSON of the iterations (one process per replica; a slice per iteration named
    by its work; counters of KV blocks and decoding requests) and how many iterations it left out."""
    its = timeline.iterations[:max_iterations]
    events, seen = [], set()
    for rep, start, end, prefill, decoding, kv in its:
        if rep not in seen:
            seen.add(rep)
            events.append({"ph": "M", "name": "process_name", "pid": rep, "tid": 0,
                           "args": {"name": f"{name} replica {rep}"}})
            events.append({"ph": "M", "name": "thread_name", "pid": rep, "tid": 0, "args": {"name": "iterations"}})
        work = " + ".join(part for part in (f"prefill {prefill}" if prefill else "",
                                            f"decode {decoding}" if decoding else "") if part)
        ts = start * 1e6
        events.append({"ph": "X", "name": work or "idle", "cat": "iteration", "pid": rep, "tid": 0, "ts": ts,
                       "dur": (end - start) * 1e6, "args": {"prefill_tokens": prefill, "decoding": decoding,
                                                            "kv_blocks": kv}})
        events.append({"ph": "C", "name": "KV blocks", "pid": rep, "ts": ts,
                       "args": {"in use": kv, "free": timeline.replica_kv_blocks.get(rep, timeline.kv_blocks) - kv}})
        events.append({"ph": "C", "name": "decoding requests", "pid": rep, "ts": ts, "args": {"decoding": decoding}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}, len(timeline.iterations) - len(its)


def _thin(rows: list) -> list:
    step = max(1, len(rows) // PLOT_MAX_POINTS)
    return rows[::step] + ([rows[-1]] if (len(rows) - 1) % step else [])


def serving_figure(timeline: ServingTimeline, title: str) -> Figure:
    """KV occupancy and decoding requests per replica over time (left), and the cumulative
    distributions of TTFT, TPOT and end-to-end latency (right)."""
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    grid = fig.add_gridspec(2, 2, width_ratios=(1.6, 1))
    kv_ax, dec_ax, cdf_ax = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[1, 0]), fig.add_subplot(grid[:, 1])
    dec_ax.sharex(kv_ax)
    by_rep: dict[int, list] = {}
    for row in timeline.iterations:
        by_rep.setdefault(row[0], []).append(row)
    for rep, rows in sorted(by_rep.items()):
        rows = _thin(rows)
        t = [r[1] for r in rows]
        blocks = timeline.replica_kv_blocks.get(rep, timeline.kv_blocks)
        kv_ax.step(t, [100.0 * r[5] / blocks for r in rows], where="post", lw=0.9,
                   label=f"replica {rep}")
        dec_ax.step(t, [r[4] for r in rows], where="post", lw=0.9)
    kv_ax.set(ylabel="KV blocks in use (%)", ylim=(0, 105), title=title)
    dec_ax.set(xlabel="time (s)", ylabel="decoding requests")
    if len(by_rep) <= 8:
        kv_ax.legend(loc="lower right", fontsize="small")
    ttft = timeline.first - timeline.arrivals
    e2e = timeline.finish - timeline.arrivals
    series = {"TTFT": ttft, "end-to-end": e2e}
    several = timeline.output > 1
    if several.any():
        series["TPOT"] = per_token(timeline.first, timeline.finish, timeline.output)[several]
    for label, x in series.items():
        x = np.sort(x[np.isfinite(x)]) * 1e3
        if x.size:
            cdf_ax.plot(x, np.arange(1, x.size + 1) / x.size * 100, label=label)
    cdf_ax.set(xscale="log", xlabel="latency (ms)", ylabel="requests at or below (%)",
               title="latency distributions")
    cdf_ax.grid(True, which="both", alpha=0.3)
    cdf_ax.legend(loc="upper left")
    return fig
