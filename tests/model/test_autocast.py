"""``training.autocast``: torch.autocast over fp32 parameters (torch AMP, Hugging Face Trainer
``fp16``/``bf16=True``, torchtitan under DDP) against 16-bit parameters with an fp32 master copy."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import comm_ledger
from simcore.model.params import param_counts
from simcore.model.step_costs import memory_report
from simcore.plan.interop import import_plan
from simcore.plan.writers import export_plan
from simcore.plan.load import dump_plan, load_plan, plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError
from simcore.results import GIB


def _doc(model="llama3-8b", node="dgx-h100", dp=8, zero=0, autocast=True, **training):
    return {"model": model, "cluster": {"node": node, "nodes": 1}, "parallel": {"dp": dp, "zero": zero},
            "training": {"global_batch": 4 * dp, "micro_batch": 1, "precision": "bf16", "flash_attention": True,
                         "autocast": autocast, **training}}


def _terms(doc) -> dict:
    return memory_report(plan_from_dict(doc))["ranks"][0]["terms"]


@pytest.mark.parametrize("over, message", [
    ({"training": {"precision": "fp32"}}, "training.autocast casts fp32 parameters to a 16-bit"),
    ({"training": {"master_weights": False}}, "without master weights"),
    ({"parallel": {"zero": 3}}, "parallel.zero<=1, parallel.pp=1"),
    ({"parallel": {"pp": 2, "dp": 4}}, "parallel.zero<=1, parallel.pp=1"),
])
def test_layouts_autocast_does_not_run_are_one_sentence(over, message):
    doc = _doc()
    for section, fields in over.items():
        doc[section] = {**doc[section], **fields}
    with pytest.raises(PlanError, match=message):
        plan_from_dict(doc)


def test_a_plan_file_keeps_it_and_omits_the_default(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(dump_plan(plan_from_dict(_doc())))
    assert load_plan(path).training.autocast
    assert "autocast" not in plan_to_dict(plan_from_dict(_doc(autocast=False)))["training"]


def test_model_states_are_fp32_weights_and_gradients_and_no_master_copy():
    """DDP: 4 + 4 + 8 bytes a parameter, where 16-bit weights with a master copy hold 2 + 2 + 12
    (the same 16); the optimizer steps the fp32 parameters themselves."""
    ac, mixed = _terms(_doc()), _terms(_doc(autocast=False))
    assert ac["weights"] == pytest.approx(2 * mixed["weights"])
    assert ac["gradients"] == pytest.approx(2 * mixed["gradients"])
    assert ac["optimizer_states"] == pytest.approx(mixed["optimizer_states"] * 8 / 12)
    states = ("weights", "gradients", "optimizer_states")
    assert sum(ac[k] for k in states) == pytest.approx(sum(mixed[k] for k in states))


def test_zero1_keeps_whole_fp32_weights_so_autocast_holds_more():
    ac, mixed = _terms(_doc(zero=1)), _terms(_doc(zero=1, autocast=False))
    states = ("weights", "gradients", "optimizer_states")
    assert sum(ac[k] for k in states) > sum(mixed[k] for k in states)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_every_weights_16_bit_copy_lives_to_the_forwards_end(recompute):
    """The cast copies are cached whatever the grad mode, so a checkpointed forward holds them too:
    each layer's activations carry 2 bytes per parameter of the layer beyond the 16-bit count."""
    plan = plan_from_dict(_doc(recompute=recompute))
    ac, mixed = _terms(_doc(recompute=recompute)), _terms(_doc(recompute=recompute, autocast=False))
    pc = param_counts(plan.model)
    copies = 2 * (pc.attention + pc.mlp) * plan.model.layers
    assert ac["activations_layers"] - mixed["activations_layers"] > copies
    if recompute == "full":   # the layer inputs in fp32 (the residual stream) and the copies, nothing else
        assert ac["activations_layers"] == pytest.approx(2 * mixed["activations_layers"] + copies)


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["gpt-1.7b", "llama3-8b", "llama2-13b"]),
       node=st.sampled_from(["dgx-a100-80gb", "dgx-h100"]), zero=st.sampled_from([0, 1]),
       micro_batch=st.sampled_from([1, 2, 4]), recompute=st.sampled_from(["none", "selective", "full"]))
