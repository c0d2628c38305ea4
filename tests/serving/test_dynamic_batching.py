"""Dynamic batching (``scheduler.batch_window_s`` with ``static_batch``): a batch forms when
``max_num_seqs`` requests wait or the oldest has waited the window, then runs to its end, as
TorchServe's batchSize / maxBatchDelay and Triton's dynamic batcher run it; on every router."""
from __future__ import annotations

import numpy as np
import pytest

from simcore.engine.serving import simulate_serving
from simcore.serving.load import serving_from_dict
from simcore.serving.spec import PlanError


def plan(window: float | None = 0.0, traffic: dict | None = None, **top):
    scheduler = {"capacity_policy": "static_batch", "max_num_seqs": 8}
    if window is not None:
        scheduler["batch_window_s"] = window
    doc = {"model": "llama3-8b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 1}, "scheduler": scheduler,
           "traffic": {"arrival": "offline", "num_requests": 1, "prompt_len": 512, "output_len": 16,
                       **(traffic or {})}, **top}
    return serving_from_dict(doc)


def test_no_window_is_the_static_batch():
    poisson = {"arrival": "poisson", "rate": 4.0, "num_requests": 60}
    a, b = simulate_serving(plan(0.0, poisson)), simulate_serving(plan(None, poisson))
    assert (a.ttft, a.e2e, a.makespan_s) == (b.ttft, b.e2e, b.makespan_s)


def test_a_lone_request_waits_the_window_and_a_full_batch_none():
    alone, waited = simulate_serving(plan(0.0)), simulate_serving(plan(0.25))
    assert waited.ttft_mean == pytest.approx(alone.ttft_mean + 0.25)
    full = {"num_requests": 8}   # max_num_seqs wait at once: the batch forms at once
    assert simulate_serving(plan(0.25, full)).ttft == simulate_serving(plan(0.0, full)).ttft


@pytest.mark.parametrize("router, replicas", [("round_robin", 1), ("round_robin", 2), ("least_outstanding", 2)])
def test_a_window_trades_latency_for_fuller_batches(router, replicas):
    """At a light load a window gathers more requests a batch: fewer iterations for the same work,
    every first token later than without it by no more than the window and a batch's run."""
    poisson = {"arrival": "poisson", "rate": 6.0, "num_requests": 120, "seed": 3}
    top = {"router": router, "parallel": {"tp": 1, "replicas": replicas}}
    none, wide = simulate_serving(plan(0.0, poisson, **top)), simulate_serving(plan(0.4, poisson, **top))
    assert wide.requests == none.requests == 120
    assert wide.iterations < none.iterations
    assert wide.ttft_mean > none.ttft_mean
    assert wide.ttft[2] <= none.ttft[2] + 0.4 + wide.e2e[2]


def test_a_closed_loop_holds_its_first_batch_for_the_window():
    clients = {"arrival": "concurrency", "concurrency": 3, "num_requests": 12}
    none, wide = simulate_serving(plan(0.0, clients)), simulate_serving(plan(0.1, clients))
    assert wide.requests == 12 and np.isfinite(wide.ttft_mean)
    # 3 clients never fill a batch of 8: each batch waits the window from its first request's send
    assert wide.ttft_mean == pytest.approx(none.ttft_mean + 0.1)


@pytest.mark.parametrize("scheduler, words", [
    ({"capacity_policy": "on_demand", "batch_window_s": 0.1}, "scheduler.batch_window_s=0.1 is dynamic batching"),
    ({"capacity_policy": "static_batch", "batch_window_s": -1}, "scheduler.batch_window_s=-1 must be 0 or more"),
    ({"capacity_policy": "static_batch", "batch_window_s": "soon"}, "scheduler.batch_window_s must be a number"),
])
def test_bad_input_is_one_sentence_naming_the_field(scheduler, words):
    doc = {"model": "llama3-8b", "hardware": {"node": "dgx-h100"}, "parallel": {"tp": 1}, "scheduler": scheduler,
           "traffic": {"arrival": "offline", "num_requests": 1, "prompt_len": 512, "output_len": 16}}
    with pytest.raises(PlanError) as err:
        serving_from_dict(doc)
    assert words in str(err.value) and "\n" not in str(err.value)
