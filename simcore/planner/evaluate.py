"""Evaluating layout families: the rules, the memory and dominance pruning, the analytic ranking.

``evaluate_family`` turns one layout family (``simcore.planner.space.families``) into at
most one row of the search's table: ``check_plan`` rejects what breaks a rule,
``memory_table`` / ``fits_memory`` what does not fit, dominance what needs more recompute
or offload than it must, the search's bound a family whose step floor is far off the best
(``simcore.planner.bound``); the survivor is timed by the analytic path. ``Tally``
(``simcore.planner.tally``) counts what happened to the candidates; ``_evaluate_chunk`` is
the worker of one batch of families (one process of a parallel search).
"""
from __future__ import annotations

import gc
from dataclasses import replace

from simcore.model import activations
from simcore.model import memory as mem
from simcore.model import peak as pk
from simcore.plan.spec import Offload, Plan, Recompute, RecomputeMethod, Schedule, evolve
from simcore.planner.headroom import FITS, fit_class, memory_margin
from simcore.planner.space import Layout, SearchSpace
from simcore.planner.tally import Tally, rejected
from simcore.planner.uncertainty import interval_key


# --------------------------------------------------------------------------- pruning

def _peak_ranks(plan: Plan, params: tuple) -> list[int]:
    """Pipeline ranks that can hold the most bytes: the first (embedding, most micro-batches
    in flight), the last (logits, output layer), and each that holds more layers, or more
    parameters (``params``: ``stage_params``; an MoE model's first, dense, layers hold fewer), than
    every earlier rank: a rank with no more of either than an earlier one keeps fewer micro-batches."""
    pp, stages = plan.parallel.pp, plan.layers_per_stage
    if plan.parallel.schedule in (Schedule.ZERO_BUBBLE, Schedule.DUALPIPE_V):   # owed weight gradients peak mid-pipeline
        return list(range(pp))
    layers = [sum(stages[v] for v in range(r, len(stages), pp)) for r in range(pp)]
    out = {0, pp - 1}
    for values in (layers, [sp.total for sp in params]):
        top = values[0]
        for r, v in enumerate(values):
            if v > top:
                out.add(r)
                top = v
    return sorted(out)


def _activation_key(plan: Plan, overlap: float) -> tuple:
    """What a rank's activation bytes depend on (``memory.activation_bytes``): not the offload
    or the recompute (a key of its own), and the ZeRO stage only through ``overlap``, the
    loss's room in FSDP2 ZeRO-3's buffers (``memory.loss_overlap``), so layouts share them.
    Within one search every plan holds the base plan's model object, hence its id."""
    par, tr = plan.parallel, plan.training
    interleaved = par.vpp > 1 or par.schedule in (Schedule.GPIPE, Schedule.ZERO_BUBBLE)   # schedules' own counts
    return (id(plan.model), par.tp, par.pp, par.cp, par.ep, par.etp, par.vpp, par.microbatch_group,
            par.schedule if interleaved else None,
            par.sequence_parallel, tr.micro_batch, tr.flash_attention, plan.num_microbatches, plan.layers_per_stage,
            tr.activation_offload, tr.autocast, tr.precision, tr.fp8_recipe, overlap)


def _shared_parts(plan: Plan, cache: dict | None = None) -> tuple:
    """What ``memory_table``'s settings (and ``_least_block``'s layer counts) share of ``plan``, none
    of it read by the recompute: the stage parameters, the ranks that can be fullest and their
    shapes (``activations.rank_shapes``), the first two kept in ``cache`` (``memory_table``'s) for
    the layout's other micro-batches and offloads; the loss's overlap, the framework terms,
    whether the gradients are live."""
    key = ("params", plan.model, plan.parallel)
    if cache is None or (hit := cache.get(key)) is None:
        params = mem.stage_params(plan)
        hit = (params, _peak_ranks(plan, params))
        if cache is not None:
            cache[key] = hit
    return (*hit, activations.rank_shapes(plan, plan.layers_per_stage), mem.loss_overlap(plan, hit[0]),
            *pk.framework_terms(plan), pk.gradients_at_activation_peak(plan))


