"""Issue 56.3: checkpoints as the stacks write them (simcore/planner/checkpoints.py): async
never stalls more than sync, its lost work per failure, deduplication, compression, the CLI."""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from simcore.planner import checkpoints as cks
from simcore.planner.failures import _scenario, checkpoint_bytes, plan_checkpoints
from simcore.planner.runcost import run_cost, summary_lines
from simcore.plan.load import load_plan, plan_from_dict
from simcore.plan.spec import PlanError
from topologies.hardware import load_catalog
from trainplan.cli import main

ROOT = Path(__file__).resolve().parents[2]


def plan_of(nodes: int = 2, zero: int = 0, storage: str = "lustre"):
    return plan_from_dict({
        "model": "gpt-1.7b",
        "cluster": {"node": "dgx-h100", "nodes": nodes, "storage": storage},
        "parallel": {"tp": 8, "pp": 1, "dp": nodes, "zero": zero},
        "training": {"global_batch": 16 * nodes, "micro_batch": 1},
    })


def pred(step_s: float):
    return SimpleNamespace(step_time_s=step_s, compute_s=step_s)


def printed_stall_h(rc) -> float:
    """The total stall the printout shows (0 when none is written)."""
    line = next(x for x in summary_lines(rc) if x.startswith("checkpoint stall"))
    m = re.search(r"= ([\d,.]+) h", line)
    return float(m.group(1).replace(",", "")) if m else 0.0


# --------------------------------------------------------------------------- the property

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 16), tier=st.sampled_from(sorted(load_catalog().storage)),
       write_scale=st.floats(1e-3, 10.0), step_s=st.floats(0.05, 30.0), tokens=st.floats(1e8, 1e13),
       failures=st.floats(0.0, 1e-2), interval=st.one_of(st.none(), st.floats(1.0, 1e6)),
       compression=st.floats(1.0, 8.0), dedup=st.booleans(), zero=st.sampled_from([0, 1, 3]))
def test_async_never_stalls_more_than_sync(nodes, tier, write_scale, step_s, tokens, failures, interval,
                                           compression, dedup, zero):
    base = load_catalog().storage[tier]
    storage = replace(base, write_bytes_per_s=base.write_bytes_per_s * write_scale,
                      per_client_bytes_per_s=base.per_client_bytes_per_s * write_scale)
    kw = dict(storage=storage, monte_carlo=0, prices={"failures_per_gpu_hour": failures},
              checkpoint_interval_s=interval, checkpoint_compression=compression, checkpoint_dedup=dedup)
    plan = plan_of(nodes, zero)
    sync = run_cost(plan, pred(step_s), tokens, checkpoint="sync", **kw)
    asyn = run_cost(plan, pred(step_s), tokens, checkpoint="async", **kw)
    assert asyn.checkpoint.blocking_s <= sync.checkpoint.blocking_s
    for a, s in ((asyn.on_demand, sync.on_demand), (asyn.spot, sync.spot)):
        if not (a.infeasible or s.infeasible):
            assert a.checkpoint_total_s <= s.checkpoint_total_s * (1 + 1e-12)
    if not (asyn.on_demand.infeasible or sync.on_demand.infeasible):
        assert printed_stall_h(asyn) <= printed_stall_h(sync)


# --------------------------------------------------------------------------- the pieces

def test_async_blocks_for_the_host_copy_and_waits_for_a_slow_write():
    plan = plan_of()
    slow = replace(load_catalog().storage["lustre"], write_bytes_per_s=1e9, per_client_bytes_per_s=1e9)
    ck = plan_checkpoints(plan, slow, 3600.0, mode="async")
    assert ck.staging_s == pytest.approx(checkpoint_bytes(plan) / 16 / plan.cluster.node.gpu.host_bytes_per_s)
    assert ck.blocking_s == ck.staging_s and ck.wait_s == 0 and ck.interval_s >= ck.write_s
    given = plan_checkpoints(plan, slow, 3600.0, mode="async", interval_s=10.0)   # below the write
    assert given.wait_s == pytest.approx(given.write_s - given.staging_s - 10.0)
    assert given.blocking_s == pytest.approx(given.staging_s + given.wait_s)
    assert given.blocking_s < given.write_s
    assert plan_checkpoints(plan, slow, 3600.0, tiered=True) == ck                 # the old name
    with pytest.raises(PlanError, match="contradict"):
        plan_checkpoints(plan, slow, 3600.0, tiered=True, mode="sync")


