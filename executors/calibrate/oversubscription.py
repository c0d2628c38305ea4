"""CPU hosts: what a rank gets when several share the cores, and the anchor of the compute
figures to the executor's own step. The one-rank GEMM and tiny-layer rates with 1, 2, 4
ranks running at once (processes set up as the executor's ranks), the executor's own
slowdown with n ranks (a data-parallel run of the validation tiny model: a lone GEMM or
layer slows less than a real step), and ``anchor_to_executor``, which scales the compute
figures (dispatch and device time apart) so that the executor's one-rank steps at two
widths, measured in the same calibration, are predicted as measured.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from executors.procs import idle_gloo_transport
from executors.calibrate.probes import _layer_step, probe_spec
from simcore.results import atomic_write_text


OVERSUB_RANKS = (1, 2, 4)
#: Seconds every oversubscription worker runs each probe for, all ranks at once.
OVERSUB_WINDOW_S = 0.25
#: Interleaved rounds of the oversubscription probe (median kept).
OVERSUB_CYCLES = 3
#: The workload of the executor slowdown probe: the local validation matrix's tiny model
#: (validation/local.yaml's base; a modelling choice: the workload whose slowdown the
#: predictions must carry).
STEP_PROBE_MODEL = dict(name="step-probe", layers=4, hidden=64, heads=4, kv_heads=4, ffn_hidden=256, vocab=256,
                        seq_len=32, tied_embeddings=False)
#: A wider model of the same class, run on one rank for the anchor's second equation: at
#: hidden 64 a step is mostly per-kernel dispatch, at 256 mostly device time (GEMMs, memory),
#: so the two steps together fix a dispatch ratio and a device ratio (a modelling choice;
#: neither width is in the local matrix, whose wider layout has hidden 128).
WIDE_PROBE_MODEL = dict(STEP_PROBE_MODEL, name="step-probe-wide", hidden=256, heads=16, kv_heads=16, ffn_hidden=1024)


def _window_rate(fn, work: float, window_s: float, group) -> float:
    """Work per second of ``fn`` repeated for ``window_s``, started on a gloo barrier of ``group``."""
    dist.barrier(group=group)
    reps, start = 0, time.perf_counter()
    while reps < 2 or time.perf_counter() - start < window_s:
        fn()
        reps += 1
    return reps * work / (time.perf_counter() - start)


def _oversub_rank(rank: int, world: int, device, ranks: tuple[int, ...], size: int, window_s: float,
                  cycles: int) -> list[dict]:
    """One rank of the oversubscription probe, in a process set up exactly as the executor
    sets up its ranks (``executors.procs.spawn``: one intra-op thread, a gloo process group
    with its background threads): for each rank count n in ``ranks`` (interleaved over
    ``cycles`` rounds) ranks 0..n-1 run the GEMM and the probe layer, each over a window they
    start together on a barrier, while the others wait blocked in a barrier (no CPU). Rows
    of (cycle, n, rates) of this rank."""
    torch.manual_seed(rank)
    a, b = torch.randn(size, size), torch.randn(size, size)
    layer = _layer_step(probe_spec(), device)
    for fn in (lambda: a @ b, layer):   # warm-up
        fn()
    groups = {n: None if n == world else dist.new_group(list(range(n))) for n in ranks}
    idle_gloo_transport()
    rows = []
    for cycle in range(cycles):
        for n in ranks:
            if rank < n:
                g = groups[n]
                rows.append({"cycle": cycle, "n": n,
                             "matmul": _window_rate(lambda: a @ b, 2.0 * size**3, window_s, g),
                             "layer": _window_rate(layer, 1.0, window_s, g)})
            dist.barrier()
    return rows


#: Steps (after warm-up) of each executor run of the slowdown probe, and its interleaved
#: rounds (median kept). A noise choice: on the 2-core validation host one round's 2-rank
#: forward slowdown read anywhere from 1.05x to 1.73x.
SLOWDOWN_STEPS, SLOWDOWN_WARMUP, SLOWDOWN_ROUNDS = 8, 2, 5
#: Executor phases whose time the slowdown probe compares: those with no collective in them
#: (DDP's gradient all-reduce runs inside ``backward``), so the comm model is not counted twice.
SLOWDOWN_PHASES = ("forward", "optimizer")


def _probe_plan(ranks: int, profile=None, spec: dict = STEP_PROBE_MODEL):
    """A data-parallel plan of ``spec`` (``STEP_PROBE_MODEL`` by default) on ``ranks`` ranks
    of this host (with the profile at ``profile``, default this host's cached one), four
    micro-batches of one sample per rank per step."""
    from simcore.plan.load import plan_from_dict

    model = {k: v for k, v in spec.items() if k not in ("kv_heads", "ffn_hidden")}
    cluster = {"node": "localhost", "gpus_per_node": max(OVERSUB_RANKS), **({"profile": str(profile)} if profile else {})}
    return plan_from_dict({"name": f"{spec['name']}-dp{ranks}", "model": model, "cluster": cluster,
                           "parallel": {"dp": ranks},
                           "training": {"global_batch": 4 * ranks, "micro_batch": 1, "precision": "fp32"}},
                          Path("."))


def bench_executor_slowdown(ranks=OVERSUB_RANKS, cycles: int = OVERSUB_CYCLES) -> tuple[dict, dict, dict]:
    """Per-rank slowdown of a real training step when ``n`` ranks share this host: the
    executor itself (``executors.launch.run``, fork, gloo: its threads, DDP, autograd and
    AdamW as a validation run has them) on ``_probe_plan(n)``, the time of
    ``SLOWDOWN_PHASES`` per rank with n ranks over that with one, median over ``cycles``
    interleaved rounds. Returns ({n: slowdown} (1.0 for one rank), the one-rank run's
    compute phases: forward and backward, and those of ``WIDE_PROBE_MODEL`` on one rank
    (``wide_forward``, ``wide_backward``), medians over the rounds, which
    ``anchor_to_executor`` uses, {n: the mean rank's wait for the last one at the gradient
    all-reduce (``executors.measure.dp_sync_wait_s``) over the rest of the step, median over
    the rounds} for n > 1). The ranks run the same work, but on a shared host one of them
    is late at every sync by a different amount; a model of the mean rank misses the wait."""
    from executors.launch import run

    ratios: dict = {n: [] for n in ranks}
    waits: dict = {n: [] for n in ranks if n > 1}
    one: dict = {"forward": [], "backward": [], "wide_forward": [], "wide_backward": []}
    for _ in range(cycles):
        wide = run(_probe_plan(1, spec=WIDE_PROBE_MODEL), steps=SLOWDOWN_STEPS, warmup=SLOWDOWN_WARMUP,
                   start_method="fork")
        for k in ("forward", "backward"):
            one[f"wide_{k}"].append(wide.time_s.get(k, 0.0))
        t = {}
        for n in ranks:
            m = run(_probe_plan(n), steps=SLOWDOWN_STEPS, warmup=SLOWDOWN_WARMUP, start_method="fork")
            t[n] = sum(m.time_s.get(k, 0.0) for k in SLOWDOWN_PHASES)
            if n in waits:
                wait = m.extra.get("dp_sync_wait_s", 0.0)
                waits[n].append(wait / max(m.step_time_s - wait, 1e-12))
            if n == 1:
                for k in ("forward", "backward"):
                    one[k].append(m.time_s.get(k, 0.0))
        for n in ranks:
            ratios[n].append(t[n] / t[min(ranks)])
    slowdown = {n: max(1.0, statistics.median(v)) for n, v in ratios.items()}
    return (slowdown, ({k: statistics.median(v) for k, v in one.items()} if one["forward"] else {}),
            {n: statistics.median(v) for n, v in waits.items() if v})


def anchor_to_executor(profile: dict, profile_path) -> dict:
    """Scale a CPU profile's compute figures so that the executor's own one-rank steps of the
    slowdown probe, measured in the same calibration, are predicted as measured: the
    per-kernel kernel and dispatch times up by a dispatch ratio, the peak and memory
    bandwidth down by a device ratio. The probe layer and the GEMM grid run in isolation; a
    training step's forward and backward run among the optimizer's and the other layers'
    tensors, which on a small shared host cost 10-50% more than the isolated probes predict,
    and not alike for dispatch and device time: with one ratio fitted at hidden 64 the
    one-rank forward ran 11%, 26% and 52% longer than predicted at hidden 64, 128 and 256. Two steps
    (``_probe_plan(1)``, mostly dispatch, and the ``WIDE_PROBE_MODEL`` one, mostly device
    time) give two equations, measured = r_dispatch x dispatch + r_device x device, each
    plan's split predicted by the profile; where they leave a ratio that is not positive (or
    the wide step was not measured), one ratio for both, from the first step. The ratios and
    the steps they came from are kept under ``efficiency.executor_anchor``. ``profile_path``
    must hold ``profile`` (the plans are resolved from it)."""
    one = (profile.get("raw") or {}).get("executor_one_rank") or {}
    if not one.get("forward"):
        return profile
    doubled = yaml.safe_load(yaml.safe_dump(profile))   # the per-kernel figures twice over
    _scale_compute(doubled, 2.0, host_unit=False, device=1.0)
    with tempfile.TemporaryDirectory(prefix="trainplan-anchor-") as tmp:
        doubled_path = Path(tmp) / "doubled.yaml"
        atomic_write_text(doubled_path, yaml.safe_dump(doubled, sort_keys=False))
        base = _dispatch_split(profile_path, doubled_path, STEP_PROBE_MODEL)
        measured = one_rank_step_s(profile)
        r = rd = rg = measured / sum(base)
        how = "one ratio for both"
        if one.get("wide_forward"):
            wide = _dispatch_split(profile_path, doubled_path, WIDE_PROBE_MODEL)
            measured_wide = one["wide_forward"] + one["wide_backward"]
            det = base[0] * wide[1] - base[1] * wide[0]
            if det:
                d, g = (measured * wide[1] - measured_wide * base[1]) / det, (base[0] * measured_wide - wide[0] * measured) / det
                if d > 0 and g > 0:
                    rd, rg, how = d, g, "dispatch and device ratios from two widths"
    _scale_compute(profile, rd, host_unit=False, device=rg)
    profile["efficiency"]["executor_anchor"] = {
        "ratio": rd, "device_ratio": rg, "single_ratio": r, "measured_s": dict(one),
        "source": f"forward + backward of the executor's one-rank {_probe_plan(1).name} and "
                  f"{_probe_plan(1, spec=WIDE_PROBE_MODEL).name} steps ({SLOWDOWN_STEPS - SLOWDOWN_WARMUP} steps, "
                  f"median of the calibration's rounds) over the profile's prediction before this scaling; {how}"}
    atomic_write_text(profile_path, yaml.safe_dump(profile, sort_keys=False))
    return profile


def one_rank_step_s(profile: dict) -> float:
    """Forward + backward of the executor's one-rank probe step kept in ``profile`` (0 where
    it was not measured: a GPU profile, a quick calibration)."""
    one = (profile.get("raw") or {}).get("executor_one_rank") or {}
    return float(one.get("forward", 0.0)) + float(one.get("backward", 0.0))


def _dispatch_split(profile_path, doubled_path, spec: dict) -> tuple[float, float]:
    """(dispatch, device) seconds of the one-rank probe plan of ``spec``'s forward and
    backward as the profile at ``profile_path`` predicts them, from the same profile with
    its per-kernel figures doubled at ``doubled_path``, which adds their part once more
    (``simcore.model.compute.phase_s`` sums the two)."""
    from simcore.engine.predict import simulate

    def predict(path) -> float:
        t = simulate(_probe_plan(1, path, spec), engine="analytic").time_s
        return t["forward"] + t["backward"]

    both, plain = predict(doubled_path), predict(profile_path)
    return both - plain, 2 * plain - both


def _scale_compute(profile: dict, r: float, *, host_unit: bool = True, device: float | None = None) -> None:
    """Compute time x r: per-kernel host, kernel and dispatch times times r, peaks and
    memory bandwidth over ``device`` (default r). ``host_unit=False`` leaves
    ``host_overhead_us`` alone: on a serial device it is only the unit of the separately
    measured parallel-wrapper, checkpointing, optimizer and pipeline host costs, which the
    plain layer's compute does not move."""
    device = r if device is None else device
    eff = profile["efficiency"]
    for key in ("host_overhead_us", "kernel_overhead_us", "dispatch_us"):
        if key == "host_overhead_us" and not host_unit:
            continue
        if eff.get(key):
            eff[key] *= r
    dev = profile["device"]
    dev["dense_tflops"] = {p: (v / device if v else v) for p, v in dev["dense_tflops"].items()}
    dev["hbm_tbyte_per_s"] /= device


