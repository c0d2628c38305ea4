"""The host costs after a calibration (``executors.calibrate.profile``): their pooling
over this host's past calibrations, the point-to-point figures in the simulator's unit,
and the refresh of the load-sensitive figures before a validation run."""
from pathlib import Path

import pytest
import yaml

from executors.calibrate import parallel_probes as pprobes
from executors.calibrate import profile as cal


def test_host_costs_are_pooled_over_this_hosts_last_calibrations():
    def prof(tp, chunk, date, host="vm"):
        return {"measured_on": {"host": host, "torch": "2.13.0+cpu", "device": "cpu", "date": date},
                "efficiency": {"parallel_host": {"tp": {"forward_kernels": tp, "backward_kernels": 2 * tp},
                                                 "pipeline_chunk": {"forward_kernels": chunk, "backward_kernels": 1.0},
                                                 "p2p_send_kernels": 3.0, "source": "probe"}}}

    # a first calibration stands alone
    first = cal.pool_host_costs(prof(100.0, 1.0, "d1"), None)
    assert first["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 100.0
    # the next ones take the median per entry and direction over the history kept so far
    second = cal.pool_host_costs(prof(60.0, 5.0, "d2"), first)
    third = cal.pool_host_costs(prof(110.0, 2.0, "d3"), second)
    ph = third["efficiency"]["parallel_host"]
    assert ph["tp"] == {"forward_kernels": 100.0, "backward_kernels": 200.0}
    assert ph["pipeline_chunk"]["forward_kernels"] == 2.0 and ph["pooled_calibrations"] == 3
    assert ph["p2p_send_kernels"] == 3.0                  # re-measured by every refresh: not pooled
    assert "median over the last 3" in ph["source"] and ph["source"].count("pooled:") == 1
    # only the last HOST_COST_HISTORY calibrations count
    cur = third
    for i in range(cal.HOST_COST_HISTORY):
        cur = cal.pool_host_costs(prof(10.0, 1.0, f"e{i}"), cur)
    assert cur["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 10.0
    assert len(cur["raw"]["host_cost_history"]) == cal.HOST_COST_HISTORY
    # a profile from before the history counts with its own figures
    legacy = prof(80.0, 1.0, "d0")
    assert cal.pool_host_costs(prof(60.0, 1.0, "d1"), legacy)["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 70.0
    # another host's (or torch's) history is not mixed in
    other = cal.pool_host_costs(prof(50.0, 1.0, "f1", host="other"), third)
    assert other["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 50.0
    assert len(other["raw"]["host_cost_history"]) == 1
    # nor a history measured by another probe method, nor a legacy profile of one
    newer = prof(40.0, 1.0, "g1")
    newer["efficiency"]["parallel_host"]["probe_method"] = pprobes.PARALLEL_PROBE_METHOD
    pooled = cal.pool_host_costs(newer, third)
    assert pooled["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 40.0
    assert pooled["raw"]["host_cost_history"][-1]["method"] == pprobes.PARALLEL_PROBE_METHOD
    assert cal.pool_host_costs(prof(40.0, 1.0, "g2"), legacy)["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 60.0
    # the wrappers' communication shares are pooled alike, over the calibrations that measured them
    cur = first
    for share, date in (([0.2, 0.4], "h1"), ([0.6, 0.5], "h2"), ([0.5, 0.9], "h3")):
        p = prof(100.0, 1.0, date)
        p["efficiency"]["parallel_host"]["comm_share"] = {"tp": share}
        cur = cal.pool_host_costs(p, cur)
    assert cur["efficiency"]["parallel_host"]["comm_share"] == {"tp": [0.5, 0.5]}
    # the grouped probe's point-to-point figures, which no refresh re-measures, are pooled too
    cur = first
    for lat, date in ((30.0, "k1"), (25.0, "k2"), (4.0, "k3")):
        p = prof(100.0, 1.0, date)
        p["efficiency"]["parallel_host"].update({"p2p_latency_kernels@4": lat, "p2p_latency_kernels": lat})
        cur = cal.pool_host_costs(p, cur)
    assert cur["efficiency"]["parallel_host"]["p2p_latency_kernels@4"] == 25.0
    assert cur["efficiency"]["parallel_host"]["p2p_latency_kernels"] == 4.0   # this calibration's own
    assert [h.get("p2p_latency_kernels@4") for h in cur["raw"]["host_cost_history"]] == [None, 30.0, 25.0, 4.0]
    assert len(cur["raw"]["host_cost_history"]) == 4      # the first had no shares: not in their median


def test_host_costs_pool_in_a_share_of_the_executors_one_rank_step():
    def prof(tp, opt, unit_us, step_s, date):
        return {"measured_on": {"host": "vm", "torch": "2.13.0+cpu", "device": "cpu", "date": date},
                "efficiency": {"host_overhead_us": unit_us, "host_overhead_source": "probe layer",
                               "parallel_host": {"tp": {"forward_kernels": tp, "backward_kernels": 2 * tp},
                                                 "optimizer_per_tensor_kernels": opt,
                                                 "p2p_send_kernels": 3.0, "source": "probe"}},
                "raw": {"executor_one_rank": {"forward": step_s / 2, "backward": step_s / 2}}}

    # one calibration: the unit is its own host kernel time, now as a share of its step
    first = cal.pool_host_costs(prof(100.0, 4.0, 40.0, 0.02, "d1"), None)
    eff = first["efficiency"]
    assert eff["host_overhead_per_step"] == pytest.approx(40e-6 / 0.02)
    assert eff["host_overhead_us"] == pytest.approx(40.0) and eff["parallel_host"]["tp"]["forward_kernels"] == 100.0
    # a calibration whose probe layer read the host 2x slow against its step counted half the
    # kernels for the same wrapper seconds: in the pooled unit its counts agree with the first's
    second = cal.pool_host_costs(prof(50.0, 2.0, 80.0, 0.02, "d2"), first)
    third = cal.pool_host_costs(prof(100.0, 4.0, 40.0, 0.02, "d3"), second)
    eff = third["efficiency"]
    assert eff["host_overhead_per_step"] == pytest.approx(40e-6 / 0.02)     # the median share
    assert eff["parallel_host"]["tp"] == {"forward_kernels": pytest.approx(100.0), "backward_kernels": pytest.approx(200.0)}
    assert eff["host_overhead_us"] == pytest.approx(40.0)
    # the seconds each calibration measured come back: kernels x unit
    assert second["efficiency"]["parallel_host"]["tp"]["forward_kernels"] * second["efficiency"]["host_overhead_us"] \
        == pytest.approx(100.0 * 40.0)
    # this calibration's own unmeasured-by-refresh figures move into the pooled unit; the
    # refresh's own (p2p) stay
    assert second["efficiency"]["parallel_host"]["optimizer_per_tensor_kernels"] * \
        second["efficiency"]["host_overhead_us"] == pytest.approx(2.0 * 80.0)
    assert third["efficiency"]["parallel_host"]["p2p_send_kernels"] == 3.0
    assert "executor one-rank step" in eff["parallel_host"]["source"] and "as a share" in eff["host_overhead_source"]
    # a history without the step (an older calibration) is not mixed with one that has it
    legacy = cal.pool_host_costs(
        {k: v for k, v in prof(30.0, 1.0, 40.0, 0.02, "d0").items() if k != "raw"}, None)
    assert "unit_per_step" not in legacy["raw"]["host_cost_history"][0]
    fresh = cal.pool_host_costs(prof(100.0, 4.0, 40.0, 0.02, "d4"), legacy)
    assert len(fresh["raw"]["host_cost_history"]) == 1 and fresh["efficiency"]["parallel_host"]["tp"]["forward_kernels"] == 100.0


def _refreshable_profile(**efficiency) -> dict:
    """The CPU profile figures ``refresh_host_speed`` reads, the host kernel time a share of the step."""
    return {"measured_on": {"device": "cpu"},
            "device": {"dense_tflops": {"fp32": 0.05}, "hbm_tbyte_per_s": 0.01},
            "efficiency": {"host_overhead_us": 40.0, "host_overhead_per_step": 2e-3, **efficiency},
            "oversubscription": {"matmul_flops_per_s_per_rank": {1: 5e10}},
            "raw": {"host_overhead": {"per_kernel_s": 4e-5, "forward_kernels": 12, "backward_kernels": 16}}}


def test_refresh_takes_the_host_kernel_time_from_the_executors_step(tmp_path, monkeypatch):
    """The refresh's host kernel time is the pooled share of the one-rank step it measures."""
    prof = _refreshable_profile()
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    oversub = {"matmul": {1: 5e10}, "layer": {1: 1000.0, 2: 600.0}, "slowdown": {1: 1.0},
               "one_rank_step": {"forward": 0.012, "backward": 0.018}}
    monkeypatch.setattr(cal, "bench_oversubscription", lambda **kw: oversub)
    monkeypatch.setattr(cal, "anchor_to_executor", lambda p, path: p)
    out = cal.refresh_host_speed(path)
    assert out["efficiency"]["host_overhead_us"] == pytest.approx(2e-3 * 0.030 * 1e6)   # 60 us
    # without the pooled share the probe layer's per-kernel time stands, as before
    del prof["efficiency"]["host_overhead_per_step"]
    path.write_text(yaml.safe_dump(prof))
    out = cal.refresh_host_speed(path)
    assert out["efficiency"]["host_overhead_us"] == pytest.approx(1e6 / (1000.0 * 28))


def test_point_to_point_figures_return_the_probes_seconds_in_a_plan(tmp_path, monkeypatch):
    """The pipeline point-to-point figures are counted in the probe's own per-kernel time on
    two busy ranks; converted, a 2-rank plan on the profile charges the seconds the probe
    measured, whatever the simulator's host kernel time (the refresh converts its own)."""
    from simcore.model import compute as cmp
    from simcore.plan.load import plan_from_dict

    prof = yaml.safe_load((Path(__file__).resolve().parents[2] / "data" / "localhost-profile.yaml").read_text())
    eff = prof["efficiency"]
    eff["host_overhead_us"] = 30.0
    eff["host_oversubscription"] = {"1": 1000.0, "2": 800.0}   # 2 ranks: 37.5 us per kernel
    probe_kernel_s = 60e-6
    eff["parallel_host"].update({"p2p_send_kernels": 3.0, "p2p_latency_kernels": 10.0, "p2p_wake_kernels": 1.0,
                                 "p2p_post_kernels": 0.5, "lone_all_reduce_kernels": 20.0,
                                 "lone_broadcast_kernels": 5.0})
    cal.p2p_in_sim_unit(eff, probe_kernel_s, 2)
    assert eff["parallel_host"]["p2p_unit_factor"] == pytest.approx(60.0 / 37.5)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    monkeypatch.setenv("TRAINPLAN_PROFILE", str(path))
    plan = plan_from_dict({"model": {"name": "tiny", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256,
                                     "seq_len": 32, "tied_embeddings": False},
                           "cluster": {"node": "localhost", "gpus_per_node": 2}, "parallel": {"dp": 1, "pp": 2},
                           "training": {"global_batch": 8, "micro_batch": 1, "precision": "fp32"}})
    dev = cmp.device_model(plan.cluster.node.gpu, "fp32")
    assert dev.p2p_send_s == pytest.approx(3.0 * probe_kernel_s)
    assert dev.busy_p2p_latency_s == pytest.approx(10.0 * probe_kernel_s)
    assert dev.p2p_wake_s == pytest.approx(1.0 * probe_kernel_s)
    assert dev.p2p_post_s == pytest.approx(0.5 * probe_kernel_s)
    from simcore.model.step_costs import step_costs
    assert step_costs(plan).p2p_post_s == pytest.approx(0.5 * probe_kernel_s)   # 1F1B: the engine fuses it
    # the lone collectives stay in the probe's unit (converted, they sent dp2-pp2 59% over)
    assert dev.lone_all_reduce_s == pytest.approx(20.0 * 37.5e-6)
    assert dev.lone_broadcast_s == pytest.approx(5.0 * 37.5e-6)

    # the refresh converts the figures it re-measures with the unit it sets
    refreshed = _refreshable_profile(parallel_host={"p2p_send_kernels": 99.0})
    path.write_text(yaml.safe_dump(refreshed))
    monkeypatch.setattr(cal, "bench_oversubscription", lambda **kw: {
        "matmul": {1: 5e10}, "layer": {1: 1000.0, 2: 600.0}, "slowdown": {1: 1.0},
        "one_rank_step": {"forward": 0.012, "backward": 0.018}})
    monkeypatch.setattr(cal, "bench_p2p", lambda: {"kernels": {"p2p_send_kernels": 3.0}, "per_kernel_s": 80e-6,
                                                   "ranks": 2})
    monkeypatch.setattr(cal, "anchor_to_executor", lambda p, path: p)
    out = cal.refresh_host_speed(path)["efficiency"]
    unit_2 = out["host_overhead_us"] * 1e-6 * 1000.0 / 600.0   # 60 us x 5/3: the simulator's 2-rank kernel
    assert out["parallel_host"]["p2p_send_kernels"] * unit_2 == pytest.approx(3.0 * 80e-6)
