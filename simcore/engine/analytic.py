"""StepCosts -> StepResult by closed forms (``engine="analytic"``).

The analytic step, for the slowest pipeline rank with per-micro-batch time T = C + X
(compute C, blocking TP/CP/EP/PP communication X):
- 1F1B and GPipe: (m - 1) T_max + sum_r T_r, i.e. (m + p - 1) T for uniform stages
  (Narayanan et al. 2021, Sec. 2.2.1: bubble fraction (p - 1)/m);
- interleaved 1F1B: m T_max + (sum_r T_r - T_max) / v (Sec. 2.2.2: bubble (p - 1)/(m v));
- zero-bubble (ZB-H1, Qi et al. 2024, arXiv 2401.10241): bubble (p - 1)(T_F + T_B - T_W) / v;
- DualPipeV (DeepSeek-V3, arXiv 2412.19437 Table 2): bubble (p - 1)(F&B + B - 3W) in chunk times,
  F&B = F + B as torch runs a pair, floored where the weight gradients cannot fill it;
- data-parallel gradient reduction overlapped with the last micro-batch's backward up
  to the compute available (torch DDP buckets, Li et al. 2020, VLDB, Sec. 3.2.3), the
  last bucket always exposed; ZeRO-1 parameter all-gather after the step exposed;
  FSDP2 (ZeRO-2/3) per-layer all-gathers, as many as torch issues
  (``fsdp_calls.fsdp_stage_calls``), and, without pipelining, its per-micro-batch
  reduce-scatters hidden behind the layer's compute by prefetching, the excess exposed;
  pipelined, FSDP2 reduce-scatters once after the stage's last backward, as DDP reduces;
- offload: PCIe copies overlapped with the host optimizer step; the longer one counts
  (DeepSpeed's); FSDP2's copies run inside the forward and backward, so they add to it.
"""
from __future__ import annotations

from itertools import repeat
from operator import add, truediv

from simcore.model.costs import StepCosts
from simcore.model.dp_costs import fsdp2_offload
from simcore.model.overlap import lost_share
from simcore.model.schedules import Action, Op, fused_p2p
from simcore.plan.spec import Offload, Plan, Schedule
from simcore.results import GIB, StepResult, rate_fields


def _interference_loss(c: StepCosts) -> float:
    """Compute time lost per second of overlapped communication (``overlap.lost_share``)."""
    return lost_share(c.time_detail_s.get("comm_compute_interference", 1.0))


def _fused_posts(c: StepCosts, r: int) -> tuple[float, float]:
    """Per micro-batch on pipeline rank ``r`` (CPU host): the receive posts that go out with a
    send (``schedules.fused_p2p``), comm, and the receive wait they take off, idle."""
    par, m = c.plan.parallel, c.plan.num_microbatches
    if c.p2p_post_s <= 0 or par.pp == 1:
        return 0.0, 0.0
    posts = saved = 0.0
    for v in par.rank_stages(r):
        for op in (Op.F, Op.B):
            wait = c.host_p2p_s(v, op == Op.F)[1]
            for i in range(m):
                sent, posted = fused_p2p(par.schedule, par.pp, m, Action(v, op, i))
                posts += sent * c.p2p_post_s
                saved += posted * min(wait, c.p2p_post_s)
    return posts / m, saved / m


def _by_rank(x: tuple[float, ...], par) -> tuple[float, ...]:
    """Per pipeline rank, the sum of its virtual stages' values of ``x`` (read only)."""
    return x if len(x) == par.pp else par.by_rank(x)


def _host_p2p(c: StepCosts) -> bool:
    """Whether the costs carry a calibrated CPU host's blocking gloo send and receive terms."""
    return bool(c.forward_send_s or c.forward_recv_wait_s)


