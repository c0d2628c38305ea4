"""Memory by term: micro-batches in flight counted on the schedule, the loss's buffers,
FSDP2's buffers, the allocator's margin and the CUDA context, headroom and fits."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simcore.model import activations as acts
from simcore.model import memory as mem
from simcore.model import peak as pk
from simcore.model.step_costs import memory_report
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError, Schedule

ROOT = Path(__file__).resolve().parents[2]


def _plan(parallel=None, training=None, model="llama3-8b", nodes=8):
    return plan_from_dict({"model": {"name": model, "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": {"dp": 8, **(parallel or {})},
                           "training": {"global_batch": 256, "flash_attention": True, **(training or {})}})


@pytest.mark.parametrize("pp, m, v", [(4, 8, 2), (4, 16, 2), (8, 16, 4), (2, 8, 3), (4, 4, 2)])
def test_interleaved_peak_on_the_schedule_is_the_warmup_formula(pp, m, v):
    """torch's ScheduleInterleaved1F1B and Megatron: warm-up (v-1)p + 2(p-1-r) chunks, +1 at the peak."""
    flights, owed = acts.counted_peaks(Schedule.INTERLEAVED_1F1B, pp, m, v)
    assert acts.schedule_peaks(Schedule.INTERLEAVED_1F1B, pp, m, v) == (flights, owed)
    assert list(flights) == [min(m * v, (v - 1) * pp + 2 * (pp - 1 - r) + 1) for r in range(pp)]
    assert owed == (0,) * pp


@pytest.mark.parametrize("pp, m", [(4, 8), (8, 8), (4, 2)])
def test_gpipe_holds_every_microbatch_and_1f1b_p_minus_r(pp, m):
    for kind, want in ((Schedule.GPIPE, (m,) * pp), (Schedule.ONE_F_ONE_B, tuple(min(m, pp - r) for r in range(pp)))):
        assert acts.counted_peaks(kind, pp, m, 1)[0] == want == acts.schedule_peaks(kind, pp, m, 1)[0]


@pytest.mark.parametrize("pp, m, v", [(4, 8, 1), (8, 8, 1), (4, 2, 1), (12, 24, 1), (4, 8, 2), (8, 16, 3)])
def test_zero_bubble_closed_forms_are_its_schedule(pp, m, v):
    """ZB-H1 / ZB-V as torch orders them: rank r keeps p - r forwards (vp - r chunks with v
    stages a rank) and owes up to r + 1 weight gradients."""
    flights, owed = acts.counted_peaks(Schedule.ZERO_BUBBLE, pp, m, v)
    assert acts.schedule_peaks(Schedule.ZERO_BUBBLE, pp, m, v) == (flights, owed)
    assert owed == tuple(min(m, r + 1) for r in range(pp))


def test_zero_bubble_owes_weight_gradients_and_pays_for_them():
    flights, owed = acts.schedule_peaks(Schedule.ZERO_BUBBLE, 4, 8, 1)
    assert max(owed) > 0 and owed[-1] >= owed[0]
    zb = _plan({"pp": 4, "dp": 2, "schedule": "zero-bubble"}, {"global_batch": 16})
    one = _plan({"pp": 4, "dp": 2}, {"global_batch": 16})
    stash = [acts.rank_activation_bytes(zb, r, zb.layers_per_stage, acts.activation_terms(zb))["wgrad_stash"]
             for r in range(4)]
    assert all(s > 0 for s, o in zip(stash, owed) if o) and max(stash) > 0
    assert memory_report(zb)["max_gpu_bytes"] > memory_report(one)["max_gpu_bytes"]


