"""A closed loop of clients (arrival: concurrency): never more requests outstanding than clients,
each new request sent the moment another finishes, and Little's law (clients = throughput x
latency) in the steady state."""
from __future__ import annotations

import numpy as np
import pytest

from simcore.engine.serving import ServingTimeline, simulate_serving
from simcore.serving.load import serving_from_dict
from simcore.serving.spec import PlanError


def plan(clients=24, replicas=1, n=300, **traffic):
    return serving_from_dict({"model": "llama3-8b", "hardware": {"node": "dgx-h100"},
                              "parallel": {"tp": 1, "replicas": replicas},
                              "traffic": {"arrival": "concurrency", "concurrency": clients, "num_requests": n,
                                          "prompt_len": 700, "output_len": 90, **traffic}})


@pytest.mark.parametrize("replicas", [1, 3])
def test_the_clients_bound_the_requests_outstanding(replicas):
    tl = ServingTimeline()
    r = simulate_serving(plan(replicas=replicas), timeline=tl)
    assert r.requests == 300 and np.all(np.isfinite(tl.finish))
    for t in np.unique(tl.arrivals):
        outstanding = np.count_nonzero((tl.arrivals <= t) & (tl.finish > t))
        assert outstanding <= 24
    late = tl.arrivals[tl.arrivals > 0]
    assert np.count_nonzero(tl.arrivals == 0) == 24 and np.isin(late, tl.finish).all()
    # Little's law: the clients are always busy (no think time) but for the tail
    e2e = (tl.finish - tl.arrivals).mean()
    assert r.req_s * e2e == pytest.approx(24, rel=0.1)


def test_more_clients_raise_throughput_and_latency():
    few, many = simulate_serving(plan(clients=8)), simulate_serving(plan(clients=64))
    assert many.output_tok_s > few.output_tok_s and many.e2e[0] > few.e2e[0]


def test_a_closed_loop_needs_its_clients():
    with pytest.raises(PlanError, match="traffic.arrival=concurrency needs traffic.concurrency"):
        plan(clients=0)


def test_fewer_clients_than_replicas_leave_replicas_idle():
    r = simulate_serving(plan(clients=2, replicas=3, n=40))
    assert r.requests == 40 and np.isfinite(r.makespan_s) and r.e2e[2] > 0