def _hops(c: StepCosts) -> list[float]:
    """Per pipeline rank and micro-batch, the exposed time of its activation and gradient
    sends (one each per virtual stage). 1F1B and GPipe wait for them (Megatron's
    ``batch_p2p_comm``: the send and the next receive in one blocking call). The interleaved
    schedule overlaps them: Megatron-Core posts the next chunk's receive and this chunk's send
    before computing (``overlap_p2p_comm``, the default with a virtual pipeline: Megatron-LM
    arguments.py ``--no-overlap-p2p-communication``; Megatron-Bridge comm_overlap.py sets it
    whenever vp > 1), and torch's interleaved schedules send with ``isend``; a hop is then
    exposed only by what the chunk it hides behind cannot cover. A calibrated CPU host keeps
    them whole (gloo's transfers are its blocking costs, ``StepCosts.host_p2p_s``). DualPipeV's
    paired forward sends its activation only after the pair's backward (``actions.Overlap``): the
    hand-offs around the V stay on the critical path, 2(p - 1)/p hops a micro-batch whatever the
    chunks' times (the event engine's walk of torch's order, tests/engine/test_dualpipe_engine.py)."""
    par = c.plan.parallel
    if par.pp == 1:
        return [0.0]
    if par.v_shape and not _host_p2p(c):
        return [2 * c.p2p_s * (par.pp - 1) / par.pp] * par.pp
    if par.vpp == 1 or _host_p2p(c):
        return [2 * c.p2p_s * (c.stages // par.pp)] * par.pp
    p2p = c.p2p_s   # each virtual stage's two hops, then a rank's (its stages r, r + p, ...)
    hops = [max(0.0, p2p - f) + max(0.0, p2p - bi - bw - rc)
            for f, bi, bw, rc in zip(c.forward_s, c.backward_input_s, c.backward_weight_s, c.recompute_s)]
    return [sum(hops[r::par.pp]) for r in range(par.pp)]


def _rank_sums(c: StepCosts) -> dict[str, list[float] | tuple[float, ...]]:
    """Per pipeline rank, per micro-batch (a list per part): compute, blocking comm (with FSDP
    exposure and PP sends), weight-gradient time, the CPU host's receive waits (idle), summed
    over the rank's virtual stages."""
    par = c.plan.parallel
    p = par.pp
    lost = _interference_loss(c)
    hops = _hops(c)
    host_p2p = _host_p2p(c)
    posted = c.p2p_post_s > 0 and p > 1
    fsdp = any(c.forward_gather_s) or any(c.backward_gather_s) or \
        (c.grad_reduce_per_microbatch and any(c.grad_reduce_per_step_s))
    fwd, bin_, bwt, rec = (_by_rank(x, par) for x in (c.forward_s, c.backward_input_s, c.backward_weight_s,
                                                    c.recompute_s))
    p2p, wait = list(hops), [0.0] * p
    for r in range(p) if host_p2p or posted else ():
        host = [c.host_p2p_s(v, f) for v in par.rank_stages(r) for f in (True, False)] if host_p2p else ()
        if host:
            p2p[r], wait[r] = hops[r] + sum(h[0] for h in host), sum(h[1] for h in host)
        if posted:
            posts, saved = _fused_posts(c, r)
            p2p[r], wait[r] = p2p[r] + posts, wait[r] - saved
    comm = list(map(add, map(add, _by_rank(c.forward_comm_s, par), _by_rank(c.backward_comm_s, par)), p2p))
    if fsdp:
        comm = list(map(add, comm, _by_rank(_fsdp_exposed(c, lost), par)))
    return dict(compute=list(map(add, map(add, map(add, fwd, bin_), bwt), rec)), comm=comm, w=bwt, fwd=fwd,
                bwd=list(map(add, bin_, bwt)), rec=rec, p2p=p2p, wait=wait)


def _fsdp_exposed(c: StepCosts, lost: float) -> list[float]:
    """FSDP2 per virtual stage and micro-batch: prefetched gathers hide behind the layer
    compute, the first one cannot; the hidden part slows the compute it hides behind."""
    m, out = c.plan.num_microbatches, []
    rs_all = [g / m for g in c.grad_reduce_per_step_s] if c.grad_reduce_per_microbatch else repeat(0.0)
    for fg, bg, rs, f, bi, bw, rec, layers in zip(c.forward_gather_s, c.backward_gather_s, rs_all, c.forward_s,
                                                   c.backward_input_s, c.backward_weight_s, c.recompute_s, c.layers):
        comm = 0.0
        if fg + bg + rs > 0:   # max(0, x) and min(x, y) written out: a pipeline has hundreds of stages
            bwd, back = bi + bw + rec, bg + rs   # the backward (``StepCosts.backward_s``) and its recompute
            comm = (fg - f if fg > f else 0.0) + (back - bwd if back > bwd else 0.0) \
                + fg / (layers if layers > 1 else 1)
            comm += lost * ((fg if fg < f else f) + (back if back < bwd else bwd))
        out.append(comm)
    return out


def _pipeline_s(c: StepCosts, t: list[float], ranks: dict, crit: int) -> float:
    """Forward/backward span of all micro-batches on the critical rank, bubble included
    (``t``: each rank's time per micro-batch, ``ranks``: their parts, ``_rank_sums``)."""
    par = c.plan.parallel
    m, p, v = c.plan.num_microbatches, par.pp, par.vpp
    tmax, w_crit = t[crit], ranks["w"][crit]
    if p == 1:
        return m * tmax
    if par.schedule == Schedule.DUALPIPE_V:
        return m * tmax + _dualpipe_bubble(t, ranks, crit)
    if par.schedule == Schedule.ZERO_BUBBLE:   # ZB-H1: the weight gradients fill the bubble
        return m * tmax + (p - 1) * max(0.0, tmax - w_crit) / v
    return _span(t, m, v)


def _span(t, m: int, v: int) -> float:
    """1F1B and GPipe's span, (m - 1) T_max + sum_r T_r, or the interleaved schedule's,
    m T_max + (sum_r T_r - T_max) / v (module docstring), of the ranks' times ``t``."""
    tmax = max(t)
    return m * tmax + (sum(t) - tmax) / v if v > 1 else (m - 1) * tmax + sum(t)


def _dualpipe_bubble(t: list[float], ranks: dict, crit: int) -> float:
    """DualPipeV's bubble, in chunk times (a chunk: half a rank's per micro-batch time ``t[r]``):
    the DualPipe paper's (p - 1)(F&B + B - 3W) (arXiv 2412.19437 Table 2; the DualPipe README's
    (PP/2 - 1)(F&B + B - 3W), PP = 2p stages), F&B the paired forward and backward as torch runs
    them, one after the other (F + B; B = I + W, so F + 2I - W). The weight gradients fill the
    bubble only as far as there are input gradients to pair them with: where W > I or F > I the
    walk of torch's order floors it at 2F + (I - W)+ and F + I a rank, and where I > F the first
    forward's wait is min(F, (p - 1)(I - F)) shorter (the event engine's answer on uniform stages,
    tests/engine/test_dualpipe_engine.py). Each rank but the critical one adds its own term, as the
    interleaved form sums the others' times. F is the forward's share of a chunk's time less W
    (its communication shared alike)."""
    def chunk(r: int) -> tuple[float, float, float]:
        x, w = t[r] / 2, ranks["w"][r] / 2
        busy = ranks["compute"][r] - ranks["w"][r]
        f = (x - w) * (ranks["fwd"][r] / busy if busy > 0 else 0.5)
        return f, x - w - f, w

    per_rank = [max(f + 2 * i - w, 2 * f + max(0.0, i - w), f + i) for f, i, w in map(chunk, range(len(t)))]
    f, i, _ = chunk(crit)
    return sum(per_rank) - per_rank[crit] - min(f, (len(t) - 1) * max(0.0, i - f))


def _reduce_tail(grad: float, buckets: int, window: float) -> float:
    """A gradient reduction of ``grad`` seconds in ``buckets`` buckets issued during a
    backward of ``window`` seconds: what is left after it, the last bucket at least."""
    return max(grad / max(1, buckets), grad - window) if grad > 0 else 0.0


def _reduce_tail_s(c: StepCosts, v: int) -> float:
    """Virtual stage ``v``'s gradient reduction left after its last backward."""
    return _reduce_tail(c.grad_reduce_per_step_s[v], c.grad_buckets[v], c.backward_s(v) + c.recompute_s[v])


def _held_sends_s(c: StepCosts) -> float:
    """The drain's wait where every stage's gradient sync holds its last input-gradient send
    (``StepCosts.grad_sync_holds_send``): the last micro-batch's backward passes the virtual
    stages from last to first, each after the previous one's reduction tail. Zero-bubble
    reduces in its weight-gradient pass, which sends nothing; DualPipeV's data parallel is
    ``replicate`` (``executors.support.uses_replicate``), whose REDUCE_GRAD follows the send."""
    if not c.grad_sync_holds_send or c.plan.parallel.schedule in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V):
        return 0.0
    return sum(_reduce_tail_s(c, v) for v in range(1, c.stages))


def step_floor(plan: Plan, kept: dict | None = None) -> float:
    """A lower bound on ``analytic(step_costs(plan))``'s step: each rank's stages' compute and
    blocking communication (``step_costs.stage_work``), in the pipeline span ``_pipeline_s``
    gives them for 1F1B, GPipe and the interleaved schedule (``_span``, non-decreasing in every
    rank's time), m times the slowest rank for zero-bubble and DualPipeV (their bubbles read the
    weight gradients' share, and are >= 0); the step adds hops, exposure, DP tails, the
    optimizer and offload, none negative. 0 where ``stage_work`` has none (a calibrated CPU
    host). More recompute and any offload only add: a family's floor at its lightest setting
    bounds every row of it (the layout search skips families whose floor is far off the best,
    ``simcore.planner.evaluate.evaluate_family``)."""
    from simcore.model.step_costs import stage_work

    work = stage_work(plan, kept)
    if work is None:
        return 0.0
    par, m = plan.parallel, plan.num_microbatches
    t = _by_rank(work, par)
    if par.pp == 1 or par.schedule in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V):
        return m * max(t)
    return _span(t, m, par.vpp)


