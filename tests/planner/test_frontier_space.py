"""The search space as the stacks run it (issue 50): pipelines of any depth with the layers split
as Meta, Megatron-LM and torchtitan split them, micro-batches and context parallel as the
published runs tuned them, MoE parallel folding, the stack's switches; and the pruning that
keeps the search fast loses nothing."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from simcore.engine.predict import simulate
from simcore.model.step_costs import step_costs
from simcore.plan.load import plan_from_dict
from simcore.plan.rules import check_plan
from simcore.plan.spec import PlanError, Recompute, Schedule, ZeroStage
from simcore.plan.torchtitan_writer import stage_split
from simcore.planner.evaluate import Tally, _evaluate_chunk, evaluate_family
from simcore.planner.search import search
from simcore.planner.space import base_plan, derive_space, families, layer_split

META = ("llama3-405b", {"node": "dgx-h100", "nodes": 2048, "fabric": "roce-400"}, 2048)


def test_layer_splits_as_the_stacks_make_them():
    assert layer_split(126, 16, "even") == (7,) + (8,) * 14 + (7,)      # Llama 3 405B on 16 stages (Meta)
    assert layer_split(126, 64, "ends") == (1,) + (2,) * 62 + (1,)      # Bridge's 405B, pp 16 x vpp 4
    assert layer_split(126, 128, "ends") == (0,) + (1,) * 126 + (0,)    # pp 16 x vpp 8: embedding, loss alone
    assert layer_split(126, 128, "even") == layer_split(126, 128, "ends")
    assert layer_split(10, 13, "even") is None                          # a middle stage without a layer
    assert layer_split(80, 8, "ends") is None                           # Megatron asserts (L + 2) % stages == 0
    assert layer_split(80, 8, "titan") == tuple(stage_split(80, 8, 1, 1))
    for layers, stages in ((61, 16), (94, 24), (96, 7), (126, 32)):
        for name in ("even", "ends", "titan"):
            split = layer_split(layers, stages, name)
            assert split is None or (sum(split) == layers and len(split) == stages and 0 not in split[1:-1])
    with pytest.raises(ValueError, match="split='odd' is not one of"):
        layer_split(10, 2, "odd")


def test_the_mtp_split_counts_the_modules_as_layers_of_the_last_stage():
    """Megatron-Bridge's DeepSeek-V3 layout 'Et*4|(t*4|)*14tmL': 61 layers and one MTP module over
    16 virtual stages, four layers a stage and the last one layer beside the module."""
    assert layer_split(61, 16, "mtp", 1) == (4,) * 15 + (1,)
    assert layer_split(61, 16, "mtp") is None                            # no modules: not a split of its own
    assert layer_split(63, 16, "mtp", 1) == (4,) * 15 + (3,)
    for layers, stages, mtp in ((61, 16, 1), (61, 8, 1), (94, 24, 2), (60, 16, 4)):
        split = layer_split(layers, stages, "mtp", mtp)
        assert split is None or (sum(split) == layers and len(split) == stages and min(split) >= 0)


def test_bridges_deepseek_v3_layout_with_its_mtp_module_is_in_the_space():
    hf = Path(__file__).resolve().parents[2] / "examples" / "hf" / "deepseek-v3" / "config.json"
    base = base_plan({"hf_config": str(hf), "seq_len": 4096}, {"node": "dgx-b200", "nodes": 32}, 4096,
                     {"precision": "mxfp8"})
    assert base.model.mtp_layers == 1                                     # num_nextn_predict_layers
    found = _families_like(base, tp=1, pp=8, vpp=2, ep=32, cp=1, micro_batch=1, schedule=Schedule.INTERLEAVED_1F1B)
    blocks = {f.split: f.apply(base, True).layers_per_stage for f in found}
    assert blocks["mtp"] == (4,) * 15 + (2,)                             # the last stage: a layer, the module
    check_plan(next(f for f in found if f.split == "mtp").apply(base, True))


def _families_like(base, **fields):
    space = derive_space(base)
    return [f for f in families(base, space, base.cluster.gpus) if all(getattr(f, k) == v for k, v in fields.items())]


def test_the_layouts_meta_and_nvidia_ran_are_in_the_space():
    base = base_plan(*META)
    assert 16 in derive_space(base).pp                                   # 126 layers: no longer divisors only
    found = _families_like(base, tp=8, pp=16, dp=128, cp=1, zero=ZeroStage.OPTIMIZER_STATES, micro_batch=1)
    shapes = {(f.schedule, f.vpp): f.apply(base, True).layers_per_stage for f in found}
    assert shapes[Schedule.ONE_F_ONE_B, 1] == (7,) + (8,) * 14 + (7,)   # one layer fewer on the ends (Meta)
    assert shapes[Schedule.INTERLEAVED_1F1B, 8] == (0,) + (1,) * 126 + (0,)   # Megatron-Bridge's VP 8
    assert {v for s, v in shapes if s == Schedule.INTERLEAVED_1F1B} >= {2, 4, 8}
    for f in found:
        check_plan(f.apply(base, True))


def test_a_split_cannot_win_for_nothing():
    """Every split runs the same layers: the stages' forward and backward times add up to the
    same work, so a split only moves time between stages (the slowest one sets the pace)."""
    base = base_plan(*META)
    lays = _families_like(base, tp=8, pp=16, dp=128, cp=1, zero=ZeroStage.OPTIMIZER_STATES, micro_batch=1,
                          schedule=Schedule.INTERLEAVED_1F1B)
    by_split = {}
    for lay in lays:
        c = step_costs(lay.apply(base, True))
        inner = [i for i, n in enumerate(c.layers) if 0 < i < len(c.layers) - 1]
        per_layer = {round(c.forward_s[i] / c.layers[i], 12) for i in inner if c.layers[i]}
        assert len(per_layer) == 1                                       # a layer costs the same on any stage
        by_split[lay.vpp, lay.split] = (sum(c.forward_s) + sum(c.backward_input_s) + sum(c.backward_weight_s))
    totals = list(by_split.values())
    assert max(totals) == pytest.approx(min(totals), rel=1e-9)


def test_the_planner_is_at_least_as_good_as_metas_layout():
    """Llama 3 405B on 16,384 H100 (Dubey et al. 2024, Table 4: tp 8, pp 16, dp 128, 8k tokens,
    16M-token batches): the search, whose space now holds that layout, answers at least as fast
    as the layout's own prediction, and pipelines (it ranked only pp 1 or 2 before)."""
    result = search(*META, top_k=0, progress=False, explain=0)
    meta = plan_from_dict({"model": {"name": "llama3-405b"}, "cluster": META[1],
                           "parallel": {"tp": 8, "pp": 16, "dp": 128, "vpp": 4, "zero": 1, "sequence_parallel": True,
                                        "schedule": "interleaved-1f1b"},
                           "training": {"global_batch": 2048, "micro_batch": 1, "recompute": "none"}})
    best = result.table.iloc[0]
    assert best["step_time_s"] <= simulate(meta).step_time_s
    assert best["pp"] > 2 and best["fits"]


