"""1-bit LAMB and 0/1 Adam (``training.optimizer: onebit_lamb | zero_one_adam``) as DeepSpeed runs
them (simcore/model/onebit.py, simcore/planner/onebit_phases.py; DeepSpeed @edaa7221 lamb.py and
zoadam.py): the all-reduce they share with 1-bit Adam, their own passes, their states, their rules,
the ds_config round trip, the phases ``trainplan cost`` charges, and that neither wins for nothing."""
from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import onebit
from simcore.model.dp_costs import rank_costs
from simcore.model.step_costs import memory_report
from simcore.model.workload import param_counts
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.readers import TOOL_OPTIONS_PATH, read_deepspeed
from simcore.plan.spec import Optimizer, PlanError
from simcore.plan.writers import export_plan

SIBLINGS = ("onebit_lamb", "zero_one_adam")


def _plan(optimizer="onebit_lamb", nodes=4, fabric="eth-100", model="llama2-7b", tp=1, **training):
    cluster = {"node": "dgx-h100", "nodes": nodes, **({"fabric": fabric} if fabric else {})}
    return plan_from_dict({"model": {"name": model, "seq_len": 2048}, "cluster": cluster,
                           "parallel": {"dp": 8 * nodes // tp, "tp": tp, "zero": 0},
                           "training": {"global_batch": 8 * nodes, "micro_batch": 1, "precision": "fp16",
                                        "optimizer": optimizer, "flash_attention": True, "recompute": "full",
                                        **training}})


def _costs(plan) -> tuple[dict, float]:
    """(dp_costs, optimizer seconds) of the first rank."""
    dev = cmp.device_model(plan.cluster.node.gpu, plan.training.precision.value)
    d, (opt, _), _ = rank_costs(plan, dev)[1][0]
    return d, opt


def test_the_passes_counted_by_hand():
    assert onebit.LAMB_KERNEL_BYTES == 112       # lamb.py's compression stage beyond 1-bit Adam's step
    assert onebit.LAMB_WARMUP_BYTES == 24        # its warm-up's two norms
    assert onebit.ZERO_ONE_LOCAL_BYTES == 12     # comm_buffer.add_(-lr * update), less K's read and write
    assert onebit.ZERO_ONE_SYNC_BYTES == 124     # the passes around the accumulator's all-reduce
    assert onebit.local_step_ramp() == (1, 2, 4, 8)


def test_lamb_shares_the_all_reduce_and_adds_its_passes():
    """1-bit LAMB all-reduces the same flat momentum as 1-bit Adam each step; its step adds LAMB's
    passes and the fresh variance's read and write (K 16, not 12)."""
    lamb, adam1, adam = _costs(_plan()), _costs(_plan("onebit_adam")), _costs(_plan("adam"))
    assert lamb[0]["grad"] == 0.0 and lamb[0]["sync"] == pytest.approx(adam1[0]["sync"])
    dev = cmp.device_model(_plan().cluster.node.gpu, "fp16")
    n = param_counts(_plan().model).total
    extra = cmp.stream_s(2 * 4 * n, dev) - dev.kernel_overhead_s + cmp.stream_s(onebit.LAMB_KERNEL_BYTES * n, dev)
    assert lamb[1] - adam[1] == pytest.approx(extra, rel=1e-3)


def test_zero_one_syncs_one_step_in_sixteen():
    zoa, adam1 = _costs(_plan("zero_one_adam")), _costs(_plan("onebit_adam"))
    assert zoa[0]["grad"] == 0.0
    assert zoa[0]["sync"] == pytest.approx(adam1[0]["sync"] / onebit.LOCAL_STEP_CLIPPER)


@settings(max_examples=25, deadline=None)
@given(elements=st.floats(1e3, 1e11), ranks=st.sampled_from([2, 8, 16, 64, 256]),
       fabric=st.sampled_from(["eth-100", "ib-hdr"]))
def test_zero_one_never_slower_on_the_wire_than_onebit_adam(elements, ranks, fabric):
    plan = _plan(nodes=max(1, ranks // 8), fabric=fabric)
    dev = cmp.device_model(plan.cluster.node.gpu, "fp16")
    net = coll.group_net(plan.cluster, dev, ranks, 1)
    one = onebit.sync_s(Optimizer.ONEBIT_ADAM, elements, net, dev)
    assert onebit.sync_s(Optimizer.ZERO_ONE_ADAM, elements, net, dev) == pytest.approx(one / 16)
    assert onebit.sync_s(Optimizer.ONEBIT_LAMB, elements, net, dev) == one


def _transcribed_uncompressed(steps: int) -> int:
    """zoadam.py's counters step by step: the first step() initializes over the engine's all-reduce;
    then a variance update (the engine's all-reduce) where step % var_interval == 0."""
    count, interval, counter = 0, 1, 0
    for step in range(1, steps + 1):
        if step == 1:
            count += 1
            continue
        if step % interval == 0:
            count, counter = count + 1, counter + 1
            if counter == onebit.VAR_UPDATE_SCALER:
                counter, interval = 0, interval * 2
    return count


@settings(max_examples=30, deadline=None)
@given(steps=st.integers(0, 6000))
def test_the_variance_updates_follow_zoadam(steps):
    assert onebit.uncompressed_steps(steps) == _transcribed_uncompressed(steps)


@pytest.mark.parametrize("optimizer", SIBLINGS)
def test_memory_holds_the_extra_states(optimizer):
    n = param_counts(_plan().model).total
    terms = memory_report(_plan(optimizer))["ranks"][0]["terms"]
    adam = memory_report(_plan("adam"))["ranks"][0]["terms"]
    # exp_avg_sq_fresh (1-bit LAMB) or momentum_accumulator (0/1 Adam): fp32, 4 bytes a parameter more
    assert terms["optimizer_states"] == pytest.approx(adam["optimizer_states"] * 16 / 12)
    assert terms["onebit_errors"] == pytest.approx(onebit.error_bytes(n, 32), rel=1e-3)
    clone = terms.get("onebit_momentum_clone", 0.0)   # exp_avg_last_step, held through 1-bit LAMB's step
    assert clone == (pytest.approx(4 * n, rel=1e-3) if optimizer == "onebit_lamb" else 0.0)
    assert memory_report(_plan(optimizer))["max_gpu_bytes"] > memory_report(_plan("onebit_adam"))["max_gpu_bytes"]


@pytest.mark.parametrize("optimizer, name", [("onebit_lamb", "1bit-Lamb"), ("zero_one_adam", "0/1 Adam")])
def test_zero_is_refused_in_one_sentence(optimizer, name):
    with pytest.raises(PlanError) as err:
        plan_from_dict({"model": "llama2-7b", "cluster": {"node": "dgx-h100", "nodes": 2},
                        "parallel": {"dp": 16, "zero": 1}, "training": {"global_batch": 16, "optimizer": optimizer}})
    message = str(err.value)
    assert message.startswith(f"training.optimizer={optimizer} needs parallel.zero=0")
    assert f'"{name} is not compatible with ZeRO"' in message and message.count(". ") == 0
    with pytest.raises(PlanError, match="training.grad_compression=none"):
        _plan(optimizer, grad_compression="bf16")


@pytest.mark.parametrize("optimizer, kind, step", [("onebit_lamb", "OneBitLamb", "freeze_step"),
                                                   ("zero_one_adam", "ZeroOneAdam", "var_freeze_step")])
def test_ds_config_names_the_type_and_reads_back(optimizer, kind, step):
    plan = _plan(optimizer, onebit_freeze_step=2000)
    cfg = json.loads(export_plan(plan, "deepspeed"))
    assert cfg["optimizer"] == {"type": kind, "params": {step: 2000}} and cfg["zero_optimization"]["stage"] == 0
    known = yaml.safe_load(TOOL_OPTIONS_PATH.read_text())["deepspeed"]["optimizer_types"]
    assert kind.lower() in known   # DeepSpeed's own name for it
    fields = read_deepspeed(json.dumps(cfg)).fields
    assert fields["training.optimizer"] == optimizer and fields["training.onebit_freeze_step"] == 2000


@pytest.mark.parametrize("optimizer", SIBLINGS)
def test_the_executor_collectives_and_torchtitan_refuse(optimizer):
    from executors.support import check_executable
    from simcore.model.collective_plan import expected_calls

    with pytest.raises(ValueError, match=f"training.optimizer={optimizer} is priced, not run"):
        check_executable(_plan(optimizer, nodes=1, fabric=None), "cuda")
    with pytest.raises(ValueError, match=f"training.optimizer={optimizer}: DeepSpeed's compressed all-reduce is "
                                         "priced"):
        expected_calls(_plan(optimizer), 0)
    doc = plan_to_dict(_plan(optimizer))
    bf16 = plan_from_dict({**doc, "training": {**doc["training"], "precision": "bf16"}})
    with pytest.raises(ValueError, match=f"training.optimizer={optimizer}"):
        export_plan(bf16, "torchtitan")


def _free(monkeypatch):
    for name in ("all_gather_s", "reduce_scatter_s", "all_to_all_s", "all_reduce_s"):
        monkeypatch.setattr(coll, name, lambda *a, **k: 0.0)


@settings(max_examples=6, deadline=None)
@given(nodes=st.sampled_from([1, 2, 4]), fabric=st.sampled_from([None, "eth-100", "ib-hdr"]),
       model=st.sampled_from(["llama2-7b", "gpt-1.7b"]), optimizer=st.sampled_from(SIBLINGS))
def test_neither_wins_for_nothing(nodes, fabric, model, optimizer):
    """On one data-parallel rank (nothing to all-reduce), or with communication free, neither is
    faster than Adam: they only add their passes; past 1 rank 0/1 Adam's step is never slower
    than 1-bit Adam's (one all-reduce in 16)."""
    t = simulate(_plan(optimizer, nodes, fabric, model)).step_time_s
    alone = simulate(_plan(optimizer, 1, None, model, tp=8)).step_time_s
    assert alone >= simulate(_plan("adam", 1, None, model, tp=8)).step_time_s * (1 - 1e-12)
    with pytest.MonkeyPatch.context() as mp:
        _free(mp)
        free_adam = simulate(_plan("adam", nodes, fabric, model)).step_time_s
        free = simulate(_plan(optimizer, nodes, fabric, model)).step_time_s
    assert free >= free_adam * (1 - 1e-12) and t >= free_adam * (1 - 1e-12)
    if optimizer == "zero_one_adam":
        assert t <= simulate(_plan("onebit_adam", nodes, fabric, model)).step_time_s * (1 + 1e-12)


def _run(plan, steps):
    from simcore.planner.runcost import run_cost

    tokens = steps * plan.training.global_batch * plan.model.seq_len
    return run_cost(plan, simulate(plan), tokens, failures=False, monte_carlo=0)


def test_cost_charges_lambs_warm_up_as_lamb():
    lamb = _plan()
    t_adam, t_lamb = simulate(_plan("adam")).step_time_s, simulate(lamb).step_time_s
    dev = cmp.device_model(lamb.cluster.node.gpu, "fp16")
    warm = t_adam + cmp.stream_s(onebit.LAMB_WARMUP_BYTES * param_counts(lamb.model).total, dev)
    rc = _run(lamb, 150_000)
    assert rc.useful_s == pytest.approx(100_000 * warm + 50_000 * t_lamb, rel=1e-4)
    assert any("first 100,000 steps (training.onebit_freeze_step) run as LAMB" in n for n in rc.notes)


def test_cost_charges_zero_one_adams_phases():
    """To var_freeze_step (and the step past it) the gradient: the first step and the variance
    updates at Adam's step, the rest at 1-bit Adam's; then 32,678 steps at each local-step interval
    1, 2, 4, 8, each slower than the steady one and faster than the one before; then the steady one."""
    from simcore.planner.onebit_phases import warmup_phases

    zoa = _plan("zero_one_adam", onebit_freeze_step=1000)
    t_adam, t_one, steady = (simulate(_plan(o)).step_time_s for o in ("adam", "onebit_adam", "zero_one_adam"))
    steps = 1001 + 4 * 32678 + 5000
    phases, note = warmup_phases(zoa, simulate(zoa), steps)
    plain = _transcribed_uncompressed(1001)
    assert phases[:2] == [(plain, pytest.approx(t_adam)), (1001 - plain, pytest.approx(t_one))]
    ramp = [t for _, t in phases[2:]]
    assert [n for n, _ in phases[2:]] == [32678] * 4 and ramp == sorted(ramp, reverse=True) and ramp[-1] > steady
    rc = _run(zoa, steps)
    assert rc.useful_s == pytest.approx(sum(n * t for n, t in phases) + 5000 * steady, rel=1e-6)
    assert any(n.startswith("0/1 Adam, as DeepSpeed runs it") and "every 8" in n for n in rc.notes)
    short = warmup_phases(_plan("zero_one_adam", onebit_freeze_step=0), simulate(zoa), 10)[0]
    assert short == [(1, pytest.approx(t_adam)), (9, pytest.approx(ramp[0]))]
