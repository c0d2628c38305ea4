"""The collectives a layout issues equal those the simulator predicts (issue 6, STYLE.md tier 3).

``simcore.model.collective_plan`` predicts from the Plan alone, without torch, every collective
each rank issues in one steady-state step; here the executor runs the same Plans on 2 and
4 gloo ranks (forked, several layouts per launch, as in tests/test_executor_parallel.py)
and records its calls with ``executors.record.record_collectives``. Per rank, the
(kind, axis) counts must be equal exactly, and so must the multiset of recorded bytes
per call. Pure tests pin the model structure (parameter tensors against
``executors.model``), DDP's bucketing and FSDP2's all-gather walk on hand-worked cases.
"""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch.distributed as dist

from executors import launch, parallel, procs, record, watchdog
from executors.model import build_model
from simcore.model import collective_plan as cp
from simcore.model import fsdp_calls as fc
from simcore.model import param_layout as pl
from simcore.model.schedules import Action, Op
from simcore.plan.spec import ZeroImpl
from tests.executors.test_executor_parallel import GPT, LLAMA, STEPS, fp8_plan, make_plan

BIG = dict(LLAMA, name="test-llama-big", hidden=256, heads=4, kv_heads=2, ffn_hidden=512, layers=12, vocab=256)
"""28.9 MB of fp32 gradients: DDP's rebuilt buckets are 1 MiB, then 25 MiB, then the rest."""


# --------------------------------------------------------------------------- model structure

SPECS = {
    "gpt-untied": GPT,
    "gpt-tied": dict(GPT, tied_embeddings=True),
    "llama-gqa": LLAMA,
    "llama-tied": dict(LLAMA, tied_embeddings=True, layers=3),
    "moe": dict(LLAMA, experts=4, top_k=2),
    "moe-gelu-learned": dict(GPT, experts=3, top_k=1),
}


def _spec(fields):
    return make_plan(fields).model


@pytest.mark.parametrize("name", list(SPECS))
def test_parameter_tensors_match_the_torch_model(name):
    spec = _spec(SPECS[name])
    model = build_model(spec)
    assert pl.num_parameter_tensors(spec) == sum(1 for _ in model.parameters())
    full = pl.StagePart(stage=0, layers=tuple(range(spec.layers)), embed=True, head=True)
    predicted = {p.name: p.shape for p in pl.part_params(spec, full)}
    assert predicted == {n: tuple(p.shape) for n, p in model.named_parameters()}


def test_gpt_tensor_count_by_hand():
    # per block 2 norms, wq wk wv wo, w1 w2; plus tok, pos, norm, output (tied: no output)
    assert pl.num_parameter_tensors(_spec(GPT)) == 4 * 8 + 4
    assert pl.num_parameter_tensors(_spec(dict(GPT, tied_embeddings=True))) == 4 * 8 + 3
    assert pl.num_parameter_tensors(_spec(LLAMA)) == 4 * 9 + 3  # w3, no position embedding


