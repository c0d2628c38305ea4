"""What the optimizer keeps (AdamW, SGD, 8-bit AdamW, Adafactor), eager vs fused element-wise
kernels, and gradients zeroed rather than freed: each charged where the stacks charge it,
and none of them a memory saving the model hands out for nothing."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from executors.model import build_model
from simcore.model import activations as acts
from simcore.model import peak as pk
from simcore.model import workload as wl
from simcore.model.optim_states import EIGHT_BIT_BLOCK, flat_partitions, optimizer_bytes_per_param
from simcore.model.step_costs import memory_report
from simcore.plan.load import dump_plan, load_plan, plan_from_dict
from simcore.plan.spec import Kernels, Optimizer, PlanError
from tests.executors.test_executor_parallel import GPT, LLAMA, make_plan


def _plan(training=None, parallel=None, model=None, nodes=1):
    return plan_from_dict({"model": model or {"name": "llama3-8b", "seq_len": 4096},
                           "cluster": {"node": "dgx-h100", "nodes": nodes},
                           "parallel": {"dp": 8 * nodes, **(parallel or {})},
                           "training": {"global_batch": 8 * nodes, "flash_attention": True, **(training or {})}})


def _states(plan) -> float:
    return memory_report(plan)["ranks"][0]["terms"]["optimizer_states"]


def test_k_per_optimizer_by_hand():
    tr = _plan().training
    k = {o: optimizer_bytes_per_param(dataclasses.replace(tr, optimizer=o), 4096) for o in Optimizer}
    assert k[Optimizer.ADAMW] == k[Optimizer.ADAM] == 12        # fp32 master, m, v
    assert k[Optimizer.SGD] == 8                                # fp32 master, momentum
    assert k[Optimizer.ADAMW8BIT] == 4 + 2 + 8 / EIGHT_BIT_BLOCK   # uint8 m, v and an fp32 scale per block each
    assert k[Optimizer.ADAFACTOR] == 4 + 8 / 4096               # row and column accumulators only
    pure = dataclasses.replace(tr, master_weights=False)
    assert optimizer_bytes_per_param(pure, 4096) == 4           # bf16 m and v
    assert optimizer_bytes_per_param(dataclasses.replace(pure, optimizer=Optimizer.ADAMW8BIT), 4096) == \
        2 + 8 / EIGHT_BIT_BLOCK                                 # 8-bit states stay 8-bit
    assert optimizer_bytes_per_param(dataclasses.replace(tr, optimizer=Optimizer.ADAFACTOR), 4096, flat=True) == 8


def test_smaller_states_shrink_only_the_optimizer_term():
    plans = {o: _plan({"optimizer": o.value}, {"zero": 1}) for o in (Optimizer.ADAMW, Optimizer.ADAMW8BIT,
                                                                     Optimizer.ADAFACTOR)}
    states = {o: _states(p) for o, p in plans.items()}
    assert states[Optimizer.ADAFACTOR] < states[Optimizer.ADAMW8BIT] < states[Optimizer.ADAMW]
    for o, p in plans.items():
        terms = memory_report(p)["ranks"][0]["terms"]
        base = memory_report(plans[Optimizer.ADAMW])["ranks"][0]["terms"]
        assert terms["weights"] == base["weights"] and terms["gradients"] == base["gradients"]


def test_deepspeed_flattens_what_adafactor_would_factor():
    """DeepSpeed's ZeRO steps flat fp32 partitions: Adafactor keeps a whole accumulator there."""
    fsdp = _plan({"optimizer": "adafactor"}, {"zero": 1})
    ds = _plan({"optimizer": "adafactor"}, {"zero": 1, "zero_impl": "deepspeed"})
    assert flat_partitions(ds) and not flat_partitions(fsdp)
    assert _states(ds) == pytest.approx(_states(fsdp) * (4 + 4) / (4 + 8 / 4096))   # master + a whole accumulator


@pytest.mark.parametrize("spec", [LLAMA, GPT])
def test_adafactor_states_of_the_executor_model_are_what_the_model_says(spec):
    """torch.optim.Adafactor's states on the executor's model: the r + c accumulators of each
    matrix (and the vectors' whole ones), within the bound the model charges."""
    plan = make_plan(spec, optimizer="adafactor")
    model = build_model(plan.model)
    opt = torch.optim.Adafactor(model.parameters())
    sum(p.sum() for p in model.parameters()).backward()
    opt.step()
    kept = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
               if torch.is_tensor(t) and t.dim() > 0)
    n = sum(p.numel() for p in model.parameters())
    charged = optimizer_bytes_per_param(plan.training, plan.model.hidden) * n
    assert kept == pytest.approx(charged, rel=0.2)


