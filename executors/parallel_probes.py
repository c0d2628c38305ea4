"""The host cost of torch's parallel machinery on a CPU host, measured on two ranks at once
(fork, gloo) in units of the plain probe layer's per-kernel time of the same launch, so that
load from other processes falls on plain and wrapped alike: DTensor TP (with and without
SP), FSDP2 (ZeRO-2/3), the model's ends under each, a ``PipelineStage`` chunk's bookkeeping,
AdamW over plain and DTensor parameters, the point-to-point hand-over between busy ranks as
a pipeline runs it, and a lone all-reduce and broadcast issued right after compute, as DDP
and ZeroRedundancyOptimizer issue theirs.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from executors.probes import (_layer_step, _median_step, _optimizer_per_tensor_s, _wrapped_layer_step, probe_kernels,
                              probe_spec)


#: Layer steps per probe variant of the parallel probe (median kept; a modelling choice).
PARALLEL_PROBE_REPS = 20
#: Interleaved rounds of the parallel probe's layer variants (median of the per-round ratios;
#: with 5 the TP figure moved 95-174 kernels between calibrations on the shared 2-core host).
PARALLEL_PROBE_ROUNDS = 9
#: Round trips of the busy-rank point-to-point relay (``_busy_p2p``).
P2P_PROBE_REPS = 60
#: Calls of each lone collective (``_lone_collectives``) and their size: one latency-bound
#: message (the bytes term comes from the back-to-back fits).
LONE_COLLECTIVE_REPS = 20
LONE_COLLECTIVE_BYTES = 4 * 1024
#: Schedule steps and micro-batches of the pipeline-chunk probe (``_pipeline_chunk``).
PIPELINE_PROBE_REPS = 8
PIPELINE_PROBE_MICROBATCHES = 4


def _busy_p2p(rank: int, step, reps: int, shape: tuple[int, ...]) -> tuple[float, float, float]:
    """A two-rank relay as a pipeline runs it: rank 0 computes (the probe layer's forward and
    backward), sends its activation to rank 1, which was blocked in its receive, computes and
    sends back. Returns (wall time of the relay on this rank, this rank's compute in it, the
    time this rank spent in its sends)."""
    buf = torch.zeros(shape)
    peer = 1 - rank
    compute = send = 0.0
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        if rank == 1:
            dist.irecv(buf, src=peer).wait()
        c = time.perf_counter()
        step()
        d = time.perf_counter()
        dist.isend(buf, dst=peer).wait()
        compute, send = compute + d - c, send + time.perf_counter() - d
        if rank == 0:
            dist.irecv(buf, src=peer).wait()
    return time.perf_counter() - t0, compute, send


def _busy_stream(rank: int, step, reps: int, shape: tuple[int, ...]) -> tuple[float, float]:
    """Two busy ranks in a stream, as GPipe's forward phase runs them: rank 0 computes and
    posts an asynchronous send it does not wait for (gloo's thread must deliver it while both
    ranks compute), rank 1 waits for each message, then computes. Returns (wall time, compute)
    of this rank; rank 1's period less the slower rank's compute is the delivery delay."""
    bufs = [torch.zeros(shape) for _ in range(reps)]
    peer = 1 - rank
    compute, works = 0.0, []
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(reps):
        if rank == 1:
            dist.irecv(bufs[i], src=peer).wait()
        c = time.perf_counter()
        step()
        compute += time.perf_counter() - c
        if rank == 0:
            works.append(dist.isend(bufs[i], dst=peer))
    wall = time.perf_counter() - t0
    for w in works:
        w.wait()
    return wall, compute


def _handover_probes(rank: int, step, spec) -> dict:
    """The relay and the stream of ranks 0 and 1, busy with ``step`` (the plain probe layer)
    between messages of one micro-batch's activations."""
    shape = (1, spec.seq_len, spec.hidden)
    return {"p2p": _busy_p2p(rank, step, P2P_PROBE_REPS, shape), "stream": _busy_stream(rank, step, P2P_PROBE_REPS, shape)}


