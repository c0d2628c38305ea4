"""Run cost: hand-worked checkpoint intervals, exact no-failure costs, scaling, storage, energy, Monte-Carlo."""
from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from simcore.planner import runcost as rcm
from simcore.model import workload as wl
from simcore.engine.runs import monte_carlo_runs, simulate_training_run
from simcore.planner.failures import (checkpoint_bytes, daly_interval_s, expected_wall_s, plan_checkpoints,
                                      storage_bytes_per_s, young_interval_s)
from simcore.planner.runcost import run_cost
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError
from topologies.hardware import load_catalog


def small_plan(nodes: int = 2, node: str = "dgx-h100", storage: str = "lustre"):
    return plan_from_dict({
        "model": "gpt-1.7b",
        "cluster": {"node": node, "nodes": nodes, "storage": storage},
        "parallel": {"tp": 8, "pp": 1, "dp": nodes},
        "training": {"global_batch": 16 * nodes, "micro_batch": 1},
    })


def pred(step_s: float, compute_s: float | None = None):
    return SimpleNamespace(step_time_s=step_s, compute_s=step_s if compute_s is None else compute_s)


# --------------------------------------------------------------------------- intervals

def test_young_interval_hand_worked():
    # C = 60 s, M = 1 day: sqrt(2 * 60 * 86400) = sqrt(10,368,000) = 3219.937888 s
    assert young_interval_s(60.0, 86400.0) == pytest.approx(3219.937888, rel=1e-9)


def test_daly_interval_hand_worked():
    # x = C/2M = 60/172800 = 3.472222e-4; sqrt(x) = 0.01863390;
    # 3219.937888 * (1 + 0.01863390/3 + 3.472222e-4/9) - 60 = 3219.937888 * 1.00625005 - 60 = 3180.0627
    assert daly_interval_s(60.0, 86400.0) == pytest.approx(3180.0627, rel=1e-6)
    assert daly_interval_s(300.0, 100.0) == 100.0           # C >= 2M: checkpoint every M
    assert daly_interval_s(60.0, math.inf) == math.inf       # never fails: never checkpoint


def test_daly_wall_time_hand_worked():
    # M = 10 h, R = 0.5 h, tau = 1 h, C = 0.1 h, T_s = 100 h:
    # 10 e^0.05 (e^0.11 - 1) * 100 = 10 * 1.0512711 * 0.1162781 * 100 = 122.2400 h
    wall = expected_wall_s(100 * 3600, 3600, 360, 1800, 36000)
    assert wall / 3600 == pytest.approx(122.2400, rel=1e-5)
    # no failures: exactly the work plus one write per interval but the last (99 of them)
    assert expected_wall_s(100 * 3600, 3600, 360, 1800, math.inf) == 100 * 3600 + 99 * 360


# --------------------------------------------------------------------------- exact costs

def test_no_failures_costs_exactly_gpu_hours_times_price():
    plan = small_plan()
    tokens_per_step = plan.training.global_batch * plan.model.seq_len      # 32 x 2048 = 65,536
    rc = run_cost(plan, pred(2.0), 1000 * tokens_per_step, failures=False, monte_carlo=0)
    assert rc.steps == 1000
    assert rc.on_demand.wall_s == 2000.0
    assert rc.gpu_hours == 16 * 2000.0 / 3600                               # 8.888... GPU-hours
    price = load_catalog().prices.gpus["h100-sxm"]
    assert rc.on_demand.usd == pytest.approx(rc.gpu_hours * price.on_demand_usd, rel=1e-12)
    assert rc.reserved.usd == pytest.approx(rc.gpu_hours * price.reserved_usd, rel=1e-12)
    assert rc.spot.usd == pytest.approx(rc.gpu_hours * price.spot_usd, rel=1e-12)
    assert rc.on_demand.goodput == 1.0 and rc.checkpoint.interval_s == math.inf


def test_doubling_nodes_at_perfect_scaling_halves_days_and_keeps_gpu_hours():
    a, b = small_plan(nodes=2), small_plan(nodes=4)
    b = replace(b, training=replace(b.training, global_batch=a.training.global_batch))
    tokens = 2e9
    ra = run_cost(a, pred(3.0), tokens, failures=False, monte_carlo=0)
    rb = run_cost(b, pred(1.5), tokens, failures=False, monte_carlo=0)   # twice the GPUs, half the step
    assert rb.days == pytest.approx(ra.days / 2, rel=1e-12)
    assert rb.gpu_hours == pytest.approx(ra.gpu_hours, rel=1e-12)
    assert rb.on_demand.usd == pytest.approx(ra.on_demand.usd, rel=1e-12)


def test_price_overrides_and_plan_price():
    plan = small_plan()
    rc = run_cost(plan, pred(1.0), 1e9, prices={"on_demand_usd": 1.0}, failures=False, monte_carlo=0)
    assert rc.on_demand.usd == pytest.approx(rc.gpu_hours)
    own = replace(plan, cluster=replace(plan.cluster, price_per_gpu_hour=2.5))
    assert run_cost(own, pred(1.0), 1e9, failures=False, monte_carlo=0).on_demand.usd == \
        pytest.approx(2.5 * rc.gpu_hours)
    with pytest.raises(PlanError, match="unknown price override 'dollars'"):
        run_cost(plan, pred(1.0), 1e9, prices={"dollars": 1.0})
    with pytest.raises(PlanError, match="tokens"):
        run_cost(plan, pred(1.0), 0)


