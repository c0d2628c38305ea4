"""The profile ``trainplan calibrate --from-trace`` writes: the catalog's entries for the Plan's GPU
(``device`` in the schema of gpus.yaml, ``efficiency`` in that of efficiency.yaml, as a
calibrated profile has them), with the figures the traces determine replaced
(``executors.calibrate.from_trace``) and a ``from_trace`` section that gives, for each figure
written, its value, the catalog's, and where it came from (files, kernels, residual), and for
each figure not written, why.
"""
from __future__ import annotations

import copy
import statistics
from pathlib import Path

import yaml

from executors.calibrate.from_trace import attention_fractions, collective_fits, gemm_curve, now
from topologies.hardware import CATALOG_DIR, load_catalog

#: Figures of the catalog entry no trace determines, and why (each is kept; the output says so).
NOT_FROM_A_TRACE = {
    "device": "the datasheet peaks and link rates: every rate a trace shows is a fraction of them",
    "efficiency.kernel_overhead_us": "the model's is GPU time per modelled kernel (several CUDA kernels, launch "
                                     "gaps and tails each); a trace's kernels are not mapped to the modelled ones",
    "efficiency.host_overhead_us": "the model's is host time per modelled kernel; a trace's host-bound gaps are "
                                   "shown by `trainplan compare --trace`, not divided among modelled kernels",
    "efficiency.memory_bound": "elementwise kernels' bytes are not in a trace",
    "efficiency.collective.nvlink_hop_latency_us": "one group size per link class cannot split the latency into "
                                                  "a base and per-hop part; the catalog's hop latency is kept",
    "efficiency.collective.net_hop_latency_us": "as the NVLink hop latency",
}


def _catalog_entries(gpu) -> tuple[dict, dict]:
    """(gpus.yaml entry, efficiency entry) of ``gpu``: a calibrated profile's own where it is one."""
    devices = yaml.safe_load((CATALOG_DIR / "gpus.yaml").read_text())
    if gpu.name not in devices:
        raise ValueError(f"--plan's node is a calibrated profile ({gpu.name}), not a catalog GPU: refit it from its own "
                         "runs with --from-run; --from-trace fits a cluster's figures against the catalog's")
    device = devices[gpu.name]   # a plan on a fitted profile (cluster.profile) is refitted from the catalog's
    return dict(device, name=gpu.name), copy.deepcopy(load_catalog().efficiency[gpu.name])


def _fit_source(fits: list[dict], files: list[str], what: str) -> dict:
    return {"files": files, "kernels": sum(f["kernels"] for f in fits),
            "residual": round(max(f["residual"] for f in fits), 4),
            "fits": [f"{f['collective']} on {f['ranks']} ranks ({f['link']}, {f['sizes']} message sizes)" for f in fits],
            "how": what}


def _collective(eff: dict, fits: list[dict], files: list[str], fitted: dict, kept: dict) -> None:
    coll = eff["collective"]
    for link, key in (("nvlink", "nvlink_efficiency"), ("net", "nic_efficiency")):
        good = [f for f in fits if f["link"] == link and f["bandwidth_determined"]
                and f["collective"] in ("all_reduce", "all_gather", "reduce_scatter")]
        if good:
            value = statistics.median(f["bus_bytes_per_s"] / f["link_bytes_per_s"] for f in good)
            fitted[f"efficiency.collective.{key}"] = {"value": round(value, 4), "catalog": coll[key], **_fit_source(
                good, files, "the ring collectives' fitted bus bandwidth over the group's link rate")}
            coll[key] = round(value, 4)
        else:
            seen = [f for f in fits if f["link"] == link]
            kept[f"efficiency.collective.{key}"] = "; ".join(
                f"{f['collective']} on {f['ranks']}: " + ", ".join(w for w in f["why_not"] if not w.startswith("latency"))
                for f in seen if not f["bandwidth_determined"]) or f"no NCCL call of known bytes over {link}"
    good = [f for f in fits if f["collective"] == "all_reduce" and f["latency_determined"]]
    if good:
        value = statistics.median(f["base_latency_s"] for f in good) * 1e6
        fitted["efficiency.collective.base_latency_us"] = {"value": round(value, 3), "catalog": coll["base_latency_us"],
                                                           **_fit_source(good, files, "the all-reduce fits' latency "
                                                                         "less the catalog's hop latency per ring step")}
        coll["base_latency_us"] = round(value, 3)
    else:
        ar = [f for f in fits if f["collective"] == "all_reduce"]
        kept["efficiency.collective.base_latency_us"] = "; ".join(
            f"all_reduce on {f['ranks']}: " + ", ".join(w for w in f["why_not"] if w.startswith(("latency", "the calls")))
            for f in ar) or "no all-reduce of known bytes in the traces (the model's base latency is the all-reduce's)"
        other = [f for f in fits if f["latency_determined"] and f["collective"] != "all_reduce"]
        if other:
            kept["efficiency.collective.base_latency_us"] += "; recorded in from_trace.collective_fits, not written " \
                "(the model's base latency is the all-reduce's, a small message runs NCCL's lower-latency LL protocol): " \
                + ", ".join(f"{f['collective']} on {f['ranks']} ranks {f['latency_s'] * 1e6:.1f} us" for f in other)
    if any(k.startswith("efficiency.collective") for k in fitted):
        coll["source"] = (f"{', '.join(k.rsplit('.', 1)[1] for k in fitted if k.startswith('efficiency.collective'))}: "
                          f"fitted from profiler traces ({len(files)} files; from_trace.fitted); the rest: "
                          f"{coll.get('source', 'the catalog')}")


