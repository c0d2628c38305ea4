"""Ranking for the stack a team runs: the layouts its exporter (or trainplan's executor)
refuses leave the ranking, each kind of refusal counted in one sentence."""
from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from simcore.plan.choices import NoLayoutFits
from simcore.plan.spec import PlanError
from simcore.planner.search import _layout_of, search
from simcore.planner.space import base_plan
from simcore.planner.stacks import exporter_check, keep_runnable
from simcore.plan.writers import export_plan
from trainplan.cli import main

QUESTION = ({"name": "llama3-70b", "seq_len": 8192}, {"node": "gb200-nvl72", "nodes": 16}, 256)


def test_the_stacks_exporter_decides_and_the_sentence_counts_its_refusals():
    df = pd.DataFrame({"layout": ["a", "b", "c", "d"], "zero": [1, 3, 1, 2]})
    refuses = lambda z: None if z >= 2 else f"parallel.zero={z} has no X option"  # noqa: E731
    kept, sentence = keep_runnable(df, lambda row: row["zero"], refuses, "torchtitan", "m on 8 x g")
    assert list(kept["layout"]) == ["b", "d"]
    assert sentence == ("2 layouts that fit were left out because torchtitan 0.3 cannot run them: "
                        "parallel.zero has no X option (2)")
    with pytest.raises(NoLayoutFits, match=r"^Megatron-LM runs no layout of m on 8 x g that fits \(most often: "
                                        r"parallel.zero has no X option\)$"):
        keep_runnable(df.head(1), lambda row: row["zero"], refuses, "megatron", "m on 8 x g")
    with pytest.raises(PlanError, match="is not one of: megatron, deepspeed, torchtitan, torchtitan-0.2"):
        exporter_check("jax")


def test_a_refusal_is_counted_without_its_value_and_keeps_its_punctuation():
    from simcore.planner.stacks import _kind

    assert _kind("training.grad_compression needs parallel.tp=1: DDP's hooks cannot wrap DTensors") == (
        "training.grad_compression needs parallel.tp: DDP's hooks cannot wrap DTensors")
    assert _kind("parallel.zero=2, not parallel.ep=4; and (parallel.cp=2)") == (
        "parallel.zero, not parallel.ep; and (parallel.cp)")


def test_a_search_for_torchtitan_ranks_what_torchtitan_runs_in_the_same_order():
    """Its layouts, in the order of the whole ranking where the stack changes nothing (cp 1: torch's
    context parallel gathers K/V, so a cp layout is priced as torchtitan runs it, all_gather)."""
    from simcore.planner.stacks import stack_base

    every = search(*QUESTION, top_k=0, progress=False)
    res = search(*QUESTION, top_k=0, progress=False, stack="torchtitan")
    base = stack_base(base_plan(*QUESTION), "torchtitan")
    assert base.parallel.cp_comm.value == "all_gather"
    for _, row in res.table.head(40).iterrows():
        export_plan(_layout_of(row).apply(base), "torchtitan")   # no refusal
    # (torchtitan's own split of the layers, ``-split:titan``, is searched for it alone)
    kept = set(res.table.loc[res.table["cp"] == 1, "layout"]) & set(every.table["layout"])
    assert res.table["layout"].str.endswith("-split:titan").any()
    by_time = lambda t: t.sort_values(["step_time_s", "memory_per_gpu_gib"], kind="stable")["layout"]  # noqa: E731
    assert [lay for lay in by_time(res.table) if lay in kept] == [lay for lay in by_time(every.table) if lay in kept]
    cp = res.table[res.table["cp"] > 1].merge(every.table, on="layout", suffixes=("", "_ring"))
    assert len(cp) and (cp["step_time_s"] >= cp["step_time_s_ring"]).all()   # the gather blocks; the ring hides
    assert (cp["step_time_s"] > cp["step_time_s_ring"]).mean() > 0.5
    assert len(res.table) < len(every.table) and (res.table["zero"] != 1).all()
    assert (res.table["activation_offload"] == 0).all()
    assert "because torchtitan 0.3 cannot run them: parallel.zero has no torchtitan option" in res.explanations[1]


