"""TensorRT-LLM's capacity policies beside vLLM's on-demand blocks: a reservation to completion
never preempts and never holds more requests than the cache can finish; a static batch runs
to its end before the next one starts."""
from __future__ import annotations

import math

import pytest

from simcore.engine.serving import simulate_serving
from simcore.serving.cost import activation_bytes, iteration_s, kv_bytes_per_token, replica_cost, weight_bytes
from simcore.serving.load import serving_from_dict
from simcore.serving.spec import CapacityPolicy, PlanError


def plan(policy="on_demand", **sections):
    doc = {"model": "llama3-8b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 1},
           "scheduler": {"capacity_policy": policy},
           "traffic": {"arrival": "offline", "num_requests": 120, "prompt_len": 4096, "output_len": 512}}
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value}
    return serving_from_dict(doc)


def test_the_policy_is_read_and_a_bad_one_is_one_sentence():
    assert plan("guaranteed_no_evict").scheduler.capacity_policy == CapacityPolicy.GUARANTEED_NO_EVICT
    assert plan().scheduler.capacity_policy == CapacityPolicy.ON_DEMAND
    with pytest.raises(PlanError) as exc:
        plan("lru")
    assert str(exc.value) == ("scheduler.capacity_policy='lru' is not one of: "
                              "on_demand, guaranteed_no_evict, static_batch")


def test_a_reservation_to_completion_never_preempts_where_on_demand_does():
    small = {"gpu_memory_utilization": 0.3}
    lazy = simulate_serving(plan(kv_cache=small))
    gne = simulate_serving(plan("guaranteed_no_evict", kv_cache=small))
    assert lazy.preemptions > 0 and gne.preemptions == 0
    assert gne.kv_occupancy_max <= 1.0
    # at most as many requests run as the cache can carry to their end: the first tokens come in
    # waves of at most floor(blocks / reservation) requests
    p = plan("guaranteed_no_evict", kv_cache=small)
    per_request = math.ceil((4096 + 512) / p.kv_cache.block_size)
    assert replica_cost(p).kv_blocks // per_request < 120
    assert gne.requests == lazy.requests == 120


def test_a_static_batch_runs_to_its_end_before_the_next():
    b, prompt, out = 8, 256, 16
    one = plan("static_batch", scheduler={"max_num_seqs": b, "max_num_batched_tokens": 1024},
               traffic={"num_requests": b, "prompt_len": prompt, "output_len": out})
    three = plan("static_batch", scheduler={"max_num_seqs": b, "max_num_batched_tokens": 1024},
                 traffic={"num_requests": 3 * b, "prompt_len": prompt, "output_len": out})
    gne = plan("guaranteed_no_evict", scheduler={"max_num_seqs": b, "max_num_batched_tokens": 1024},
               traffic={"num_requests": 3 * b, "prompt_len": prompt, "output_len": out})
    r1, r3, rg = simulate_serving(one), simulate_serving(three), simulate_serving(gne)
    assert r3.makespan_s == pytest.approx(3 * r1.makespan_s, rel=1e-9)
    assert r3.iterations == 3 * r1.iterations
    # continuous batching starts the next prompts while the batch decodes: never slower
    assert rg.makespan_s <= r3.makespan_s * (1 + 1e-9)


def test_a_static_batch_whose_prompts_exceed_the_budget_prefills_them_in_turn():
    """The whole batch is admitted at once; its prompts take the token budget in turn."""
    b, prompt, out = 4, 512, 2
    p = plan("static_batch", scheduler={"max_num_seqs": b, "max_num_batched_tokens": 1024, "chunked_prefill": False},
             traffic={"num_requests": b, "prompt_len": prompt, "output_len": out})
    rc = replica_cost(p)
    pairs = prompt * (prompt + 1) / 2
    # 1: two prompts fill the budget; 2: their decodes leave room for one more whole prompt;
    # 3: its decode and the last prompt; 4: the last decode
    steps = [iteration_s(rc, 2 * prompt, 2 * pairs, 0, 2),
             iteration_s(rc, prompt + 2, pairs + 2 * prompt + 2, 2 * prompt, 3),
             iteration_s(rc, prompt + 1, pairs + prompt + 1, prompt, 2),
             iteration_s(rc, 1, prompt + 1, prompt, 1)]
    r = simulate_serving(p, rc)
    assert r.iterations == 4
    assert r.makespan_s == pytest.approx(sum(steps), rel=1e-9)


def test_tensorrt_llms_kv_share_is_of_the_memory_left():
    p = plan(kv_cache={"free_memory_fraction": 0.95})
    held = weight_bytes(p)
    left = p.cluster.node.gpu.hbm_bytes - held - activation_bytes(p)
    assert replica_cost(p).kv_blocks == int(0.95 * left // (kv_bytes_per_token(p) * p.kv_cache.block_size))
    with pytest.raises(PlanError, match="not both"):
        plan(kv_cache={"free_memory_fraction": 0.9, "gpu_memory_utilization": 0.9})
    with pytest.raises(PlanError) as exc:
        plan(kv_cache={"free_memory_fraction": 1.5})
    assert str(exc.value) == "kv_cache.free_memory_fraction=1.5 must be in (0, 1]"
