"""Calibration: microbenchmarks of the machine at hand -> a hardware profile YAML.

The profile has the catalog's shapes so the simulator needs no special case for it:
a ``device`` section in the schema of ``topologies/catalog/gpus.yaml`` (the measured
peak stands in for the datasheet peak), an ``efficiency`` section in the schema of
``efficiency.yaml`` (matmul efficiency curve over GEMM size, memory-bound efficiency,
kernel and host overhead, collective alpha-beta), and the raw measurements they were
fitted from.

What is measured, on the backend a run will use (gloo on CPU, nccl on GPU), and where:
- ``executors.calibrate.probes`` (one process): matmul throughput over a grid of GEMM shapes and
  precisions (one thread per rank on CPU, as the executor runs; on CPU the efficiency
  curve comes from a transformer layer's GEMM shapes, forward, dX and dW, timed with
  their operands out of cache, as inside a step); memory-bound bandwidth (a large tensor
  copy) and the fixed cost of a tiny kernel; the host (framework) cost of eager PyTorch
  per modelled kernel: one tiny transformer layer (``executors.model.Block``) forward and
  backward over the kernels ``simcore.model.workload`` counts for it (on a CPU, where the
  issuing thread runs each kernel, less the layer's modelled device time: the per-kernel
  dispatch time ``simcore.model.compute.phase_s`` adds to the device time), and the same layer
  under full and selective ``checkpoint_wrapper``; the optimizer step (``AdamW`` as the
  executor builds it): a cost per parameter tensor and a bandwidth;
- ``executors.calibrate.gpu_probes``, on a GPU: GEMMs up to 16k per precision (fp32, tf32,
  bf16, fp16, fp8), SDPA's FlashAttention forward and backward over sequence lengths,
  streaming bandwidth beyond the L2, host-device copies (pinned and pageable, both ways);
- ``executors.calibrate.collective_probes``: all-reduce, all-gather, reduce-scatter, broadcast,
  all-to-all and send/recv latency and bandwidth over message sizes, for group sizes 2
  and 4, fitted as t = a + n/b (Hockney's alpha-beta model);
- ``executors.calibrate.oversubscription``, on CPU: throughput per rank when 1, 2, 4 ranks run at
  once, scaled by the slowdown of the executor's own step with n ranks (a lone GEMM or
  layer slows less than a real step when ranks share cores), and the anchor of the
  compute figures to the executor's own one-rank steps at two widths
  (``anchor_to_executor``: a dispatch and a device ratio; the isolated probes predict a
  real step 10-50% off on a small shared host);
- ``executors.calibrate.parallel_probes``, on CPU: the host cost of DTensor TP, FSDP2 (per layer and
  for the model's ends, from whole models wrapped as the executor wraps them), a pipeline
  stage's chunk and the busy-rank point-to-point hand-over, on two ranks at once (TP and
  the hand-over on four ranks too, two pairs side by side: kept as ``name@4``).

This module runs the probes (``calibrate``), which ``executors.calibrate.build.build_profile``
fits into the profile, pools the one-shot host costs over this host's past calibrations
(``pool_host_costs``) and re-measures the load-sensitive figures before a validation run
(``refresh_host_speed``). ``executors.calibrate.refit.refit_profile`` refits a profile from a
measured run (``trainplan calibrate --from-run``).
"""
from __future__ import annotations

import datetime as _dt
import os
import statistics
import time
from pathlib import Path

import torch
import yaml

from executors.calibrate.build import _host_overhead_s, _rank_tables, build_profile
from executors.calibrate.collective_probes import COLLECTIVE_BYTES, GROUP_SIZES, bench_collectives
from executors.calibrate.handover_probes import P2P_KEYS, bench_p2p
from executors.calibrate.oversubscription import (_per_rank, _scale_compute, anchor_to_executor, bench_oversubscription,
                                                  one_rank_step_s)
from executors.calibrate.parallel_probes import (GROUPED_PROBE_MODES, GROUPED_PROBE_RANKS, PARALLEL_PROBE_REPS,
                                                 bench_parallel_host)