def _compute(plan, eff: dict, ops, files: list[str], fitted: dict, kept: dict) -> None:
    curve = gemm_curve(plan, ops, eff["matmul"]["points"])
    if curve:
        points, rec = curve
        fitted["efficiency.matmul.points"] = {"value": points, "catalog": eff["matmul"]["points"], "files": files,
                                              "kernels": rec["gemms"], "residual": round(rec["residual"], 4),
                                              "how": "each GEMM's FLOPs (aten op's Input Dims) over its kernels' time "
                                                     "and the datasheet peak; median per half decade of FLOPs, the "
                                                     "catalog's points kept outside the range seen",
                                              "flops_range": rec["flops_range"], "precisions": rec["precisions"]}
        eff["matmul"] = {"points": points, "source": f"fitted from profiler traces between {rec['flops_range'][0]:.3g} "
                                                     f"and {rec['flops_range'][1]:.3g} FLOPs ({rec['gemms']} GEMMs); "
                                                     f"outside: {eff['matmul'].get('source', 'the catalog')}"}
    else:
        kept["efficiency.matmul.points"] = ("no GEMM kernel with a known shape: the traces hold no aten::mm/addmm/bmm "
                                            "op with 'Input Dims' (profile with record_shapes=True)")
    att = attention_fractions(plan, ops)
    for direction in ("forward", "backward"):
        if direction in att:
            value, n, spread = att[direction]
            fitted[f"efficiency.attention.{direction}"] = {
                "value": round(value, 4), "catalog": eff["attention"][direction], "files": files, "kernels": n,
                "residual": round(spread, 4), "how": "flash SDPA ops' FLOPs (Input Dims; causal: half) over their "
                                                     "kernels' time and the 16-bit peak, median"}
            eff["attention"][direction] = round(value, 4)
        else:
            kept[f"efficiency.attention.{direction}"] = (f"no flash attention {direction} op with 'Input Dims' "
                                                         "(profile with record_shapes=True)")
    if any(k.startswith("efficiency.attention") for k in fitted):
        eff["attention"]["source"] = f"fitted from profiler traces (from_trace.fitted); was: {eff['attention'].get('source', '')}"


def trace_profile(plan, calls, ops, files: list[str], devices: list[str], notes: list[str]) -> dict:
    """The profile document of the figures ``calls`` (NCCL) and ``ops`` (GEMM, attention) determine."""
    gpu = plan.cluster.node.gpu
    device, eff = _catalog_entries(gpu)
    fitted, kept = {}, {}
    fits = collective_fits(plan, calls)
    _collective(eff, fits, files, fitted, kept)
    _compute(plan, eff, ops, files, fitted, kept)
    kept.update(NOT_FROM_A_TRACE)
    return {"measured_on": {"host": "profiler traces", "date": now(), "device": ", ".join(devices) or gpu.name,
                            "traces": files, "plan": plan.name},
            "device": dict(device, source=f"catalog: {device.get('source', '')}") if device else device,
            "efficiency": eff,
            "from_trace": {"fitted": fitted, "kept_from_catalog": kept, "notes": notes,
                           "collective_fits": [{k: v for k, v in f.items()} for f in fits]}}


def write_profile(profile: dict, out) -> Path:
    from simcore.results import atomic_write_text

    out = Path(out)
    atomic_write_text(out, yaml.safe_dump(profile, sort_keys=False))
    return out