@pytest.mark.parametrize("pp, m", [(2, 4), (2, 7), (4, 8), (4, 9), (4, 16), (8, 16), (8, 21), (12, 24)])
def test_dualpipev_closed_forms_are_its_schedule(pp, m):
    """DualPipeV as torch orders it: every rank keeps 2p + 1 chunks (the DualPipe README's PP + 1,
    PP = 2p stages) and owes up to r + 1 weight gradients; the two peak apart, and ``peak_apart``'s
    three points give the largest a x chunks + b x owed of every state the schedule passes through."""
    flights, owed = acts.counted_peaks(Schedule.DUALPIPE_V, pp, m, 2)
    assert acts.schedule_peaks(Schedule.DUALPIPE_V, pp, m, 2) == (flights, owed)
    assert flights == (2 * pp + 1,) * pp and owed == tuple(r + 1 for r in range(pp))
    for r, states in enumerate(acts.counted_states(Schedule.DUALPIPE_V, pp, m, 2)):
        for a, b in ((1.0, 0.0), (1.0, 0.3), (1.0, 1.0), (1.0, 2.5), (0.2, 1.0), (0.0, 1.0)):
            live, w = acts.peak_apart(flights[r], owed[r], a, b)
            assert (live, w) in states
            assert live * a + w * b == max(x * a + y * b for x, y in states)


def test_dualpipev_memory_is_what_its_schedule_keeps():
    """Rank 0 holds both ends (the loss's buffers, the output layer); every rank keeps 2p + 1
    chunks of half its layers (1F1B: p - r of all of them)."""
    dual = _plan({"pp": 4, "dp": 2, "vpp": 2, "schedule": "dualpipev"}, {"global_batch": 16})
    one = _plan({"pp": 4, "dp": 2}, {"global_batch": 16})
    terms, ones = acts.activation_terms(dual), acts.activation_terms(one)
    parts = [acts.rank_activation_bytes(dual, r, dual.layers_per_stage, terms) for r in range(4)]
    base = [acts.rank_activation_bytes(one, r, one.layers_per_stage, ones) for r in range(4)]
    assert parts[0]["loss"] > 0 and all(p["loss"] == 0 for p in parts[1:])
    assert len({p["layers"] for p in parts}) == 1
    assert parts[0]["layers"] == pytest.approx(base[0]["layers"] * 9 / 2 / 4, rel=0.05)   # 9 half-rank chunks vs 4
    params = mem.stage_params(dual)
    assert params[0].ends > 0 and params[-1].ends == 0   # the output layer sits on rank 0


def test_loss_buffer_by_kind_of_loss():
    """eager 12 B (16 B under TP's loss_parallel), fused 4 B, chunked 2 + 12/8 B per logit, split over TP."""
    plans = {k: _plan(training={"loss": k}) for k in ("eager", "fused", "chunked")}
    logits = 4096 * 128256
    assert acts.loss_bytes(plans["eager"]) == (4 * logits, 8 * logits)
    assert acts.loss_bytes(plans["fused"]) == (2 * logits, 2 * logits)
    assert acts.loss_bytes(plans["chunked"]) == pytest.approx((2 * logits, 12 / 8 * logits))
    tp = _plan({"tp": 8, "dp": 8}, {"loss": "fused"})
    assert sum(acts.loss_bytes(tp)) == pytest.approx(4 * logits / 8)
    # eager under TP is torch's loss_parallel: zeros_like, exp and their sum beside the log-softmax
    tp_eager = _plan({"tp": 8, "dp": 8}, {"loss": "eager"})
    assert acts.loss_bytes(tp_eager) == pytest.approx((4 * logits / 8, 12 * logits / 8))


def test_fsdp2_buffers_and_the_loss_transients_are_not_alive_together():
    """ZeRO-3 without a pipeline: the root reshards after forward, so the loss's transients
    take the place of the gathered buffers at the peak; ZeRO-1 keeps its buckets beside them."""
    z3 = memory_report(_plan({"zero": 3}))["ranks"][0]["terms"]
    buffers = z3["fsdp_all_gather"] + z3["fsdp_reduce_scatter"] + z3["fsdp_root"]
    _, transient = acts.loss_bytes(_plan())
    assert z3["activations_loss_transient"] + buffers == pytest.approx(max(transient, buffers))
    assert 0 < buffers < transient or z3["activations_loss_transient"] == 0
    z1 = memory_report(_plan({"zero": 1}))["ranks"][0]["terms"]
    assert z1["activations_loss_transient"] == pytest.approx(transient)