def test_the_plan_command_ranks_for_the_executor(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["plan", "--model", "llama3-70b", "--cluster", "gb200-nvl72", "--nodes", "16", "--global-batch", "256",
            "--seq-len", "8192", "--top-k", "0", "--rows", "5", "--json"]
    assert main(args + ["--stack", "executor"]) == 0
    out = json.loads(capsys.readouterr().out)
    # FSDP2's CPUOffloadPolicy moves parameters too (offload: optimizer is refused); activation offload
    # runs on a GPU (executors/act_offload.py), never with recompute (refused as Megatron-Core refuses it)
    assert all(r["offload"] != "optimizer" for r in out["table"])
    assert all(r["recompute"] == "none" for r in out["table"] if r["activation_offload"])
    assert any(r["activation_offload"] for r in out["table"])
    assert "because trainplan's executor cannot run them" in out["explanations"][1]


def test_what_if_cells_and_procurement_rank_for_a_stack():
    from simcore.planner.procure_input import candidates_from_dict, sweep_of
    from simcore.planner.whatif import run_whatif, sweep_from_dict

    doc = {"name": "t", "model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 1}, "global_batch": 64,
           "tokens": 1e10, "grid": {"nodes": [1, 2]}, "failures": False,
           "space": {"zero": [1, 3], "pp": [1], "cp": [1], "micro_batch": [1]}, "stack": "torchtitan"}
    table = run_whatif(sweep_from_dict(doc), progress=False).table
    assert table["fits"].all() and (~table["layout"].str.contains("-z1-")).all()   # torchtitan has no ZeRO-1
    gpt = run_whatif(sweep_from_dict({**doc, "model": "gpt-1.7b"}), progress=False).table   # a GeLU MLP
    assert not gpt["fits"].any() and gpt["note"].str.startswith("torchtitan 0.3 runs no layout of gpt-1.7b").all()
    c = candidates_from_dict({"model": "llama3-8b", "tokens": 1e12, "stack": "megatron"})
    assert c.stack == "megatron" and sweep_of(c, "h100-sxm").stack == "megatron" and c.space["zero"] == [1]
    # procurement's default axes take the stack's own ZeRO: torchtitan's FSDP2, not a distributed optimizer
    tt = candidates_from_dict({"model": "llama3-8b", "tokens": 1e12, "stack": "torchtitan"})
    assert tt.space["zero"] == [3]
    with pytest.raises(PlanError, match=r"^candidates.stack='jax' is not one of: megatron, deepspeed"):
        candidates_from_dict({"model": "llama3-8b", "tokens": 1e12, "stack": "jax"})


def test_torchtitans_ddp_layouts_pay_for_the_autocast_it_runs_them_under():
    """torchtitan applies bf16 through torch.autocast under DDP (fp32 weights and gradients, the
    16-bit copies cached to the forward's end): a search for torchtitan prices its DDP layouts
    so, where a search for any stack prices 16-bit weights with a master copy."""
    small_llama = {"name": "llama-1b", "layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn_hidden": 8192,
                   "vocab": 128256, "seq_len": 2048, "gated_mlp": True, "tied_embeddings": False,
                   "position_embedding": "rope"}
    question = (small_llama, {"node": "dgx-h100", "nodes": 1}, 64)
    every = search(*question, top_k=0, progress=False).table
    tt = search(*question, top_k=0, progress=False, stack="torchtitan-0.2").table
    ddp = tt[(tt["zero"] == 0) & (tt["tp"] == 1) & (tt["pp"] == 1) & (tt["cp"] == 1)]
    assert len(ddp) and ddp["autocast"].all() and ddp["layout"].str.endswith("-amp").all()
    assert not tt[tt["zero"] > 0]["autocast"].any()
    base = base_plan(*question)
    for _, row in ddp.head(3).iterrows():
        plan = _layout_of(row).apply(base)
        assert plan.training.autocast
        export_plan(plan, "torchtitan-0.2")   # no refusal
        twin = every[every["layout"] == row["layout"].removesuffix("-amp")]
        if len(twin):   # the same layout priced with a master copy: lighter and faster
            assert float(row["memory_per_gpu_gib"]) > float(twin["memory_per_gpu_gib"].iloc[0])
            assert float(row["step_time_s"]) > float(twin["step_time_s"].iloc[0])


@pytest.mark.parametrize("stack", ["torchtitan-0.2", "deepspeed"])
def test_a_search_for_torchtitan_or_deepspeed_prices_the_attention_they_run(stack):
    """torchtitan's attention is torch SDPA, FlashAttention-2 on an H100 (cuDNN's is opt-in,
    pytorch/pytorch#138522), as is Hugging Face's under DeepSpeed and Megatron-DeepSpeed's flash-attn:
    a search for them prices that kernel, not the catalog's cuDNN entry (Megatron-LM's TE)."""
    small_llama = {"name": "llama-1b", "layers": 16, "hidden": 2048, "heads": 32, "kv_heads": 8, "ffn_hidden": 8192,
                   "vocab": 128256, "seq_len": 8192, "gated_mlp": True, "tied_embeddings": False,
                   "position_embedding": "rope"}
    question = (small_llama, {"node": "dgx-h100", "nodes": 1}, 16)
    tt = search(*question, top_k=0, progress=False, stack=stack)   # torchtitan 0.3 runs its registry's shapes only
    assert tt.best.training.attention_kernel.value == "flash2"
    every = search(*question, top_k=0, progress=False).table.set_index("layout")
    shared = [r for _, r in tt.table.head(5).iterrows() if r["layout"] in every.index]
    assert shared and all(float(r["step_time_s"]) > float(every.loc[r["layout"], "step_time_s"]) for r in shared)


def test_a_search_for_deepspeed_charges_deepspeed_s_zero_and_no_schedule_it_lacks():
    """DeepSpeed runs its own ZeRO-2/3 (dearer than FSDP2's), its pipeline engine one 1F1B
    schedule and a sequence split by Ulysses' all-to-all: a DeepSpeed ranking gets none of
    FSDP2's, interleaving's or the ring's advantages for free, and each ranked layout exports."""
    from simcore.plan.spec import ZeroImpl
    from simcore.planner.stacks import stack_base

    question = ("llama3-70b", {"node": "dgx-h100", "nodes": 8}, 256)
    every = search(*question, top_k=0, progress=False).table
    t = search(*question, top_k=0, progress=False, stack="deepspeed").table
    assert (every["schedule"] != "1f1b").any()
    assert (t.loc[t["pp"] > 1, "schedule"] == "1f1b").all() and (t["vpp"] == 1).all()
    base = stack_base(base_plan(*question), "deepspeed")
    assert (base.parallel.zero_impl, base.parallel.cp_comm.value) == (ZeroImpl.DEEPSPEED, "a2a")
    for _, row in t.head(20).iterrows():
        plan = _layout_of(row).apply(base)
        assert plan.parallel.zero == 0 or plan.parallel.zero_impl == ZeroImpl.DEEPSPEED
        json.loads(export_plan(plan, "deepspeed"))   # no refusal
    assert t.iloc[0]["step_time_s"] >= every.iloc[0]["step_time_s"]


def test_a_search_for_megatron_takes_its_recipes_overlaps_where_a_layout_can():
    """TP communication overlap (with SP) and the overlapped parameter gather (ZeRO-1), as NVIDIA's
    recipes run Megatron: every layout that can take them has them, its export writes them, and
    they cost nothing where they cannot apply."""
    from simcore.planner.stacks import MEGATRON_RECIPE_SWITCHES, stack_base

    res = search("llama3-70b", {"node": "dgx-h100", "nodes": 8}, 128, top_k=0, progress=False, stack="megatron",
                 explain=0)
    base = stack_base(base_plan("llama3-70b", {"node": "dgx-h100", "nodes": 8}, 128), "megatron")
    assert all(getattr(base.parallel, k) == v for k, v in MEGATRON_RECIPE_SWITCHES.items())
    for _, row in res.table.head(30).iterrows():
        par = _layout_of(row).apply(base).parallel
        assert par.tp_comm_overlap == (par.tp > 1 and par.sequence_parallel)
        assert par.overlap_param_gather == (int(par.zero) == 1)
    best = _layout_of(res.table.iloc[0]).apply(base)
    command = export_plan(best, "megatron")
    assert ("--tp-comm-overlap" in command) == best.parallel.tp_comm_overlap
    assert ("--overlap-param-gather" in command) == best.parallel.overlap_param_gather


def test_the_stacks_that_run_expandable_segments_are_charged_its_margin_and_their_exports_set_it():
    """torchtitan's run_train.sh and Megatron-Bridge's launcher run PyTorch's allocator with
    expandable segments: a search for them charges no caching margin, and the exported launch sets
    the allocator so the run reserves what was predicted; a Plan that says otherwise keeps its own."""

    from simcore.model.peak import EXPANDABLE_SEGMENTS_MARGIN
    from simcore.planner.stacks import stack_base

    plain = base_plan("llama3-70b", {"node": "dgx-h100", "nodes": 8}, 128)
    assert plain.training.allocator_margin is None
    for stack in ("megatron", "torchtitan"):
        base = stack_base(plain, stack)
        assert base.training.allocator_margin == EXPANDABLE_SEGMENTS_MARGIN
    own = replace(plain, training=replace(plain.training, allocator_margin=0.05))
    assert stack_base(own, "megatron").training.allocator_margin == 0.05
    res = search("llama3-70b", {"node": "dgx-h100", "nodes": 8}, 128, top_k=0, progress=False, stack="megatron",
                 explain=0)
    best = _layout_of(res.table.iloc[0]).apply(stack_base(plain, "megatron"))
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in export_plan(best, "megatron")
    cached = replace(best, training=replace(best.training, allocator_margin=None))
    assert "PYTORCH_CUDA_ALLOC_CONF" not in export_plan(cached, "megatron")


def test_a_search_on_tpus_for_maxtext_ranks_what_its_export_writes(tmp_path):
    """A TPU cluster searches (its chips have no fp32 peak: the search's base takes its cluster, not a
    probe plan in fp32), and for MaxText ranks only layouts its exporter writes: the best one's launch
    carries its mesh."""
    res = search("llama3-8b", {"node": "tpu-v5p-host", "nodes": 8}, 64, jobs=1, top_k=0, progress=False,
                 stack="maxtext", training={"precision": "bf16"})
    df = res.table
    assert len(df) and (df.pp == 1).all() and set(df.zero) <= {0, 1, 3}
    assert (df[df.cp > 1].zero == 3).all()   # MaxText shards parameters over its context axis too
    text = export_plan(res.best, "maxtext")
    assert f"ici_tensor_parallelism={res.best.parallel.tp} " in text
    assert any("MaxText cannot run them" in line for line in res.explanations)
    # MaxText's remat policies: minimal_with_context (none), minimal (JAX's dots), full; no Megatron selective
    assert set(df.recompute) == {"none", "dots", "full"}
    assert base_plan("llama3-8b", {"node": "tpu-v5p-host", "nodes": 8}, 64).training.precision.value == "bf16"


def test_a_search_for_mindspeed_turns_mc2_on_where_a_dense_layout_takes_it():
    from simcore.plan.load import plan_from_dict
    from simcore.planner.stacks import stack_base

    def base(model):
        return plan_from_dict({"model": {"name": model}, "cluster": {"node": "atlas-800t-a2", "nodes": 1},
                               "parallel": {"dp": 8}, "training": {"global_batch": 32}})

    assert stack_base(base("llama3-8b"), "mindspeed").parallel.tp_comm_overlap       # MC2: TP with SP
    assert not stack_base(base("mixtral-8x7b"), "mindspeed").parallel.tp_comm_overlap   # its MLP runs none
    res = search("llama3-8b", {"node": "atlas-800t-a2", "nodes": 1}, 32, jobs=1, top_k=0, progress=False,
                 stack="mindspeed", explain=0)
    ms = stack_base(base_plan("llama3-8b", {"node": "atlas-800t-a2", "nodes": 1}, 32), "mindspeed")
    plans = [_layout_of(row).apply(ms) for _, row in res.table.head(30).iterrows()]
    assert any(p.parallel.tp > 1 for p in plans)
    for p in plans:   # each layout takes MC2 where it can, and the launch writes what the ranking priced
        assert p.parallel.tp_comm_overlap == (p.parallel.tp > 1 and p.parallel.sequence_parallel)
        assert ("--use-ascend-mc2" in export_plan(p, "mindspeed")) == p.parallel.tp_comm_overlap


def test_an_ascend_search_ranks_for_mindspeed_and_gpu_stacks_are_refused_there():
    from simcore.plan.load import plan_from_dict
    from simcore.planner.stacks import hardware_stack

    ascend = plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "atlas-800t-a2", "nodes": 1},
                             "parallel": {"dp": 8}, "training": {"global_batch": 32}})
    stack, sentence = hardware_stack(ascend, None)
    assert stack == "mindspeed" and sentence.startswith("Ranked for MindSpeed-LLM, the stack trainplan exports for "
                                                        "ascend-910b (no other stack it exports launches on an Ascend NPU)")
    with pytest.raises(PlanError, match=r"^stack=megatron: Megatron-LM launches on GPUs, not on ascend-910b "
                                        r"\(stack=mindspeed ranks the layouts MindSpeed-LLM runs there\)$"):
        hardware_stack(ascend, "megatron")
    # a 910C package is two NPU dies, which MindSpeed counts: no launch of packages, so every layout, said so
    a3 = plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "cloudmatrix-384", "nodes": 1},
                         "parallel": {"dp": 8}, "training": {"global_batch": 32}})
    stack, sentence = hardware_stack(a3, None)
    assert stack is None and sentence.startswith("Ranked over every layout: trainplan writes no MindSpeed-LLM "
                                                 "launch for ascend-910c packages (2 NPU dies each")
    with pytest.raises(ValueError, match=r"^cluster.node=cloudmatrix-384 holds ascend-910c packages of 2 dies each"):
        export_plan(a3, "mindspeed")
    gpu = plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                          "parallel": {"dp": 8}, "training": {"global_batch": 32}})
    with pytest.raises(PlanError, match=r"^stack=mindspeed: MindSpeed-LLM launches on Ascend NPUs, not on h100-sxm$"):
        hardware_stack(gpu, "mindspeed")
    assert hardware_stack(gpu, None) == (None, "")