def _activation_sums(p_rc: Plan, parts: tuple) -> dict[int, float]:
    """Activation bytes of the ranks that can be fullest under ``p_rc``'s recompute
    (``memory.activation_bytes``, from the shapes ``parts`` holds)."""
    _, ranks, shapes, overlap, *_ = parts
    terms, per_chunk, vpp = activations.activation_terms(p_rc, overlap), {}, p_rc.parallel.vpp
    return {r: sum(activations.shape_activation_parts(vpp, shapes[r], terms, per_chunk)) for r in ranks}


def _kinds(p_off: Plan, parts: tuple) -> dict:
    """(Model states, buffer terms, their sum) of the ranks that can be fullest under ``p_off``'s
    offload, kept per kind of rank where ``memory._row_maker`` keeps them (``peak.rank_kinds``: the
    timed layout's ``step_costs`` finds them there)."""
    params, ranks, count_buffers = parts[0], parts[1], parts[6]
    kinds = pk.rank_kinds(p_off, count_buffers)
    per_value = {id(params[r]): params[r] for r in ranks}   # ``stage_params`` gives equal ranks one value
    per_value = {k: mem.rank_kind(p_off, sp, kinds, count_buffers) for k, sp in per_value.items()}
    return {r: per_value[id(params[r])] for r in ranks}


def _peak(kinds: dict, acts: dict, parts: tuple) -> float:
    """GPU bytes of the fullest of the ranks ``parts`` names (``memory_per_rank``'s total)."""
    _, ranks, _, _, framework, fragmentation, _, grads_live = parts
    return max(pk.peak_tensor_bytes(kinds[r][0], acts[r], kinds[r][2], grads_live) * (1 + fragmentation)
               for r in ranks) + framework


def memory_table(plan: Plan, offloads, recomputes, cache: dict | None = None, parts: tuple | None = None,
                 ) -> dict[tuple[Offload, Recompute], tuple[float, float]]:
    """(GPU bytes of the fullest rank, host offload bytes per node) of ``plan`` under each
    offload x recompute setting: ``memory.memory_per_rank``'s sums, evaluated once for
    the parts the settings share (``_shared_parts``, or ``parts`` where given) and only on the
    ranks that can be fullest. ``cache`` (one per batch of layouts of one base plan) keeps the
    activation bytes for the next layout that differs only in ZeRO stage or schedule twin."""
    parts = parts or _shared_parts(plan)
    ranks, shapes, overlap = parts[1], parts[2], parts[3]
    acts, offloaded, p_rcs = {}, dict.fromkeys(recomputes, 0.0), {plan.training.recompute: plan}
    shared = (_activation_key(plan, overlap), tuple(ranks)) if cache is not None else None
    for rc in recomputes:
        key = (shared, rc) if cache is not None else None
        if key is None or key not in cache:
            p_rcs[rc] = p_rcs.get(rc) or evolve(plan, training=evolve(plan.training, recompute=rc))
            value = _activation_sums(p_rcs[rc], parts)
            if key is None:
                acts[rc] = value
                continue
            cache[key] = value
        acts[rc] = cache[key]
    if plan.training.activation_offload:   # the offloaded activations wait in the node's host memory
        for rc in recomputes:
            p_rc = p_rcs.get(rc) or evolve(plan, training=evolve(plan.training, recompute=rc))
            terms = activations.activation_terms(p_rc, overlap)
            offloaded[rc] = plan.cluster.gpus_per_node * max(
                activations.shape_offloaded_bytes(shapes[r], terms) for r in ranks)
    out = {}
    for off in offloads:
        kinds = _kinds(plan if off == plan.training.offload else evolve(plan, training=evolve(plan.training, offload=off)),
                       parts)
        host = max(kinds[r][0]["host"] for r in ranks) * plan.cluster.gpus_per_node
        for rc in recomputes:
            out[off, rc] = (_peak(kinds, acts[rc], parts), host + offloaded[rc])
    return out


def fits_memory(plan: Plan, peak_bytes: float, host_bytes_per_node: float) -> bool:
    node = plan.cluster.node
    return peak_bytes <= node.gpu.hbm_bytes and host_bytes_per_node <= node.host_memory_bytes


