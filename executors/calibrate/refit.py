"""Refit a profile from a measured run (``trainplan calibrate --from-run``): the compute and
communication figures are scaled by the ratio of measured to predicted phase times, so the
next prediction on this machine starts from what was seen.
"""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import yaml

from executors.calibrate.oversubscription import _scale_compute
from simcore.results import atomic_write_text


#: Measured phase (``StepResult.time_s`` key) -> the profile figure it refits.
#: Compute phases refit the host overhead and the peak together (both scale the
#: compute time of an overhead- or FLOP-bound phase); pp_comm the p2p hop latency;
#: dp_comm the all-reduce latency and bandwidth.
REFIT_PHASES = {"compute": ("forward", "backward", "recompute"), "pp": ("pp_comm",), "dp": ("dp_comm",)}
#: Ratios outside [1/REFIT_CLAMP, REFIT_CLAMP] are clamped: one noisy run must not move a
#: figure by more than this factor (a robustness choice, not hardware).
REFIT_CLAMP = 4.0


def _load_measured(path) -> dict:
    doc = json.loads(Path(path).read_text())
    return doc.get("measured", doc)   # a `trainplan validate --json` document or a `run --json` one


def _phase_ratio(pred: dict, meas: dict, keys: tuple[str, ...]) -> float | None:
    p = sum(float(pred.get(k, 0.0)) for k in keys)
    m = sum(float(meas.get(k, 0.0)) for k in keys)
    if p <= 0 or m <= 0:
        return None
    return min(REFIT_CLAMP, max(1.0 / REFIT_CLAMP, m / p))


def refit_profile(profile_path, measured_json_path, plan) -> dict:
    """Refit the profile's efficiency and bandwidth figures from a measured run of ``plan``
    (``trainplan run --json`` / ``validate --json`` output): each figure is scaled by the
    ratio of measured to predicted time of the phase it drives. Writes the profile back
    (atomically, the old figures kept under ``refits``) and returns it."""
    from simcore.engine.predict import simulate

    profile = yaml.safe_load(Path(profile_path).read_text())
    measured = _load_measured(measured_json_path)
    meas_t = measured.get("time_s") or (measured.get("breakdown") or {}).get("time_s") or {}
    if not meas_t:
        raise ValueError(f"{measured_json_path} has no 'time_s' phase breakdown (use `trainplan run --json`)")
    pred_t = simulate(plan, engine="des").time_s
    eff = profile["efficiency"]
    before = {"host_overhead_us": eff.get("host_overhead_us"), "kernel_overhead_us": eff.get("kernel_overhead_us"),
              "dispatch_us": eff.get("dispatch_us"),
              "dense_tflops": dict(profile["device"]["dense_tflops"]), "collective": dict(eff["collective"])}
    ratios = {k: _phase_ratio(pred_t, meas_t, keys) for k, keys in REFIT_PHASES.items()}
    if ratios["compute"]:
        _scale_compute(profile, ratios["compute"])
    if ratios["pp"]:
        eff["collective"]["nvlink_hop_latency_us"] *= ratios["pp"]
    if ratios["dp"]:
        _scale_all_reduce(profile, ratios["dp"])
    profile.setdefault("refits", []).append({
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "plan": plan.name, "measured": str(measured_json_path),
        "ratios": {k: v for k, v in ratios.items() if v}, "before": before})
    atomic_write_text(profile_path, yaml.safe_dump(profile, sort_keys=False))
    return profile


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
