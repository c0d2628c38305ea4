"""Prefill/decode disaggregation: the prefill pool serves every request to its first token exactly
as a pool of its own would, the KV cache then travels over NVLink or the NICs, and the decode
pool finishes every request; the GPUs of both pools are counted."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from simcore.engine.serving import ServingTimeline, kv_transfer_s, request_lengths, simulate_serving
from simcore.serving.cost import kv_bytes_per_token
from simcore.serving.load import serving_from_dict
from simcore.serving.spec import PlanError

TRAFFIC = {"arrival": "poisson", "rate": 5, "num_requests": 200, "prompt_len": 1536, "output_len": 96}


def plan(nodes=None, **extra):
    hw = {"node": "dgx-h100", **({"nodes": nodes} if nodes else {})}
    return serving_from_dict({"model": "llama3-8b", "hardware": hw, "parallel": {"tp": 1, "replicas": 2},
                              "disaggregation": {"prefill_tp": 2, "prefill_replicas": 1},
                              "traffic": TRAFFIC, **extra})


def test_the_first_token_is_the_prefill_pools_own():
    p = plan()
    tl = ServingTimeline()
    r = simulate_serving(p, timeline=tl)
    alone = serving_from_dict({"model": "llama3-8b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 2},
                               "traffic": {**TRAFFIC, "output_len": 1}})
    ta = ServingTimeline()
    simulate_serving(alone, timeline=ta)
    assert np.array_equal(tl.first, ta.first)
    assert p.gpus == 4 and r.requests == 200 and np.all(tl.finish > tl.first)
    prompt, output = request_lengths(p)
    assert r.output_tok_s * r.makespan_s == pytest.approx(output.sum())


def test_the_kv_cache_travels_over_nvlink_or_the_nics():
    one, two = plan(), plan(nodes=2)
    prompt = np.array([1536])
    pre = replace(one, tp=2, replicas=1, disaggregation=None)
    gpu, fabric = one.cluster.node.gpu, two.cluster.fabric
    assert kv_transfer_s(one, pre, prompt)[0] == pytest.approx(1536 * kv_bytes_per_token(pre) / gpu.intra_link_bytes_per_s)
    # a pool beyond one NVLink domain sends over the NICs
    wide = replace(two, replicas=8, cluster=two.cluster)
    assert kv_transfer_s(wide, pre, prompt)[0] == pytest.approx(1536 * kv_bytes_per_token(pre) / fabric.nic_bytes_per_s)
    assert kv_transfer_s(wide, pre, prompt)[0] > kv_transfer_s(one, pre, prompt)[0]


def test_decode_instances_never_preempt():
    small = plan(kv_cache={"gpu_memory_utilization": 0.3}, traffic={**TRAFFIC, "rate": 40})
    assert simulate_serving(small).preemptions == 0


@pytest.mark.parametrize("edit, words", [
    ({"traffic": {**TRAFFIC, "arrival": "concurrency", "concurrency": 8}},
     "traffic.arrival=concurrency with disaggregation is not simulated"),
    ({"disaggregation": {"prefill_tp": 3, "prefill_replicas": 1}}, "disaggregation.prefill_tp=3 must divide"),
    ({"disaggregation": {"prefill_tp": 2, "prefill_replicas": 1}, "hardware": {"node": "dgx-h100", "nodes": 1},
      "parallel": {"tp": 2, "replicas": 4}}, "the plan's 10 GPUs"),
])
def test_a_bad_disaggregation_is_one_sentence(edit, words):
    doc = {"model": "llama3-8b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 1, "replicas": 2},
           "disaggregation": {"prefill_tp": 2, "prefill_replicas": 1}, "traffic": TRAFFIC, **edit}
    with pytest.raises(PlanError, match=words):
        serving_from_dict(doc)


def test_the_search_sizes_each_pool_to_its_own_target():
    """serve-plan --disaggregate: the fewest prefill instances whose prompts-only run meets the
    TTFT target, then the fewest decode instances that meet the SLO behind them; both pools
    priced."""
    from simcore.planner.serving_disagg_search import prompts_only
    from simcore.planner.serving_search import at_rate, capacity_search
    from simcore.serving.spec import SloSpec

    base = serving_from_dict({"model": "llama3-8b", "hardware": {"node": "dgx-h100"},
                              "traffic": {**TRAFFIC, "rate": 30, "num_requests": 300}})
    slo = SloSpec(ttft_s=0.25, tpot_s=0.012, percentile=90)
    res = capacity_search(base, slo=slo, rate=30, gpus=["h100-sxm"], precisions=["bf16"], tps=[1, 2],
                          disaggregated=True)
    met = [o for o in res.options if o.met]
    assert met and all(o.prefill_tp in (1, 2) and o.prefill_replicas >= 1 for o in met)
    o = met[0]
    assert o.gpus == o.tp * o.replicas + o.prefill_tp * o.prefill_replicas
    assert o.usd_per_mtok["on_demand"] == pytest.approx(o.gpus * o.usd_per_gpu_hour["on_demand"] /
                                                        (30 * TRAFFIC["output_len"] * 3600 / 1e6))
    pre = replace(prompts_only(at_rate(base, 30)), tp=o.prefill_tp)
    if o.prefill_replicas > 1:   # one prefill instance fewer misses the TTFT target
        assert simulate_serving(replace(pre, replicas=o.prefill_replicas - 1), slo=slo).slo_ttft_s > slo.ttft_s
    assert simulate_serving(replace(pre, replicas=o.prefill_replicas), slo=slo).slo_ttft_s <= slo.ttft_s
    assert o.result.slo_met


def test_serve_plan_prints_the_pools(tmp_path, capsys):
    import json

    from trainplan.cli import main

    f = tmp_path / "p.yaml"
    f.write_text(json.dumps({"model": "llama3-8b", "hardware": {"node": "dgx-h100"},
                             "traffic": {**TRAFFIC, "rate": 10, "num_requests": 200},
                             "slo": {"ttft_ms": 500, "tpot_ms": 40}}))
    assert main(["serve-plan", str(f), "--gpus", "h100-sxm", "--tp", "1", "--precisions", "bf16",
                 "--disaggregate", "--frontier", "0"]) == 0
    out = capsys.readouterr().out
    assert "prefill TP x decode TP" in out and "P TP1 x " in out and "prefill instance(s) of TP1" in out