def test_eager_kernels_keep_the_silu_output_and_the_norms_fp32_upcast():
    m, kw = _plan().model, dict(b=1, s=4096)
    extra = wl.eager_activation_bytes(m, **kw)
    assert extra == 2 * 4096 * m.ffn_hidden + 2 * 4 * 4096 * m.hidden
    assert wl.eager_activation_bytes(m, tp=4, sequence_parallel=True, **kw) == extra / 4
    gpt = dataclasses.replace(m, gated_mlp=False)
    assert wl.eager_activation_bytes(gpt, **kw) == 0.0   # GeLU and LayerNorm keep what fused kernels do


@pytest.mark.parametrize("recompute", ["none", "selective", "op", "full", "layer:2"])
def test_eager_kernels_never_lower_memory_and_per_op_sac_keeps_w2s_output_more(recompute):
    fused = _plan({"recompute": recompute})
    eager = _plan({"recompute": recompute, "kernels": "eager"})
    assert memory_report(eager)["max_gpu_bytes"] >= memory_report(fused)["max_gpu_bytes"]
    a, b = acts._layer_terms(fused)[0], acts._layer_terms(eager)[0]
    assert b.whole > a.whole and b.boundary == a.boundary
    if recompute == "op":   # eager SAC stores every MUST_SAVE output; compiled, w2's is never read
        m = fused.model
        assert b.kept - a.kept == pytest.approx(2 * 4096 * m.hidden)
    else:
        assert b.kept > a.kept


def test_gradients_zeroed_in_place_are_live_at_the_activation_peak():
    freed, zeroed = _plan(), _plan({"grads_to_none": False})
    one = dataclasses.replace(freed, parallel=dataclasses.replace(freed.parallel, dp=1),
                              training=dataclasses.replace(freed.training, global_batch=1))
    kept = dataclasses.replace(one, training=dataclasses.replace(one.training, grads_to_none=False))
    assert not pk.gradients_at_activation_peak(one) and pk.gradients_at_activation_peak(kept)
    assert memory_report(kept)["max_gpu_bytes"] > memory_report(one)["max_gpu_bytes"]
    assert memory_report(zeroed)["max_gpu_bytes"] >= memory_report(freed)["max_gpu_bytes"]


def test_optimizer_in_backward_keeps_one_gradient_tensor_and_needs_one_micro_batch():
    """torchtune's optimizer_in_bwd / torchtitan's early_step_in_backward: each gradient is
    stepped and freed in its post-accumulate-grad hook (FSDP2 runs the hooks after its
    reduce-scatter, _fsdp_collectives.py), so only the largest tensor's gradient is ever whole."""
    single = _plan(parallel={"dp": 1}, training={"global_batch": 1})
    fused = dataclasses.replace(single, training=dataclasses.replace(single.training, optimizer_in_backward=True))
    g_step, g_bwd = (memory_report(p)["ranks"][0]["terms"]["gradients"] for p in (single, fused))
    m = single.model
    assert g_bwd == pytest.approx(2 * m.vocab * m.hidden)   # the bf16 gradient of the embedding or output
    assert pk.gradients_at_activation_peak(fused) and not pk.gradients_at_activation_peak(single)
    assert memory_report(fused)["max_gpu_bytes"] < memory_report(_plan(parallel={"dp": 1}, training={
        "global_batch": 1, "grads_to_none": False}))["max_gpu_bytes"]
    fsdp = _plan({"optimizer_in_backward": True}, {"zero": 3})
    assert memory_report(fsdp)["ranks"][0]["terms"]["gradients"] == pytest.approx(4 * m.vocab * m.hidden / 8)
    with pytest.raises(PlanError, match="training.optimizer_in_backward needs one micro-batch per step"):
        _plan({"optimizer_in_backward": True, "global_batch": 16}, {"zero": 3})
    with pytest.raises(PlanError, match="with data parallel, FSDP2"):
        _plan({"optimizer_in_backward": True}, {"zero": 1})


def test_new_fields_round_trip_and_bad_values_name_the_field(tmp_path):
    plan = _plan({"optimizer": "adamw8bit", "kernels": "eager", "grads_to_none": False, "optimizer_in_backward": True},
                 {"zero": 3})
    path = tmp_path / "p.yaml"
    path.write_text(dump_plan(plan))
    back = load_plan(path)
    assert back.training == plan.training and back.training.kernels == Kernels.EAGER
    assert "kernels" not in dump_plan(_plan())   # the defaults are not written
    with pytest.raises(PlanError, match="training.kernels='compiled' is not one of: fused, eager"):
        _plan({"kernels": "compiled"})
    with pytest.raises(PlanError, match="training.optimizer='lion' is not one of"):
        _plan({"optimizer": "lion"})
