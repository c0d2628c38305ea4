"""The torch-wrapper probes of the parallel probe (``executors.calibrate.parallel_probes``):
what each rank builds and times (the probe model at two depths, plain and wrapped as
``executors.parallel`` wraps it, DTensor TP with and without SP and FSDP2, with the model's
ends; the exposed communication the executor's recorder sees in each), and the fits of the
ranks' timings to host costs in units of the plain probe layer's per-kernel time (extra
kernels per layer and for the ends, communication shares), with their conversion to the
simulator's unit (``wrapper_kernels``).
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.distributed as dist

from executors.calibrate.probes import probe_kernels, probe_spec


#: The wrappers the parallel probe times on whole models (``_wrapped_model_steps``); ``cp``
#: is the executor's ring attention (``executors.ring_attention``), timed on a rank's share
#: of the sequence against the plain model on as many tokens (``half{L}``): what the ring's
#: blocks, merges and gloo exchanges add to a layer beyond the attention of those tokens.
WRAPPER_MODES = ("tp", "tp_sp", "fsdp_zero2", "fsdp_zero3", "cp", "moe", "ep")
#: The plain model each wrapper's extra cost is taken over (``_depth_fit``): ``moe`` is the
#: probe model with MoE layers (``PROBE_MOE``, the executor's routing, capacity buffers and
#: per-expert loop) over the dense one; ``ep`` the same MoE model with its experts sharded
#: over the pair (``executors.moe.apply_ep``: all-to-all dispatch and combine) over ``moe``.
WRAPPER_BASE = {"cp": "half", "ep": "moe"}
#: Ranks per wrapped group of the parallel probe (the local matrix's tp2 and dp2); a probe on
#: more ranks runs several such groups side by side.
PROBE_GROUP = 2
#: The MoE layer of the ``moe`` and ``ep`` probes (the local matrix's ep2-dp2 model).
PROBE_MOE = dict(experts=4, top_k=2)
#: Wrappers whose model has no ends of their own (the fitted intercept is noise).
LAYER_ONLY = ("cp", "moe", "ep")
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


def _model_step(m, x, labels=None):
    """(fwd_s, bwd_s) closure of one micro-batch through a probe model or one of its ends:
    the loss on ``labels`` where it ends in the output projection, else the output's sum.
    Given an ``executors.record.Recorder`` the two phases are drawn on its compute stream,
    as the executor draws a step's."""
    from executors.model import loss_context, loss_fn

    def run(rec=None) -> tuple[float, float]:
        t0 = time.perf_counter()
        with rec.span("forward", "forward") if rec else contextlib.nullcontext():
            y = m(x)
            with loss_context(y):
                loss = loss_fn(y, labels) if labels is not None else y.sum()
        t1 = time.perf_counter()
        with rec.span("backward", "backward") if rec else contextlib.nullcontext(), loss_context(y):
            loss.backward()
        return t1 - t0, time.perf_counter() - t1
    return run


def _recorded_comm(rank: int, mesh, steps: dict, names: list[str], reps: int) -> dict:
    """Per step closure of ``names``: the median over ``reps`` recorded steps of (forward,
    backward) seconds and the exposed communication in each, as the executor's recorder
    sees them (``executors.record``: collectives timed from call to completion, a blocking
    one cut out of the compute spans; ``simcore.results.split_step``). Apart from the timed
    rounds, since recording costs host time of its own."""
    from executors import record
    from simcore.results import split_step

    rec = record.Recorder(rank=rank)
    group = frozenset(dist.get_process_group_ranks(mesh.get_group()))
    out: dict = {}
    with record.record_collectives(rec):
        for name in names:   # the probe mesh's one axis stands for the executor's tp or dp axis
            rec.axis_of = {group: next((a for a in ("tp", "cp", "ep") if name.startswith(a)), "dp")}
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
    from executors.moe import apply_ep
    from executors.ring_attention import apply_cp

    s, world = spec.seq_len, mesh.size()
    tokens = torch.randint(0, spec.vocab, (1, s), device=device)
    labels = torch.randint(0, spec.vocab, (1, s), device=device)
    wraps = {"tp": lambda m: apply_tp(m, mesh, False), "tp_sp": lambda m: apply_tp(m, mesh, True),
             "fsdp_zero2": lambda m: apply_fsdp2(m, mesh, False), "fsdp_zero3": lambda m: apply_fsdp2(m, mesh, True)}

    def model(layers: int, wrap=None, end: str = "", moe: bool = False):
        m = Transformer(probe_spec(layers=layers, **(PROBE_MOE if moe else {}))).to(device)
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
        for mode in (m for m in modes if m not in LAYER_ONLY):
            steps[f"{mode}{n}"] = _model_step(model(n, wraps[mode]), tokens, labels)
        if "moe" in modes or "ep" in modes:   # MoE layers plain, and their experts over the pair
            steps[f"moe{n}"] = _model_step(model(n, moe=True), tokens, labels)
        if "ep" in modes:
            steps[f"ep{n}"] = _model_step(model(n, lambda m: apply_ep(m, mesh.get_group()), moe=True), tokens, labels)
        if "cp" in modes:   # a rank's share of the sequence, ring attention against plain
            ring = model(n)
            pos = apply_cp(ring, mesh, s)
            steps[f"cp{n}"] = _model_step(ring, tokens[:, pos], labels[:, pos])
            steps[f"half{n}"] = _model_step(model(n), tokens[:, :len(pos)], labels[:, :len(pos)])
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


def _modelled_moe_kernels() -> tuple[int, int]:
    """(forward, backward) kernels the model counts for the probe's MoE layer over its dense
    one (router, top-k, permutations, one GEMM per expert: ``workload.mlp_ops``)."""
    moe, dense = probe_kernels(probe_spec(**PROBE_MOE)), probe_kernels(probe_spec())
    return moe[0] - dense[0], moe[1] - dense[1]


def _modelled_ep_kernels() -> tuple[int, int]:
    """The same for the MoE layer with its experts over the probe pair (fewer local experts:
    negative)."""
    ep, moe = probe_kernels(probe_spec(**PROBE_MOE), ep=PROBE_GROUP), probe_kernels(probe_spec(**PROBE_MOE))
    return ep[0] - moe[0], ep[1] - moe[1]


#: The kernels the model counts itself for a wrapper, taken off its measured extra: the
#: probes' time unit is the plain layer's per-kernel time, so a modelled op counts as one.
MODELLED_KERNELS = {"moe": _modelled_moe_kernels, "ep": _modelled_ep_kernels}


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
    base = WRAPPER_BASE.get(mode, "model")
    at = [_round_extras(rows, f"{mode}{n}", kf, kb, f"{base}{n}") for n in depths]
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
        if mode in MODELLED_KERNELS:   # what the model already counts of the MoE layer as ops
            mf, mb = MODELLED_KERNELS[mode]()
            out[mode] = {"forward_kernels": max(0.0, layer[0] - mf), "backward_kernels": max(0.0, layer[1] - mb)}
        if mode in LAYER_ONLY:   # the ends hold no attention and no experts
            continue
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
            base = f"{WRAPPER_BASE.get(mode, 'model')}{deep}"
            extra = statistics.mean(r["recorded"][f"{mode}{deep}"][j] - r["recorded"][base][j] for r in rows)
            comm = statistics.mean(r["recorded"][f"{mode}{deep}"][2 + j] for r in rows)
            share.append(min(1.0, max(0.0, comm / extra)) if extra > 0 else 1.0)
        out[mode] = share
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