def test_fsdp2_buffers_only_where_fsdp2_runs():
    z3 = memory_report(_plan({"zero": 3}))["ranks"][0]["terms"]
    z1 = memory_report(_plan({"zero": 1}))["ranks"][0]["terms"]
    layer = mem.layer_params_per_gpu(_plan())[0]
    assert z3["fsdp_all_gather"] == pytest.approx(2 * 2 * layer)          # current + prefetched, bf16
    assert z3["fsdp_reduce_scatter"] == pytest.approx((2 + 4) * layer)    # bf16 gradient and its fp32 copy
    assert z3["weights"] == pytest.approx(4 * mem.stage_params(_plan())[0].total / 8)   # fp32 shards: the master
    assert z3["fsdp_root"] > 0 and z3["dp_buckets"] == 0
    assert z1["fsdp_all_gather"] == z1["fsdp_root"] == 0 and z1["dp_buckets"] == 2 * 25 * 1024**2


def test_terms_sum_to_the_total_and_margin_and_headroom_are_plain_fields():
    rep = memory_report(_plan({"zero": 3}, {"recompute": "op"}))
    rank = rep["ranks"][0]
    assert sum(rank["terms"].values()) == pytest.approx(rank["total"])
    tensors = rank["total"] - rank["terms"]["cuda_context"] - rank["terms"]["allocator_margin"]
    assert rank["terms"]["allocator_margin"] == pytest.approx(rep["allocator_margin"] * tensors)
    assert rep["allocator_margin"] == pk.ALLOCATOR_MARGIN
    assert rep["headroom_bytes"] == pytest.approx(rep["hbm_bytes"] - rep["max_gpu_bytes"])


def test_allocator_margin_is_settable_and_fits_uses_it():
    base = _plan({"zero": 3}, {"micro_batch": 2})
    peak = memory_report(base)["max_gpu_bytes"]
    hbm = base.cluster.node.gpu.hbm_bytes
    # a margin that takes the most loaded GPU just over its HBM
    tensors = (peak - pk.CUDA_CONTEXT_BYTES) / (1 + pk.ALLOCATOR_MARGIN)
    over = (hbm - pk.CUDA_CONTEXT_BYTES) / tensors - 1 + 0.01
    assert 0 < over < 1
    tight = _plan({"zero": 3}, {"micro_batch": 2, "allocator_margin": over})
    assert memory_report(base)["fits"] and not memory_report(tight)["fits"]
    assert memory_report(tight)["headroom_bytes"] < 0
    with pytest.raises(PlanError, match="training.allocator_margin=1.5 must be at least 0 and below 1"):
        _plan(training={"allocator_margin": 1.5})


def test_gradients_are_not_at_the_activation_peak_of_a_step_that_keeps_none():
    """One GPU, one micro-batch: the peak is the backward's start (no gradients yet) or the
    optimizer step (no activations); accumulation or DDP buffers keep them through the step."""
    one = plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 4096}, "cluster": {"node": "dgx-h100", "nodes": 1},
                          "parallel": {"dp": 1}, "training": {"global_batch": 1, "flash_attention": True}})
    accum = plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 4096},
                            "cluster": {"node": "dgx-h100", "nodes": 1},
                            "parallel": {"dp": 1}, "training": {"global_batch": 4, "flash_attention": True}})
    assert not pk.gradients_at_activation_peak(one) and pk.gradients_at_activation_peak(accum)
    a, b = mem.memory_per_rank(one)[0], mem.memory_per_rank(accum)[0]
    assert a["gradients"] == 0 and b["gradients"] > 0
    assert a["total"] < b["total"]


def test_memory_command_prints_terms_and_headroom_and_json():
    env = {"PYTHONPATH": str(ROOT)}
    plan = ROOT / "plans" / "llama3-8b-fsdp-h100.yaml"
    text = subprocess.run([sys.executable, "-m", "trainplan", "memory", str(plan)], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=True).stdout
    assert "fsdp_all_gather" in text and "activations_loss" in text and "headroom" in text
    doc = json.loads(subprocess.run([sys.executable, "-m", "trainplan", "memory", str(plan), "--json"],
                                    capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout)
    assert {"allocator_margin", "headroom_bytes", "cuda_context_bytes"} <= set(doc)
    assert "fsdp_reduce_scatter" in doc["ranks"][0]["terms"]
