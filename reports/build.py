"""Report builders: results in, a ``render.Report`` out (pure: no I/O, no running).

Each report puts the answer first (summary cards), then tables and figures, then every
assumption with its source: catalog figures, prices, failure rate, efficiency curves,
and the calibration profile and its date.
"""
from __future__ import annotations

import pandas as pd

from reports.plots import memory_figure, predicted_vs_measured_figure
from reports.render import Report, Section
from simcore.plan.spec import Plan
from topologies.hardware import load_catalog


def hardware_assumptions(plan: Plan) -> list[tuple[str, str]]:
    """The catalog (or calibrated) figures a prediction of ``plan`` rests on, with sources."""
    cl = plan.cluster
    gpu = cl.node.gpu
    out = []
    peak = gpu.peak(plan.training.precision.value)
    if peak:
        out.append((f"{gpu.name}: {peak / 1e12:.1f} dense TFLOP/s ({plan.training.precision.value}), "
                    f"{gpu.hbm_bytes / 2**30:.0f} GiB HBM at {gpu.hbm_bytes_per_s / 1e12:.2f} TB/s, "
                    f"{gpu.intra_link} {gpu.intra_link_bytes_per_s * 2 / 1e9:.0f} GB/s", gpu.source))
    out.append((f"{cl.node.name}: {cl.gpus_per_node} GPUs per node, {cl.node.intra}, "
                f"{cl.node.nics_per_node} NICs", cl.node.source))
    if cl.fabric is not None:
        out.append((f"{cl.fabric.name}: {cl.fabric.nic_bytes_per_s * 8 / 1e9:.0f} Gb/s per NIC, "
                    f"{cl.fabric.latency_s * 1e6:.1f} us, {cl.fabric.topology} {cl.fabric.oversubscription:g}:1",
                    cl.fabric.source))
    eff = load_catalog().efficiency.get(gpu.name)
    if eff and not gpu.efficiency_json:
        out.append((f"{gpu.name} matmul efficiency curve", eff["matmul"].get("source", "")))
        out.append((f"{gpu.name} collective bus-bandwidth efficiency", eff["collective"].get("source", "")))
    return out


def validate_report(result, *, title: str = "Predicted against measured", profile: dict | None = None,
                    notes: tuple[str, ...] = ()) -> Report:
    """The validation report of a matrix run (``trainplan.validate.MatrixResult``)."""
    table: pd.DataFrame = result.table
    sections, summary = [], []
    if len(table):
        errs = table["step_err"].abs()
        mem = table["mem_err"].abs()
        worst = table.loc[errs.idxmax()]
        summary = [("layouts compared", str(len(table))),
                   ("median |step-time error|", f"{errs.median():.1%}"),
                   ("worst layout", f"{worst['layout']} ({worst['step_err']:+.1%})"),
                   ("median |memory error|", f"{mem.median():.1%}")]
        sections.append(Section("Step time, predicted against measured",
                                text="Each point is one layout: the event engine's prediction on this host's "
                                     "calibrated profile against the executor's measured mean step "
                                     "(warm-up discarded).",
                                figure=predicted_vs_measured_figure(table), name="pred-vs-meas",
                                caption="log-log; the band is ±10%"))
        sections.append(Section("Per layout", table=table[["layout", "pred_step_s", "meas_step_s", "step_err",
                                                            "pred_compute_s", "meas_compute_s", "pred_comm_s",
                                                            "meas_comm_s", "pred_bubble_s", "meas_bubble_s",
                                                            "pred_mem_gib", "meas_mem_gib", "mem_err"]]))
        for comp in result.comparisons[:1]:
            phases = comp.table[comp.table["kind"] == "phase"][["field", "predicted", "measured", "error"]]
            sections.append(Section(f"Phase by phase: {comp.plan_name}", table=phases))
    if result.failures:
        sections.append(Section("Layouts not run",
                                table=pd.DataFrame(result.failures, columns=["layout", "reason"])))
    assumptions = []
    if profile:
        m = profile.get("measured_on", {})
        assumptions.append((f"calibrated profile of {m.get('host', 'this host')} ({m.get('date', '?')}, "
                            f"torch {m.get('torch', '?')}, {m.get('backend', '?')})",
                            profile.get("device", {}).get("source", "trainplan calibrate")))
    return Report(title=title, subtitle="trainplan validate", summary=tuple(summary), sections=tuple(sections),
                  assumptions=tuple(assumptions), notes=notes)


