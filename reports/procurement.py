"""The procurement report (``trainplan procure --report``): the answers first, the frontier of
days against dollars for each way of paying, the options' table, the assumptions with sources.

Pure: a ``simcore.planner.procure.ProcureResult`` in, a ``render.Report`` out; the figure is
built without pyplot, like ``reports.planning_plots``.
"""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from reports.planning_plots import money_axis
from reports.render import Report, Section

#: Marker per way of paying in the frontier figure.
MARKERS = {"on_demand": "o", "reserved": "s", "spot": "^", "buy": "D"}


def frontier_figure(result) -> Figure:
    """Every feasible option as a point (days, $), coloured by way of paying, each way's front
    joined, the deadline and budget drawn, the answers circled."""
    from simcore.planner.procure_answer import (MODE_LABELS, budget_choice, deadline_choice, feasible,
                                                mode_fronts, option_label)

    c, options = result.candidates, result.options
    ok, fronts = feasible(options), mode_fronts(options)
    fig = Figure(figsize=(8.5, 5), layout="constrained")
    ax = fig.add_subplot()
    for i, (mode, label) in enumerate(MODE_LABELS.items()):
        part, front = ok[ok["mode"] == mode], fronts[fronts["mode"] == mode].sort_values("days")
        if part.empty:
            continue
        ax.scatter(part["days"], part["usd"], s=12, marker=MARKERS[mode], color=f"C{i}", alpha=0.35)
        ax.plot(front["days"], front["usd"], marker=MARKERS[mode], color=f"C{i}", label=f"{label} (front)")
    if c.deadline_days is not None:
        ax.axvline(c.deadline_days, color="0.3", ls="--", lw=1, label=f"deadline {c.deadline_days:g} days")
    if c.budget_usd is not None:
        ax.axhline(c.budget_usd, color="0.3", ls=":", lw=1,
                   label="budget (held against cash paid out: a purchase's whole capex, not its share drawn here)")
    for pick, name in ((deadline_choice(options, c.deadline_days), "deadline answer"),
                       (budget_choice(options, c.budget_usd), "budget answer")):
        if pick is not None:
            ax.scatter([pick["days"]], [pick["usd"]], s=160, facecolors="none", edgecolors="k", lw=1.5)
            ax.annotate(f"{name}: {option_label(pick)}", (pick["days"], pick["usd"]), fontsize=7,
                        xytext=(6, 6), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    money_axis(ax.yaxis)
    ax.set_xlabel("days to train (log)")
    ax.set_ylabel("cost of the run (log)")
    ax.set_title("Days against dollars: every option, the front of each way of paying")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def _summary(result) -> list[tuple[str, str]]:
    from simcore.planner import formatting as f
    from simcore.planner.procure_answer import budget_choice, deadline_choice, feasible, option_label

    c, options = result.candidates, result.options
    out = []
    if c.deadline_days is not None:
        pick = deadline_choice(options, c.deadline_days)
        out.append((f"cheapest within {c.deadline_days:g} days", "none does" if pick is None else
                    f"{option_label(pick)}: {f.money(pick['usd'])}, {f.days(pick['days'])} days"))
    if c.budget_usd is not None:
        pick = budget_choice(options, c.budget_usd)
        paid = "" if pick is None or pick.get("cash_usd", pick["usd"]) == pick["usd"] else \
            f" ({f.money(pick['cash_usd'])} paid out)"
        out.append((f"fastest within {f.money(c.budget_usd)} paid out", "none does" if pick is None else
                    f"{option_label(pick)}: {f.days(pick['days'])} days, {f.money(pick['usd'])}{paid}"))
    if result.serving is not None:
        from simcore.planner.procure_serving import serving_summary

        out.append(("serving it", serving_summary(result.serving)))
    priced = int(result.cells["fits"].sum()) if "fits" in result.cells else 0
    out += [("hardware cells", f"{len(result.cells)} searched, {priced} fit"),
            ("options", f"{len(feasible(options))} priced"), ("event engine", f"{result.resimulated} cells re-simulated"),
            ("search time", f"{result.seconds:.1f} s")]
    return out


def procure_report(result, *, rows: int = 60) -> Report:
    """The report of a procurement search."""
    from simcore.planner.procure_answer import answer_lines, display_table, frontier_table

    c = result.candidates
    sources = [s for s in result.options.get("interval_source", pd.Series(dtype=object)).dropna().unique() if s]
    sections = [
        Section("The answer", text="\n\n".join(answer_lines(result))),
        Section("Days against dollars", figure=frontier_figure(result), name="frontier",
                caption="each point one option (a hardware cell and a way of paying); lines join each way's "
                        "Pareto front; circles mark the answers"),
        Section("The front of each way of paying", table=frontier_table(result.options),
                text="Options no other of the same way of paying beats on both days and dollars, fastest first; "
                     "* marks the front of all of them. Days and $ carry their 90% intervals where the validation "
                     "residuals cover the GPU (" + ("; ".join(sources[:3]) or "none") + ")."),
        Section(f"Every option, fastest first (first {rows})", table=display_table(result.options, rows)),
    ]
    if result.serving is not None:
        from simcore.planner.procure_serving import serving_answer, serving_table

        sections.append(Section(
            "Serving it", table=serving_table(result.serving),
            text=serving_answer(result.serving, c.serving) + " Each row is a GPU kind, precision and TP degree "
            "with the fewest replicas that meet the SLO at the rate on the serving event engine (vLLM's continuous "
            "batching), cheapest first; $ per million output tokens over an hour of the traffic, kWh at TDP x PUE."))
    if result.left_out:
        sections.append(Section("What the answer could not weigh", text="\n\n".join(result.left_out)))
    model = c.model.get("name", "model")
    from simcore.planner.formatting import si

    return Report(title=f"Procurement: {model}, {si(c.tokens, '')} tokens",
                  subtitle=f"{len(c.gpus)} GPU types x {len(c.nodes)} cluster sizes x {len(c.fabrics)} fabrics, "
                           f"paid {', '.join(c.modes)}; global batch {c.global_batch}; best layout per cell",
                  summary=tuple(_summary(result)), sections=tuple(sections),
                  assumptions=tuple((a, "") for a in result.assumptions))

