"""No strategy wins for nothing: properties over layouts that the prediction must hold,
whatever the model, the GPU or the layout (hypothesis draws them)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import layer_comm as lcm
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError

MODELS = ("gpt-1.7b", "llama3-8b", "llama2-13b", "llama3-70b")
NODES = ("dgx-a100-80gb", "dgx-h100", "hgx-h200")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


def _plan(model, node, *, tp=1, pp=1, dp=8, cp=1, zero=1, micro_batch=1, recompute="none", seq_len=8192,
          **parallel):
    return plan_from_dict({"model": {"name": model, "seq_len": seq_len}, "cluster": {"node": node, "nodes": 8},
                           "parallel": {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "zero": zero,
                                        "sequence_parallel": tp > 1, **parallel},
                           "training": {"global_batch": 512, "micro_batch": micro_batch, "recompute": recompute,
                                        "flash_attention": True}})


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 2, 4, 8]),
       pp=st.sampled_from([1, 2]), cp=st.sampled_from([2, 4, 8]), zero=st.sampled_from([0, 1]),
       cp_comm=st.sampled_from(["p2p", "all_gather", "a2a"]))
def test_context_parallel_costs_more_than_the_data_parallel_it_replaces(model, node, tp, pp, cp, zero, cp_comm):
    """cp ranks in place of cp data-parallel replicas, each micro-batch cp times longer so that
    every rank runs the same tokens: the same compute, plus the K/V exchange of whichever
    variant (ring, all-gather, Ulysses all-to-all: time and buffers)."""
    gpus = 64
    dp = gpus // (tp * pp * cp)
    try:
        with_cp = _plan(model, node, tp=tp, pp=pp, dp=dp, cp=cp, zero=zero, micro_batch=cp, cp_comm=cp_comm)
        without = _plan(model, node, tp=tp, pp=pp, dp=dp * cp, cp=1, zero=zero, micro_batch=1)
    except PlanError:
        return
    a, b = simulate(with_cp), simulate(without)
    assert a.step_time_s > b.step_time_s
    assert a.memory_per_gpu_gib > b.memory_per_gpu_gib


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 2, 3]), micro_batch=st.sampled_from([1, 2]))
def test_more_recomputation_never_takes_less_time(model, node, tp, pp, zero, micro_batch):
    times = []
    for recompute in ("none", "selective", "full"):
        try:
            plan = _plan(model, node, tp=tp, pp=pp, dp=64 // (tp * pp), zero=zero, micro_batch=micro_batch,
                         recompute=recompute)
        except PlanError:
            return
        times.append(simulate(plan).step_time_s)
    assert times[0] <= times[1] * (1 + 1e-9) and times[1] <= times[2] * (1 + 1e-9)


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 2, 8]),
       micro_batch=st.sampled_from([1, 2]))
def test_zero2_cannot_be_as_fast_as_zero1_and_hold_a_shard_of_the_gradients(model, node, tp, micro_batch):
    """With gradient accumulation (here 512 / (64 / tp) / micro_batch >= 4 micro-batches)."""
    try:
        z1, z2 = (_plan(model, node, tp=tp, dp=64 // tp, zero=z, micro_batch=micro_batch) for z in (1, 2))
    except PlanError:
        return
    assert z2.num_microbatches >= 4
    a, b = simulate(z1), simulate(z2)
    assert not (b.step_time_s <= a.step_time_s and b.memory_bytes["gradients"] < a.memory_bytes["gradients"])


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(("dgx-h100", "hgx-h200")), tp=st.sampled_from([1, 2, 8]),
       pp=st.sampled_from([1, 2]), zero=st.sampled_from([0, 1, 3]), recompute=st.sampled_from(["none", "full"]))
def test_fp8_gains_less_than_its_gemms_do(model, node, tp, pp, zero, recompute):
    """Only the blocks' linear layers run in FP8 (attention, norms, the output layer and the
    communication stay 16-bit) and they add casts: the step gains less than an FP8 GEMM does
    (and a small model at tp 8 can lose: its casts cost more than its GEMMs save)."""
    from simcore.model.compute import device_model

    plans = []
    for precision in ("bf16", "fp8"):
        doc = {"model": {"name": model, "seq_len": 4096}, "cluster": {"node": node, "nodes": 8},
               "parallel": {"tp": tp, "pp": pp, "dp": 64 // (tp * pp), "zero": zero, "sequence_parallel": tp > 1},
               "training": {"global_batch": 512, "precision": precision, "recompute": recompute,
                            "flash_attention": True}}
        try:
            plans.append(plan_from_dict(doc))
        except PlanError:
            return
    fp8 = device_model(plans[1].cluster.node.gpu, "fp8")
    gemm_gain = fp8.linear_peak_flops * fp8.fp8_matmul_ratio / fp8.peak_flops
    gain = simulate(plans[0]).step_time_s / simulate(plans[1]).step_time_s
    assert gain < gemm_gain


def test_fp8_leaves_attention_and_the_output_layer_at_16_bit():
    from simcore.model import compute as cmp
    from simcore.model import workload as wl

    plan = _plan("llama3-8b", "dgx-h100")
    bf16, fp8 = (cmp.device_model(plan.cluster.node.gpu, p) for p in ("bf16", "fp8"))
    ops = {op.name: op for op in wl.layer_forward_ops(plan.model, b=1, s=8192, flash=True)
           + wl.logits_forward_ops(plan.model, b=1, s=8192)}
    for name in ("flash_attention", "logits", "layernorm_1"):
        assert cmp.op_forward_s(ops[name], fp8) == cmp.op_forward_s(ops[name], bf16)
    for name in ("qkv", "mlp_in", "mlp_out"):
        assert cmp.op_forward_s(ops[name], fp8) < cmp.op_forward_s(ops[name], bf16)


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([2, 4, 8]),
       pp=st.sampled_from([1, 2]), micro_batch=st.sampled_from([1, 2]))
def test_tp_comm_overlap_hides_no_more_than_the_gemms_and_its_last_chunk_allow(model, node, tp, pp, micro_batch):
    """Overlapping TP's collectives with the GEMMs saves at most the communication itself
    (never beyond a free network) and always leaves the forward reduce-scatters' last chunk
    exposed (userbuffers' pipelined reduce-scatter; its ring all-gathers start on the local chunk)."""
    from simcore.model import step_costs as sc
    from simcore.model import overlap as ov
    from simcore.model.compute import device_model
    try:
        plain, over = (_plan(model, node, tp=tp, pp=pp, dp=64 // (tp * pp), micro_batch=micro_batch,
                             tp_comm_overlap=o) for o in (False, True))
    except PlanError:
        return
    a, b = simulate(plain), simulate(over)
    assert b.step_time_s >= a.step_time_s - a.time_s["layer_comm"] - 1e-12
    dev = device_model(over.cluster.node.gpu, over.training.precision.value)
    lc = lcm.layer_comm(over, dev)
    tp_f, tp_b = ov.tp_exposed(over, dev, lc, 1 - 1 / dev.comm_compute_interference)
    assert tp_f >= lc["tp_f"] * ov.UB_TAIL_SHARE[0] / tp > 0 and tp_b >= 0.0


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 8]),
       zero=st.sampled_from([1, 3]))