def test_tp_across_two_nodes_without_a_pipeline_is_in_the_space():
    """vTrain's GPT-18.4B ran tp 16 over two DGX A100 (vtrain_runs.csv): TP over the NICs is
    searched up to two NVLink domains, where no pipeline or context parallel cuts the memory."""
    base = base_plan("gpt-18b", {"node": "dgx-a100-80gb", "nodes": 32, "fabric": "ib-hdr"}, 1024)
    space = derive_space(base)
    assert 16 in space.tp and 32 not in space.tp
    wide = [f for f in families(base, space, 256) if f.tp == 16]
    assert wide and all(f.pp == 1 and f.cp == 1 for f in wide)


def test_micro_batch_pruning_loses_nothing():
    """A family that fits at no setting at one micro-batch is skipped at larger ones: the same rows
    as evaluating every family."""
    base = base_plan("gpt-1.7b", {"node": "dgx-h100", "nodes": 2}, 512)
    space = replace(derive_space(base), tp=(1, 2), pp=(1, 2, 3), cp=(1, 2), vpp=(2,))
    assert max(space.micro_batch) == 32
    fams = families(base, space, 16)
    pruned, tally = _evaluate_chunk((base, fams, space))
    every, full = [], Tally()
    for fam in fams:
        every += evaluate_family(base, fam, space, full, {})
    key = lambda rows: sorted((r["layout"], round(r["step_time_s"], 12)) for r in rows)  # noqa: E731
    assert key(pruned) == key(every)
    assert tally.candidates == full.candidates and tally.no_fit >= full.no_fit


