"""Refit a profile from a measured run (``trainplan calibrate --from-run``): the compute and
communication figures are scaled by the ratio of measured to predicted phase times, so the
next prediction on this machine starts from what was seen. The run must be a run of the
plan given (``trainplan run --json`` records the plan's identity): a run of another model,
layout, batch or precision would move every later prediction by its mismatch, so it is
refused and the profile left untouched. The previous profile is kept as a backup.
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import yaml

from executors.calibrate.oversubscription import _scale_compute
from executors.calibrate.profile import backup_profile
from executors.measure import plan_identity, plan_mismatch
from simcore.results import atomic_write_text


#: Measured phase (``StepResult.time_s`` key) -> the profile figure it refits.
#: Compute phases refit the host overhead and the peak together (both scale the
#: compute time of an overhead- or FLOP-bound phase); pp_comm the p2p hop latency;
#: dp_comm the all-reduce latency and bandwidth.
REFIT_PHASES = {"compute": ("forward", "backward", "recompute"), "pp": ("pp_comm",), "dp": ("dp_comm",)}
#: Ratios outside [1/REFIT_CLAMP, REFIT_CLAMP] are clamped: one noisy run must not move a
#: figure by more than this factor (a robustness choice, not hardware).
REFIT_CLAMP = 4.0


def _load_measured(path) -> tuple[dict, dict | None]:
    """The measurement in a ``run --json`` or ``validate --json`` document, and the identity of
    the plan it ran (``executors.measure.plan_identity``; None in a document without one)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--from-run {path} cannot be read as JSON: {exc}") from None
    measured = doc.get("measured", doc)
    return measured, doc.get("plan") or measured.get("plan")


def check_run_matches(path, measured: dict, identity: dict | None, plan) -> None:
    """Refuse, in one sentence, a run that is no measurement, that does not say which plan it
    ran, or that ran another plan than ``plan`` (its fields that differ named)."""
    if measured.get("source", "measured") != "measured":
        raise ValueError(f"--from-run {path} is a prediction (source={measured['source']}), not a measured run; "
                         "the profile was left unchanged")
    if not identity or "sha256" not in identity:
        raise ValueError(f"--from-run {path} does not say which plan it ran (no 'plan' entry): refit only from "
                         "`trainplan run --json` output, which records it; the profile was left unchanged")
    if identity["sha256"] != plan_identity(plan)["sha256"]:
        diff = plan_mismatch(identity, plan)
        shown = "; ".join(diff[:4]) + (f" and {len(diff) - 4} more" if len(diff) > 4 else "")
        raise ValueError(f"--from-run {path} measured plan {identity.get('name')!r}, not --plan {plan.name!r} "
                         f"(run vs plan: {shown or 'the plan hashes differ'}); the profile was left unchanged")


def _phase_ratio(pred: dict, meas: dict, keys: tuple[str, ...]) -> float | None:
    p = sum(float(pred.get(k, 0.0)) for k in keys)
    m = sum(float(meas.get(k, 0.0)) for k in keys)
    if p <= 0 or m <= 0:
        return None
    return min(REFIT_CLAMP, max(1.0 / REFIT_CLAMP, m / p))


def refit_profile(profile_path, measured_json_path, plan) -> dict:
    """Refit the profile's efficiency and bandwidth figures from a measured run of ``plan``
    (``trainplan run --json`` output, which names the plan it ran; a run of another plan is
    refused with the profile untouched): each figure is scaled by the ratio of measured to
    predicted time of the phase it drives. The previous profile is kept beside it
    (``backup_profile``); the new one is written atomically with the old figures and what
    changed under ``refits``, and returned."""
    from simcore.engine.predict import simulate

    measured, identity = _load_measured(measured_json_path)
    check_run_matches(measured_json_path, measured, identity, plan)
    profile = yaml.safe_load(Path(profile_path).read_text())
    meas_t = measured.get("time_s") or (measured.get("breakdown") or {}).get("time_s") or {}
    if not meas_t:
        raise ValueError(f"{measured_json_path} has no 'time_s' phase breakdown (use `trainplan run --json`)")
    pred_t = simulate(plan, engine="des").time_s
    eff = profile["efficiency"]
    before = {"host_overhead_us": eff.get("host_overhead_us"), "kernel_overhead_us": eff.get("kernel_overhead_us"),
              "dispatch_us": eff.get("dispatch_us"),
              "dense_tflops": dict(profile["device"]["dense_tflops"]), "collective": dict(eff["collective"])}
    old = _figures(profile)
    ratios = {k: _phase_ratio(pred_t, meas_t, keys) for k, keys in REFIT_PHASES.items()}
    if ratios["compute"]:
        _scale_compute(profile, ratios["compute"])
    if ratios["pp"]:
        eff["collective"]["nvlink_hop_latency_us"] *= ratios["pp"]
    if ratios["dp"]:
        _scale_all_reduce(profile, ratios["dp"])
    new = _figures(profile)
    changed = {k: [old[k], v] for k, v in new.items() if old.get(k) != v}
    backup = backup_profile(profile_path)
    profile.setdefault("refits", []).append({
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "plan": plan.name, "plan_sha256": identity["sha256"], "measured": str(measured_json_path),
        "backup": str(backup), "ratios": {k: v for k, v in ratios.items() if v}, "before": before,
        "changed": changed})
    atomic_write_text(profile_path, yaml.safe_dump(profile, sort_keys=False))
    return profile


def _figures(profile: dict, prefix: str = "") -> dict[str, float]:
    """Every number of the profile (but its refit history) by dotted key."""
    out = {}
    for k, v in profile.items():
        if prefix == "" and k == "refits":
            continue
        if isinstance(v, dict):
            out.update(_figures(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def _scale_all_reduce(profile: dict, ratio: float) -> None:
    """All-reduce time x ratio: latencies times it, bandwidths over it."""
    eff = profile["efficiency"]
    eff["collective"]["base_latency_us"] *= ratio
    for fit in (profile.get("collectives") or {}).get("all_reduce", {}).values():
        fit["alpha_s"] *= ratio
        if "base_latency_s" in fit:
            fit["base_latency_s"] *= ratio
        fit["bus_bytes_per_s"] /= ratio
    dev = profile["device"]
    dev["intra_link_gbyte_per_s_bidir"] /= ratio
