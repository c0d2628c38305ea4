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


def validate_report(result, *, title: str = "Predicted against measured", profile: dict | None = None) -> Report:
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
                  assumptions=tuple(assumptions))


def memory_section(plan: Plan, report: dict) -> Section:
    """Memory per GPU by kind for each pipeline rank against HBM (from ``simulate.memory_report``)."""
    return Section("Memory per GPU", text=f"Most loaded GPU: {report['memory_per_gpu_gib']:.1f} GiB of "
                                          f"{report['hbm_bytes'] / 2**30:.0f} GiB; "
                                          f"{'fits' if report['fits'] else 'does NOT fit'}.",
                   figure=memory_figure(report["ranks"], report["hbm_bytes"], "Memory per GPU by pipeline rank"),
                   name="memory")


def _money(x: float) -> str:
    return f"${x / 1e6:,.2f}M" if x >= 1e6 else f"${x:,.0f}"


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

    best = res.best
    p = prediction
    summary = (("recommended layout", res.table.iloc[0]["layout"]),
               ("time to train", f"{cost.days:,.1f} days"),
               ("cost (on-demand)", _money(cost.on_demand.usd)),
               ("MFU", f"{p.mfu:.1%}"),
               ("step time", f"{p.step_time_s:.2f} s"),
               ("biggest loss", biggest_loss(p)))
    cols = [c for c in ("rank", "layout", "step_time_s", "engine_step_time_s", "mfu", "memory_per_gpu_gib",
                        "days", "usd") if c in res.table]
    sections = [
        Section("Why this layout", text="\n\n".join(res.explanations)),
        Section("Top layouts", table=res.table[cols].head(15)),
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


def _cost_lines(cost, tokens: float) -> list[str]:
    od, rs, sp = cost.on_demand, cost.reserved, cost.spot
    return [
        f"{tokens:.3g} tokens = {cost.steps:,} steps of {cost.step_time_s:.2f} s on {cost.gpus} GPUs.",
        f"On-demand: {od.wall_s / 86400:,.1f} days, {od.gpu_hours:,.0f} GPU-hours, {_money(od.usd)} "
        f"(goodput {od.goodput:.1%}, {od.expected_interruptions:.1f} interruptions expected).",
        f"Reserved: {_money(rs.usd)}. Spot: {_money(sp.usd)} over {sp.wall_s / 86400:,.1f} days "
        f"with preemptions.",
        f"Energy: {cost.energy_kwh:,.0f} kWh, {_money(cost.energy_usd)}.",
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
    """The procurement report of a what-if sweep (``simcore.planner.whatif.WhatIfResult``)."""
    from reports.planning_plots import whatif_figures

    ok = res.table[res.table["fits"]]
    summary = []
    if len(ok):
        fastest = ok.loc[ok["days"].idxmin()]
        cheapest = ok.loc[ok["usd"].idxmin()]
        axes = list(res.sweep.grid)
        label = lambda row: ", ".join(f"{a}={row[a]}" for a in axes)  # noqa: E731
        summary = [("cells", f"{len(ok)} of {len(res.table)} fit"),
                   ("fastest", f"{label(fastest)}: {fastest['days']:,.0f} days"),
                   ("cheapest", f"{label(cheapest)}: {_money(cheapest['usd'])}")]
    figs = whatif_figures(res)
    sections = [Section(name.replace("_", " "), figure=fig, name=name) for name, fig in figs.items()]
    cols = [c for c in (*res.sweep.grid, "layout", "step_time_s", "mfu", "days", "usd", "usd_spot",
                        "energy_kwh", "goodput") if c in res.table]
    sections.append(Section("Every cell", table=res.table[cols]))
    return Report(title=f"What-if: {res.sweep.name}",
                  subtitle=f"{res.sweep.model.get('name', 'model')}, {res.sweep.tokens:.3g} tokens, global batch "
                           f"{res.sweep.global_batch}; best layout per cell by {res.sweep.objective}",
                  summary=tuple(summary), sections=tuple(sections),
                  assumptions=tuple((a, "") for a in res.assumptions))
