"""The serving loop on this host (executors/serving_loop.py): it schedules as the serving engine
does, its KV cache decodes as the full model does, it preempts when blocks run out, it measures as
the engine measures, the serving calibration is fitted and read back, and the plans it cannot run
are one sentence. No timing is asserted here (bench/serving_local.py holds the accuracy target)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from executors.model import build_model
from executors.serving_kv import reference_tokens
from executors.serving_loop import LoopLimits, LoopRecord, ServingLoopError, run_loop
from simcore.engine.serving import ServingTimeline, simulate_serving
from simcore.engine.serving_measure import measure, per_token
from simcore.plan.spec import PlanError
from simcore.serving.cost import iteration_s, replica_cost
from simcore.serving.host import HostCosts, calibration_entry, fit_host, host_costs_from, model_key
from simcore.serving.load import serving_from_dict
from trainplan.cli import main
from trainplan.serving_run import check_runnable, measured_result, requests, run_serving

ROOT = Path(__file__).resolve().parents[2]
TINY = {"name": "tiny", "layers": 1, "hidden": 32, "heads": 2, "kv_heads": 1, "vocab": 64, "gated_mlp": True,
        "position_embedding": "rope", "tied_embeddings": False, "seq_len": 64}
DOC = {"name": "tiny-loop", "model": TINY, "hardware": {"node": "localhost"},
       "precision": {"weights": "fp32", "activations": "fp32", "kv_cache": "fp32"},
       "scheduler": {"max_num_seqs": 3, "max_num_batched_tokens": 8}, "kv_cache": {"block_size": 4},
       "traffic": {"arrival": "offline", "num_requests": 10, "prompt_len": 11, "output_len": 6, "seed": 3}}


def plan_of(**sections):
    return serving_from_dict({**DOC, **sections})


@pytest.fixture(scope="module")
def model():
    return build_model(plan_of().model, 0).eval()


def both(plan, model, kv_blocks: int):
    """The engine's run (its timeline) and the loop's, on the same requests and ``kv_blocks``."""
    rc = replica_cost(plan)
    rc.kv_blocks = kv_blocks
    timeline = ServingTimeline()
    sim = simulate_serving(plan, rc, timeline=timeline)
    arrivals, prompts, _, output = requests(plan)
    s = plan.scheduler
    limits = LoopLimits(s.max_num_seqs, s.max_num_batched_tokens, s.chunked_prefill, kv_blocks,
                        plan.kv_cache.block_size, str(s.capacity_policy))
    rec = run_loop(model, limits, arrivals.tolist(), prompts, output.tolist())
    return sim, timeline, rec


@pytest.mark.parametrize("scheduler, kv_blocks", [
    ({"max_num_seqs": 3, "max_num_batched_tokens": 8}, 100),                           # chunked prefill beside decodes
    ({"max_num_seqs": 3, "max_num_batched_tokens": 8}, 9),                             # preemption by recompute
    ({"max_num_seqs": 4, "max_num_batched_tokens": 24, "chunked_prefill": False}, 12),
    ({"max_num_seqs": 2, "max_num_batched_tokens": 16, "capacity_policy": "guaranteed_no_evict"}, 9),
    ({"max_num_seqs": 3, "max_num_batched_tokens": 16, "capacity_policy": "static_batch"}, 100),
])
def test_the_loop_makes_the_engines_scheduling_decisions(model, scheduler, kv_blocks):
    sim, timeline, rec = both(plan_of(scheduler=scheduler), model, kv_blocks)
    engine = [(it[3], it[4], it[5]) for it in timeline.iterations]   # prefill tokens, decodes, KV blocks used
    loop = [(it[3], it[4], it[5]) for it in rec.iterations_log]
    assert loop == engine
    assert rec.preemptions == sim.preemptions and rec.iterations == sim.iterations


def test_preemption_recomputes_and_the_cache_decodes_as_the_full_model(model):
    plan = plan_of()
    sim, _, rec = both(plan, model, kv_blocks=9)
    assert rec.preemptions > 0 and rec.preemptions == sim.preemptions
    _, prompts, _, output = requests(plan)
    for prompt, out, n in zip(prompts, rec.outputs, output):
        assert out == reference_tokens(model, prompt, n)


def test_a_request_larger_than_the_cache_is_refused_not_looped(model):
    limits = LoopLimits(3, 8, True, kv_blocks=3, block_size=4)
    with pytest.raises(ServingLoopError, match="needs more KV blocks"):
        run_loop(model, limits, [0.0], [[1] * 11], [6])
    plan = plan_of()
    rc = replica_cost(plan)
    rc.kv_blocks = 3
    with pytest.raises(PlanError, match="needs more KV blocks"):
        simulate_serving(plan, rc)


def test_the_loop_waits_for_each_arrival_on_its_clock(model):
    """Poisson arrivals on a stepped clock: no request is served before it arrives, and the loop
    sleeps while it has none."""
    plan = plan_of(traffic={**DOC["traffic"], "arrival": "poisson", "rate": 50.0})
    arrivals, prompts, _, output = requests(plan)
    now, slept = [0.0], []

    def clock():
        now[0] += 1e-3
        return now[0]

    def sleep(s):
        slept.append(s)
        now[0] += s

    rec = run_loop(model, LoopLimits(3, 8, True, 100, 4), arrivals.tolist(), prompts, output.tolist(), clock, sleep)
    first, finish = np.array(rec.first), np.array(rec.finish)
    assert np.all(first >= arrivals) and np.all(finish >= first) and slept and min(slept) >= 0
    assert [len(t) for t in rec.token_times] == output.tolist()
    assert np.allclose(first, [t[0] for t in rec.token_times]) and np.allclose(finish, [t[-1] for t in rec.token_times])


def test_the_loop_is_measured_as_the_engine_measures(model):
    plan = plan_of(traffic={**DOC["traffic"], "arrival": "poisson", "rate": 200.0})
    measured, rec = run_serving(plan, model)
    arrivals, first, finish = (np.array(x) for x in (rec.arrivals, rec.first, rec.finish))
    _, _, prompt, output = requests(plan)
    assert repr(measured) == repr(measure([rec], arrivals, first, finish, prompt, output, measured.kv_blocks, None))
    assert measured.ttft[0] == pytest.approx(np.percentile(first - arrivals, 50))
    assert measured.tpot[0] == pytest.approx(np.percentile(per_token(first, finish, output), 50))
    assert measured.output_tok_s == pytest.approx(output.sum() / (finish.max() - arrivals.min()))
    assert measured.requests == 10 and measured.iterations == rec.iterations


def test_the_calibration_fit_recovers_the_loop_terms_and_reads_back():
    truth = (1e-3, 3e-5, 2e-5, 1e-4, 1e-6)
    comps = [(p, c, d, k) for p in (0, 16, 48) for c in (0, 1, 2) for d in (0, 1, 4, 8) for k in (0, 200)
             if (p > 0) == (c > 0)]
    rows = [(float(np.dot(truth, (1, d, p, c, k))) + 0.002, 0.002, (p, c, d, k)) for p, c, d, k in comps]
    tables = HostCosts(0, 0, 0, 0, 0, linear=((1.0, 1e-4), (64.0, 1e-3)), logits=((1.0, 1e-5), (8.0, 5e-5)),
                       wake=((0.01, 0.0), (0.1, 2e-3)))
    costs, groups = fit_host(tables, rows)
    assert costs.terms() == pytest.approx(truth, rel=1e-6) and len(groups) == len(comps)
    key = model_key(plan_of().model, "fp32")
    back = host_costs_from({"models": {key: calibration_entry(costs, groups, "probes", "host", "date")}}, key)
    assert back.terms() == pytest.approx(truth, rel=1e-3) and back.wake_s(0.05) == pytest.approx(2e-3 * 4 / 9)
    assert back.gemm_s(2, 32.0, 1.0) == pytest.approx(2 * (1e-4 + 9e-4 * 31 / 63) + 1e-5)
    assert host_costs_from({"models": {key: {"iteration_us": 1}}}, key) is None


def test_a_calibrated_host_prices_an_iteration_by_its_measured_terms():
    plan = plan_of()
    host = HostCosts(1e-3, 2e-5, 1e-5, 1e-4, 0.0, linear=((1.0, 1e-4), (64.0, 1e-3)), logits=((1.0, 1e-5), (8.0, 5e-5)),
                     wake=((0.01, 0.0), (0.1, 2e-3)))
    rc, bare = replica_cost(plan, host=host), replica_cost(plan)
    busy = iteration_s(rc, 9, 100.0, 60.0, 4, chunks=1, decodes=3)
    assert busy > host.gemm_s(1, 9, 4) + host.seconds(6, 1, 3, 60.0)
    assert iteration_s(rc, 9, 100.0, 60.0, 4, chunks=1, decodes=3, idle_s=0.2) == pytest.approx(busy + 2e-3)
    assert iteration_s(bare, 9, 100.0, 60.0, 4, idle_s=0.2) == iteration_s(bare, 9, 100.0, 60.0, 4)


@pytest.mark.parametrize("edit, field", [
    ({"hardware": {"node": "dgx-h100"}}, "hardware.node=dgx-h100"),
    ({"parallel": {"tp": 2}}, "parallel.tp=2"),
    ({"parallel": {"replicas": 2}}, "parallel.replicas=2"),
    ({"precision": {"weights": "bf16"}}, "precision.weights=bf16"),
    ({"disaggregation": {"prefill_tp": 1, "prefill_replicas": 1}}, "disaggregation"),
    ({"traffic": {**DOC["traffic"], "arrival": "concurrency", "concurrency": 2}}, "traffic.arrival=concurrency"),
])
def test_a_plan_the_loop_cannot_run_is_one_sentence(edit, field):
    with pytest.raises(PlanError) as exc:
        check_runnable(plan_of(**edit))
    assert str(exc.value).startswith(field) and "\n" not in str(exc.value)


@pytest.mark.parametrize("device, runs", [("cpu", False), ("cuda", True)])
def test_bf16_is_served_on_a_gpu_only(monkeypatch, device, runs):
    import trainplan.serving_run as sr

    monkeypatch.setattr(sr, "serving_device", lambda: device)
    bf16 = plan_of(precision={"weights": "bf16", "activations": "bf16", "kv_cache": "bf16"})
    if runs:
        check_runnable(bf16)
        return
    with pytest.raises(PlanError, match=r"^precision.weights=bf16/activations=bf16/kv_cache=bf16: the serving loop "
                                        r"on this CPU runs fp32, all three alike"):
        check_runnable(bf16)


def test_serve_run_refuses_in_one_sentence_and_runs_beside_the_prediction(tmp_path, monkeypatch, capsys):
    from executors.calibrate import serving_probes as probes

    refused = tmp_path / "refused.yaml"
    refused.write_text(yaml.safe_dump({**DOC, "parallel": {"tp": 2}}))
    assert main(["serve", str(refused), "--run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainplan: error: parallel.tp=2") and "\n" not in err and "Traceback" not in err
    monkeypatch.setenv("TRAINPLAN_SERVING_PROFILE", str(tmp_path / "serving.yaml"))
    for name, value in (("GEMM_ROWS", (1, 8, 16)), ("GEMM_REPS", 2), ("WAKE_IDLES", (0.001,)), ("WAKE_REPS", 1),
                        ("ROUNDS", 2), ("BATCHES", ((1, 8), (4, 8)))):
        monkeypatch.setattr(probes, name, value)
    good = tmp_path / "tiny.yaml"
    good.write_text(yaml.safe_dump(DOC))
    assert main(["serve", str(good), "--run", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured"]["requests"] == out["requests"] == 10
    assert out["measured"]["iterations"] == out["iterations"]          # offline: the same decisions
    kept = yaml.safe_load((tmp_path / "serving.yaml").read_text())["models"]
    assert list(kept) == [model_key(plan_of().model, "fp32")]
    assert main(["serve", str(good), "--run"]) == 0                    # the calibration kept is used
    text = capsys.readouterr()
    assert "measured on this host's serving loop" in text.out and "measuring" not in text.err