def test_the_stacks_switches_go_where_a_layout_takes_them():
    base = base_plan("llama3-70b", {"node": "dgx-h100", "nodes": 8}, 128,
                     parallel={"tp_comm_overlap": True, "overlap_param_gather": True})
    for f in families(base, derive_space(base), 64)[::53]:
        par = f.apply(base).parallel
        assert par.tp_comm_overlap == (f.tp > 1 and f.sequence_parallel)
        assert par.overlap_param_gather == (f.zero == ZeroStage.OPTIMIZER_STATES)
    with pytest.raises(PlanError, match="parallel.tp is not a switch a search takes"):
        base_plan("llama3-70b", {"node": "dgx-h100", "nodes": 8}, 128, parallel={"tp": 2})


def test_moe_parallel_folding_is_searched():
    """Qwen3-235B-A22B as Megatron-Bridge ran it on 256 H100: TP 2, PP 8, DP 16, EP 32 (the expert
    group across TP ranks, expert TP 1)."""
    model = {"name": "qwen3-235b", "layers": 94, "hidden": 4096, "heads": 64, "kv_heads": 4, "kv_channels": 128,
             "ffn_hidden": 1536, "vocab": 151936, "seq_len": 4096, "experts": 128, "top_k": 8, "gated_mlp": True,
             "tied_embeddings": False, "position_embedding": "rope"}
    base = base_plan(model, {"node": "dgx-h100", "nodes": 32}, 8192)
    found = _families_like(base, tp=2, pp=8, dp=16, cp=1, ep=32, vpp=4, micro_batch=1,
                           zero=ZeroStage.OPTIMIZER_STATES)
    assert {f.expert_tp for f in found} == {1}
    plan = found[0].apply(base, True)
    check_plan(plan)
    assert plan.parallel.etp == 1 and plan.layers_per_stage == (2,) + (3,) * 30 + (2,)
    assert "-etp1" in found[0].label()


def test_a_pipeline_deeper_than_the_layers_divide_runs_on_the_event_engine():
    base = base_plan("llama3-70b", {"node": "dgx-h100", "nodes": 6}, 96)
    lay = next(f for f in families(base, derive_space(base), 48)
               if f.pp == 3 and f.tp == 8 and f.vpp == 2 and f.micro_batch == 1 and f.zero == ZeroStage.OPTIMIZER_STATES)
    plan = replace(lay, recompute=Recompute.FULL).apply(base, True)
    assert sum(plan.layers_per_stage) == 80 and len(set(plan.layers_per_stage)) > 1
    des, ana = simulate(plan, engine="des"), simulate(plan)
    assert des.step_time_s == pytest.approx(ana.step_time_s, rel=0.15)