def _twin(family: Layout) -> Layout | None:
    """The 1F1B layout whose StepCosts a zero-bubble layout shares: ``step_costs`` reads the
    schedule only through the stages and the memory model (ZB-H1's owed weight gradients,
    ``simcore.model.activations``, so the twin's memory fields are recomputed); the analytic
    path's pipeline term tells their times apart."""
    if family.schedule == Schedule.ZERO_BUBBLE and family.vpp == 1:
        return replace(family, schedule=Schedule.ONE_F_ONE_B)
    return None


def _over(plan: Plan, family: Layout, limit: float, tally: Tally, count: int, cache: dict) -> bool:
    """Whether ``plan`` (``family``'s lightest setting that keeps to the rules) has a step floor
    over ``limit`` (``analytic.step_floor``: every setting of the family is at least as slow);
    its ``count`` candidates and axis values then go to ``tally.bounded``."""
    from simcore.engine.analytic import step_floor

    if limit == float("inf") or step_floor(plan, cache) <= limit:
        return False
    tally.bounded += count
    for axis in ("tp", "pp", "cp"):
        tally.bounded_values.setdefault(axis, set()).add(getattr(family, axis))
    return True


def evaluate_family(base: Plan, family: Layout, space: SearchSpace, tally: Tally,
                    cache: dict | None = None, limit: float = float("inf")) -> list[dict]:
    """Rows for one layout: for each offload setting, the lightest recompute that fits with the
    memory model's margin (heavier recompute only adds time), and on the way every lighter one
    that is thin or may not fit (``headroom.fit_class``: ranked and marked, so the search can
    say what the margin costs). An offload setting is checked (rules, memory) only when nothing
    fits without it; the rules of ``check_plan`` do not depend on recompute, so each is checked
    once. ``cache`` (per batch of layouts) reuses activation bytes and a zero-bubble layout's
    1F1B twin's StepCosts (``_twin``): the same numbers, fewer calls. A family whose step floor
    is over ``limit`` is left there (``_over``)."""
    cache = {} if cache is None else cache
    nrc, noff = len(space.recompute), len(space.offload)
    tally.candidates += nrc * noff
    node, rows, first, checked = base.cluster.node, [], None, False
    for k, off in enumerate(space.offload):
        plan = evolve(family, offload=off, recompute=space.recompute[0]).apply(base, True)
        if rejected(plan, tally, nrc):
            continue
        if not checked and _over(plan, family, limit, tally, nrc * (noff - k), cache):
            return []
        checked = True
        parts = _shared_parts(plan, cache)
        table = memory_table(plan, (off,), space.recompute, cache, parts)
        lighter = float("inf")   # the peak of the last row kept at this offload
        for i, rc in enumerate(space.recompute):
            peak, host = table[off, rc]
            cls = fit_class(peak, node.gpu.hbm_bytes) if host <= node.host_memory_bytes else None
            if cls is None:
                tally.no_fit += 1
                tally.margin_only += host <= node.host_memory_bytes and _margin_only(peak, parts, node.gpu.hbm_bytes)
                continue
            if peak >= lighter:   # more recompute that holds no fewer bytes: only slower
                tally.dominated += 1
                continue
            lighter, first = peak, (k, i) if first is None else first
            lay = evolve(family, recompute=rc, offload=off)
            if rc == Recompute.FULL and cls == FITS and space.block_recompute:   # the fewest layers that fit
                lay = _least_block(base, lay, tally, plan, parts)
            tally.simulated += 1
            tally.near += cls != FITS
            rows.append(_timed(base, lay, cache, cls, _variant(plan, lay, lay.label())))
            if cls == FITS:
                tally.dominated += nrc - i - 1 + nrc * (noff - k - 1)
                return rows if (k, i) == (0, 0) or True not in space.activation_offload else \
                    rows + _offloaded(base, family, tally)
    return rows + (_offloaded(base, family, tally) if True in space.activation_offload else [])


def _margin_only(peak: float, parts: tuple, hbm: float) -> bool:
    """Whether ``peak`` (``memory_table``'s, with the allocator's margin) would be in a fit class
    without the margin (``parts``' framework terms: the CUDA context, the margin's share); only
    for torch's caching allocator at its default margin, the one expandable segments remove (a
    compiled runtime's fragmentation, XLA's, is no setting of the launch)."""
    from simcore.model.peak import ALLOCATOR_MARGIN

    context, share = parts[4], parts[5]
    return share == ALLOCATOR_MARGIN and fit_class((peak - context) / (1 + share) + context, hbm) is not None