def _lone_collectives(step, reps: int, nbytes: int = LONE_COLLECTIVE_BYTES) -> dict:
    """Median seconds of a lone all-reduce and a lone broadcast of ``nbytes`` (latency-bound),
    each issued right after this rank ran ``step`` (the plain probe layer), as DDP issues its
    gradient all-reduce at the end of a backward and ZeroRedundancyOptimizer its broadcasts
    after the optimizer step. The collectives probe (``executors.collective_probes``) times
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


def _ends_steps(spec, mesh, device) -> dict:
    """Step closures of the probe model's ends (``executors.model.Transformer`` with no
    layers), plain and wrapped as ``executors.parallel`` wraps a whole model: the embedding
    alone and the head alone (final norm, output projection and loss) under DTensor TP, with
    and without SP (each end holds its own TP collectives), and both ends together as FSDP2's
    root group (``fully_shard`` of the model, one gather and reduce-scatter for all of them).
    Keys: embed, head, tp_embed, tp_head, tp_sp_embed, tp_sp_head, ends, fsdp_zero2_root,
    fsdp_zero3_root."""
    from torch.distributed.fsdp import fully_shard

    from executors.model import Transformer, loss_fn
    from executors.parallel import apply_tp

    s, h, world = spec.seq_len, spec.hidden, mesh.size()
    ends = probe_spec(layers=0)
    tokens = torch.randint(0, spec.vocab, (1, s), device=device)
    labels = torch.randint(0, spec.vocab, (1, s), device=device)

    def model(part: str, wrap=None):
        m = Transformer(ends).to(device)
        if part == "embed":
            m.norm = m.output = None
        elif part == "head":
            m.embed = None
        if wrap:
            wrap(m)
        return m

    def step(m, x, head: bool):
        def run() -> tuple[float, float]:
            t0 = time.perf_counter()
            y = m(x)
            loss = loss_fn(y, labels) if head else y.sum()
            t1 = time.perf_counter()
            loss.backward()
            return t1 - t0, time.perf_counter() - t1
        return run

    def hidden(sharded: bool):
        return torch.randn(1, s // world if sharded else s, h, device=device, requires_grad=True)

    out = {"embed": step(model("embed"), tokens, False), "head": step(model("head"), hidden(False), True),
           "ends": step(model("ends"), tokens, True)}
    for name, sp in (("tp", False), ("tp_sp", True)):
        out[f"{name}_embed"] = step(model("embed", lambda m: apply_tp(m, mesh, sp)), tokens, False)
        out[f"{name}_head"] = step(model("head", lambda m: apply_tp(m, mesh, sp)), hidden(sp), True)
    for name, reshard in (("fsdp_zero2_root", False), ("fsdp_zero3_root", True)):
        out[name] = step(model("ends", lambda m: fully_shard(m, mesh=mesh, reshard_after_forward=reshard)),
                         tokens, True)
    return out


#: Wrapped end of the probe model -> its plain counterpart (``_ends_steps``).
ENDS_BASE = {"tp_embed": "embed", "tp_head": "head", "tp_sp_embed": "embed", "tp_sp_head": "head",
             "fsdp_zero2_root": "ends", "fsdp_zero3_root": "ends"}


def _parallel_probe_rank(rank: int, world: int, device, reps: int, rounds: int = PARALLEL_PROBE_ROUNDS) -> dict:
    """Both ranks at once: the probe layer plain, under DTensor TP (with and without SP,
    ``executors.parallel``'s plan) and under FSDP2 (reshard after forward or not), and
    AdamW over plain and DTensor (FSDP2-sharded) parameters. The layer variants run in
    ``rounds`` interleaved rounds (each the median of its steps), so that load from other
    processes, which comes and goes by the second, falls on plain and wrapped alike, and so
    do the model's ends (``_ends_steps``); then the busy-rank point-to-point relay and stream
    between ranks 0 and 1, and on two ranks a pipeline stage's chunk and the lone collectives."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from executors.model import Block
    from executors.parallel import _block_tp_plan

    torch.manual_seed(0)
    spec = probe_spec()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("x",))
    s, h = spec.seq_len, spec.hidden
    steps = {"plain": _layer_step(spec, device)}
    for name, sp in (("tp", False), ("tp_sp", True)):
        block = Block(spec).to(device)
        parallelize_module(block, mesh, _block_tp_plan(block, sp))
        x = torch.randn(1, s // world if sp else s, h, device=device, requires_grad=True)  # (B, T[/t], H)
        steps[name] = _wrapped_layer_step(block, x)
    dtensor_params = []
    for name, reshard in (("fsdp_zero2", False), ("fsdp_zero3", True)):
        block = Block(spec).to(device)
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        x = torch.randn(1, s, h, device=device, requires_grad=True)
        steps[name] = _wrapped_layer_step(block, x)
        if reshard:
            dtensor_params = list(block.parameters())
    steps.update(_ends_steps(spec, mesh, device))
    per_round = max(2, reps // rounds)
    out: dict = {"rounds": [{k: _median_step(st, per_round, warmup=3 if r == 0 else 1) for k, st in steps.items()}
                            for r in range(rounds)]}
    for k in steps:
        out[k] = tuple(statistics.median(rd[k][i] for rd in out["rounds"]) for i in range(2))
    out["opt_dtensor"] = _optimizer_per_tensor_s(dtensor_params, reps)
    out["opt_plain"] = _optimizer_per_tensor_s(list(Block(spec).to(device).parameters()), reps)
    if rank < 2:
        out.update(_handover_probes(rank, steps["plain"], spec))
    if world == 2:
        out["pipeline_chunk"] = _pipeline_chunk(rank, world, device, spec, PIPELINE_PROBE_REPS)
        out["lone"] = _lone_collectives(steps["plain"], LONE_COLLECTIVE_REPS)
    dist.barrier()
    return out


def _round_kernels(rows: list[dict], name: str, kf: int, kb: int, base: str = "plain") -> tuple[float, float]:
    """Median over the interleaved rounds of (forward, backward) extra kernels of ``name``
    over ``base`` (its unwrapped counterpart), each round in units of its own plain layer's
    per-kernel time (ranks averaged)."""
    fwd, bwd = [], []
    for i in range(len(rows[0]["rounds"])):
        rds = [r["rounds"][i] for r in rows]
        plain = [statistics.mean(rd["plain"][j] for rd in rds) for j in range(2)]
        ref = [statistics.mean(rd[base][j] for rd in rds) for j in range(2)]
        var = [statistics.mean(rd[name][j] for rd in rds) for j in range(2)]
        per_kernel = sum(plain) / (kf + kb)
        fwd.append((var[0] - ref[0]) / per_kernel)
        bwd.append((var[1] - ref[1]) / per_kernel)
    return max(0.0, statistics.median(fwd)), max(0.0, statistics.median(bwd))


def _busy_rank_kernels(rows: list[dict], per_kernel: float) -> tuple[dict, dict]:
    """(raw seconds, kernel-unit figures) of the relay and stream probes of ranks 0 and 1,
    and of the lone collectives where they ran."""
    (wall, c0, s0), (_, c1, s1) = rows[0]["p2p"], rows[1]["p2p"]
    per_message = max(0.0, (wall - c0 - c1) / (2 * P2P_PROBE_REPS))
    send = min(per_message, (s0 + s1) / (2 * P2P_PROBE_REPS))
    (_, sc0), (wall1, sc1) = rows[0]["stream"], rows[1]["stream"]
    stream_delay = max(0.0, (wall1 - max(sc0, sc1)) / P2P_PROBE_REPS)
    raw = {"p2p_per_message_s": per_message, "p2p_send_s": send, "p2p_stream_delay_s": stream_delay}
    kernels = {"p2p_send_kernels": send / per_kernel, "p2p_latency_kernels": stream_delay / per_kernel,
               "p2p_wake_kernels": (per_message - send) / per_kernel}
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
    """The pipeline point-to-point and lone-collective figures alone (two ranks, fork, gloo):
    the kernel-unit ``p2p_*_kernels`` and ``lone_*_kernels`` of ``bench_parallel_host``, for
    the quick refresh under load."""
    from executors.launch import spawn

    rows = spawn(_p2p_probe_rank, 2, (reps,), timeout_s=120, start_method="fork")
    kf, kb = probe_kernels(probe_spec())
    per_kernel = statistics.mean(sum(r["plain"]) for r in rows) / (kf + kb)
    return _busy_rank_kernels(rows, per_kernel)[1]


def bench_parallel_host(world: int = 2, reps: int = PARALLEL_PROBE_REPS, rounds: int = PARALLEL_PROBE_ROUNDS) -> dict:
    """The torch-parallel host cost on ``world`` ranks (fork, gloo), in units of the plain
    probe layer's per-kernel cost measured in the same launch (so that load from other
    processes cancels): extra kernels per layer forward and backward for DTensor TP, TP+SP,
    FSDP2 ZeRO-2/3 (their collectives' latency and dispatch included; the median over
    interleaved rounds), the same for the model's ends (``_ends_steps``: TP's embedding and
    head, FSDP2's root group, each over its plain counterpart; on the 4-layer validation
    model they add 12-22% to the layers' wrapper cost), AdamW's cost per parameter tensor, plain and DTensor, and the
    point-to-point latency between busy ranks (the relay's wall time less both ranks'
    compute, per message). Ranks' medians are averaged."""
    from executors.launch import spawn

    rows = spawn(_parallel_probe_rank, world, (reps, rounds), timeout_s=240, start_method="fork")
    kf, kb = probe_kernels(probe_spec())
    keys = [k for k in rows[0] if k not in ("rounds", "p2p", "stream", "lone")]
    avg = {k: tuple(statistics.mean(r[k][i] for r in rows) for i in range(2)) if isinstance(rows[0][k], tuple)
           else statistics.mean(r[k] for r in rows) for k in keys}
    per_kernel = sum(avg["plain"]) / (kf + kb)
    out = {"ranks": world, "per_kernel_s": per_kernel, "raw": {k: list(v) if isinstance(v, tuple) else v
                                                                for k, v in avg.items()}}
    for name, base in (*((n, "plain") for n in ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3")), *ENDS_BASE.items()):
        f, b = _round_kernels(rows, name, kf, kb, base)
        out[name] = {"forward_kernels": f, "backward_kernels": b}
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
    chunk, AdamW per tensor) converted from the probe's own per-kernel time on its ranks to
    the simulator's for that rank count (the one-rank figure over the executor-derived
    slowdown, 1 / (layer[n] x kernels)), so the seconds the probe measured come back;
    the factor is kept as ``parallel_unit_factor``."""
    kernels = sum(probe_kernels(probe_spec()))
    n = parallel["ranks"]
    unit = parallel["per_kernel_s"] * layer[n] * kernels if n in layer else 1.0
    out = {k: {name: v * unit for name, v in parallel[k].items()}
           for k in ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3", "pipeline_chunk", *ENDS_BASE) if k in parallel}
    out["optimizer_per_tensor_kernels"] = parallel["optimizer_per_tensor_kernels"] * unit
    out["optimizer_dtensor_per_tensor_kernels"] = parallel["optimizer_dtensor_per_tensor_kernels"] * unit
    out["parallel_unit_factor"] = unit
    return out
