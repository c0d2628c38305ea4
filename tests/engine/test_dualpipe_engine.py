"""DualPipeV on both engines: the event engine plays torch's order (pairs one after the other, a
paired forward's activation sent after the pair's backward) and the analytic closed form
(the DualPipe paper's bubble, floored where the weight gradients cannot fill it) agrees with it."""
from __future__ import annotations

import itertools

import pytest

from simcore.engine.analytic import analytic
from simcore.engine.des import simulate_des
from simcore.model.dualpipe import paired_forwards
from simcore.model.schedules import Action, Op
from tests.engine.test_engine import _costs, _plan


def _dual(pp, m, f, i, w, **over):
    plan = _plan(pp=pp, global_batch=m, schedule="dualpipev", vpp=2)
    n = 2 * pp
    return _costs(plan, f=f, backward_input_s=(i,) * n, backward_weight_s=(w,) * n,
                  memory_per_rank_bytes=(1.0,) * pp, **over)


def test_balanced_chunks_give_the_papers_bubble_on_both_engines():
    """F = I = W a chunk (B = 2F): (p - 1)(F&B + B - 3W) with F&B = F + B, torch's pair one after
    the other: (p - 1) 2F (arXiv 2412.19437 Table 2)."""
    for pp, m in ((2, 4), (4, 8), (4, 16), (8, 16), (8, 40)):
        c = _dual(pp, m, 1.0, 1.0, 1.0)
        paper = (pp - 1) * ((1.0 + 2.0) + 2.0 - 3 * 1.0)
        for res in (simulate_des(c), analytic(c)):
            assert res.bubble_s == pytest.approx(paper)
            assert res.step_time_s == pytest.approx(m * 2 * 3.0 + paper)


@pytest.mark.parametrize("pp, m", [(2, 4), (2, 7), (4, 8), (4, 11), (8, 16)])
def test_the_closed_form_is_the_event_engine_on_uniform_stages(pp, m):
    """Forward, input- and weight-gradient times in every ratio: where W or F outgrow I the
    weight gradients no longer fill the bubble, and the closed form follows the engine there too."""
    for f, i, w in itertools.product((0.5, 1.0, 2.0), (0.5, 1.0, 1.5, 2.0), (0.25, 1.0, 2.0)):
        c = _dual(pp, m, f, i, w)
        assert analytic(c).step_time_s == pytest.approx(simulate_des(c).step_time_s, rel=1e-9), (f, i, w)


def test_sends_and_layer_communication_stay_close_to_the_event_engine():
    """TP communication in the chunks, pipeline hops torch's deferred sends expose, recompute."""
    for pp, m in ((4, 16), (8, 32)):
        for p2p, comm, rec in ((0.05, 0.0, 0.0), (0.1, 0.1, 0.3), (0.0, 0.2, 0.0)):
            n = 2 * pp
            c = _dual(pp, m, 1.0, 1.0, 1.0, p2p_s=p2p, forward_comm_s=(comm,) * n, backward_comm_s=(comm,) * n,
                      recompute_s=(rec,) * n)
            assert analytic(c).step_time_s == pytest.approx(simulate_des(c).step_time_s, rel=0.01)


def test_a_paired_forwards_activation_leaves_after_the_pairs_backward():
    """torch's _add_send_recv puts a pair's sends after the whole OVERLAP_F_B action: the
    downstream rank receives the paired forward's output only once the backward ran."""
    pp, m = 2, 6
    res = simulate_des(_dual(pp, m, 1.0, 1.0, 1.0, p2p_s=0.01))
    spans = {(s.rank, s.name): s for s in res.spans}
    paired = [a for a in paired_forwards(pp, m) if a.stage < 2 * pp - 1 and a.stage != pp - 1]
    assert paired
    for a in paired:
        rank = 0 if a.stage in (0, 2 * pp - 1) else 1
        compute = [s for s in res.spans if s.rank == rank and s.stream == "compute"]
        k = next(j for j, s in enumerate(compute) if s.name == str(a))
        after = compute[k + 1]   # the pair's backward, run after the forward on the one stream
        assert after.kind in ("backward", "backward_input") and Action.from_str(after.name).op in (Op.B, Op.I)
        send = spans[rank, f"{a.stage}SEND_F{a.microbatch}"]
        assert send.start_s >= after.start_s + after.duration_s - 1e-12


def test_the_v_keeps_the_middle_hop_on_one_rank():
    """Stages pp - 1 and pp sit on rank pp - 1: no send between them; rank 0 runs the first
    and the last stage."""
    pp, m = 4, 8
    res = simulate_des(_dual(pp, m, 1.0, 1.0, 1.0, p2p_s=0.01))
    names = {s.name for s in res.spans if s.stream == "pp"}
    assert not any(n.startswith(f"{pp - 1}SEND_F") or n.startswith(f"{pp}SEND_B") for n in names)
    first_last = {s.name[0] for s in res.spans if s.rank == 0 and s.stream == "compute"}
    assert first_last == {"0", str(2 * pp - 1)}