def derive_oversubscription(measured: dict) -> dict:
    """Per-rank tables ``topologies.profile.scale_for_ranks`` applies: with n ranks, the
    one-rank GEMM rate and layer rate over the executor's measured slowdown with n ranks
    (``bench_executor_slowdown``). What slows a run's ranks when they share cores (DDP and
    gloo threads, the autograd engine, caches and memory bandwidth) is not what slows a lone
    GEMM or layer: on the 2-core validation host those probes read 1.0-1.35x with 2 ranks
    while the executor's steps slowed ~1.3x, which left every multi-rank prediction too
    fast. Without a slowdown figure the measured tables stand."""
    slow = measured.get("slowdown") or {}
    if 1 not in slow:
        return {"matmul": dict(measured["matmul"]), "layer": dict(measured["layer"])}
    return {kind: {n: measured[kind][1] / slow[n] for n in slow} for kind in ("matmul", "layer")}


def bench_oversubscription(ranks=OVERSUB_RANKS, size: int = 256, window_s: float = OVERSUB_WINDOW_S,
                           cycles: int = OVERSUB_CYCLES) -> dict:
    """Per-rank GEMM FLOP/s and probe-layer steps/s when ``n`` ranks run at once (CPU hosts),
    in one fork launch of max(ranks) ranks configured as the executor's ranks
    (``_oversub_rank``; the rank counts interleaved over ``cycles`` rounds, median kept, so
    that load from other processes that comes and goes biases every count alike), and the
    executor's slowdown with n ranks (``bench_executor_slowdown``). Returns the derived
    tables (``derive_oversubscription``) under "matmul" and "layer", the slowdown under
    "slowdown", the gradient-sync wait fractions under "dp_sync_wait" and the measured GEMM
    and layer rates under "raw"."""
    from executors.procs import spawn

    ranks = tuple(sorted(ranks))
    per_rank = spawn(_oversub_rank, max(ranks), (ranks, size, window_s, cycles), timeout_s=180, start_method="fork")
    samples: dict = {kind: {n: [] for n in ranks} for kind in ("matmul", "layer")}
    for cycle in range(cycles):
        for n in ranks:
            rows = [r for rank_rows in per_rank for r in rank_rows if r["cycle"] == cycle and r["n"] == n]
            for kind in samples:
                samples[kind][n].append(statistics.mean(r[kind] for r in rows))
    measured = {kind: {n: statistics.median(v) for n, v in by_n.items()} for kind, by_n in samples.items()}
    measured["slowdown"], one_rank, sync_wait = bench_executor_slowdown(ranks, SLOWDOWN_ROUNDS if cycles > 1 else 1)
    return {**derive_oversubscription(measured), "slowdown": measured["slowdown"], "one_rank_step": one_rank,
            "dp_sync_wait": sync_wait,
            "raw": {"matmul": measured["matmul"], "layer": measured["layer"]}}


def _per_rank(table: dict) -> dict:
    return {int(k): float(v) for k, v in sorted(table.items())}
