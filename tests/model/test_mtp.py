"""DeepSeek-V3's multi-token prediction modules (``model.mtp_layers``): the field, its parameters
beside the main model's count, its work on the last pipeline stage in the analytic path, the event
engine and the collectives list alike, its memory, and the imports and exports that can or cannot
state it (issue 55)."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executors.support import check_executable
from simcore.engine.predict import simulate
from simcore.model import collective_plan as cplan
from simcore.model import compute as cmp
from simcore.model import layer_times as lt
from simcore.model import memory as mem
from simcore.model import mtp
from simcore.model import workload as wl
from simcore.model.step_costs import memory_report, step_costs
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan, hf_config_from_model, megatron_args
from topologies.placement import rank_grid

HF = Path(__file__).resolve().parents[2] / "examples" / "hf"
#: transformers 5.24.0's count of DeepSeek-V3 (tests/plan/consumers/test_hf_counts.py), which builds no MTP.
DEEPSEEK_V3_TRANSFORMERS = 671_026_404_352
#: DeepSeek-V3's Hugging Face checkpoint: "685B, which includes 671B of the Main Model weights and 14B of
#: the Multi-Token Prediction (MTP) Module weights" (deepseek-ai/DeepSeek-V3 README.md); its MTP
#: layer stores its own copies of the embedding and the output layer.
DEEPSEEK_V3_CHECKPOINT = 685e9


def _plan(model="llama3-8b", mtp_layers=0, *, tp=1, pp=2, vpp=1, dp=4, zero=1, ep=1, schedule=None, zero_impl="fsdp2",
          **training):
    parallel = {"tp": tp, "pp": pp, "vpp": vpp, "dp": dp, "ep": ep, "zero": zero, "sequence_parallel": False,
                "zero_impl": zero_impl}
    if schedule:
        parallel["schedule"] = schedule
    return plan_from_dict({"model": {"name": model, "seq_len": 4096, "mtp_layers": mtp_layers},
                           "cluster": {"node": "dgx-h100", "nodes": 4}, "parallel": parallel,
                           "training": {"global_batch": 64, "flash_attention": True, **training}})


def _deepseek(mtp_layers: int | None = None, **parallel):
    doc, warnings = import_plan(hf=str(HF / "deepseek-v3" / "config.json"), cluster="dgx-h100", nodes=32, seq_len=4096)
    doc["parallel"] = {"tp": 1, "pp": 8, "dp": 32, "ep": 32, "zero": 1, **parallel}
    if mtp_layers is not None:
        doc["model"]["mtp_layers"] = mtp_layers
    return plan_from_dict(doc), warnings


@pytest.mark.parametrize("value, rule", [(-1, r"model\.mtp_layers=-1 must be at least 0"),
                                         (1.5, r"model\.mtp_layers must be an integer, got 1\.5"),
                                         ("one", r"model\.mtp_layers must be an integer, got 'one'"),
                                         (True, r"model\.mtp_layers must be an integer, got True")])
def test_a_bad_depth_is_refused_in_one_sentence_naming_the_field(value, rule):
    with pytest.raises(PlanError, match=rule):
        _plan(mtp_layers=value)


def test_the_field_loads_and_round_trips_and_is_written_only_when_set():
    plan = _plan(mtp_layers=2)
    assert plan.model.mtp_layers == 2
    assert plan_to_dict(plan)["model"]["mtp_layers"] == 2
    assert plan_from_dict(plan_to_dict(plan)).model == plan.model
    assert "mtp_layers" not in plan_to_dict(_plan())["model"]


@pytest.mark.parametrize("pp, vpp, schedule, rank", [(2, 1, None, 1), (4, 2, "interleaved-1f1b", 3),
                                                     (2, 2, "dualpipev", 0)])
def test_the_modules_blocks_sit_on_the_last_virtual_stage(pp, vpp, schedule, rank):
    base, plan = _plan(pp=pp, vpp=vpp, schedule=schedule), _plan(mtp_layers=2, pp=pp, vpp=vpp, schedule=schedule)
    assert plan.model_layers_per_stage == base.layers_per_stage
    assert plan.layers_per_stage == (*base.layers_per_stage[:-1], base.layers_per_stage[-1] + 2)
    assert plan.parallel.stage_rank(len(plan.layers_per_stage) - 1) == rank   # DualPipeV: rank 0 holds the loss


def test_deepseek_v3_imports_its_mtp_module_stated_apart_from_the_main_count():
    plan, warnings = _deepseek()
    m = plan.model
    assert m.mtp_layers == 1 and any("model.mtp_layers=1 (num_nextn_predict_layers" in w for w in warnings)
    pc = wl.param_counts(m)
    assert pc.total == pytest.approx(DEEPSEEK_V3_TRANSFORMERS, rel=0.005)   # the main model, what transformers builds
    assert pc.total == wl.param_counts(replace(m, mtp_layers=0)).total
    h = m.hidden
    assert pc.mtp == pc.per_layer + 2 * h * h + 3 * h   # one MoE block, eh_proj, enorm, hnorm, final norm
    assert pc.total + pc.mtp + 2 * m.vocab * h == pytest.approx(DEEPSEEK_V3_CHECKPOINT, rel=0.005)


def test_model_flops_add_megatrons_mtp_terms():
    """megatron/training/training.py @d98e8a64: the MTP block as one more layer of the last layer's
    kind, 3h + 2h^2 for its norms and projection, and the logits once more, all times 3 (fwd + bwd)."""
    plan, _ = _deepseek()
    m, b = plan.model, 16
    tokens, h = b * m.seq_len, m.hidden
    extra = wl.model_flops_per_step(m, b) - wl.model_flops_per_step(replace(m, mtp_layers=0), b)
    block = wl.forward_flops_per_layer(m, tokens, m.seq_len)   # an MoE layer: DeepSeek-V3's last layer is MoE
    assert extra == pytest.approx(3 * (block + 2 * tokens * (3 * h + 2 * h * h + h * m.vocab)), rel=1e-12)


def test_the_last_stage_runs_one_more_block_and_the_heads_again_and_no_other_stage_moves():
    base, plan = _plan(pp=4, tp=2), _plan(mtp_layers=1, pp=4, tp=2)
    a, c = step_costs(base), step_costs(plan)
    assert a.forward_s[:-1] == c.forward_s[:-1] and a.forward_comm_s[:-1] == c.forward_comm_s[:-1]
    m, tr, par = plan.model, plan.training, plan.parallel
    dev = cmp.device_model(plan.cluster.node.gpu, tr.precision.value)
    one_layer = lt.layer_times(m, tr.micro_batch, m.seq_len, par.tp, 1, 1, False, True, tr.recompute, dev)[0]
    heads = cmp.ops_time_s(mtp.head_ops(m, b=tr.micro_batch, s=m.seq_len, tp=par.tp), dev)[0]
    assert c.forward_s[-1] - a.forward_s[-1] == pytest.approx(one_layer + heads, rel=1e-9)
    assert c.forward_comm_s[-1] > a.forward_comm_s[-1]   # the block's and the output layer's TP calls
    for engine in ("analytic", "des"):
        assert simulate(plan, engine=engine).step_time_s > simulate(base, engine=engine).step_time_s


def test_the_collectives_list_adds_the_blocks_and_the_heads_calls_on_the_last_stage_only():
    base, plan = _plan(pp=2, tp=2, zero=0), _plan(mtp_layers=1, pp=2, tp=2, zero=0)
    grid = rank_grid(2, plan.parallel.dp, 1, 2)
    first, last = grid.rank(pp=0, tp=0), grid.rank(pp=1, tp=0)
    assert cplan.expected_calls(plan, first) == cplan.expected_calls(base, first)
    added = cplan.expected_calls(plan, last) - cplan.expected_calls(base, last)
    tp = Counter({c: n for c, n in added.items() if c.axis == "tp"})
    act = plan.training.micro_batch * plan.model.seq_len * plan.model.hidden * 2
    n_mb = plan.num_microbatches
    # one block: 2 all-reduces forward, 2 backward; the output layer's input gradient and its loss's 3 again
    assert tp[cplan.Call(kind="all_reduce", axis="tp", bytes=act, issuer="dtensor")] == n_mb * (4 + 1)
    assert sum(n for c, n in tp.items() if c.bytes != act) == 3 * n_mb
    assert any(c.axis == "dp" for c in added)   # the block's gradients join the data-parallel reduction


def test_memory_grows_on_the_last_rank_by_the_modules_states_and_activations():
    base, plan = _plan(pp=4, zero=0), _plan(mtp_layers=1, pp=4, zero=0)
    a, c = memory_report(base), memory_report(plan)
    assert [r["total"] for r in a["ranks"][:-1]] == [r["total"] for r in c["ranks"][:-1]]
    last, more = a["ranks"][-1], c["ranks"][-1]
    pc = wl.param_counts(plan.model)
    params = sum(mem.layer_params_per_gpu(plan)) + pc.mtp - pc.per_layer   # its block, projection and norms at tp 1
    assert more["weights"] - last["weights"] == pytest.approx(2 * params, rel=1e-9)   # bf16 weights
    assert more["optimizer_states"] > last["optimizer_states"] and more["activations"] > last["activations"]


MODELS = ("gpt-1.7b", "llama3-8b", "llama2-13b")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(model=st.sampled_from(MODELS), depth=st.sampled_from([1, 2]), tp=st.sampled_from([1, 2, 4]),
       pp=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 3]), recompute=st.sampled_from(["none", "full"]))
def test_an_mtp_model_is_never_faster_nor_smaller_than_without(model, depth, tp, pp, zero, recompute):
    try:
        base = _plan(model, tp=tp, pp=pp, dp=32 // (tp * pp), zero=zero, recompute=recompute)
        plan = _plan(model, depth, tp=tp, pp=pp, dp=32 // (tp * pp), zero=zero, recompute=recompute)
    except PlanError:
        return
    a, c = simulate(base), simulate(plan)
    assert c.step_time_s > a.step_time_s
    assert c.memory_per_gpu_gib >= a.memory_per_gpu_gib
    assert max(c.memory_per_rank_gib) > max(a.memory_per_rank_gib) or pp > 1   # pp 1: the only rank grows
    assert memory_report(plan)["ranks"][-1]["total"] > memory_report(base)["ranks"][-1]["total"]


def test_megatron_writes_and_reads_the_depth():
    plan, _ = _deepseek(pp=1, dp=256, ep=64)
    assert ("--mtp-num-layers", 1) in megatron_args(plan)
    reading = read_megatron("torchrun pretrain_gpt.py --num-layers 4 --hidden-size 256 --num-attention-heads 8 "
                            "--ffn-hidden-size 1024 --seq-length 512 --padded-vocab-size 1024 --mtp-num-layers 2 "
                            "--mtp-loss-scaling-factor 0.1")
    assert reading.fields["model.mtp_layers"] == 2
    assert not any("mtp" in o for o in reading.ignored)
    assert hf_config_from_model(plan.model)["num_nextn_predict_layers"] == 1


@pytest.mark.parametrize("target, tool", [("deepspeed", "DeepSpeed config"), ("torchtitan", "torchtitan"),
                                          ("torchtitan-0.2", "torchtitan 0.2"),
                                          ("slurm-trainplan", "trainplan executor")])
def test_exports_that_build_no_mtp_refuse_in_one_sentence(target, tool):
    plan = _plan(mtp_layers=1, pp=1, dp=8, zero=3, zero_impl="deepspeed" if target == "deepspeed" else "fsdp2")
    with pytest.raises(ValueError, match=rf"^model\.mtp_layers=1 has no {tool} option: it builds no "
                                         r"multi-token-prediction modules$"):
        export_plan(plan, target)
    export_plan(replace(plan, model=replace(plan.model, mtp_layers=0)), target)   # the same plan without MTP exports


def test_the_executor_refuses_an_mtp_plan():
    with pytest.raises(ValueError, match=r"^model\.mtp_layers=1 is priced, not run"):
        check_executable(_plan(mtp_layers=1), "cpu")


def test_checkpoints_and_failure_recovery_carry_the_mtp_modules_state():
    """A checkpoint holds every trained parameter: the MTP modules' beside the main model's."""
    from simcore.planner.failures import checkpoint_bytes

    plain, deep = _plan(), _plan(mtp_layers=1)
    pc = wl.param_counts(deep.model)
    assert pc.mtp > 0 and pc.trained == pc.total + pc.mtp
    assert checkpoint_bytes(deep) / checkpoint_bytes(plain) == pytest.approx(pc.trained / pc.total)


def test_simulate_names_the_mtp_modules_parameters_beside_the_models(tmp_path, capsys):
    """An imported DeepSeek-V3 says what it holds beyond transformers' count: its MTP module."""
    import json

    import yaml

    from trainplan.cli import main

    doc = {"name": "dsv3", "model": {"hf_config": str(HF / "deepseek-v3" / "config.json"), "seq_len": 4096},
           "cluster": {"node": "dgx-b200", "nodes": 32},
           "parallel": {"tp": 1, "pp": 8, "dp": 32, "ep": 32, "zero": 1},
           "training": {"global_batch": 1024, "micro_batch": 1, "precision": "bf16", "flash_attention": True,
                        "recompute": "full"}}
    path = tmp_path / "dsv3.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["simulate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["params_total"] == DEEPSEEK_V3_TRANSFORMERS and out["params_mtp"] > 11e9
    assert main(["simulate", str(path)]) == 0
    assert f"(+{out['params_mtp'] / 1e9:.2f} B in 1 MTP modules)" in capsys.readouterr().out