def test_a_search_for_nxd_copies_the_kv_heads_as_its_launch_does():
    """NeuronX Distributed's TP counts NeuronCores (two a Trainium chip), each holding whole key/value heads:
    Llama 3 70B's 8 heads over tp 8 chips (16 cores) are copied twice, over tp 16 (32 cores) four times, the
    --kv_replicator of NxD's own Llama 70B launches (run_llama3_70B_tp_pp.sh: TP 32, kv_replicator 4); every
    layout ranked is written by the exporter, which refuses heads split within a core."""
    res = search("llama3-70b", {"node": "trn1-32xl", "nodes": 32}, 1024, jobs=1, top_k=0, progress=False,
                 stack="nxd", training={"precision": "bf16"})
    df = res.table
    assert dict(sorted(set(zip(df.tp, df.kv_replicator)))) == {1: 1, 2: 1, 4: 1, 8: 2, 16: 4}
    base = base_plan("llama3-70b", {"node": "trn1-32xl", "nodes": 32}, 1024, {"precision": "bf16"})
    wide = _layout_of(df[df.tp == 16].iloc[0]).apply(base)
    assert wide.parallel.kv_replicator == 4 and exporter_check("nxd")(wide) is None
    assert "--kv_replicator 4" in export_plan(wide, "nxd")
    halved = replace(wide, parallel=replace(wide.parallel, kv_replicator=2))   # 16 heads over 32 cores
    assert exporter_check("nxd")(halved).startswith("parallel.kv_replicator=2 has no NeuronX Distributed option")