def test_fewer_nics_per_node_never_make_a_step_faster(model, node, tp, zero):
    times = []
    for nics in (8, 4, 2, 1):
        plan = plan_from_dict({"model": {"name": model, "seq_len": 4096}, "cluster": {"node": node, "nodes": 8,
                                                                                        "nics_per_node": nics},
                               "parallel": {"tp": tp, "dp": 64 // tp, "zero": zero, "sequence_parallel": tp > 1},
                               "training": {"global_batch": 512, "flash_attention": True}})
        times.append(simulate(plan).step_time_s)
    assert all(x <= y * (1 + 1e-9) for x, y in zip(times, times[1:]))
    assert times[-1] > times[0]


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), nodes=st.sampled_from([2, 16, 64]),
       micro_batch=st.sampled_from([1, 2]))
def test_deepspeed_zero3_is_never_faster_than_fsdp2(model, node, nodes, micro_batch):
    """At one gradient dtype, DeepSpeed ZeRO-3 moves the same bytes as FSDP2 in more calls
    (one per submodule) and prefetches less (its bucket), so it never wins; on a model whose
    modules exceed the prefetch bucket part of every gather blocks. (By default DeepSpeed
    reduces 16-bit gradients where FSDP2 under torchtitan reduces fp32: a real difference,
    so both reduce bf16 here.)"""
    from simcore.model.dp_costs import DS_PREFETCH_ELEMENTS, deepspeed_gathers
    from simcore.model.memory import layer_params_per_gpu

    def plan(impl):
        return plan_from_dict({"model": {"name": model, "seq_len": 4096}, "cluster": {"node": node, "nodes": nodes},
                               "parallel": {"dp": 8 * nodes, "zero": 3, "zero_impl": impl},
                               "training": {"global_batch": 16 * nodes * micro_batch, "micro_batch": micro_batch,
                                            "flash_attention": True, "recompute": "full",
                                            "grad_compression": "bf16"}})
    fsdp, ds = plan("fsdp2"), plan("deepspeed")
    for engine in ("analytic", "des"):
        assert simulate(ds, engine=engine).step_time_s > simulate(fsdp, engine=engine).step_time_s
    layer = sum(layer_params_per_gpu(ds))
    calls, exposed = deepspeed_gathers(ds, layer)
    assert (exposed > 0) == (layer / calls > DS_PREFETCH_ELEMENTS)


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), cp=st.sampled_from([2, 4, 8, 16]),
       cp_comm=st.sampled_from(["p2p", "all_gather"]))