from executors.calibrate.gpu_probes import (ATTENTION_SEQS, GPU_MATMUL_SIZES, bench_attention, bench_cpu_optimizer,
                                            bench_gpu_matmul, bench_gpu_memory, bench_host_copies, device_facts)
from executors.calibrate.probes import (LAYER_GEMM_HIDDEN, MATMUL_SIZES, _dispatch_s, bench_host_overhead,
                                        bench_layer_gemms, bench_matmul, bench_memory, bench_optimizer)
from simcore.results import atomic_write_text
from topologies.profile import host_slowdown


#: Window and rounds of the quick re-measurement before each validation run
#: (``refresh_host_speed``). Measured on the 2-core validation host: with one 0.1 s round
#: the 2-rank slowdown read anywhere from 0.7x to 2.1x in back-to-back probes (and the
#: predictions inherited that scatter); 0.25 s x 3 interleaved rounds, median kept, keep it
#: within about 10% (a noise choice, not hardware).
REFRESH_WINDOW_S = 0.25
REFRESH_CYCLES = 3
#: Message sizes of a quick calibration: the smallest (the latency) and the two largest, which
#: set the bandwidth (with the three smallest alone the slope was lost in the latency noise).
QUICK_COLLECTIVE_BYTES = (COLLECTIVE_BYTES[0], *COLLECTIVE_BYTES[-2:])