def memory_section(plan: Plan, report: dict) -> Section:
    """Memory per GPU by kind for each pipeline rank against HBM (from ``simulate.memory_report``)."""
    from simcore.planner.formatting import headroom_gib

    room = headroom_gib(report["hbm_bytes"] / 2**30, report["memory_per_gpu_gib"])
    return Section("Memory per GPU", text=f"Most loaded GPU: {report['memory_per_gpu_gib']:.1f} GiB of "
                                          f"{report['hbm_bytes'] / 2**30:.0f} GiB; "
                                          f"{'fits' if report['fits'] else 'does NOT fit'}, headroom {room:.1f} GiB.",
                   figure=memory_figure(report["ranks"], report["hbm_bytes"], "Memory per GPU by pipeline rank"),
                   name="memory")


def biggest_loss(result) -> str:
    """The largest part of the step that is not compute, in words."""
    parts = {"exposed communication": result.exposed_comm_s, "pipeline bubble": result.bubble_s,
             "offload stall": result.offload_s}
    name, value = max(parts.items(), key=lambda kv: kv[1])
    return f"{name} {value / result.step_time_s:.0%} of the step" if value > 0 else "none (all compute)"


def plan_report(res, cost, prediction, memory: dict, *, cluster_figure=None, tokens: float) -> Report:
    """The planning report: the recommended layout first, then why, what it costs, and its assumptions.

    ``res`` is a ``simcore.planner.search.SearchResult``; ``cost`` the ``runcost.RunCost`` of the best
    plan; ``prediction`` its event-engine StepResult (with spans); ``memory`` its memory_report."""
    from reports.planning_plots import breakdown_bars, pareto_figure
    from reports.plots import gantt_figure

    from simcore.planner import formatting as f
    from simcore.planner.headroom import is_thin
    from simcore.planner.ranking import display_table, legend

    best = res.best
    p = prediction
    od = cost.on_demand
    iv = od.interval
    step_iv = iv.get("step_time_s", [None, None])
    hbm = f.hbm_gib(best)
    room = f.headroom_gib(hbm, p.memory_per_gpu_gib)
    summary = (("recommended layout", res.table.iloc[0]["layout"]),
               ("time to train", f"{f.with_interval(od.days, *iv.get('days', [None, None]), f.days)} days"),
               ("cost (on-demand)", f.with_interval(od.usd, *iv.get("usd", [None, None]), f.money)),
               ("MFU", f.percent(p.mfu)),
               ("step time", f"{f.with_interval(p.step_time_s, *step_iv, lambda v: f'{v:.2f}')} s"),
               ("memory headroom", f"{room:.1f} GiB of {hbm:.0f} GiB"
                                   + (" (thin: see 'Why this layout')" if is_thin(room, hbm) else "")),
               ("biggest loss", biggest_loss(p)))
    table_note = (legend(res.table) + ". The cards above and 'The run' are the event engine's step with "
                  "checkpoints and expected failures added (trainplan cost). Intervals (90%): "
                  + (iv.get("source") or "none"))
    sections = [
        Section("Why this layout", text="\n\n".join(res.explanations)),
        Section("Top layouts", table=display_table(res.table, 15), text=table_note),
        Section("Where the step time goes", figure=breakdown_bars(res.table), name="breakdown",
                caption="compute, exposed communication, pipeline bubble and offload stall of the top layouts"),
        Section("Cost against time", figure=pareto_figure(res.table), name="pareto",
                caption="every layout that fits; the Pareto front joined"),
        memory_section(best, memory),
        Section("One step of the recommended plan", figure=gantt_figure(p.spans, f"{best.name}: predicted step"),
                name="gantt", caption="event-engine timeline: one lane per rank and stream (representative ranks)"),
        Section("The run", text="\n".join(_cost_lines(cost, tokens))),
    ]
    if cluster_figure is not None:
        sections.append(Section("The cluster", figure=cluster_figure, name="cluster"))
    assumptions = hardware_assumptions(best) + _price_assumptions(best, cost)
    return Report(title=f"Training plan: {best.model.name} on {best.cluster.nodes} x {best.cluster.node.name}",
                  subtitle=f"{tokens:.3g} tokens, global batch {best.training.global_batch} x "
                           f"{best.model.seq_len} tokens, searched {len(res.table)} layouts that fit",
                  summary=summary, sections=tuple(sections), assumptions=tuple(assumptions),
                  notes=(("storage, not the GPUs, bounds the step: reading the training data needs "
                          f"{cost.data['needed_bytes_per_s'] / 1e9:.1f} GB/s",) if cost.data.get("storage_bound") else ()))