def analytic(c: StepCosts) -> StepResult:
    """The closed-form step (module docstring) from a StepCosts."""
    plan = c.plan
    par, tr = plan.parallel, plan.training
    m = plan.num_microbatches
    ranks = _rank_sums(c)
    t = list(map(add, map(add, ranks["compute"], ranks["comm"]), ranks["wait"]))
    crit = t.index(max(t))
    o = {k: col[crit] for k, col in ranks.items()}
    pipe = _pipeline_s(c, t, ranks, crit) + _held_sends_s(c)
    mine = par.rank_stages(crit)                   # the critical rank's virtual stages
    grad = sum(c.grad_reduce_per_step_s[v] for v in mine)
    if c.grad_reduce_per_microbatch:               # FSDP2's reduce-scatters: per layer, in _rank_sums
        grad = 0.0
    sync = sum(c.param_sync_per_step_s[v] for v in mine)
    opt = sum(c.optimizer_per_step_s[v] for v in mine)
    copies = sum(c.offload_per_step_s[v] for v in mine)
    buckets = max(c.grad_buckets[v] for v in mine)
    window = o["bwd"] + o["rec"]                   # the last micro-batch's backward
    dp_exposed = _reduce_tail(grad, buckets, window)
    dp_exposed += _interference_loss(c) * (grad - dp_exposed)   # the hidden part slows the backward
    offloaded = tr.offload != Offload.NONE
    offload_s = (opt + copies if fsdp2_offload(c.plan) else max(opt, copies)) if offloaded else 0.0
    offload_s += m * sum(sum(c.copies_s(v)) for v in mine)   # activation offload's waits
    compute_s = m * o["compute"] + (0.0 if offloaded else opt)
    exposed = m * o["comm"] + dp_exposed + sync
    bubble = max(0.0, pipe - m * (o["compute"] + o["comm"]))
    step = compute_s + exposed + bubble + offload_s
    per_rank = c.memory_per_rank_bytes
    fits = max(per_rank) <= plan.cluster.node.gpu.hbm_bytes and \
        c.time_detail_s.get("host_memory_per_node_bytes", 0.0) <= plan.cluster.node.host_memory_bytes
    time_s = {"forward": m * o["fwd"], "backward": m * o["bwd"], "recompute": m * o["rec"],
              "layer_comm": m * (o["comm"] - o["p2p"]), "pp_comm": m * o["p2p"], "dp_comm": dp_exposed,
              **({"pp_wait": m * o["wait"]} if o["wait"] else {}), "param_sync": sync, "optimizer": opt, "offload": offload_s, "bubble": bubble}
    return StepResult(
        source="analytic", plan_name=plan.name, step_time_s=step,
        **rate_fields(plan, step, c.model_flops_per_step, c.hardware_flops_per_step),
        compute_s=compute_s, exposed_comm_s=exposed,
        bubble_s=bubble, offload_s=offload_s, memory_per_gpu_gib=max(per_rank) / GIB, fits=fits,
        memory_bytes=dict(c.memory_bytes), time_s=time_s,
        memory_per_rank_gib=tuple(map(truediv, per_rank, repeat(GIB))), notes=c.notes,
    )