def test_energy_at_full_utilisation_is_node_power_times_pue():
    plan = small_plan()
    rc = run_cost(plan, pred(2.0, 2.0), 100 * 65536, failures=False, monte_carlo=0)
    node, pue = plan.cluster.node, load_catalog().prices.pue
    # GPUs at TDP plus the rest of the node at system power less its GPUs: the node's system power
    assert rc.energy_kwh == pytest.approx(2 * node.system_power_w * 200.0 * pue / 3.6e6, rel=1e-12)
    idle = run_cost(plan, pred(2.0, 0.0), 100 * 65536, failures=False, monte_carlo=0)
    saved = 16 * node.gpu.tdp_w * (1 - rcm.GPU_IDLE_POWER_FRACTION) * 200.0 * pue / 3.6e6
    assert rc.energy_kwh - idle.energy_kwh == pytest.approx(saved, rel=1e-12)


# --------------------------------------------------------------------------- storage

def test_checkpoint_size_and_write_time_through_shared_storage():
    plan = small_plan(nodes=2, storage="lustre")
    lustre = load_catalog().storage["lustre"]
    params = wl.param_counts(plan.model).total
    assert checkpoint_bytes(plan) == params * (2 + 12)          # bf16 weights + fp32 master, m, v
    # 2 nodes x 25 GB/s client links < 65 GB/s appliance: the clients bound the write
    assert storage_bytes_per_s(lustre, 2, write=True) == 50e9
    assert storage_bytes_per_s(lustre, 4, write=True) == 65e9     # now the appliance does
    ck = plan_checkpoints(plan, lustre, mtbf_s=86400.0)
    assert ck.write_s == pytest.approx(params * 14 / 50e9 + lustre.latency_s)
    assert ck.interval_s == pytest.approx(daly_interval_s(ck.write_s, 86400.0))
    nvme = load_catalog().storage["local-nvme"]
    assert storage_bytes_per_s(nvme, 4, write=True) == 4 * nvme.write_bytes_per_s


def test_tiered_checkpoint_blocks_only_for_the_host_copy():
    plan = small_plan()
    st = replace(load_catalog().storage["lustre"], write_bytes_per_s=1e9, per_client_bytes_per_s=1e9)
    ck = plan_checkpoints(plan, st, mtbf_s=3600.0, tiered=True)
    assert ck.blocking_s == pytest.approx(checkpoint_bytes(plan) / 16 / plan.cluster.node.gpu.pcie_bytes_per_s)
    assert ck.write_s > ck.blocking_s
    assert ck.interval_s >= ck.write_s                               # the drain must finish first


def test_slow_storage_bounds_the_step():
    plan = small_plan()
    st = replace(load_catalog().storage["s3"], read_bytes_per_s=1e5, per_client_bytes_per_s=1e5)
    rc = run_cost(plan, pred(0.5), 1e8, storage=st, failures=False, monte_carlo=0)
    floor = 32 * 2048 * 2 / 1e5                       # 65,536 tokens of 2 bytes (vocab 51,200) at 100 kB/s
    assert rc.data["storage_bound"] and rc.effective_step_time_s == pytest.approx(floor)
    assert any("storage, not GPUs, bounds the step" in n for n in rc.notes)
    assert not run_cost(plan, pred(0.5), 1e8, failures=False, monte_carlo=0).data["storage_bound"]


# --------------------------------------------------------------------------- failures

def test_failures_and_preemptions_cost_time():
    plan = small_plan()
    ideal = run_cost(plan, pred(1.0), 1e11, failures=False, monte_carlo=0)
    real = run_cost(plan, pred(1.0), 1e11, monte_carlo=0)
    assert real.on_demand.wall_s > ideal.on_demand.wall_s
    assert real.spot.wall_s > real.on_demand.wall_s                     # preemptions on top
    od = real.on_demand
    parts = real.useful_s + od.checkpoint_total_s + od.restart_total_s + od.lost_work_s
    assert parts == pytest.approx(od.wall_s, rel=1e-9)
    assert od.expected_interruptions > 0 and 0 < od.goodput < 1


def test_simpy_run_without_failures_is_exact():
    r = simulate_training_run(work_s=10.5, interval_s=2.0, checkpoint_s=0.25, restore_s=1.0, restart_s=1.0,
                              failure_rate_per_s=0.0, rng=np.random.default_rng(0))
    assert r.checkpoints == 5 and r.wall_s == 10.5 + 5 * 0.25 and r.interruptions == 0


def test_monte_carlo_agrees_with_daly_and_is_seeded():
    kw = dict(work_s=100 * 3600.0, interval_s=3600.0, checkpoint_s=360.0, restore_s=1800.0, restart_s=0.0,
              failure_rate_per_s=1 / 36000.0)
    runs = monte_carlo_runs(300, 7, **kw)
    mean = np.mean([r.wall_s for r in runs])
    assert mean == pytest.approx(expected_wall_s(100 * 3600, 3600, 360, 1800, 36000), rel=0.02)
    assert [r.wall_s for r in monte_carlo_runs(3, 7, **kw)] == [r.wall_s for r in runs[:3]]
    for r in runs[:20]:   # the parts add up to the wall time (recovery cut short counts as restart)
        assert r.wall_s >= kw["work_s"] + r.checkpoint_s + r.lost_work_s - 1e-6


def test_run_cost_monte_carlo_percentiles():
    plan = small_plan(nodes=8)
    rc = run_cost(plan, pred(1.0), 2e12, monte_carlo=40, seed=3,
                  prices={"failures_per_gpu_hour": 1e-3})
    mc = rc.on_demand.monte_carlo
    assert mc["runs"] == 40 and mc["days_p50"] <= mc["days_p90"]
    assert mc["days_p50"] == pytest.approx(rc.days, rel=0.05)
    assert rc.reserved.monte_carlo["days_p50"] == mc["days_p50"]
    js = rc.to_json()
    assert js["days"] == rc.days and js["on_demand"]["monte_carlo"]["seed"] == 3