def calibrate(out: str | os.PathLike, *, quick: bool = False, progress: bool = True) -> dict:
    """Measure this host and write its profile to ``out`` atomically; return the profile."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    torch.set_num_threads(1)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    gpu = device.type == "cuda"
    precisions = ["fp32", "tf32", "bf16", "fp16"] if gpu else ["fp32", "bf16"]
    with tqdm(total=len(precisions) + 8, desc="calibrate", disable=not progress, unit="bench") as bar:
        if gpu:
            matmul = bench_gpu_matmul(device, GPU_MATMUL_SIZES[:4] if quick else GPU_MATMUL_SIZES, bar)
            memory = _logged("copy bandwidth", bench_gpu_memory, device)
            extra = {"facts": device_facts(device), "host_copies": _logged("host copies", bench_host_copies, device),
                     "attention": _logged("attention", bench_attention, device,
                                          ATTENTION_SEQS[:3] if quick else ATTENTION_SEQS),
                     "cpu_optimizer": _logged("CPU AdamW", bench_cpu_optimizer)}
        else:
            matmul = bench_matmul(device, precisions, MATMUL_SIZES[:4] if quick else MATMUL_SIZES, bar)
            matmul += bench_layer_gemms(hidden=LAYER_GEMM_HIDDEN[:3] if quick else LAYER_GEMM_HIDDEN)
            memory, extra = bench_memory(device), None
        bar.update(2)
        host = _logged("host overhead", bench_host_overhead, device, reps=10 if quick else 40)
        bar.update(1)
        optimizer = _logged("optimizer", bench_optimizer, device)
        bar.update(1)
        oversub = {}
        if not gpu:
            oversub = bench_oversubscription((1, 2), window_s=0.1, cycles=1) if quick else bench_oversubscription()
        bar.update(1)
        # one GPU: NCCL refuses two ranks on one device, so the collectives are gloo's over the
        # host (single-GPU plans issue none but the loss's all-reduce); the source says so
        backend = "nccl" if gpu and torch.cuda.device_count() >= 2 else "gloo"
        if backend == "nccl":
            groups = tuple(n for n in GROUP_SIZES if n <= torch.cuda.device_count())
        else:
            groups = (2,) if quick else GROUP_SIZES
        collectives = _logged("collectives", bench_collectives, backend, groups,
                              QUICK_COLLECTIVE_BYTES if quick else COLLECTIVE_BYTES)
        bar.update(1)
        # the torch wrappers' host costs on CPU ranks (a GPU's are its kernels' and NCCL's)
        parallel = bench_parallel_host(reps=4 if quick else PARALLEL_PROBE_REPS) if not gpu else None
        bar.update(1)
        # four ranks on the cores (the quick calibration measures no four-rank slowdown to convert it by)
        grouped = bench_parallel_host(world=GROUPED_PROBE_RANKS, modes=GROUPED_PROBE_MODES) \
            if parallel and not quick else None
        bar.update(1)
    profile = build_profile(matmul, memory, collectives, oversub, device, host=host, optimizer=optimizer,
                            parallel=parallel, grouped=grouped, gpu=extra, seconds=time.perf_counter() - t0)
    if not quick:
        pool_host_costs(profile, _previous_profile(out))
    if parallel:
        p2p_in_sim_unit(profile["efficiency"], parallel["per_kernel_s"], parallel["ranks"])
    if grouped:
        p2p_in_sim_unit(profile["efficiency"], grouped["per_kernel_s"], grouped["ranks"], f"@{grouped['ranks']}")
    atomic_write_text(out, yaml.safe_dump(profile, sort_keys=False))
    return anchor_to_executor(profile, out)


def _logged(name: str, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, its duration on stderr (a probe that runs long shows where)."""
    import sys

    start = time.perf_counter()
    out = fn(*args, **kwargs)
    print(f"calibrate: {name} {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return out


def backup_profile(path) -> Path:
    """Copy the profile at ``path`` to ``PATH.bak`` (atomically, replacing an older backup)
    before it is rewritten in place; returns the backup's path."""
    path = Path(path)
    backup = path.with_name(path.name + ".bak")
    atomic_write_text(backup, path.read_text())
    return backup


def p2p_in_sim_unit(efficiency: dict, probe_per_kernel_s: float, ranks: int, suffix: str = "") -> None:
    """Convert the pipeline point-to-point figures of ``efficiency['parallel_host']``
    (``P2P_KEYS``, each with ``suffix``: ``@n`` for a grouped probe's) from the probe's
    per-kernel time on ``ranks`` busy ranks to the simulator's for that rank count
    (``host_overhead_us`` x layer[1] / layer[ranks], as
    ``topologies.profile.scale_for_ranks`` charges it), so that the seconds the probe
    measured come back; the factor is kept as ``p2p_unit_factor`` (1.33 in one refresh: the
    probe's kernel on two busy ranks is not the simulator's since the host kernel time is a
    share of the executor's one-rank step)."""
    ph = efficiency.get("parallel_host")
    layer = {int(k) for k in efficiency.get("host_oversubscription") or {}}   # host_slowdown's keys
    if not ph or 1 not in layer or ranks not in layer or not efficiency.get("host_overhead_us") \
            or probe_per_kernel_s <= 0:
        return
    factor = probe_per_kernel_s / (efficiency["host_overhead_us"] * 1e-6 * host_slowdown(efficiency, ranks))
    for k in P2P_KEYS:
        if k + suffix in ph:
            ph[k + suffix] *= factor
    ph["p2p_unit_factor" + suffix] = factor


#: Calibrations of this host whose wrapper host costs are pooled (``pool_host_costs``). A noise
#: choice: on the 2-core validation host one calibration's TP and FSDP2 figures came out
#: 25-50% below the three others of the day, and the TP/FSDP2 layouts of the bench that
#: followed were predicted 18-31% too fast.
HOST_COST_HISTORY = 5


def _previous_profile(path) -> dict | None:
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None


#: The per-kernel figures of ``parallel_host`` that one calibration measures in its host kernel
#: time and no refresh re-measures (the wrappers' entries with forward and backward kernels
#: are pooled; the point-to-point and lone-collective figures are re-measured by every refresh).
UNIT_SCALARS = ("optimizer_per_tensor_kernels", "optimizer_dtensor_per_tensor_kernels")


def pool_host_costs(profile: dict, previous: dict | None, keep: int = HOST_COST_HISTORY) -> dict:
    """Pool the one-shot host costs of ``parallel_host`` (TP, FSDP2, the model's ends, the
    pipeline chunk, checkpointing: entries with forward and backward kernels) over the last
    ``keep`` full calibrations of the same host and torch: each is measured in one ~10 s
    probe while the host's state drifts over minutes, so the figures in use are the median
    per entry over this calibration and those kept in ``previous`` (the profile being
    replaced) under ``raw.host_cost_history`` (the wrappers' communication shares,
    ``comm_share``, alike, and the grouped probe's point-to-point figures, ``p2p_*@n``, which
    no refresh re-measures: in a day's calibrations the four-rank delivery delay read
    0.11-1.15 ms); those measured by another probe method (``parallel_host.probe_method``)
    are dropped.

    The counts are in units of each calibration's host kernel time. Where the calibration
    measured the executor's one-rank step (a CPU host), the unit becomes a fixed share of
    that step instead, ``efficiency.host_overhead_per_step``: the median over the pooled
    calibrations of their host kernel time over their step. Each calibration's counts are
    converted to it before the median is taken, so a calibration whose isolated probe layer
    read the host slow (or fast) against its own step does not bias the pool, and a refresh
    takes the unit from the step it measures (``refresh_host_speed``). On the shared 2-core
    host the TP and ZeRO-3 steps followed the executor's one-rank step within about 10%
    (tp2: 25-32 steps' worth over four calibrations), the probe layer's host kernel time
    within 2x (bench/RESULTS.md)."""
    eff = profile.get("efficiency") or {}
    ph = eff.get("parallel_host")
    if not ph:
        return profile
    keys = sorted(k for k, v in ph.items() if isinstance(v, dict) and "forward_kernels" in v)
    grouped_p2p = sorted(k for k in ph if k.split("@")[0] in P2P_KEYS and "@" in k)   # no refresh re-measures them
    me, method = profile["measured_on"], ph.get("probe_method")
    step = one_rank_step_s(profile)
    per_step = eff["host_overhead_us"] * 1e-6 / step if step and eff.get("host_overhead_us") else None

    def entry(date, costs: dict) -> dict:
        return {"date": date, "method": method,
                **{k: [costs[k]["forward_kernels"], costs[k]["backward_kernels"]] for k in keys},
                **{k: costs[k] for k in grouped_p2p if k in costs},
                **({"comm_share": costs["comm_share"]} if costs.get("comm_share") else {}),
                **({"unit_per_step": per_step} if per_step else {})}

    history = []
    if previous and all((previous.get("measured_on") or {}).get(f) == me[f] for f in ("host", "torch", "device")):
        history = [h for h in (previous.get("raw") or {}).get("host_cost_history") or []
                   if h.get("method") == method and bool(h.get("unit_per_step")) == bool(per_step)]
        old = (previous.get("efficiency") or {}).get("parallel_host") or {}
        if not history and not per_step and old.get("probe_method") == method and all(k in old for k in keys):
            history = [entry(previous["measured_on"].get("date"), old)]   # a profile from before the history
    history = (history + [entry(me["date"], ph)])[-keep:]
    unit = statistics.median(h["unit_per_step"] for h in history) if per_step else None

    def in_unit(h: dict) -> float:   # one of ``h``'s counts in the pooled unit
        return h["unit_per_step"] / unit if unit else 1.0

    for k in keys:
        rows = [h for h in history if k in h]
        ph[k] = {"forward_kernels": statistics.median(h[k][0] * in_unit(h) for h in rows),
                 "backward_kernels": statistics.median(h[k][1] * in_unit(h) for h in rows)}
    for k in grouped_p2p:   # in each probe's own per-kernel time, converted after (``p2p_in_sim_unit``)
        ph[k] = statistics.median(h[k] for h in history if k in h)
    shares = [h["comm_share"] for h in history if h.get("comm_share")]
    if ph.get("comm_share"):
        ph["comm_share"] = {m: [statistics.median(sh[m][j] for sh in shares if m in sh) for j in range(2)]
                            for m in ph["comm_share"]}
    ph["pooled_calibrations"] = len(history)
    ph["source"] = ph.get("source", "").split("; pooled:")[0] + (
        f"; pooled: the kernel counts are the median over the last {len(history)} full calibrations of this host "
        "(raw.host_cost_history)" + (", each in the unit host_overhead_per_step x its executor one-rank step"
                                      if unit else ""))
    if unit:
        for k in UNIT_SCALARS:
            if k in ph:
                ph[k] *= per_step / unit
        eff["host_overhead_us"] = unit * step * 1e6
        eff["host_overhead_per_step"] = unit
        eff["host_overhead_source"] = (
            f"{eff.get('host_overhead_source', '').split('; as a share')[0]}; as a share of the executor's one-rank "
            f"step (host_overhead_per_step, the median over the {len(history)} pooled calibrations of that "
            "kernel time over their step), the unit of the parallel_host costs")
    profile.setdefault("raw", {})["host_cost_history"] = history
    return profile


def refresh_host_speed(profile_path, *, window_s: float = REFRESH_WINDOW_S, cycles: int = REFRESH_CYCLES) -> dict:
    """Re-measure the load-sensitive host figures of a CPU profile now (~25 s): the
    oversubscription probes (1, 2, 4 ranks, the executor's slowdown included), hence the
    per-kernel dispatch and the per-rank GEMM rates, the host kernel time (the unit of the
    wrapper, checkpointing and optimizer host costs: ``host_overhead_per_step`` times the
    executor's one-rank step measured here, where the calibration pooled it; else the probe
    layer's), the pipeline point-to-point figures (``bench_p2p``), and the anchor to the
    executor's one-rank step. (Re-measuring
    the torch wrappers' host cost here too, with a shorter ``bench_parallel_host``, was
    tried: it added as much noise per run as it removed bias; bench/RESULTS.md.) On a machine shared with other work the speed a rank gets changes
    from minute to minute, so a prediction compared with a run should use figures taken
    just before it. The other figures (in units of the host kernel, or fits) are kept."""
    profile = yaml.safe_load(Path(profile_path).read_text())
    if (profile.get("measured_on") or {}).get("device") != "cpu":
        return profile   # a GPU's speed does not depend on other processes' CPU load
    oversub = bench_oversubscription(window_s=window_s, cycles=cycles)
    eff = profile["efficiency"]
    anchor = eff.pop("executor_anchor", None)
    if anchor:   # back to the probes' own figures; re-anchored below on this refresh's run
        _scale_compute(profile, 1.0 / anchor["ratio"], host_unit=False,
                       device=1.0 / anchor.get("device_ratio", anchor["ratio"]))
    host = (profile.get("raw") or {}).get("host_overhead")
    if host:
        eff["host_overhead_us"] = _host_overhead_s(host, oversub) * 1e6
    _rank_tables(eff, oversub)   # the per-rank layer rate and the ranks' spread move with the load
    p2p = bench_p2p() if eff.get("parallel_host") else None   # the hand-over between busy ranks moves with the load
    if p2p:
        eff["parallel_host"].update(p2p["kernels"])
    old_one = (profile["oversubscription"].get("matmul_flops_per_s_per_rank") or {}).get(1)
    if old_one and oversub["matmul"].get(1):   # the one-rank GEMM rate moves the measured peak with it
        r = oversub["matmul"][1] / float(old_one)
        profile["device"]["dense_tflops"] = {p: (v * r if v else v) for p, v in profile["device"]["dense_tflops"].items()}
    if "dispatch_us" in eff:
        eff["dispatch_us"] = _dispatch_s(eff, profile["device"]["dense_tflops"]["fp32"] * 1e12,
                                         profile["device"]["hbm_tbyte_per_s"] * 1e12) * 1e6
    profile["oversubscription"]["matmul_flops_per_s_per_rank"] = _per_rank(oversub["matmul"])
    profile["oversubscription"]["layer_steps_per_s_per_rank"] = _per_rank(oversub["layer"])
    profile["oversubscription"]["executor_slowdown"] = _per_rank(oversub.get("slowdown", {}))
    profile.setdefault("raw", {})["executor_one_rank"] = oversub.get("one_rank_step") or {}
    step = one_rank_step_s(profile)
    if eff.get("host_overhead_per_step") and step:   # after dispatch_us, which is the probe's
        eff["host_overhead_us"] = eff["host_overhead_per_step"] * step * 1e6
    if p2p:   # after host_overhead_us and the rank tables, the simulator's unit
        p2p_in_sim_unit(eff, p2p["per_kernel_s"], p2p["ranks"])
    profile["measured_on"]["refreshed"] = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    atomic_write_text(profile_path, yaml.safe_dump(profile, sort_keys=False))
    return anchor_to_executor(profile, profile_path)
