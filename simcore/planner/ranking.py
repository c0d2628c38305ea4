"""The ranked table of a layout search as a reader sees it: the table's columns, one engine per
column, and the sentences that say why the runners-up lose.

A search times every layout on the analytic closed forms and re-simulates the first K on the
event engine (``simcore.planner.search``). The two engines' figures are never mixed in one
column: ``step_time_s``, ``mfu``, ``days``, ``usd`` are the analytic path's for every row;
``des_step_time_s``, ``des_mfu``, ``des_days``, ``des_usd`` the event engine's, for the rows it
ran. Each column's heading names its engine, days, $ and MFU sit under the engine their step
came from, and a comparison (``why_slower``) uses one engine for both rows: the event engine
where both ran on it, else the analytic path. The first row is the recommendation
(``headroom.recommended_first``); the K re-simulated follow in the event engine's order,
then the rest in the analytic order, which is never faster than theirs.
"""
from __future__ import annotations

import pandas as pd

from simcore.planner.tally import UNTIMED, bounded_sentence

#: The engines' column prefixes and the names the headings give them.
ENGINES = (("des_", "event"), ("", "analytic"))
_PARTS = (("compute_s", "compute"), ("exposed_comm_s", "exposed communication"), ("bubble_s", "pipeline bubble"),
          ("offload_s", "offload stall"))


def engine_prefix(*rows) -> str:
    """The column prefix of the one engine every row's figures come from: the event engine's where it
    ran on each of them (``des_``), else the analytic path's ('')."""
    return "des_" if all(pd.notna(r.get("des_step_time_s")) for r in rows) else ""


def _cost_col(row, pre: str) -> str | None:
    return next((pre + c for c in ("usd", "usd_per_mtok") if pre + c in row), None)


def why_slower(row, best) -> str:
    """One sentence: how ``row`` compares with ``best`` in time (and cost, and GPUs when they
    differ) and which parts of the step grow, both on one engine (``engine_prefix``)."""
    pre = engine_prefix(row, best)
    t, t0 = row[pre + "step_time_s"], best[pre + "step_time_s"]
    deltas = sorted(((row[pre + c] - best[pre + c], name) for c, name in _PARTS), reverse=True)
    grow = [f"{name} {d:+.3g} s" for d, name in deltas if d > 0.005 * t0][:2]
    shrink = [f"{name} {d:+.3g} s" for d, name in deltas[::-1] if d < -0.005 * t0][:1]
    why = ", ".join(grow) or "no single part (a tie within 0.5%)"
    extra = f" (it saves {shrink[0]})" if shrink else ""
    cost_col = _cost_col(row, pre)
    cost = f", cost {100 * (row[cost_col] / best[cost_col] - 1):+.1f}%" \
        if cost_col and pd.notna(row[cost_col]) and pd.notna(best[cost_col]) else ""
    gpus = f" on {row['gpus']} GPUs (best: {best['gpus']})" if row["gpus"] != best["gpus"] else ""
    engine = "event engine" if pre else "analytic"
    return (f"{row['layout']}: {t:.3g} s per step{gpus}, time {100 * (t / t0 - 1):+.1f}%{cost} on the best "
            f"({engine}); its step differs by {why}{extra}; {row['memory_per_gpu_gib']:.1f} GiB per GPU")


def tally_sentence(tally) -> str:
    """What the search looked at and why candidates left (``tally.Tally``)."""
    if not tally.candidates:
        return ("no tp x pp x cp x dp of these GPUs meets the divisibility rules: tp divides the heads and KV heads "
                "inside an NVLink domain, pp at most the layers, cp the sequence, dp x micro-batch the global batch; "
                "try another node count or global batch")
    common = max(tally.rules.items(), key=lambda kv: kv[1])[0] if tally.rules else ""
    return (f"{tally.candidates} candidates: {tally.broke_rule} break a rule"
            + (f" (most often: {common})" if common else "")
            + f", {tally.no_fit} do not fit in memory"
            + (f" ({tally.margin_only} of them only by the caching allocator's assumed margin, which "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True removes: --stack megatron or torchtitan "
               "launches with it)" if tally.margin_only else "")
            + f", {tally.dominated} are dominated "
            f"(heavier recompute than needed, or offload where none is needed){bounded_sentence(tally)}, "
            f"{tally.simulated} simulated"
            + (f" ({tally.near} of them within the memory model's error of the GPU's memory: thin or may not fit)"
               if tally.near else ""))


def _best_line(best) -> str:
    ties = f"; {best['ties']} more complex layouts give the same answer ({best['tied_with']})" \
        if best.get("ties", 0) else ""
    if pd.notna(best.get("des_step_time_s")):
        timed = (f"{best['des_step_time_s']:.2f} s per step on the event engine ({best['step_time_s']:.2f} s "
                 f"analytic), MFU {best['des_mfu']:.1%} ({best['mfu']:.1%} analytic)")
    else:
        timed = f"{best['step_time_s']:.2f} s per step (analytic), MFU {best['mfu']:.1%}"
    return f"best: {best['layout']} at {timed}, {best['memory_per_gpu_gib']:.1f} GiB per GPU{ties}"