def test_the_least_recompute_that_fits():
    """Where full recompute is what makes a layout fit, the search recomputes the fewest layers of
    each chunk that fit with the memory model's margin (Megatron-LM's block method): one layer fewer
    would not, and it costs no more time and saves no more memory than recomputing every layer."""
    from simcore.model import memory as mem
    from simcore.planner.headroom import memory_margin

    base = base_plan(*META)
    lay = next(f for f in _families_like(base, tp=8, pp=16, dp=128, cp=1, zero=ZeroStage.OPTIMIZER_STATES,
                                           micro_batch=1, schedule=Schedule.INTERLEAVED_1F1B, vpp=4))
    space = derive_space(base)
    rows = evaluate_family(base, lay, space, Tally(), {})
    block = [r for r in rows if r["recompute_layers"]]
    assert len(block) == 1 and block[0]["layout"].endswith(f"-rc:full-block{block[0]['recompute_layers']}")
    n = block[0]["recompute_layers"]
    roomy = base.cluster.node.gpu.hbm_bytes / memory_margin().hi
    peak = lambda k: max(mem.rank_totals(replace(lay, recompute=Recompute.FULL, recompute_layers=k)  # noqa: E731
                                         .apply(base, True))[0])
    assert peak(n) <= roomy and (n == 1 or peak(n - 1) > roomy)
    full = simulate(replace(lay, recompute=Recompute.FULL).apply(base, True))
    part = simulate(replace(lay, recompute=Recompute.FULL, recompute_layers=n).apply(base, True))
    none = simulate(replace(lay, recompute=Recompute.NONE).apply(base, True))
    assert none.step_time_s <= part.step_time_s <= full.step_time_s
    assert full.memory_per_gpu_gib <= part.memory_per_gpu_gib <= none.memory_per_gpu_gib


def test_precision_is_an_axis_of_the_search(tmp_path, capsys, monkeypatch):
    """bf16 against fp8 on H100 in one ranking; a precision the GPU lacks is refused in one sentence
    by the command line, and skipped per cell by what-if and procurement (an A100 cell trains bf16)."""
    from simcore.planner.space import precisions_of
    from simcore.planner.whatif import _space_of
    from trainplan.cli import main
    from topologies.hardware import load_catalog

    args = ("gpt-1.7b", {"node": "dgx-h100", "nodes": 1}, 32)
    res = search(*args, top_k=0, progress=False, explain=0, precisions=["bf16", "fp8"])
    assert set(res.table["precision"]) == {"", "fp8"}
    fp8 = res.table[res.table["precision"] == "fp8"].iloc[0]
    assert fp8["layout"].endswith("-fp8") and search_best_of(res, "") > fp8["step_time_s"]   # FP8 GEMMs are faster
    gpus = load_catalog().gpus
    assert precisions_of(gpus["h100-sxm"]) == ("fp16", "bf16", "fp8")
    assert "nvfp4" in precisions_of(gpus["b200"]) and "fp8" not in precisions_of(gpus["a100-80gb"])
    monkeypatch.chdir(tmp_path)
    a100 = ["plan", "--model", "gpt-1.7b", "--cluster", "dgx-a100-80gb", "--nodes", "1", "--global-batch", "32",
            "--top-k", "0"]
    assert main(a100 + ["--precision", "fp8"]) == 2
    assert capsys.readouterr().err.strip() == ("trainplan: error: precision=fp8 is not supported by a100-80gb (its "
                                               "catalog entry has no dense_tflops.fp8 peak; it has: fp16, bf16)")
    assert main(a100 + ["--precision", "bf17"]) == 2
    assert capsys.readouterr().err.strip() == ("trainplan: error: precision='bf17' is not one of: fp32, fp16, bf16, "
                                               "fp8, mxfp8, nvfp4")
    from simcore.planner.whatif import Sweep
    sweep = Sweep(name="s", model={"name": "gpt-1.7b"}, cluster={"node": "dgx-a100-80gb", "nodes": 1}, global_batch=32,
                  tokens=1e9, space={"precision": ["all"]})
    base = base_plan("gpt-1.7b", {"node": "dgx-a100-80gb", "nodes": 1}, 32)
    assert _space_of(base, sweep, {}).precision == ("fp16", "bf16")


def search_best_of(res, precision: str) -> float:
    return float(res.table.loc[res.table["precision"] == precision, "step_time_s"].min())