def test_a_trainium_search_without_a_stack_ranks_for_nxd_where_its_examples_build_the_model():
    """Trainium's own stack is NeuronX Distributed for the Llama models its examples build: a search that
    names none ranks what NxD runs and says so; stack=any ranks every layout (ZeRO-2/3 too); a model NxD's
    examples do not build (GPT-3's GeLU MLP) is ranked over every layout, said so."""
    res = search("llama3-8b", {"node": "trn1-32xl", "nodes": 2}, 64, jobs=1, top_k=0, progress=False,
                 training={"precision": "bf16"})
    line = next(s for s in res.explanations if s.startswith("Ranked for NeuronX Distributed"))
    assert "stack=any ranks every layout" in line
    nxd = search("llama3-8b", {"node": "trn1-32xl", "nodes": 2}, 64, jobs=1, top_k=0, progress=False, stack="nxd",
                 training={"precision": "bf16"})
    assert list(res.table.layout) == list(nxd.table.layout)          # the default is the named stack
    every = search("llama3-8b", {"node": "trn1-32xl", "nodes": 2}, 64, jobs=1, top_k=0, progress=False,
                   stack="any", training={"precision": "bf16"})
    assert not any(s.startswith("Ranked") for s in every.explanations)
    assert set(nxd.table.zero) <= {0, 1} and set(every.table.zero) - {0, 1}   # every layout: ZeRO-2/3 too
    gpt = search("gpt-1.7b", {"node": "trn1-32xl", "nodes": 1}, 32, jobs=1, top_k=0, progress=False,
                 training={"precision": "bf16"})
    assert any(s.startswith("Ranked over every layout") and "its examples build Llama models only" in s
               for s in gpt.explanations)