def _variant(plan: Plan, lay: Layout, name: str | None = None) -> Plan:
    """``lay.apply(base, True)`` (named ``name``; else ``plan``'s name) where ``plan`` is the Plan
    of ``lay``'s family at its offload without block recompute: only the recompute differs, so
    the same Plan is ``plan``'s sections with another training section."""
    block = {"recompute_layers": lay.recompute_layers, "recompute_method": RecomputeMethod.BLOCK} \
        if lay.recompute_layers else {}
    return evolve(plan, training=evolve(plan.training, recompute=lay.recompute, **block), name=name or plan.name)


def _least_block(base: Plan, lay: Layout, tally: Tally, plan: Plan | None = None,
                 parts: tuple | None = None) -> Layout:
    """``lay`` (full recompute, which fits with the memory model's margin) recomputing only the
    fewest layers of each chunk that fit with it (Megatron-LM's block method; a chunk's bytes
    fall as more of its layers recompute), or ``lay`` itself where every layer must. ``plan``
    (``lay``'s family's at its offload, ``_variant``) and its ``_shared_parts``, where given,
    are what each count's bytes share."""
    plan = plan or lay.apply(base, True)
    chunk = max(plan.layers_per_stage)
    if chunk <= 1 or plan.training.recompute_method == RecomputeMethod.BLOCK:
        return lay
    roomy = base.cluster.node.gpu.hbm_bytes / memory_margin().hi
    parts = parts or _shared_parts(plan)
    kinds = _kinds(plan, parts)

    def peak(n: int) -> float:   # the ranks that can be fullest (``memory_table``)
        return _peak(kinds, _activation_sums(_variant(plan, evolve(lay, recompute_layers=n)), parts), parts)

    if peak(chunk - 1) > roomy:
        return lay
    lo, hi = 1, chunk - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if peak(mid) <= roomy else (mid + 1, hi)
    tally.candidates += 1
    return evolve(lay, recompute_layers=lo)


def _timed(base: Plan, lay: Layout, cache: dict, cls: str, plan: Plan | None = None) -> dict:
    """The analytic row of one layout (``cls`` its fit class; ``plan``: its Plan, where built)."""
    from simcore.engine.analytic import analytic
    from simcore.model.memory import memory_fields
    from simcore.model.step_costs import step_costs

    plan = plan or lay.apply(base, True)
    twin = _twin(lay)
    costs = cache.pop(("costs", twin), None) if twin is not None else None
    # the twin's time, this schedule's memory (zero-bubble keeps owed weight gradients)
    costs = step_costs(plan, cache) if costs is None else replace(costs, plan=plan, **memory_fields(plan))
    if lay.schedule == Schedule.ONE_F_ONE_B and lay.vpp == 1 and lay.pp > 1:
        cache["costs", lay] = costs
    return _row(lay, analytic(costs), cls, plan.name)


def _offloaded(base: Plan, family: Layout, tally: Tally) -> list[dict]:
    """A layout without a pipeline that fits only with recomputation or optimizer offload (or
    not at all), with the fewest layers' activations offloaded to host memory that make it fit
    without either (``training.activation_offload`` below the model's layers, as Megatron-Core
    requires) with the memory model's margin where any count does (``headroom``): its row,
    or none where no count fits the GPU and the host."""
    from simcore.engine.analytic import analytic
    from simcore.model.step_costs import step_costs

    top = base.model.layers - 1
    if family.pp > 1 or top < 1 or base.training.activation_offload:
        return []
    tally.candidates += 1

    def plan_of(n: int) -> Plan:
        return replace(family, recompute=Recompute.NONE, offload=Offload.NONE, activation_offload=n).apply(base, True)

    if rejected(plan_of(top), tally):
        return []
    peak = lambda n: max(mem.rank_totals(plan_of(n))[0])  # noqa: E731
    hbm, least = base.cluster.node.gpu.hbm_bytes, peak(top)
    if least > hbm:
        tally.no_fit += 1
        return []
    roomy = hbm / memory_margin().hi
    limit = roomy if least <= roomy else hbm
    lo, hi = 1, top   # the GPU's bytes fall as layers are offloaded: the fewest within the limit
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if peak(mid) <= limit else (mid + 1, hi)
    plan = plan_of(lo)
    totals, _, host = mem.rank_totals(plan)
    if not fits_memory(base, max(totals), pk.host_node_bytes(plan, host)):
        tally.no_fit += 1
        return []
    tally.simulated += 1
    cls = fit_class(max(totals), hbm)
    tally.near += cls != FITS
    return [_row(replace(family, activation_offload=lo), analytic(step_costs(plan)), cls)]


