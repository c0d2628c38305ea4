"""DualPipeV cannot win for nothing (tests/model/test_no_free_lunch.py's properties, drawn by
hypothesis): its step is never below the compute its ranks run, on either engine; its activations
are the chunks its schedule keeps in flight, no fewer; and the bubble it saves over 1F1B is paid
for in activation memory."""
from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simcore.engine.analytic import analytic
from simcore.engine.des import simulate_des
from simcore.model.step_costs import memory_report, step_costs
from simcore.plan.spec import PlanError
from tests.model.test_no_free_lunch import MODELS, NODES, _plan

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
REL = 1e-9


def _dual(model, node, tp, pp, recompute, zero=1, dp=None, **kw):
    return _plan(model, node, tp=tp, pp=pp, dp=dp or 64 // (tp * pp), zero=zero, recompute=recompute, vpp=2,
                 schedule="dualpipev", **kw)


def _rank_compute(c) -> list[float]:
    """Per pipeline rank, the compute of one micro-batch over its virtual stages."""
    par = c.plan.parallel
    return [sum(c.forward_s[v] + c.backward_input_s[v] + c.backward_weight_s[v] + c.recompute_s[v]
                for v in par.rank_stages(r)) for r in range(par.pp)]


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([2, 4]), recompute=st.sampled_from(["none", "selective", "full"]),
       engine=st.sampled_from(["analytic", "des"]))
def test_dualpipev_step_is_never_below_the_compute_it_runs(model, node, tp, pp, recompute, engine):
    try:
        plan = _dual(model, node, tp, pp, recompute)
    except PlanError:
        return
    c = step_costs(plan)
    res = analytic(c) if engine == "analytic" else simulate_des(c)
    m = plan.num_microbatches
    work = _rank_compute(c)
    assert res.step_time_s >= m * max(work) * (1 - REL)             # the busiest rank's compute, back to back
    assert res.step_time_s >= m * sum(work) / pp * (1 - REL)        # the whole pipeline's, spread evenly
    assert res.bubble_s >= 0.0 and res.compute_s <= res.step_time_s * (1 + REL)


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([2, 4]), recompute=st.sampled_from(["none", "selective"]))
def test_dualpipev_activations_are_the_chunks_its_schedule_keeps(model, node, tp, pp, recompute):
    """Every rank keeps 2p + 1 chunks at its peak: each rank's in-flight activations are 2p + 1
    times a chunk's stash, the stash the interleaved schedule (vpp 2, the same stages) keeps
    (3p - 1 - 2r) of on rank r; and the loss's buffers sit on rank 0, beside the embedding."""
    try:
        dual = _dual(model, node, tp, pp, recompute)
        inter = dataclasses.replace(dual, parallel=dataclasses.replace(dual.parallel, schedule="interleaved-1f1b"))
    except PlanError:
        return
    assume(len(set(dual.layers_per_stage)) == 1 and dual.num_microbatches % pp == 0)
    a, b = memory_report(dual)["ranks"], memory_report(inter)["ranks"]
    for r in range(pp):
        chunk = b[r]["terms"]["activations_layers"] / (3 * pp - 1 - 2 * r)
        held = a[r]["terms"]["activations_layers"] + a[r]["terms"]["activations_wgrad_stash"]
        assert held >= (2 * pp + 1) * chunk * (1 - 1e-6)
        assert (a[r]["terms"]["activations_loss"] > 0) == (r == 0)


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([2, 4]), recompute=st.sampled_from(["none", "selective", "full"]),
       zero=st.sampled_from([0, 1]))
def test_dualpipev_pays_for_its_bubble_in_activations(model, node, tp, pp, recompute, zero):
    """Against 1F1B on the same ranks: where DualPipeV's step is shorter, its fullest rank holds at
    least the activations 1F1B's does (2p + 1 half-rank chunks against p whole ones)."""
    try:
        dual = _dual(model, node, tp, pp, recompute, zero=zero)
        one = dataclasses.replace(dual, parallel=dataclasses.replace(dual.parallel, schedule="1f1b", vpp=1))
    except PlanError:
        return
    assume(len(set(dual.layers_per_stage)) == 1)
    x, y = analytic(step_costs(dual)), analytic(step_costs(one))
    acts = [max(r["activations"] for r in memory_report(p)["ranks"]) for p in (dual, one)]
    if x.step_time_s < y.step_time_s:
        assert acts[0] >= acts[1]