def test_ddp_buckets_close_when_they_reach_their_limit():
    mib = 1024 * 1024
    assert cp.ddp_buckets([mib // 2, mib // 2, 3, 20 * mib, 5 * mib, 7]) == [mib, 3 + 25 * mib, 7]
    assert cp.ddp_buckets([100, 200]) == [300]
    assert cp.ddp_buckets([2 * mib, 30 * mib, 1]) == [2 * mib, 30 * mib, 1]


def test_big_llama_buckets_by_hand():
    # ready order: output 262144 B, norm 1024 B, layers.11 w2, w3 (524288 B each) close the
    # 1 MiB bucket at 1311744 B; 25 MiB closes the next; 1050624 B are left for the last
    plan = make_plan(BIG, dp=2, gb=4)
    assert cp.expected_calls(plan, 0) == Counter({
        cp.Call(kind="all_reduce", axis="dp", bytes=b, issuer="ddp"): 1 for b in (1311744, 26499072, 1050624)})


def test_fsdp_walk_of_a_1f1b_stage_by_hand():
    # ZeRO-3 under Schedule1F1B, stage 0 of 2, 4 micro-batches: F0 F1 B0 F2 B1 F3 B2 B3.
    # Each forward reshards; backwards keep the unit gathered; F0, F1, B0, B1, B2 gather.
    ops = [Action(0, Op.F, 0), Action(0, Op.F, 1), Action(0, Op.B, 0), Action(0, Op.F, 2), Action(0, Op.B, 1),
           Action(0, Op.F, 3), Action(0, Op.B, 2), Action(0, Op.B, 3), Action(0, Op.REDUCE_GRAD)]
    assert fc.fsdp_unit_calls(ops, 0, reshard_after_forward=True, pipelined=True) == (5, 1)
    assert fc.fsdp_unit_calls(ops, 0, reshard_after_forward=False, pipelined=True) == (1, 1)
    assert fc.rank_actions(make_plan(dp=2, pp=2, zero=3), 0) == ops


def test_zero1_buckets_follow_the_greedy_largest_first_partition():
    assert cp.zero1_buckets([1, 5, 3, 3, 2], 2) == [7, 7]          # 5, 3, 3 -> rank 1, 2 -> rank 0, 1 -> rank 1
    assert cp.zero1_buckets([4, 4, 4], 4) == [4, 4, 4, 0]         # a rank without tensors broadcasts a dummy


def _dp_bytes(plan, wire) -> Counter:
    out: Counter = Counter()
    for c, n in cp.expected_calls(plan, 0, wire).items():
        if c.axis == "dp":
            out[c.kind] += c.bytes * n
    return out


def test_the_plans_wire_moves_its_own_dtypes():
    """``plan_wire``: the executor's calls with the plan's dtypes (issue 57.10). The executor's
    autocast moves fp32 parameters and gradients; a bf16 plan gathers 16-bit parameters and
    reduces fp32 gradients (Megatron-LM's and torchtitan's defaults), FP8 primary weights are
    gathered at one byte, DeepSpeed's ZeRO reduces in the model's dtype."""
    exe = cp.EXECUTOR_WIRE
    bf16 = make_plan(LLAMA, dp=2, zero=3, precision="bf16")
    own, fp32 = _dp_bytes(bf16, cp.plan_wire(bf16)), _dp_bytes(bf16, exe)
    assert own["all_gather"] * 2 == fp32["all_gather"] and own["reduce_scatter"] == fp32["reduce_scatter"]
    assert cp.plan_wire(make_plan(LLAMA, dp=2, zero=3)) == exe                 # an fp32 plan moves fp32
    auto = dataclasses.replace(bf16, training=dataclasses.replace(bf16.training, autocast=True))
    assert cp.plan_wire(auto) == exe                                           # torch AMP: fp32 parameters
    ds = dataclasses.replace(bf16, parallel=dataclasses.replace(bf16.parallel, zero_impl=ZeroImpl.DEEPSPEED))
    assert _dp_bytes(ds, cp.plan_wire(ds))["reduce_scatter"] * 2 == fp32["reduce_scatter"]
    z1 = make_plan(LLAMA, dp=2, zero=1, precision="fp8")
    fp8 = dataclasses.replace(z1, training=dataclasses.replace(z1.training, fp8_param_gather=True))
    wire = cp.plan_wire(fp8)
    params = pl.part_params(fp8.model, pl.StagePart(stage=0, layers=tuple(range(fp8.model.layers)), embed=True,
                                                    head=True))
    block = sum(pl._numel(p.shape) for p in params if p.name.startswith("layers.") and not p.norm)
    # the broadcasts hold every parameter once: the blocks' linear weights at 1 byte, the rest at 2
    assert _dp_bytes(fp8, wire)["broadcast"] == block + 2 * (sum(pl._numel(p.shape) for p in params) - block)
    assert _dp_bytes(z1, exe)["broadcast"] == 4 * sum(pl._numel(p.shape) for p in params)


def test_closed_forms_of_the_tiny_gpt():
    L, n_mb = GPT["layers"], 4
    assert cp.expected_collectives(make_plan(dp=2, zero=1))[1] == {("all_reduce", "dp"): 1, ("broadcast", "dp"): 2}
    assert cp.expected_collectives(make_plan(dp=2, zero=3))[0] == {("all_gather", "dp"): 2 * n_mb * (L + 1),
                                                                  ("reduce_scatter", "dp"): n_mb * (L + 1)}
    # per micro-batch: 4 per block, the embedding's and the head's, the loss_parallel three
    assert cp.expected_collectives(make_plan(LLAMA, tp=2))[0] == {("all_reduce", "tp"): 8 * (4 * L + 2 + 3)}
    pp = cp.expected_collectives(make_plan(pp=2, vpp=2, schedule="interleaved-1f1b"))
    assert pp == {r: {("send", "pp"): 3 * 8, ("recv", "pp"): 3 * 8} for r in (0, 1)}


def test_unmodelled_layouts_are_value_errors():
    with pytest.raises(ValueError, match="model.experts=4 with training.recompute=full"):
        cp.expected_collectives(make_plan(dict(LLAMA, experts=4, top_k=2), dp=2, recompute="full"))
    with pytest.raises(ValueError, match="model.experts=4 with training.recompute=layer:2"):
        cp.expected_collectives(make_plan(dict(LLAMA, experts=4, top_k=2), dp=2, recompute="layer:2"))
    with pytest.raises(ValueError, match="training.recompute=op and parallel.tp=2"):
        cp.expected_collectives(make_plan(dict(LLAMA, experts=4, top_k=2), tp=2, recompute="op"))



def test_powersgd_all_reduces_three_times_a_bucket():
    """torch's powerSGD_hook in its steady state (``ddp_hooks``): per bucket the concatenated
    uncompressed tensors (norms, biases: even none), all Ps, all Qs; rank 1, fp32."""
    plain, squeezed = cp.expected_calls(make_plan(BIG, dp=2, gb=4), 0), \
        cp.expected_calls(make_plan(BIG, dp=2, gb=4, grad_compression="powersgd"), 0)
    n_plain = sum(n for c, n in plain.items() if c.issuer == "ddp")
    calls = {c: n for c, n in squeezed.items() if c.issuer == "ddp"}
    assert sum(calls.values()) == 3 * n_plain == 9
    assert sum(c.bytes * n for c, n in calls.items()) < sum(c.bytes * n for c, n in plain.items() if c.issuer == "ddp") / 20


def test_int8_all_to_alls_and_all_gathers_each_bucket():
    """The int8 hook (``executors.int8_hook``): per DDP bucket one all-to-all and one all-gather,
    each of the bucket's int8 values and a scale a group (``ddp_hooks.int8_call_bytes``)."""
    plain = cp.expected_calls(make_plan(BIG, dp=2, gb=4), 0)
    int8 = cp.expected_calls(make_plan(BIG, dp=2, gb=4, grad_compression="int8"), 0)
    buckets = sorted(c.bytes // 4 for c, n in plain.items() if c.issuer == "ddp" for _ in range(n))
    calls = {c: n for c, n in int8.items() if c.issuer == "ddp"}
    assert sorted((c.kind, c.bytes) for c, n in calls.items() for _ in range(n)) == sorted(
        (kind, cp.hooks.int8_call_bytes(b, 2)) for b in buckets for kind in ("all_to_all", "all_gather"))
    fp32 = sum(c.bytes * n for c, n in plain.items() if c.issuer == "ddp")
    assert fp32 / 4 < sum(c.bytes * n for c, n in calls.items()) / 2 < fp32 / 4 * 1.001
    text = cp.format_collectives(make_plan(BIG, dp=2, gb=4, grad_compression="int8"))
    assert {tuple(line.split()[:3]) for line in text.splitlines()[2:]} == {("dp", "all_gather", "3"),
                                                                          ("dp", "all_to_all", "3")}


def test_format_collectives_lists_every_axis_and_kind():
    text = cp.format_collectives(make_plan(LLAMA, dp=2, tp=2, sequence_parallel=True, zero=3))
    rows = {tuple(line.split()[:3]) for line in text.splitlines()[2:]}
    assert rows == {("dp", "all_gather", "40"), ("dp", "reduce_scatter", "20"), ("tp", "all_gather", "72"),
                    ("tp", "all_reduce", "52"), ("tp", "reduce_scatter", "68")}
    assert "bytes/call" in text and "rank 0 (pipeline stage 0)" in text
    assert "(no collectives)" in cp.format_collectives(make_plan(dp=1))


# --------------------------------------------------------------------------- executed layouts

def record_step(rank, world, device, plans):
    """Run STEPS steps of each plan (PowerSGD's uncompressed first ones more); return the last
    step's counts and recorded bytes."""
    out = []
    for plan in plans:
        mesh = parallel.build_mesh(plan, "cpu")
        trainer = parallel.build_trainer(plan, mesh, device, seed=0, lr=0.5)
        rec = record.Recorder(rank=rank, axis_of=record.axis_map(mesh))
        steps = STEPS + (parallel.POWERSGD_START_ITER if plan.training.grad_compression.value == "powersgd" else 0)
        with record.record_collectives(rec):
            for step in range(steps):
                tokens, labels = launch.local_batch(plan, step, 0, mesh.get_local_rank("dp"))
                rec.counts.clear()
                rec.enabled = True
                rec.start_step()
                trainer.step(tokens, labels)
                rec.enabled = False
                dist.barrier()  # every completion callback of the step has run
                watchdog.heartbeat()   # progress: the timeout bounds a step, not the batch of layouts
        sizes = Counter((kind, stream, int(nbytes))
                        for stream, kind, _, _, _, nbytes in rec.spans if stream != "compute")
        out.append({"counts": Counter(rec.counts), "bytes": sizes})
    return out


def recorded_bytes(plan, calls: Counter) -> Counter:
    """The sizes ``executors.record`` records: a call's first tensor argument, i.e. the shard
    for c10d reduce-scatter (FSDP2's output) and functional all-gather (DTensor's input);
    receives are counted but not drawn."""
    par = plan.parallel
    sizes = {"dp": par.dp, "tp": par.tp, "pp": par.pp, "dp_shard": par.shard_ranks, "dp_replicate": par.dp_replicate}
    out: Counter = Counter()
    for c, n in calls.items():
        shard = (c.kind, c.issuer) in (("reduce_scatter", "fsdp2"), ("all_gather", "dtensor"))
        if c.kind != "recv":
            out[(c.kind, c.axis, c.bytes // sizes[c.axis] if shard else c.bytes)] += n
    return out


TWO_RANK = {
    "dp2": make_plan(dp=2),
    "dp2-tied": make_plan(dict(GPT, tied_embeddings=True), dp=2),
    "dp2-three-buckets": make_plan(BIG, dp=2, gb=4),
    "dp2-fp16-compression": make_plan(dp=2, grad_compression="fp16"),
    "dp2-powersgd": make_plan(dp=2, grad_compression="powersgd"),
    "dp2-int8": make_plan(dp=2, grad_compression="int8"),
    "dp2-int8-three-buckets": make_plan(BIG, dp=2, gb=4, grad_compression="int8"),
    "zero1-adamw": make_plan(LLAMA, dp=2, zero=1, optimizer="adamw"),
    "zero1-adafactor": make_plan(LLAMA, dp=2, zero=1, optimizer="adafactor"),
    "zero2": make_plan(dp=2, zero=2),
    # FSDP2's int8 reduce-scatter (executors.int8_hook): an all-to-all a group; BIG's blocks pad their chunks
    "zero2-int8": make_plan(dp=2, zero=2, grad_compression="int8"),
    "zero3-int8-big": make_plan(BIG, dp=2, gb=4, zero=3, grad_compression="int8"),
    # int4: two values a byte, the same calls
    "dp2-int4-three-buckets": make_plan(BIG, dp=2, gb=4, grad_compression="int4"),
    "zero2-int4": make_plan(dp=2, zero=2, grad_compression="int4"),
    "zero3-recompute-full": make_plan(dp=2, zero=3, recompute="full"),
    # torchao's float8: fp32 gathers, or the blocks' linear weights at one byte and one amax all-reduce a step
    "zero3-fp8": fp8_plan(make_plan(LLAMA, dp=2, zero=3, precision="fp8"), gather=False),
    "zero3-fp8-gather": fp8_plan(make_plan(LLAMA, dp=2, zero=3, precision="fp8"), gather=True),
    "zero2-fp8-gather": fp8_plan(make_plan(LLAMA, dp=2, zero=2, precision="fp8"), gather=True),
    "tp2": make_plan(LLAMA, tp=2),
    "tp2-recompute-full": make_plan(LLAMA, tp=2, recompute="full"),
    "tp2-sp-adamw": make_plan(tp=2, sequence_parallel=True, optimizer="adamw"),
    "tp2-sp-recompute-full": make_plan(LLAMA, tp=2, sequence_parallel=True, recompute="full"),
    # torchtitan's per-op SAC re-runs wo's all-reduce, or under SP both inputs' all-gathers;
    # the saved reduce-scatters are served from its cache (``executors.record.replayed``)
    "tp2-recompute-op": make_plan(LLAMA, tp=2, recompute="op"),
    "tp2-sp-recompute-op": make_plan(LLAMA, tp=2, sequence_parallel=True, recompute="op"),
    "tp2-recompute-layer2": make_plan(LLAMA, tp=2, recompute="layer:2"),
    "tp2-sp-recompute-block1": make_plan(LLAMA, tp=2, sequence_parallel=True,
                                         recompute={"layers": 1, "method": "block"}),
    "pp2-1f1b": make_plan(pp=2, schedule="1f1b"),
    "pp2-interleaved": make_plan(pp=2, vpp=2, schedule="interleaved-1f1b"),
    "pp2-zero-bubble": make_plan(pp=2, vpp=2, schedule="zero-bubble"),
}
FOUR_RANK = {
    "dp2xpp2-zero1": make_plan(dp=2, pp=2, zero=1),
    # hybrid sharding: FSDP2 over 2 shards, the shard all-reduced over 2 replicas (foreach_reduce)
    "dp4-hsdp2-zero3": make_plan(dp=4, zero=3, dp_replicate=2),
    # int8 under hybrid sharding: the all-to-all over the shard group, FSDP2's fp32 all-reduce over the replicas
    "dp4-hsdp2-zero3-int8": make_plan(dp=4, zero=3, dp_replicate=2, grad_compression="int8"),
    "dp2xpp2-zero3-gpipe": make_plan(dp=2, pp=2, zero=3, schedule="gpipe"),
    "dp2xpp2-zero3-interleaved": make_plan(dp=2, pp=2, vpp=2, zero=3, schedule="interleaved-1f1b"),
    "dp2xpp2-zero2-zero-bubble": make_plan(dp=2, pp=2, zero=2, schedule="zero-bubble"),
    # under hybrid sharding the amax all-reduce runs over the shard group, as FSDP2's gathers
    "dp4-hsdp2-zero3-fp8-gather": fp8_plan(make_plan(LLAMA, dp=4, zero=3, dp_replicate=2, precision="fp8"), gather=True),
    "dp2xtp2-replicate-sp": make_plan(LLAMA, dp=2, tp=2, sequence_parallel=True),
    "dp2xtp2-sp-zero3-adamw": make_plan(LLAMA, dp=2, tp=2, sequence_parallel=True, zero=3, optimizer="adamw"),
    # FSDP2's int8 reduce-scatter over the dp group of a 2-D mesh: the TP-local shards all-to-all'd
    "dp2xtp2-sp-zero3-int8": make_plan(LLAMA, dp=2, tp=2, sequence_parallel=True, zero=3, grad_compression="int8"),
    "tp2xpp2-sp": make_plan(LLAMA, tp=2, pp=2, sequence_parallel=True),
    "pp4-interleaved": make_plan(dict(GPT, layers=8), pp=4, vpp=2, schedule="interleaved-1f1b"),
}
def test_zero_bubble_with_zero_0_or_1_uses_replicate_not_ddp():
    """torch's split backward skips DDP's reducer hooks (the replicas of the later stages
    drifted apart when DDP ran it), so the executor runs FSDP2's replicate there."""
    from executors.parallel import uses_replicate

    assert uses_replicate(make_plan(dp=2, pp=2, schedule="zero-bubble"))
    assert not uses_replicate(make_plan(dp=2, pp=2, schedule="1f1b"))


def _run(world, layouts):
    results = procs.spawn(record_step, world, (list(layouts.values()),), timeout_s=240, start_method="fork")
    return {name: [results[r][i] for r in range(world)] for i, name in enumerate(layouts)}


@pytest.fixture(scope="module")
def two_rank():
    return _run(2, TWO_RANK)


@pytest.fixture(scope="module")
def four_rank():
    return _run(4, FOUR_RANK)


def _check(plan, measured):
    expected = cp.expected_collectives(plan)
    for rank, rec in enumerate(measured):
        assert rec["counts"] == expected[rank], f"rank {rank}"
        assert rec["bytes"] == recorded_bytes(plan, cp.expected_calls(plan, rank)), f"rank {rank}"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TWO_RANK))
def test_two_rank_collectives_match_the_prediction(two_rank, name):
    _check(TWO_RANK[name], two_rank[name])


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FOUR_RANK))
def test_four_rank_collectives_match_the_prediction(four_rank, name):
    _check(FOUR_RANK[name], four_rank[name])
