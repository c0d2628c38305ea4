"""The checkpoint choices side by side: synchronous and asynchronous saves, uncompressed and
at a stated compression ratio, each run through the run cost (``runcost.run_cost``, analytic:
no Monte-Carlo), and what each saves in days and $ against synchronous, uncompressed
checkpoints. The model of each choice: ``simcore.planner.checkpoints``."""
from __future__ import annotations

from simcore.plan.spec import Plan
from simcore.planner.checkpoints import check_compression


def choices(compression: float) -> list[tuple[str, float]]:
    """The choices compared: sync and async, uncompressed and (when stated) compressed."""
    out = [("sync", 1.0), ("async", 1.0)]
    return out + ([("sync", compression), ("async", compression)] if compression != 1 else [])


def compare(plan: Plan, prediction, tokens: float, *, compression: float = 1.0, **kw) -> list[dict]:
    """Each choice's run (analytic, no Monte-Carlo) and what it saves against synchronous,
    uncompressed checkpoints: on-demand days and $, the stall, the lost work."""
    from simcore.planner.runcost import run_cost

    check_compression(compression)
    kw = {k: v for k, v in kw.items() if k not in ("monte_carlo", "checkpoint", "tiered_checkpoints")}
    rows = []
    for mode, ratio in choices(compression):
        od = run_cost(plan, prediction, tokens, monte_carlo=0, checkpoint=mode, checkpoint_compression=ratio,
                      **kw).on_demand
        rows.append({"mode": mode, "compression": ratio, "days": od.days, "usd": od.usd,
                     "stall_s": od.checkpoint_total_s, "lost_work_s": od.lost_work_s, "infeasible": od.infeasible})
    base = rows[0]
    for r in rows:
        r["saves_days"], r["saves_usd"] = base["days"] - r["days"], base["usd"] - r["usd"]
    return rows


def compare_lines(rows: list[dict]) -> list[str]:
    """One line per choice: its days, $, stall and lost work, and what it saves."""
    lines = ["checkpoint choices (on demand, expected by Daly's model; against sync, uncompressed):"]
    for r in rows:
        name = r["mode"] + (f", compressed {r['compression']:g}x" if r["compression"] != 1 else "")
        if r["infeasible"]:
            lines.append(f"  {name:>22}: infeasible ({r['infeasible']})")
            continue
        saves = "baseline" if r is rows[0] else f"saves {r['saves_days']:.2f} days, ${r['saves_usd']:,.0f}"
        lines.append(f"  {name:>22}: {r['days']:.2f} days, ${r['usd']:,.0f}; stall {r['stall_s'] / 3600:.1f} h, "
                     f"lost work {r['lost_work_s'] / 3600:.1f} h; {saves}")
    return lines
