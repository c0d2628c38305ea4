"""The serving plan, the per-iteration cost and the serving engine: no win for nothing, the
closed form in a steady state, one sentence for a bad field, the command's figures."""
from __future__ import annotations

from pathlib import Path

import pytest

from simcore.engine.serving import simulate_serving
from simcore.serving.cost import decode_s, iteration_s, replica_cost
from simcore.serving.load import load_serving_plan, serving_from_dict
from simcore.serving.spec import PlanError
from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[2]


def plan(tp=1, model="llama3-8b", node="dgx-h100", **sections):
    doc = {"model": model, "hardware": {"node": node}, "parallel": {"tp": tp},
           "traffic": {"arrival": "poisson", "rate": 5, "num_requests": 200, "prompt_len": 512, "output_len": 64}}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value}
    return serving_from_dict(doc)


def test_more_load_never_lowers_latency_percentiles():
    low = simulate_serving(plan(traffic={"rate": 5}))
    high = simulate_serving(plan(traffic={"rate": 40}))
    for a, b in ((low.ttft, high.ttft), (low.e2e, high.e2e), (low.tpot, high.tpot)):
        assert all(y >= x * (1 - 1e-9) for x, y in zip(a, b))


def test_a_larger_kv_budget_never_lowers_throughput():
    traffic = {"arrival": "offline", "num_requests": 400, "prompt_len": 2048, "output_len": 256}
    small = simulate_serving(plan(traffic=traffic, kv_cache={"gpu_memory_utilization": 0.25}))
    large = simulate_serving(plan(traffic=traffic, kv_cache={"gpu_memory_utilization": 0.9}))
    assert small.kv_blocks < large.kv_blocks and small.preemptions > 0
    assert large.output_tok_s >= small.output_tok_s


def test_decode_time_grows_with_context_and_batch():
    rc = replica_cost(plan())
    times = [decode_s(rc, 32, ctx) for ctx in (128, 1024, 4096, 16384)]
    assert times == sorted(times) and times[-1] > times[0]
    assert decode_s(rc, 64, 1024) >= decode_s(rc, 32, 1024)


@pytest.mark.parametrize("model", ["llama3-8b", "llama3-70b"])
def test_tp2_never_more_than_halves_a_decode_step(model):
    fp8 = {"weights": "fp8", "activations": "fp8", "kv_cache": "fp8"}
    one, two = (replica_cost(plan(model=model, tp=tp, node="hgx-h200", precision=fp8)) for tp in (1, 2))
    for seqs in (1, 16, 128):
        for ctx in (256, 4096):
            assert decode_s(two, seqs, ctx) >= decode_s(one, seqs, ctx) / 2


def test_offline_throughput_is_the_closed_form_in_a_steady_state():
    b, prompt, out, waves = 16, 64, 32, 3
    p = plan(traffic={"arrival": "offline", "num_requests": waves * b, "prompt_len": prompt, "output_len": out},
             scheduler={"max_num_seqs": b})
    rc = replica_cost(p)
    wave = iteration_s(rc, b * prompt, b * prompt * (prompt + 1) / 2, 0, b)
    for j in range(1, out):
        ctx = b * (prompt + j - 1)
        wave += iteration_s(rc, b, ctx + b, ctx, b)
    r = simulate_serving(p, rc)
    assert r.output_tok_s == pytest.approx(waves * b * out / (waves * wave), rel=1e-9)
    assert r.tpot[0] == pytest.approx((wave - iteration_s(rc, b * prompt, b * prompt * (prompt + 1) / 2, 0, b)) / (out - 1))


@pytest.mark.parametrize("edit, sentence", [
    ({"parallel": {"tp": 3}}, "parallel.tp=3 does not divide model.heads=32"),
    ({"scheduler": {"max_num_seqs": 0}}, "scheduler.max_num_seqs=0 must be at least 1"),
    ({"precision": {"kv_cache": "int3"}}, "precision.kv_cache='int3' is not one of: bf16, fp16, fp8, int8, int4, fp32"),
    ({"traffic": {"arrival": "poisson", "rate": 0}}, "traffic.rate=0 must be positive"),
])
def test_a_bad_field_is_one_sentence(edit, sentence):
    with pytest.raises(PlanError) as exc:
        plan(**edit)
    assert str(exc.value) == sentence


def test_an_unknown_field_is_named():
    with pytest.raises(PlanError, match=r"unknown field 'scheduler.max_seqs'"):
        plan(scheduler={"max_seqs": 8})


def test_example_plans_load():
    for path in sorted((ROOT / "plans/serving").glob("*.yaml")):
        assert load_serving_plan(path).gpus >= 1


def test_serve_prints_the_figures(tmp_path, capsys):
    f = tmp_path / "serve.yaml"
    f.write_text("model: llama3-8b\nhardware: {node: dgx-h100}\nparallel: {tp: 1, replicas: 2}\n"
                 "traffic: {arrival: poisson, rate: 8, num_requests: 100, prompt_len: 256, output_len: 32}\n")
    assert main(["serve", str(f)]) == 0
    out = capsys.readouterr().out
    for word in ("TTFT", "TPOT", "end-to-end latency", "output tok/s", "total tok/s", "KV occupancy", "p99",
                 "on_demand admission"):
        assert word in out


def test_serve_bad_plan_exit_2(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text("model: llama3-8b\nhardware: {node: dgx-h100}\nparallel: {tp: 3}\n"
                 "traffic: {arrival: offline, num_requests: 10, prompt_len: 8, output_len: 8}\n")
    assert main(["serve", str(f)]) == 2
    assert capsys.readouterr().err.strip() == "trainplan: error: parallel.tp=3 does not divide model.heads=32"