def _row(lay: Layout, res, fit: str, name: str = "") -> dict:
    return {"layout": name or lay.label(), "tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "cp": lay.cp, "ep": lay.ep,
            "vpp": lay.vpp, "zero": int(lay.zero), "schedule": lay.schedule.value,
            "micro_batch": lay.micro_batch, "sequence_parallel": lay.sequence_parallel, "recompute": lay.recompute.value, "offload": lay.offload.value,
            "activation_offload": lay.activation_offload, "autocast": lay.autocast, "split": lay.split,
            "expert_tp": lay.expert_tp, "recompute_layers": lay.recompute_layers, "precision": lay.precision,
            "dp_replicate": lay.dp_replicate, "fp8_recipe": lay.fp8_recipe, "compression": lay.compression,
            "kv_replicator": lay.kv_replicator, "gpus": lay.tp * lay.pp * lay.dp * lay.cp,
            "step_time_s": res.step_time_s, "tokens_per_s": res.tokens_per_s, "mfu": res.mfu,
            "compute_s": res.compute_s, "exposed_comm_s": res.exposed_comm_s, "bubble_s": res.bubble_s,
            "offload_s": res.offload_s, "memory_per_gpu_gib": res.memory_per_gpu_gib, "fits": res.fits, "fit": fit}


def _evaluate_chunk(args) -> tuple[list[dict], Tally]:
    """The rows of one batch of families. A family that fits under no recompute or offload
    setting at one micro-batch fits at no larger one (``_without_micro_batch``): the bytes a
    rank holds never fall as the micro-batch grows (a schedule's micro-batches in flight times
    their size is min(m, k) x b for m = B / b, non-decreasing in b; the model states do not
    change), so the larger ones are counted as not fitting unevaluated. The cyclic garbage collector
    is off meanwhile: a batch leaves no reference cycles, and each of its passes walked every object
    the search holds (8% of a search's time). ``bound`` (``bound.bound_of``'s value, per GPU, lows),
    where given: a family is left where its step floor times its interval's low end is over the
    value (its GPU-seconds where per GPU: the cost objective), ``evaluate_family``'s ``limit``."""
    base, chunk, space, *bound = args
    value, per_gpu, lows = bound[0] if bound else (float("inf"), False, {})
    tally, rows, cache, too_big = Tally(), [], {}, {}
    per_family = len(space.recompute) * len(space.offload)
    collecting = gc.isenabled()
    gc.disable()
    try:
        for fam in chunk:
            key = _without_micro_batch(fam)
            if fam.micro_batch >= too_big.get(key, fam.micro_batch + 1):
                n = per_family + (True in space.activation_offload and fam.pp == 1)
                tally.candidates += n
                tally.no_fit += n
                continue
            broke, bounded = tally.broke_rule, tally.bounded
            low = lows.get(interval_key(fam), 0.0) if lows else 0.0
            limit = value / low / (fam.tp * fam.pp * fam.dp * fam.cp if per_gpu else 1) if low else float("inf")
            found = evaluate_family(base, fam, space, tally, cache, limit)
            if not found and tally.broke_rule == broke and tally.bounded == bounded:
                too_big[key] = min(fam.micro_batch, too_big.get(key, fam.micro_batch))
            rows += found
    finally:
        if collecting:
            gc.enable()
    return rows, tally


def _without_micro_batch(fam: Layout) -> tuple:
    return (fam.tp, fam.pp, fam.dp, fam.cp, fam.ep, fam.expert_tp, fam.vpp, fam.zero, fam.schedule, fam.split,
            fam.sequence_parallel, fam.autocast, fam.recompute, fam.offload, fam.activation_offload, fam.precision,
            fam.dp_replicate, fam.compression, fam.kv_replicator)