def test_async_loses_the_unprotected_write_per_failure():
    """An async checkpoint is durable only when its write ends: each failure loses the write
    time after the step resumed (write - staging) more than an instantly durable one."""
    plan = plan_of()
    slow = replace(load_catalog().storage["lustre"], write_bytes_per_s=2e9, per_client_bytes_per_s=2e9)
    mtbf, work, recover = 20 * 3600.0, 1000 * 3600.0, 600.0
    ck = plan_checkpoints(plan, slow, mtbf, mode="async")
    assert ck.unprotected_s == pytest.approx(ck.write_s - ck.staging_s) and ck.unprotected_s > 0
    a = _scenario("on_demand", 1.0, work, recover, mtbf, ck, 16)
    durable = _scenario("on_demand", 1.0, work, recover, mtbf, replace(ck, unprotected_s=0.0), 16)
    extra = a.lost_work_s / a.expected_interruptions - durable.lost_work_s / durable.expected_interruptions
    assert extra == pytest.approx(ck.unprotected_s, rel=0.02)
    assert a.restart_total_s / a.expected_interruptions == pytest.approx(
        durable.restart_total_s / durable.expected_interruptions, rel=0.02)
    parts = work + a.checkpoint_total_s + a.restart_total_s + a.lost_work_s
    assert parts == pytest.approx(a.wall_s, rel=1e-9)
    sync = _scenario("on_demand", 1.0, work, recover, mtbf, plan_checkpoints(plan, slow, mtbf, mode="sync"), 16)
    assert a.lost_work_s / a.expected_interruptions > sync.lost_work_s / sync.expected_interruptions


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("nodes", [1, 2, 8])
def test_dedup_never_writes_more_than_replicated(nodes, zero):
    plan, storage = plan_of(nodes, zero), load_catalog().storage["lustre"]
    dedup = plan_checkpoints(plan, storage, 86400.0, deduplicated=True)
    rep = plan_checkpoints(plan, storage, 86400.0, deduplicated=False)
    assert dedup.written_bytes == checkpoint_bytes(plan) <= rep.written_bytes
    assert dedup.write_s <= rep.write_s and dedup.restore_s <= rep.restore_s
    if nodes == 1 or zero == 3:   # nothing is held twice
        assert rep.written_bytes == dedup.written_bytes


def test_compression_divides_the_bytes_written_and_read():
    plan, storage = plan_of(8), load_catalog().storage["lustre"]
    one = plan_checkpoints(plan, storage, 86400.0)
    two = plan_checkpoints(plan, storage, 86400.0, compression=2.0)
    assert two.written_bytes == one.written_bytes / 2 and two.size_bytes == one.size_bytes
    assert two.write_s - storage.latency_s == pytest.approx((one.write_s - storage.latency_s) / 2)
    assert two.restore_s - storage.latency_s == pytest.approx((one.restore_s - storage.latency_s) / 2)
    assert two.staging_s == one.staging_s                     # staged uncompressed, compressed on the host
    for bad in (0.5, math.nan, math.inf, "x"):
        with pytest.raises(PlanError, match="compression ratio"):
            cks.check_compression(bad)


def test_ratio_one_is_todays_numbers_on_a_shipped_plan():
    """Regression: sync, deduplicated, ratio 1 gives the figures of the commit before issue 56.3."""
    plan = load_plan(ROOT / "plans/llama3-70b-h100.yaml")
    p = SimpleNamespace(step_time_s=19.474, compute_s=15.0)
    rc = run_cost(plan, p, 1.5e13, monte_carlo=0)
    same = run_cost(plan, p, 1.5e13, monte_carlo=0, checkpoint="sync", checkpoint_compression=1.0,
                    checkpoint_dedup=True)
    assert rc.to_json() == same.to_json()
    ck = rc.checkpoint
    assert ck.written_bytes == ck.size_bytes and ck.blocking_s == ck.write_s and ck.unprotected_s == 0
    assert ck.write_s == pytest.approx(4.115732878933333, rel=1e-12)       # before: 988 GB at 240 GB/s + latency
    assert ck.restore_s == pytest.approx(2.244990661236364, rel=1e-12)
    # the figures of commit 9d95888 (before issue 56.3) for this step time
    assert rc.on_demand.wall_s == pytest.approx(279227529.9493713, rel=1e-12)
    assert rc.on_demand.usd == pytest.approx(49640449.76877712, rel=1e-12)
    assert rc.spot.usd == pytest.approx(32169098.18779431, rel=1e-12)
    assert rc.on_demand.lost_work_s == pytest.approx(237081.54466200207, rel=1e-9)
    assert ck.interval_s == pytest.approx(4849.026, rel=1e-12)


# --------------------------------------------------------------------------- the command

def test_cost_compare_prints_a_line_per_choice(capsys):
    plan = str(ROOT / "plans/llama3-70b-h100.yaml")
    assert main(["cost", plan, "--tokens", "1e12", "--monte-carlo", "0", "--checkpoint", "compare",
                 "--checkpoint-compression", "1.5"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint stall (sync, deduplicated writes" in out and "per checkpoint" in out
    rows = [x for x in out.splitlines() if re.match(r"\s+(a?sync)(, compressed 1.5x)?: ", x)]
    assert len(rows) == 4 and "baseline" in rows[0] and all("saves" in r for r in rows[1:])
    assert main(["cost", plan, "--tokens", "1e12", "--monte-carlo", "0", "--checkpoint", "async", "--json"]) == 0
    import json

    js = json.loads(capsys.readouterr().out)
    assert js["checkpoint"]["mode"] == "async" and js["checkpoint"]["blocking_s"] < js["checkpoint"]["write_s"]


@pytest.mark.parametrize("argv, says", [
    (["--checkpoint", "lazy"], "--checkpoint takes sync, async or compare"),
    (["--checkpoint-compression", "0.5"], "compression ratio 0.5 must be"),
    (["--checkpoint-compression", "abc"], "compression ratio abc must be"),
    (["--checkpoint-writes", "twice"], "--checkpoint-writes takes dedup or replicated"),
    (["--tiered-checkpoints", "--checkpoint", "sync"], "contradicts"),
])
def test_bad_checkpoint_options_are_one_sentence_and_exit_2(argv, says, capsys):
    assert main(["cost", str(ROOT / "plans/llama3-70b-h100.yaml"), "--tokens", "1e12", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainplan: error: ") and says in err and "\n" not in err
