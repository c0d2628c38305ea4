"""Report builders: results in, a ``render.Report`` out (pure: no I/O, no running).

Each report puts the answer first (summary cards), then tables and figures, then every
assumption with its source: catalog figures, prices, failure rate, efficiency curves,
and the calibration profile and its date.
"""
from __future__ import annotations

import pandas as pd

from reports.plots import memory_figure, predicted_vs_measured_figure
from reports.render import Report, Section
from simcore.spec import Plan
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
    """The validation report of a matrix run (``reports.validate.MatrixResult``)."""
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
                   figure=memory_figure(report["ranks"], report["hbm_bytes"], f"{plan.name}: memory per GPU"),
                   name="memory")