def test_context_parallel_chunks_run_attention_slower_per_flop(model, node, cp, cp_comm):
    """Ring and all-gather CP give each rank two chunks of s/(2cp) query tokens: an attention
    kernel that short reaches less of the GPU than the whole sequence's (FlashAttention's
    tile prologue and tail), and never more; Ulysses keeps the whole sequence."""
    from simcore.model import workload as wl
    from simcore.model.compute import device_model, op_backward_s, op_forward_s
    plan = _plan(model, node, seq_len=8192)
    dev = device_model(plan.cluster.node.gpu, "bf16")
    s = 8192 // cp

    def per_flop(chunk):
        op = wl.attention_core_ops(plan.model, 1, s, 1, cp, True, chunk)[0]
        return (op_forward_s(op, dev) + op_backward_s(op, dev)[0]) / op.flops

    short, whole = per_flop(wl.attention_chunk(s, cp, cp_comm)), per_flop(8192)
    assert short >= whole
    if s // 2 < 2048:
        assert short > whole
    assert wl.attention_chunk(s, cp, "a2a") == 8192


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(("dgx-h100", "hgx-h200")), tp=st.sampled_from([1, 2, 8]),
       zero=st.sampled_from([1, 3]))
def test_fp8_scaling_recipes_pay_for_their_scales(model, node, tp, zero):
    """Current and tensorwise scaling read each tensor once more for its amax than delayed
    scaling; rowwise scales run slower GEMMs on top (catalog fp8_recipes): never faster, and
    strictly slower where the step is device-bound (a small model's eager step is host-bound)."""
    def step(recipe):
        plan = _plan(model, node, tp=tp, dp=64 // tp, zero=zero)
        doc = {**plan_to_dict(plan), "training": {**plan_to_dict(plan)["training"], "precision": "fp8",
                                                  "fp8_recipe": recipe}}
        return simulate(plan_from_dict(doc)).step_time_s
    delayed, current, tensorwise, rowwise = (step(r) for r in ("delayed", "current", "tensorwise", "rowwise"))
    tol = 1 + 1e-9   # equal sums in another order
    assert delayed <= current * tol and current == tensorwise and current <= rowwise * tol
    if model == "llama3-70b":
        assert delayed < current < rowwise


def test_an_fp8_recipe_needs_fp8():
    import pytest
    plan = _plan("llama3-8b", "dgx-h100")
    doc = plan_to_dict(plan)
    doc["training"]["fp8_recipe"] = "rowwise"
    with pytest.raises(PlanError, match="training.fp8_recipe=rowwise applies to training.precision=fp8"):
        plan_from_dict(doc)


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 2, 8]),
       micro_batch=st.sampled_from([1, 2]))