def test_autocast_is_never_faster_nor_lighter_than_a_master_copy(model, node, zero, micro_batch, recompute):
    """Its casts (every weight each forward, the norms' outputs per linear) and fp32 norms and
    residual adds cost time; its cached copies and fp32 tensors cost memory: it cannot win."""
    doc = _doc(model=model, node=node, zero=zero, micro_batch=micro_batch, recompute=recompute)
    doc["training"]["global_batch"] = 8 * micro_batch * 2
    ac, mixed = (plan_from_dict({**doc, "training": {**doc["training"], "autocast": a}}) for a in (True, False))
    a, m = simulate(ac), simulate(mixed)
    assert a.step_time_s > m.step_time_s
    assert a.memory_per_gpu_gib > m.memory_per_gpu_gib


def test_ddp_reduces_the_same_fp32_gradients_and_zero1_gathers_fp32_weights():
    ddp = [comm_ledger.step_bytes(plan_from_dict(_doc(autocast=a))) for a in (True, False)]
    assert ddp[0] == ddp[1]
    zero1 = [comm_ledger.step_bytes(plan_from_dict(_doc(zero=1, autocast=a))) for a in (True, False)]
    assert sum(zero1[0].values()) > sum(zero1[1].values())


def test_torchtitan_runs_autocast_exactly_under_ddp():
    """torchtitan's mixed_precision_param goes through torch.autocast under DDP or one device and
    through fully_shard's policy else: its import says so, and its export refuses the other."""
    ddp = plan_from_dict(_doc())
    doc, _ = import_plan(torchtitan=export_plan(ddp, "torchtitan"), cluster="dgx-h100", nodes=1)
    assert doc["training"]["autocast"] is True and doc["parallel"]["zero"] == 0
    for target in ("torchtitan", "torchtitan-0.2"):
        assert "training.autocast: true predicts that run" in export_plan(plan_from_dict(_doc(autocast=False)), target)
    with pytest.raises(ValueError, match="training.autocast=true has no torchtitan option"):
        export_plan(plan_from_dict({**_doc(), "parallel": {"dp": 4, "tp": 2, "sequence_parallel": True}}), "torchtitan")
    fsdp = plan_from_dict(_doc(zero=3, autocast=False))
    doc, _ = import_plan(torchtitan=export_plan(fsdp, "torchtitan"), cluster="dgx-h100", nodes=1)
    assert not doc["training"].get("autocast", False)


@pytest.mark.parametrize("target", ["megatron", "deepspeed"])
def test_stacks_with_a_master_copy_refuse_it(target):
    with pytest.raises(ValueError, match=r"training.autocast=true has no .*master copy"):
        export_plan(plan_from_dict(_doc()), target)


def test_a_7b_checkpointed_forward_holds_its_14_gb_of_copies():
    """What a user of the Hugging Face Trainer meets: Llama 2 7B, one sequence a micro-batch, two
    accumulated, checkpointing, fp16=True on one 80 GB GPU: the copies alone are 2 bytes x 6.5 B
    parameters at the forward's end."""
    plan = plan_from_dict({"model": "llama2-7b", "cluster": {"node": "dgx-a100-80gb", "nodes": 1, "gpus_per_node": 1},
                           "parallel": {"dp": 1}, "training": {"global_batch": 2, "precision": "fp16",
                                                              "autocast": True, "recompute": "full"}})
    layers = memory_report(plan)["ranks"][0]["terms"]["activations_layers"]
    pc = param_counts(plan.model)
    copies = 2 * (pc.attention + pc.mlp) * plan.model.layers
    assert copies / GIB > 12.0
    # beside them: the 32 checkpointed fp32 layer inputs (2 GiB) and one layer's recomputation
    assert copies < layers < copies + 4 * GIB


def test_torchs_own_tracker_holds_the_autocast_count_without_fsdp():
    """The executor's model under TP alone runs torch.autocast over fp32 parameters, and torch's
    MemTracker counts its tensors (fake, on this CPU): the autocast count is within 10% of it,
    where the master-copy count misses its fp32 norms, cast copies and fp32 weights by 18%."""
    from executors.memory_trace import compare

    small = {"name": "small-llama", "layers": 4, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn_hidden": 5632,
             "vocab": 32000, "seq_len": 2048, "gated_mlp": True, "tied_embeddings": False,
             "position_embedding": "rope"}
    plan = plan_from_dict({"model": small, "cluster": {"node": "dgx-h100", "nodes": 1},
                           "parallel": {"dp": 1, "tp": 4, "zero": 0, "sequence_parallel": True},
                           "training": {"global_batch": 2, "micro_batch": 2, "flash_attention": True}})
    out = compare(plan)
    assert out["traced_autocast_differs"] and abs(out["difference"]) < 0.10