def explain_ranking(df: pd.DataFrame, tally, explain: int = 5) -> list[str]:
    """Why the runners-up lose: the top ``explain`` after the best, then the best layout of
    each tp and pp value that is not among them."""
    best = df.iloc[0]
    out = [tally_sentence(tally), _best_line(best)]
    shown = set(range(1, min(len(df), explain + 1)))
    out += [f"#{i + 1} {why_slower(df.iloc[i], best)}" for i in sorted(shown)]
    hybrid = "dp_replicate" in df and (df["dp_replicate"] > 1).any()   # a search with hybrid sharding
    for axis in ("tp", "pp", "cp") + (("dp_replicate",) if hybrid else ()):
        for value, idx in df.groupby(axis).head(1).set_index(axis)["rank"].items() if "rank" in df else ():
            i = int(idx) - 1
            if i > 0 and i not in shown:
                shown.add(i)
                out.append(f"best with {axis}={value} is #{i + 1}: {why_slower(df.iloc[i], best)}")
        left = sorted(set(tally.bounded_values.get(axis, ())) - set(df[axis]))
        out += [f"no layout with {axis}={v} is ranked: {UNTIMED}, or they do not fit or break a rule" for v in left]
    return out


#: Columns the CLI prints for ``trainplan plan`` (the table has more), with their headings.
TABLE_COLUMNS = ("rank", "layout", "ties")


def summary_table(result, rows: int = 20) -> str:
    """The first ``rows`` of the ranked table as the terminal prints it (``display_table``), with
    what its headings mean."""
    source = result.table["interval_source"].iloc[0] if len(result.table) else ""
    return display_table(result.table, rows).to_string(index=False) + "\n" + legend(result.table) \
        + f"\nintervals: 90%, step time {source}"


def legend(table: pd.DataFrame) -> str:
    """One sentence: which engine each heading's figures come from and how the rows are ordered."""
    ran = int(table["des_step_time_s"].notna().sum()) if "des_step_time_s" in table else 0
    event = (f"[event]: the event engine, for the {ran} layouts re-simulated on it (ranked by it); " if ran else "")
    return (f"{event}[analytic]: the closed forms, every layout; the first row is the recommendation, the rest "
            "follow in order; days and $ are useful training time on-demand (trainplan cost adds failures)")


def _engine_columns(df: pd.DataFrame, pre: str, name: str) -> dict[str, list[str]]:
    """The step, MFU, days and $ of one engine, blank where it did not run."""
    from simcore.planner import formatting as f

    ran = df[pre + "step_time_s"].notna()
    secs = lambda v: f"{v:.3f}"  # noqa: E731

    def col(key, fmt):
        return [f.with_interval(v, lo, hi, fmt) if ok and pd.notna(v) else ("n/a" if ok else "") for ok, v, lo, hi in
                zip(ran, df[pre + key], df[pre + key + "_lo"], df[pre + key + "_hi"])]

    out = {f"step s [{name}]": col("step_time_s", secs),
           f"MFU [{name}]": [f.percent(v) if ok else "" for ok, v in zip(ran, df[pre + "mfu"])]}
    if pre + "days" in df:
        out[f"days [{name}]"] = col("days", f.days)
        out[f"$ [{name}]"] = col("usd", f.money)
    elif pre + "usd_per_mtok" in df:
        out[f"$ per M tokens [{name}]"] = [f"{v:,.2f}" if ok and pd.notna(v) else ("n/a" if ok else "")
                                           for ok, v in zip(ran, df[pre + "usd_per_mtok"])]
    return out


def display_table(table: pd.DataFrame, rows: int = 20) -> pd.DataFrame:
    """The first ``rows`` of the ranked table, in the columns a reader needs: per engine (its
    name in each heading) the step, MFU, days and $ with their intervals; memory and its
    headroom. One source for the terminal and the planning report."""
    from simcore.planner.headroom import mark_thin

    df = table.head(rows)
    out = df[[c for c in TABLE_COLUMNS if c in df]].copy()
    for pre, name in ENGINES:
        if pre + "step_time_s" in df and df[pre + "step_time_s"].notna().any():
            for heading, values in _engine_columns(df, pre, name).items():
                out[heading] = values
    out["GiB"] = df["memory_per_gpu_gib"].map(lambda v: f"{v:.1f}")
    out["headroom GiB"] = mark_thin(df["headroom_gib"], (df["memory_per_gpu_gib"] + df["headroom_gib"]).max())
    return out
