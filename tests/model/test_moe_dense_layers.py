"""An MoE model's dense layers (``model.dense_layers``: DeepSeek's ``first_k_dense_replace``)
are dense layers in time, collectives and memory (``simcore.model.moe_layers``): the stage that
holds the first layers runs their dense MLP and none of the router, experts or all-to-alls, and
holds their parameters and activations, not an MoE layer's. Before, setting ``dense_layers``
changed neither the step time, nor the collectives, nor the memory."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import collective_plan as cplan
from simcore.model import comm_ledger as ledger
from simcore.model import compute as cmp
from simcore.model import layer_comm as lcm
from simcore.model import layer_times as lt
from simcore.model import memory as mem
from simcore.model import moe_layers as ml
from simcore.model import step_costs as sc
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import Plan, PlanError
from topologies.placement import rank_grid

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


def _model(dense_layers: int, **over) -> dict:
    """A DeepSeek-V2-Lite-like MoE: 64 experts top-6 of width 1408, two shared, a dense MLP of
    10944 (no wider than the 6 x 1408 + 2 x 1408 a token runs in an MoE layer)."""
    return {"name": "moe-like", "layers": 8, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn_hidden": 1408,
            "vocab": 32000, "seq_len": 4096, "gated_mlp": True, "experts": 64, "top_k": 6,
            "shared_ffn_hidden": 2816, "dense_ffn_hidden": 10944 if dense_layers else 0,
            "dense_layers": dense_layers, "position_embedding": "rope", "tied_embeddings": False, "dropout": 0.0,
            **over}


def _plan(dense_layers: int, *, node: str = "dgx-h100", model: dict | None = None, training: dict | None = None,
          **parallel) -> Plan:
    par = {"tp": 1, "pp": 2, "dp": 8, "ep": 8, "zero": 1, **parallel}
    par.setdefault("sequence_parallel", par["tp"] > 1)
    return plan_from_dict({"model": _model(dense_layers, **(model or {})), "cluster": {"node": node, "nodes": 2},
                           "parallel": par,
                           "training": {"global_batch": 64, "micro_batch": 1, "flash_attention": True,
                                        "recompute": "selective", **(training or {})}})


def _dev(plan: Plan) -> cmp.DeviceModel:
    tr = plan.training
    return cmp.device_model(plan.cluster.node.gpu, tr.precision.value, fp8_recipe=tr.fp8_recipe.value,
                            attention_kernel=tr.attention_kernel.value)


@SETTINGS
@given(node=st.sampled_from(["dgx-a100-80gb", "dgx-h100", "hgx-h200"]), tp=st.sampled_from([1, 2, 4]),
       ep=st.sampled_from([1, 2, 8]), capacity=st.sampled_from([1.0, 1.25, 2.0]),
       dispatcher=st.sampled_from(["alltoall", "deepep"]), precision=st.sampled_from(["bf16", "fp8"]),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_a_dense_layer_never_costs_more_than_an_moe_layer(node, tp, ep, capacity, dispatcher, precision, recompute):
    """A dense layer no wider than what a token runs in an MoE layer (top-k experts and the shared
    ones) is never slower than an MoE layer of the same model, forward or backward (recomputation
    included), its blocking communication and host work counted: the same attention, one GEMM
    where the experts run many, no router, no permutation, no all-to-all. (Term by term it can
    be slower: a host-bound MoE layer hides TP's collectives in its wait for the host.)"""
    try:
        plan = _plan(3, node=node, tp=tp, dp=8 // tp, ep=ep, moe_dispatcher=dispatcher,
                     model={"capacity_factor": capacity}, training={"precision": precision, "recompute": recompute})
    except PlanError:
        return
    dev = _dev(plan)
    moe, dense = sc._layer_work(plan, dev), sc._layer_work(ml.dense_plan(plan), dev)
    (t, c, _), (tm, cm, _) = dense, moe
    assert t[0] + c[0] + c[2] <= (tm[0] + cm[0] + cm[2]) * (1 + 1e-9)                 # forward
    assert sum(t[1:]) + c[1] + c[3] <= (sum(tm[1:]) + cm[1] + cm[3]) * (1 + 1e-9)     # backward
    assert dense[2]["ep_f"] == dense[2]["ep_b"] == 0.0
    assert (moe[2]["ep_f"] > 0) == (ep > 1)


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_setting_dense_layers_changes_step_time_collectives_and_memory(engine):
    """The issue's finding: dense_layers 0 and 3 gave the same prediction."""
    base, dense = _plan(0, pp=1, vpp=1), _plan(3, pp=1, vpp=1)
    a, b = simulate(base, engine=engine), simulate(dense, engine=engine)
    assert b.step_time_s < a.step_time_s
    assert b.exposed_comm_s < a.exposed_comm_s
    assert b.memory_per_gpu_gib != a.memory_per_gpu_gib
    assert ledger.step_bytes(dense)["ep", "all_to_all"] < ledger.step_bytes(base)["ep", "all_to_all"]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_only_the_stages_holding_the_first_layers_change(k):
    """pp 4 of two layers a stage: the first k layers lie on the first stages; the others run and
    hold exactly what they did. On a stage with d dense layers the EP all-to-alls fall by d
    layers' (the blocking comm of tp 1 is the all-to-alls alone)."""
    base, plan = _plan(0, pp=4, dp=4, ep=4), _plan(k, pp=4, dp=4, ep=4)
    dense = ml.stage_dense_layers(plan.model, plan.layers_per_stage)
    assert dense == tuple(max(0, min(2, k - 2 * v)) for v in range(4))
    a, b = sc.step_costs(base), sc.step_costs(plan)
    ep = lcm.layer_comm(plan, _dev(plan))
    for v, d in enumerate(dense):
        if not d:
            assert (b.forward_s[v], b.backward_input_s[v], b.forward_comm_s[v]) == \
                (a.forward_s[v], a.backward_input_s[v], a.forward_comm_s[v])
            continue
        assert b.forward_s[v] < a.forward_s[v] and b.backward_input_s[v] < a.backward_input_s[v]
        assert a.forward_comm_s[v] - b.forward_comm_s[v] == pytest.approx(d * ep["ep_f"])
    # memory: the ranks without dense layers hold what they held; the first the dense layers'
    # parameters in place of the MoE layers' (more replicated ones, none of the experts)
    pa, pb = mem.stage_params(base), mem.stage_params(plan)
    dense_l, expert_l = mem.layer_params_per_gpu(plan)
    flat = mem.layer_params_per_gpu(ml.dense_plan(plan))[0]
    for r, d in enumerate(dense):
        assert pb[r].expert == pytest.approx(pa[r].expert - d * expert_l)
        assert pb[r].dense == pytest.approx(pa[r].dense + d * (flat - dense_l))


def test_the_collectives_list_has_no_all_to_all_for_a_dense_layer():
    """``trainplan collectives``, as the executor (whose first blocks are dense too) issues them:
    four all-to-alls per MoE layer and micro-batch, none for a dense one; the experts' gradient
    all-reduce covers the MoE layers' experts only; the byte ledger agrees."""
    small = {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn_hidden": 32, "vocab": 256, "seq_len": 32,
             "experts": 4, "top_k": 2, "shared_ffn_hidden": 0}

    def plan(k):
        return _plan(k, pp=2, dp=4, ep=2, zero=0, model={**small, "dense_ffn_hidden": 96 if k else 0},
                     training={"global_batch": 8, "precision": "fp32", "recompute": "none"})

    base, dense = plan(0), plan(1)
    grid = rank_grid(2, 4, 1, 1)
    for pp_rank, d in ((0, 1), (1, 0)):
        calls = [cplan.by_kind_axis(cplan.expected_calls(p, grid.rank(pp=pp_rank))) for p in (base, dense)]
        mbs = dense.num_microbatches
        assert calls[0][("all_to_all", "ep")] - calls[1][("all_to_all", "ep")] == 4 * d * mbs
        bytes_ = [ledger.step_bytes(p, pp_rank) for p in (base, dense)]
        assert bytes_[1]["ep", "all_to_all"] == pytest.approx(bytes_[0]["ep", "all_to_all"] * (2 - d) / 2)
    experts = [sum(c.bytes * n for c, n in cplan.expected_calls(p, 0).items() if c.issuer == "moe"
                   and c.kind == "all_reduce") for p in (base, dense)]
    assert experts[1] == experts[0] / 2   # stage 0's two layers: one MoE layer left


def test_a_dense_first_stage_holds_a_dense_layers_activations():
    """With a capacity factor of 2 an MoE layer keeps twice its routed copies; the first rank's
    dense layers keep a dense MLP's activations instead, the other ranks what they kept."""
    base, plan = (_plan(k, pp=4, dp=4, ep=4, model={"capacity_factor": 2.0}) for k in (0, 2))
    a, b = sc.memory_report(base)["ranks"], sc.memory_report(plan)["ranks"]
    assert b[0]["activations"] < a[0]["activations"]
    assert [r["activations"] for r in b[1:]] == [r["activations"] for r in a[1:]]


# ---- interleaved dense and MoE layers (``model.moe_layers``: Llama 4 Maverick, Qwen2-MoE's sparse step)

def _interleaved(moe_layers, **parallel) -> Plan:
    return _plan(0, model={"moe_layers": list(moe_layers), "dense_ffn_hidden": 10944}, **parallel)


@pytest.mark.parametrize("engine", ["analytic", "des"])
def test_moe_layers_that_are_a_suffix_are_dense_layers(engine):
    """``moe_layers`` [3..7] is ``dense_layers`` 3 in every figure; every layer listed is none dense."""
    a, b = _interleaved(range(3, 8)), _plan(3)
    sa, sb = simulate(a, engine=engine), simulate(b, engine=engine)
    assert sa.step_time_s == pytest.approx(sb.step_time_s, rel=1e-12)
    assert [r["total"] for r in mem.memory_per_rank(a)] == pytest.approx([r["total"] for r in mem.memory_per_rank(b)])
    assert cplan.expected_collectives(a) == cplan.expected_collectives(b)
    every = _plan(0, model={"moe_layers": list(range(8))})
    assert simulate(every, engine=engine).step_time_s == pytest.approx(simulate(_plan(0), engine=engine).step_time_s)


def test_interleaved_dense_layers_fall_where_their_indices_do():
    """Alternate layers dense (Maverick's pattern) on 2 stages of 4: two dense layers a stage, where
    a prefix of 4 puts all four on the first; the parameters are the same either way."""
    alt, prefix = _interleaved(range(1, 8, 2)), _plan(4)
    assert ml.stage_dense_layers(alt.model, alt.layers_per_stage) == (2, 2)
    assert ml.stage_dense_layers(prefix.model, prefix.layers_per_stage) == (4, 0)
    assert alt.model.dense_count == prefix.model.dense_count == 4
    from simcore.model.params import param_counts
    assert param_counts(alt.model).total == param_counts(prefix.model).total
    ta, tp_ = (sc.step_costs(p) for p in (alt, prefix))
    assert ta.forward_s[0] > tp_.forward_s[0] and ta.forward_s[1] < tp_.forward_s[1]   # the MoE work moved


def test_moe_layers_rules():
    for bad, words in (([3, 1], "increasing layer indices"), ([0, 8], "from 0 to model.layers-1=7")):
        with pytest.raises(PlanError, match=words):
            _interleaved(bad)
    with pytest.raises(PlanError, match="give one"):
        _plan(2, model={"moe_layers": [5, 6, 7]})