def _scenario_text(s, label: str) -> str:
    from simcore.planner import formatting as f

    if s.infeasible:
        return f"{label}: infeasible ({s.infeasible})."
    iv = s.interval
    spares = f", {s.spare_nodes} spare node{'s' if s.spare_nodes > 1 else ''}" if s.spare_nodes else ""
    return (f"{label}: {f.with_interval(s.days, *iv.get('days', [None, None]), f.days)} days, "
            f"{f.with_interval(s.usd, *iv.get('usd', [None, None]), f.money)} (goodput {f.percent(s.goodput)}, "
            f"{s.expected_interruptions:,.1f} interruptions expected{spares}).")


def _cost_lines(cost, tokens: float) -> list[str]:
    from simcore.planner import formatting as f

    return [
        f"{tokens:.3g} tokens = {cost.steps:,} steps of {cost.step_time_s:.2f} s on {cost.gpus} GPUs.",
        _scenario_text(cost.on_demand, "On-demand"), _scenario_text(cost.reserved, "Reserved"),
        _scenario_text(cost.spot, "Spot"),
        f"Intervals (90%): {cost.on_demand.interval.get('source', 'none')}.",
        f"Energy: {cost.energy_kwh:,.0f} kWh, {f.money(cost.energy_usd)}.",
        f"Checkpoints: {cost.checkpoint.size_bytes / 1e9:,.0f} GB each, every "
        f"{cost.checkpoint.interval_s / 60:,.0f} min.",
    ]


def _price_assumptions(plan: Plan, cost) -> list[tuple[str, str]]:
    prices = load_catalog().prices
    gp = prices.gpus.get(plan.cluster.node.gpu.name)
    out = []
    if gp:
        out.append((f"{plan.cluster.node.gpu.name}: ${gp.on_demand_usd:.2f} on-demand, ${gp.reserved_usd:.2f} "
                    f"reserved, ${gp.spot_usd:.2f} spot per GPU-hour", gp.source))
    out.append((f"energy ${prices.usd_per_kwh:.3f}/kWh, PUE {prices.pue}", prices.energy_source))
    out.append((f"{prices.interruptions_per_gpu_hour:.3g} interruptions per GPU-hour, restart "
                f"{prices.restart_s / 60:.0f} min", prices.failures_source))
    return out + [(n, "trainplan run cost model") for n in cost.notes]


def whatif_report(res) -> Report:
    """The procurement report of a what-if sweep (``simcore.planner.whatif.WhatIfResult``):
    the same formatted table the terminal prints, every grid axis in the figures."""
    from reports.planning_plots import gpus_text, whatif_figures
    from simcore.planner import formatting as f

    ok = res.table[res.table["fits"]]
    summary = []
    axes = list(res.sweep.grid)

    def label(row) -> str:   # the GPUs beside the axes: a node is 4 GPUs of one kind, 8 of another
        return ", ".join(f"{a}={row[a]}" for a in axes) + ("" if "gpus" in axes else gpus_text(row))

    priced = ok[ok["days"].notna()] if "days" in ok else ok
    if len(priced):
        fastest = priced.loc[priced["days"].idxmin()]
        cheapest = priced.loc[priced["usd"].idxmin()]
        summary = [("cells", f"{len(ok)} of {len(res.table)} fit"),
                   ("fastest", f"{label(fastest)}: {f.with_interval(fastest['days'], fastest.get('days_lo'), fastest.get('days_hi'), f.days)} days"),
                   ("cheapest", f"{label(cheapest)}: {f.with_interval(cheapest['usd'], cheapest.get('usd_lo'), cheapest.get('usd_hi'), f.money)}")]
    figs = whatif_figures(res)
    headings = {"heatmap_days": "Days to train, every cell", "heatmap_usd": "Cost (on-demand), every cell",
                "pareto": "Cost against time"}
    sections = [Section(headings.get(name, name), figure=fig, name=name) for name, fig in figs.items()]
    sources = list(res.table["interval_source"].dropna().unique()) if "interval_source" in res.table else []
    sections.append(Section("Every cell", table=res.display_table(),
                            text="Intervals (90%) come from the step-time residuals of the validation sets: "
                                 + "; ".join(sources) if sources else ""))
    notes = tuple(res.notes())
    return Report(title=f"What-if: {res.sweep.name}",
                  subtitle=f"{res.sweep.model.get('name', 'model')}, {res.sweep.tokens:.3g} tokens, global batch "
                           f"{res.sweep.global_batch}; best layout per cell by {res.sweep.objective}",
                  summary=tuple(summary), sections=tuple(sections), notes=notes,
                  assumptions=tuple((a, "") for a in res.assumptions))
