"""The host cost of torch's parallel machinery on a CPU host, measured on two ranks at once
(fork, gloo) in units of the plain probe layer's per-kernel time of the same launch, so that
load from other processes falls on plain and wrapped alike: DTensor TP (with and without
SP), FSDP2 (ZeRO-2/3), the model's ends under each, a ``PipelineStage`` chunk's bookkeeping,
AdamW over plain and DTensor parameters, the point-to-point hand-over between busy ranks as
a pipeline runs it, and a lone all-reduce and broadcast issued right after compute, as DDP
and ZeroRedundancyOptimizer issue theirs. TP and the hand-over are measured on four ranks
too (two pairs side by side, ``GROUPED_PROBE_RANKS``), where the ranks outnumber a small
host's cores.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.distributed as dist

from executors.procs import idle_gloo_transport
from executors.calibrate.probes import _layer_step, _median_step, _optimizer_per_tensor_s, probe_kernels, probe_spec


#: Layer steps per probe variant of the parallel probe (median kept; a modelling choice).
PARALLEL_PROBE_REPS = 20
#: Interleaved rounds of the parallel probe's layer variants (median of the per-round ratios;
#: with 5 the TP figure moved 95-174 kernels between calibrations on the shared 2-core host).
PARALLEL_PROBE_ROUNDS = 9
#: The wrappers the parallel probe times on whole models (``_wrapped_model_steps``).
WRAPPER_MODES = ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3")
#: Ranks per wrapped group of the parallel probe (the local matrix's tp2 and dp2); a probe on
#: more ranks runs several such groups side by side.
PROBE_GROUP = 2
#: Ranks and wrappers of the grouped probe (``bench_parallel_host(world=GROUPED_PROBE_RANKS)``):
#: two TP pairs side by side, as the local matrix's tp2-pp2 puts four ranks on the cores. On
#: the 2-core validation host a TP all-reduce read 2.2-2.6 ms in that run and 2.3 ms in this
#: probe, where the two-rank figures scaled by the one-rank slowdown tables gave 1.45 ms
#: (bench/RESULTS.md). FSDP2 is left out to keep the calibration short (4 s a wrapper).
GROUPED_PROBE_RANKS = 4
GROUPED_PROBE_MODES = ("tp", "tp_sp")
#: Depths of the wrapped probe models: the extra cost over the plain model at two depths
#: gives the cost per layer (the slope) and the ends' (the intercept). Timing one wrapped
#: block alone read FSDP2's cost per layer 30% under a block's inside a sharded model
#: (the block alone is its own root group; bench/RESULTS.md). 2 and 6 bracket the local
#: matrix's 4 layers without being it (a modelling choice).
WRAPPER_FIT_LAYERS = (2, 6)
#: The wrappers' entries for the model's ends (``parallel_host_kernels``).
WRAPPER_ENDS = ("tp_embed", "tp_head", "tp_sp_embed", "tp_sp_head", "fsdp_zero2_root", "fsdp_zero3_root")
#: Recorded steps per wrapped model of the communication-share probe (``_recorded_comm``;
#: median kept; a noise choice: the shares read 0.4-0.7 and moved by up to 0.2 between
#: back-to-back calibrations, which the pooling over calibrations evens out).
COMM_SHARE_REPS = 3
#: Version of the parallel probe's method, kept with the pooled host costs: calibrations
#: that measured the wrappers another way are not pooled with this one. 3: gloo's transport
#: threads at SCHED_IDLE (``executors.procs.idle_gloo_transport``), which made the wrapped
#: layers cheaper than the method-2 calibrations read them.
PARALLEL_PROBE_METHOD = 3
#: Round trips of the busy-rank point-to-point relay (``_busy_p2p``).
P2P_PROBE_REPS = 60
#: Calls of each lone collective (``_lone_collectives``) and their size: one latency-bound
#: message (the bytes term comes from the back-to-back fits).
LONE_COLLECTIVE_REPS = 20
LONE_COLLECTIVE_BYTES = 4 * 1024
#: Schedule steps and micro-batches of the pipeline-chunk probe (``_pipeline_chunk``).
PIPELINE_PROBE_REPS = 8
PIPELINE_PROBE_MICROBATCHES = 4


def _busy_p2p(rank: int, step, reps: int, shape: tuple[int, ...]) -> tuple[float, float, float, float]:
    """A two-rank relay as a pipeline runs it, in pairs of ranks (0, 1), (2, 3) ... at once:
    the even rank computes (the probe layer's forward and backward), sends its activation to
    the odd one, which was blocked in its receive, computes and sends back. Returns (wall
    time of the relay on this rank, this rank's compute in it, the time this rank spent in
    its sends, the time it spent posting its receives: the ``irecv`` call before its wait)."""
    buf = torch.zeros(shape)
    peer, role = rank ^ 1, rank % 2   # pairs (0, 1), (2, 3), ...: all pairs at once
    compute = send = post = 0.0

    def receive() -> float:
        t = time.perf_counter()
        work = dist.irecv(buf, src=peer)
        posted = time.perf_counter() - t
        work.wait()
        return posted

    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        if role == 1:
            post += receive()
        c = time.perf_counter()
        step()
        d = time.perf_counter()
        dist.isend(buf, dst=peer).wait()
        compute, send = compute + d - c, send + time.perf_counter() - d
        if role == 0:
            post += receive()
    return time.perf_counter() - t0, compute, send, post


def _busy_stream(rank: int, step, reps: int, shape: tuple[int, ...]) -> tuple[float, float]:
    """Two busy ranks in a stream, as GPipe's forward phase runs them, in pairs as
    ``_busy_p2p``: the even rank computes and posts an asynchronous send it does not wait for
    (gloo's thread must deliver it while both ranks compute), the odd one waits for each
    message, then computes. Returns (wall time, compute) of this rank; the odd rank's period
    less the slower rank's compute is the delivery delay."""
    bufs = [torch.zeros(shape) for _ in range(reps)]
    peer, role = rank ^ 1, rank % 2
    compute, works = 0.0, []
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(reps):
        if role == 1:
            dist.irecv(bufs[i], src=peer).wait()
        c = time.perf_counter()
        step()
        compute += time.perf_counter() - c
        if role == 0:
            works.append(dist.isend(bufs[i], dst=peer))
    wall = time.perf_counter() - t0
    for w in works:
        w.wait()
    return wall, compute


def _handover_probes(rank: int, step, spec) -> dict:
    """The relay and the stream of each pair of ranks, busy with ``step`` (the plain probe layer)
    between messages of one micro-batch's activations."""
    shape = (1, spec.seq_len, spec.hidden)
    return {"p2p": _busy_p2p(rank, step, P2P_PROBE_REPS, shape), "stream": _busy_stream(rank, step, P2P_PROBE_REPS, shape)}


def _lone_collectives(step, reps: int, nbytes: int = LONE_COLLECTIVE_BYTES) -> dict:
    """Median seconds of a lone all-reduce and a lone broadcast of ``nbytes`` (latency-bound),
    each issued right after this rank ran ``step`` (the plain probe layer), as DDP issues its
    gradient all-reduce at the end of a backward and ZeroRedundancyOptimizer its broadcasts
    after the optimizer step. The collectives probe (``executors.calibrate.collective_probes``) times
    calls back to back, which keeps gloo's threads awake; a lone call pays their wake-up
    too (on the 2-core validation host 1.3-2.3 ms for 4 KB against a 1.1 ms fitted alpha)."""
    buf = torch.ones(max(1, nbytes // 4))
    ops = {"all_reduce": lambda: dist.all_reduce(buf), "broadcast": lambda: dist.broadcast(buf, src=0)}
    times: dict = {k: [] for k in ops}
    for i in range(reps + 2):
        for k, op in ops.items():
            step()
            t0 = time.perf_counter()
            op()
            if i >= 2:
                times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _pipeline_chunk(rank: int, world: int, device, spec, reps: int) -> tuple[float, float]:
    """(forward, backward) median seconds of one ``PipelineStage`` chunk of the probe layer
    (torch.distributed.pipelining, a GPipe schedule over all ranks, timed as
    ``executors.measure.instrument_stage`` times a run's chunks): the probe layer plus the
    stage's per-chunk bookkeeping (argument flattening, detaching, gradient hand-over)."""
    from torch.distributed import pipelining

    from executors.model import Block

    s, h, m = spec.seq_len, spec.hidden, PIPELINE_PROBE_MICROBATCHES
    stage = pipelining.PipelineStage(Block(spec).to(device), rank, world, device)
    times: dict = {"f": [], "b": []}
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def timed(fn, key):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            times[key].append(time.perf_counter() - t0)
            return out
        return run

    stage.forward_one_chunk, stage.backward_one_chunk = timed(fwd, "f"), timed(bwd, "b")
    sched = pipelining.ScheduleGPipe(stage, m, loss_fn=lambda y, t: y.sum())
    x = torch.randn(m, s, h, device=device)
    for i in range(reps):
        if i == 2:
            times = {"f": [], "b": []}
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=x)
    return statistics.median(times["f"]), statistics.median(times["b"])


def _model_step(m, x, labels=None):
    """(fwd_s, bwd_s) closure of one micro-batch through a probe model or one of its ends:
    the loss on ``labels`` where it ends in the output projection, else the output's sum.
    Given an ``executors.measure.Recorder`` the two phases are drawn on its compute stream,
    as the executor draws a step's."""
    from executors.model import loss_fn

    def run(rec=None) -> tuple[float, float]:
        t0 = time.perf_counter()
        with rec.span("forward", "forward") if rec else contextlib.nullcontext():
            y = m(x)
            loss = loss_fn(y, labels) if labels is not None else y.sum()
        t1 = time.perf_counter()
        with rec.span("backward", "backward") if rec else contextlib.nullcontext():
            loss.backward()
        return t1 - t0, time.perf_counter() - t1
    return run


def _recorded_comm(rank: int, mesh, steps: dict, names: list[str], reps: int) -> dict:
    """Per step closure of ``names``: the median over ``reps`` recorded steps of (forward,
    backward) seconds and the exposed communication in each, as the executor's recorder
    sees them (``executors.measure``: collectives timed from call to completion, a blocking
    one cut out of the compute spans; ``simcore.results.split_step``). Apart from the timed
    rounds, since recording costs host time of its own."""
    from executors import measure
    from simcore.results import split_step

    rec = measure.Recorder(rank=rank)
    group = frozenset(dist.get_process_group_ranks(mesh.get_group()))
    out: dict = {}
    with measure.record_collectives(rec):
        for name in names:   # the probe mesh's one axis stands for the executor's tp or dp axis
            rec.axis_of = {group: "tp" if name.startswith("tp") else "dp"}
            rows = []
            for i in range(reps + 1):
                rec.start_step()
                f, _b = steps[name](rec)
                end = rec.now()   # the forward ends at ~f: it started with the step
                if i:   # the first is a warm-up
                    spans = rec.step_spans()
                    rows.append((f, end - f, split_step(spans, rank, 0.0, f)["exposed_comm_s"],
                                 split_step(spans, rank, f, end)["exposed_comm_s"]))
            out[name] = [statistics.median(r[j] for r in rows) for j in range(4)]
    return out


def _wrapped_model_steps(spec, mesh, device, modes: tuple[str, ...] = WRAPPER_MODES) -> tuple[dict, list | None]:
    """Step closures of the probe model at each depth of ``WRAPPER_FIT_LAYERS``, plain
    (``model{L}``) and wrapped as ``executors.parallel`` wraps a whole model (``{mode}{L}``:
    DTensor TP with and without SP; FSDP2 with a group per block and the root group,
    resharding after forward or not), and the model's ends (no layers), by which TP's ends
    are split between the embedding and the head: the embedding alone and the head alone
    (final norm, output projection and loss), plain and under TP with and without SP. Also
    the FSDP2-sharded (DTensor) parameters of one block, for the optimizer probe (None
    without FSDP2 among ``modes``, the wrappers timed)."""
    from executors.model import Transformer
    from executors.parallel import apply_fsdp2, apply_tp

    s, world = spec.seq_len, mesh.size()
    tokens = torch.randint(0, spec.vocab, (1, s), device=device)
    labels = torch.randint(0, spec.vocab, (1, s), device=device)
    wraps = {"tp": lambda m: apply_tp(m, mesh, False), "tp_sp": lambda m: apply_tp(m, mesh, True),
             "fsdp_zero2": lambda m: apply_fsdp2(m, mesh, False), "fsdp_zero3": lambda m: apply_fsdp2(m, mesh, True)}

    def model(layers: int, wrap=None, end: str = ""):
        m = Transformer(probe_spec(layers=layers)).to(device)
        if end == "embed":
            m.norm = m.output = None
        elif end == "head":
            m.embed = None
        if wrap:
            wrap(m)
        return m

    steps = {}
    for n in WRAPPER_FIT_LAYERS:
        steps[f"model{n}"] = _model_step(model(n), tokens, labels)
        for mode in modes:
            steps[f"{mode}{n}"] = _model_step(model(n, wraps[mode]), tokens, labels)
    sharded = model(1, wraps["fsdp_zero3"]) if "fsdp_zero3" in modes else None
    steps["embed"] = _model_step(model(0, end="embed"), tokens)

    def hidden(t: int):   # the last layer's output, whose gradient the head's backward computes
        return torch.randn(1, t, spec.hidden, device=device, requires_grad=True)   # (B, T, H)

    steps["head"] = _model_step(model(0, end="head"), hidden(s), labels)
    for mode in (m for m in ("tp", "tp_sp") if m in modes):
        steps[f"{mode}_embed"] = _model_step(model(0, wraps[mode], "embed"), tokens)
        steps[f"{mode}_head"] = _model_step(model(0, wraps[mode], "head"), hidden(s // world if mode == "tp_sp" else s),
                                            labels)
    return steps, list(sharded.layers["0"].parameters()) if sharded else None


def _parallel_probe_rank(rank: int, world: int, device, reps: int, rounds: int = PARALLEL_PROBE_ROUNDS,
                         modes: tuple[str, ...] = WRAPPER_MODES) -> dict:
    """All ranks at once, in groups of two (pairs (0, 1), (2, 3) ... side by side where
    ``world`` is more than 2): the plain probe layer (the kernel unit) and the probe model at
    two depths plain and under the wrappers of ``modes`` (DTensor TP with and without SP,
    ``executors.parallel``'s plan; FSDP2, reshard after forward or not), with the model's
    ends for TP's split (``_wrapped_model_steps``), in ``rounds`` interleaved rounds (each
    the median of its steps), so that load from other processes, which comes and goes by the
    second, falls on plain and wrapped alike; AdamW over plain and DTensor (FSDP2-sharded)
    parameters where FSDP2 is timed; then the busy-rank point-to-point relay and stream of
    each pair, and on two ranks a pipeline stage's chunk and the lone collectives."""
    from torch.distributed.device_mesh import init_device_mesh

    from executors.model import Block

    torch.manual_seed(0)
    spec = probe_spec()
    if world == PROBE_GROUP:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("x",))
    else:
        mesh = init_device_mesh(device.type, (world // PROBE_GROUP, PROBE_GROUP), mesh_dim_names=("pairs", "x"))["x"]
    idle_gloo_transport()
    steps = {"plain": _layer_step(spec, device)}
    wrapped, dtensor_params = _wrapped_model_steps(spec, mesh, device, modes)
    steps.update(wrapped)
    per_round = max(2, reps // rounds)

    def timed(step, r: int) -> tuple[float, float]:
        if world > PROBE_GROUP:   # groups side by side start each variant together, as a run's ranks run
            dist.barrier()        # theirs (one group's own collectives keep its ranks together)
        return _median_step(step, per_round, warmup=3 if r == 0 else 1)

    out: dict = {"rounds": [{k: timed(st, r) for k, st in steps.items()} for r in range(rounds)]}
    for k in steps:
        out[k] = tuple(statistics.median(rd[k][i] for rd in out["rounds"]) for i in range(2))
    deep = WRAPPER_FIT_LAYERS[-1]
    out["recorded"] = _recorded_comm(rank, mesh, steps, [f"model{deep}", *(f"{m}{deep}" for m in modes)],
                                     COMM_SHARE_REPS)
    if dtensor_params:
        out["opt_dtensor"] = _optimizer_per_tensor_s(dtensor_params, reps)
        out["opt_plain"] = _optimizer_per_tensor_s(list(Block(spec).to(device).parameters()), reps)
    out.update(_handover_probes(rank, steps["plain"], spec))
    if world == PROBE_GROUP:
        out["pipeline_chunk"] = _pipeline_chunk(rank, world, device, spec, PIPELINE_PROBE_REPS)
        out["lone"] = _lone_collectives(steps["plain"], LONE_COLLECTIVE_REPS)
    dist.barrier()
    return out


def _round_extras(rows: list[dict], name: str, kf: int, kb: int, base: str = "plain") -> list[tuple[float, float]]:
    """Per interleaved round, the (forward, backward) extra kernels of ``name`` over ``base``
    (its unwrapped counterpart), in units of that round's plain layer's per-kernel time
    (ranks averaged)."""
    out = []
    for i in range(len(rows[0]["rounds"])):
        rds = [r["rounds"][i] for r in rows]
        plain, ref, var = ([statistics.mean(rd[k][j] for rd in rds) for j in range(2)] for k in ("plain", base, name))
        per_kernel = sum(plain) / (kf + kb)
        out.append(((var[0] - ref[0]) / per_kernel, (var[1] - ref[1]) / per_kernel))
    return out


def _median_kernels(per_round: list[tuple[float, float]]) -> tuple[float, float]:
    """The median over rounds of (forward, backward) kernels, a negative one (noise) as zero."""
    return tuple(max(0.0, statistics.median(x[j] for x in per_round)) for j in range(2))


def _round_kernels(rows: list[dict], name: str, kf: int, kb: int, base: str = "plain") -> tuple[float, float]:
    """Median over the interleaved rounds of (forward, backward) extra kernels of ``name``
    over ``base`` (``_round_extras``)."""
    return _median_kernels(_round_extras(rows, name, kf, kb, base))


def _depth_fit(rows: list[dict], mode: str, kf: int, kb: int,
               depths: tuple[int, int] = WRAPPER_FIT_LAYERS) -> tuple[tuple[float, float], tuple[float, float]]:
    """((forward, backward) kernels per layer, the same for the ends) of wrapper ``mode``:
    per round, its extra cost over the plain model at two depths, a line through them (the
    slope per layer, the intercept for the ends); the median over rounds of each."""
    lo, hi = depths
    at = [_round_extras(rows, f"{mode}{n}", kf, kb, f"model{n}") for n in depths]
    slope = [tuple((h[j] - l[j]) / (hi - lo) for j in range(2)) for l, h in zip(*at)]
    ends = [tuple(l[j] - lo * k[j] for j in range(2)) for l, k in zip(at[0], slope)]
    return _median_kernels(slope), _median_kernels(ends)


def parallel_host_kernels(rows: list[dict], kf: int, kb: int, modes: tuple[str, ...] = WRAPPER_MODES) -> dict:
    """Per wrapper of ``modes`` its kernels per layer (``_depth_fit``) and its ends':
    FSDP2's root group (``fsdp_zero2/3_root``), TP's embedding and head (``tp[_sp]_embed``,
    ``tp[_sp]_head``: the fitted ends split in the ratio of the embedding's and the head's
    own extra costs, each timed alone over its plain counterpart)."""
    out = {}
    for mode in modes:
        layer, ends = _depth_fit(rows, mode, kf, kb)
        out[mode] = {"forward_kernels": layer[0], "backward_kernels": layer[1]}
        if mode.startswith("fsdp"):
            out[f"{mode}_root"] = {"forward_kernels": ends[0], "backward_kernels": ends[1]}
            continue
        embed, head = (_round_kernels(rows, f"{mode}_{e}", kf, kb, e) for e in ("embed", "head"))
        share = [embed[j] / (embed[j] + head[j]) if embed[j] + head[j] > 0 else 0.5 for j in range(2)]
        out[f"{mode}_embed"] = {"forward_kernels": ends[0] * share[0], "backward_kernels": ends[1] * share[1]}
        out[f"{mode}_head"] = {"forward_kernels": ends[0] * (1 - share[0]), "backward_kernels": ends[1] * (1 - share[1])}
    return out


def comm_shares(rows: list[dict], modes: tuple[str, ...] = WRAPPER_MODES) -> dict:
    """Per wrapper of ``modes``, [forward, backward] share of its extra time over the
    plain model that the executor's recorder counts as exposed communication (the probe
    model at the deeper depth, ``_recorded_comm``, ranks averaged), each within [0, 1]; the
    rest is host compute (DTensor dispatch and redistribution, FSDP2's hooks and copies),
    which a run measures as compute. All communication (1) where no extra time was seen."""
    deep = WRAPPER_FIT_LAYERS[-1]
    out = {}
    for mode in modes:
        share = []
        for j in range(2):
            extra = statistics.mean(r["recorded"][f"{mode}{deep}"][j] - r["recorded"][f"model{deep}"][j] for r in rows)
            comm = statistics.mean(r["recorded"][f"{mode}{deep}"][2 + j] for r in rows)
            share.append(min(1.0, max(0.0, comm / extra)) if extra > 0 else 1.0)
        out[mode] = share
    return out


def _busy_rank_kernels(rows: list[dict], per_kernel: float) -> tuple[dict, dict]:
    """(raw seconds, kernel-unit figures) of the relay and stream probes (each pair of ranks'
    figures, averaged over the pairs), and of the lone collectives where they ran."""
    pairs = []
    for even, odd in zip(rows[::2], rows[1::2]):
        (wall, c0, s0, p0), (_, c1, s1, p1) = even["p2p"], odd["p2p"]
        per_message = max(0.0, (wall - c0 - c1) / (2 * P2P_PROBE_REPS))
        send = min(per_message, (s0 + s1) / (2 * P2P_PROBE_REPS))
        (_, sc0), (wall1, sc1) = even["stream"], odd["stream"]
        stream_delay = max(0.0, (wall1 - max(sc0, sc1)) / P2P_PROBE_REPS)
        post = min(stream_delay, (p0 + p1) / (2 * P2P_PROBE_REPS))   # the receive wait holds a post
        pairs.append((per_message, send, stream_delay, post))
    per_message, send, stream_delay, post = (statistics.mean(p[j] for p in pairs) for j in range(4))
    raw = {"p2p_per_message_s": per_message, "p2p_send_s": send, "p2p_stream_delay_s": stream_delay,
           "p2p_post_s": post}
    kernels = {"p2p_send_kernels": send / per_kernel, "p2p_latency_kernels": stream_delay / per_kernel,
               "p2p_wake_kernels": (per_message - send) / per_kernel, "p2p_post_kernels": post / per_kernel}
    if "lone" in rows[0]:   # the slower rank's call is the collective's time
        for op in ("all_reduce", "broadcast"):
            raw[f"lone_{op}_s"] = max(r["lone"][op] for r in rows)
            kernels[f"lone_{op}_kernels"] = raw[f"lone_{op}_s"] / per_kernel
    return raw, kernels


def _p2p_probe_rank(rank: int, world: int, device, reps: int) -> dict:
    """The plain probe layer on both ranks at once (the kernel unit), then the relay and the stream."""
    torch.manual_seed(0)
    spec = probe_spec()
    step = _layer_step(spec, device)
    out = {"plain": _median_step(step, reps)}
    out.update(_handover_probes(rank, step, spec))
    out["lone"] = _lone_collectives(step, LONE_COLLECTIVE_REPS)
    dist.barrier()
    return out


def bench_p2p(reps: int = 10) -> dict:
    """The pipeline point-to-point and lone-collective figures alone (two ranks, fork, gloo),
    for the quick refresh under load: ``kernels``, the kernel-unit ``p2p_*_kernels`` and
    ``lone_*_kernels`` of ``bench_parallel_host``, in units of ``per_kernel_s``, the plain
    probe layer's per-kernel time on the ``ranks`` ranks of the same launch."""
    from executors.procs import spawn

    rows = spawn(_p2p_probe_rank, 2, (reps,), timeout_s=120, start_method="fork")
    kf, kb = probe_kernels(probe_spec())
    per_kernel = statistics.mean(sum(r["plain"]) for r in rows) / (kf + kb)
    return {"kernels": _busy_rank_kernels(rows, per_kernel)[1], "per_kernel_s": per_kernel, "ranks": 2}


def bench_parallel_host(world: int = PROBE_GROUP, reps: int = PARALLEL_PROBE_REPS, rounds: int = PARALLEL_PROBE_ROUNDS,
                        modes: tuple[str, ...] = WRAPPER_MODES) -> dict:
    """The torch-parallel host cost on ``world`` ranks (fork, gloo; groups of two side by side
    where ``world`` is more than 2, so that their ranks share the cores), in units of the plain
    probe layer's per-kernel cost measured in the same launch (so that load from other
    processes cancels): extra kernels per layer forward and backward for the wrappers of
    ``modes``, DTensor TP, TP+SP and FSDP2 ZeRO-2/3 (their collectives' latency and dispatch
    included) and for the model's ends under each (TP's embedding and head, FSDP2's root group), from the probe
    model wrapped as the executor wraps it at two depths (``parallel_host_kernels``; the
    median over interleaved rounds); AdamW's cost per parameter tensor, plain and DTensor;
    the point-to-point figures between busy ranks; on two ranks a pipeline stage's chunk and
    the lone collectives. Ranks' medians are averaged."""
    from executors.procs import spawn

    if world < PROBE_GROUP or world % PROBE_GROUP:
        raise ValueError(f"world={world}: the parallel probe runs groups of {PROBE_GROUP} ranks")
    rows = spawn(_parallel_probe_rank, world, (reps, rounds, modes), timeout_s=240, start_method="fork")
    kf, kb = probe_kernels(probe_spec())
    keys = [k for k in rows[0] if k not in ("rounds", "p2p", "stream", "lone", "recorded")]
    avg = {k: tuple(statistics.mean(r[k][i] for r in rows) for i in range(2)) if isinstance(rows[0][k], tuple)
           else statistics.mean(r[k] for r in rows) for k in keys}
    per_kernel = sum(avg["plain"]) / (kf + kb)
    out = {"ranks": world, "per_kernel_s": per_kernel, "raw": {k: list(v) if isinstance(v, tuple) else v
                                                                for k, v in avg.items()}}
    out.update(parallel_host_kernels(rows, kf, kb, modes))
    out["comm_share"] = comm_shares(rows, modes)
    if "opt_plain" in avg:
        out["optimizer_per_tensor_kernels"] = avg["opt_plain"] / per_kernel
        out["optimizer_dtensor_per_tensor_kernels"] = avg["opt_dtensor"] / per_kernel
    raw, kernels = _busy_rank_kernels(rows, per_kernel)
    out["raw"].update(raw)
    out.update(kernels)
    if "pipeline_chunk" in avg:   # a stage's chunk over the plain layer, both ranks averaged
        out["pipeline_chunk"] = {"forward_kernels": max(0.0, (avg["pipeline_chunk"][0] - avg["plain"][0]) / per_kernel),
                                 "backward_kernels": max(0.0, (avg["pipeline_chunk"][1] - avg["plain"][1]) / per_kernel)}
    return out


def wrapper_kernels(parallel: dict, layer: dict) -> dict:
    """The torch-wrapper host costs of ``bench_parallel_host`` (TP, TP+SP, FSDP2, pipeline
    chunk, AdamW per tensor, where measured) converted from the probe's own per-kernel time
    on its ranks to the simulator's for that rank count (the one-rank figure over the
    executor-derived slowdown, 1 / (layer[n] x kernels)), so the seconds the probe measured
    come back; the factor is kept as ``parallel_unit_factor``."""
    kernels = sum(probe_kernels(probe_spec()))
    n = parallel["ranks"]
    unit = parallel["per_kernel_s"] * layer[n] * kernels if n in layer else 1.0
    out = {k: {name: v * unit for name, v in parallel[k].items()}
           for k in (*WRAPPER_MODES, *WRAPPER_ENDS, "pipeline_chunk") if k in parallel}
    for k in ("optimizer_per_tensor_kernels", "optimizer_dtensor_per_tensor_kernels"):
        if k in parallel:
            out[k] = parallel[k] * unit
    out["parallel_unit_factor"] = unit
    return out