def test_deepspeed_zero2_pays_a_reduce_scatter_per_micro_batch(model, node, tp, micro_batch):
    """DeepSpeed ZeRO-2 keeps whole parameters (one all-gather a step, as ZeRO-1) and shards
    gradients by reduce-scattering every micro-batch: never faster than ZeRO-1 under
    accumulation; with pipelining DeepSpeed refuses it."""
    z1 = _plan(model, node, tp=tp, dp=64 // tp, zero=1, micro_batch=micro_batch)
    ds2 = _plan(model, node, tp=tp, dp=64 // tp, zero=2, micro_batch=micro_batch, zero_impl="deepspeed")
    assert ds2.num_microbatches >= 4
    for engine in ("analytic", "des"):
        assert simulate(ds2, engine=engine).step_time_s > simulate(z1, engine=engine).step_time_s
    import pytest
    with pytest.raises(PlanError, match="DeepSpeed's pipeline engine runs ZeRO-1 at most"):
        _plan(model, node, tp=tp, pp=2, dp=32 // tp, zero=2, micro_batch=micro_batch, zero_impl="deepspeed")


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([2, 4, 8]))
def test_sequence_parallel_moves_the_all_reduces_bytes(model, node, tp):
    """Sequence parallel turns each TP all-reduce into a reduce-scatter and an all-gather: the
    same bytes on the wire (Korthikanti et al. 2022, Sec. 4.2.2). Its TP communication costs
    what plain TP's costs, up to the latency of twice the calls and an all-reduce's tree
    algorithm on small messages; it once cost half."""
    from simcore.model.step_costs import step_costs

    def tp_comm(sp: bool) -> float:
        plan = _plan(model, node, tp=tp, dp=64 // tp, zero=1)
        doc = plan_to_dict(plan)
        doc["parallel"]["sequence_parallel"] = sp
        return step_costs(plan_from_dict(doc)).time_detail_s["tp_comm_per_layer_s"]
    assert tp_comm(True) >= 0.95 * tp_comm(False)


@SETTINGS
@given(model=st.sampled_from(MODELS), tp=st.sampled_from([2, 4, 8]), pp=st.sampled_from([1, 2]),
       cp=st.sampled_from([1, 2]))
def test_fp32_activations_cost_twice_the_bytes_on_the_wire(model, tp, pp, cp):
    """An fp32 plan's TP, CP and pipeline messages are 4 bytes an element, not 16-bit ones."""
    from simcore.model.step_costs import step_costs

    def comm(precision: str) -> tuple[float, float]:
        doc = plan_to_dict(_plan(model, "dgx-a100-80gb", tp=tp, pp=pp, cp=cp, dp=64 // (tp * pp * cp)))
        doc["training"]["precision"] = precision
        c = step_costs(plan_from_dict(doc))
        return c.time_detail_s["tp_comm_per_layer_s"], c.p2p_s
    (tp32, p2p32), (tp16, p2p16) = comm("fp32"), comm("bf16")
    assert tp32 > 1.5 * tp16
    assert p2p32 >= p2p16 and (pp == 1 or p2p32 > p2p16)


@SETTINGS
@given(model=st.sampled_from(MODELS), node=st.sampled_from(NODES), tp=st.sampled_from([1, 2, 4, 8]),
       cp=st.sampled_from([1, 2]), sp=st.booleans(),
       recompute=st.sampled_from(["selective", "op", "dots", "layer:2"]))
def test_recomputed_layers_pay_for_the_collectives_they_re_run(model, node, tp, cp, sp, recompute):
    """A recomputed attention exchanges K/V again (the ring runs inside it); torchtitan's
    per-op SAC all-gathers the attention's and the MLP's inputs again under SP, or all-reduces
    wo's output again without it (it saves only the reduce-scatters); JAX's dots policy (MaxText's
    minimal) all-gathers the re-run norms' outputs again under SP, nothing without; a layer recomputed whole
    re-runs its forward's collectives. Each is charged in the step's backward communication
    and in the bytes the model says it moves; Megatron's selective recompute re-runs no TP
    collective."""
    from simcore.model import comm_ledger
    from simcore.model.step_costs import step_costs
    if tp == 1 and cp == 1:
        return

    def plan(rc: str):
        doc = plan_to_dict(_plan(model, node, tp=tp, cp=cp, dp=64 // (tp * cp), zero=1, recompute=rc))
        doc["parallel"]["sequence_parallel"] = sp and tp > 1
        return plan_from_dict(doc)
    try:
        none, rc = plan("none"), plan(recompute)
    except PlanError:
        return
    (c0, bytes0), (c1, bytes1) = ((step_costs(p), comm_ledger.step_bytes(p)) for p in (none, rc))
    re_runs_tp = tp > 1 and recompute != "selective" and (sp or recompute != "dots")
    assert (bytes1["tp", "all_gather" if sp else "all_reduce"] > bytes0["tp", "all_gather" if sp else "all_reduce"]) \
        == re_runs_tp
    assert (bytes1["cp", "send"] > bytes0["cp", "send"]) == (cp > 1)
    # the backward's communication and recomputation together: what is re-run costs time, though
    # a host-bound layer may hide the collectives in its GPU's wait for the host (test_host_slack)
    comm0, comm1 = (sum(c.backward_comm_s) + sum(c.recompute_s) for c in (c0, c1))
    if re_runs_tp or cp > 1:
        assert comm1 > comm0
    else:   # nothing re-run: no more exposed than without recompute
        assert sum(c1.backward_comm_s) <= sum(c0.backward_comm_s) * (1 + 1e-12)
