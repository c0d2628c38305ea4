"""training.activation_offload: what the GPU keeps, what the host holds, what the copies cost,
in both engines; the Plan field's rules and the exports that can or cannot say it."""
from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.engine.predict import simulate
from simcore.model import act_offload as ao
from simcore.model import activations as acts
from simcore.model import recompute as rcp
from simcore.model.dp_costs import host_link_bytes_per_s
from simcore.model.step_costs import memory_report, step_costs
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan

GIB = 2**30


def _doc(off=0, *, model="llama3-8b", node="dgx-h100", nodes=1, seq_len=8192, zero=3, recompute="none", **training):
    return {"model": {"name": model, "seq_len": seq_len}, "cluster": {"node": node, "nodes": nodes},
            "parallel": {"zero": zero},
            "training": {"global_batch": 8 * nodes * 2, "activation_offload": off, "flash_attention": True,
                         "recompute": recompute, **training}}


def _plan(off=0, **kw):
    return plan_from_dict(_doc(off, **kw))


def test_the_gpu_keeps_the_kept_layers_or_two_offloaded_ones_and_the_host_the_rest():
    base = _plan(0)
    stash = rcp.chunk_stash_bytes(base.training, 32, acts.layer_activations(base))
    per = stash / 32
    for off, resident in ((8, 24), (16, 16), (31, 2), (32, 2)):
        plan = _plan(off)
        gpu, host = rcp.offload_split(plan.training, 32, stash)
        assert gpu == pytest.approx(per * resident) and host == pytest.approx(per * off)
        # the node's host memory holds every GPU's offloaded layers
        assert memory_report(plan)["host_offload_bytes_per_node"] == pytest.approx(8 * per * off)
    full = _plan(16, recompute="full")   # checkpointed layers offload their inputs only
    assert memory_report(full)["host_offload_bytes_per_node"] == pytest.approx(
        8 * 16 * acts.layer_activations(full).boundary)
    assert _plan("all").training.activation_offload == 32


def test_a_copy_the_compute_cannot_hide_is_waited_for_in_both_engines():
    """PCIe Gen5 behind a shared switch (32 GB/s a GPU) against NVLink-C2C (225 GB/s a GPU):
    the same layer's copy is exposed on one and hidden on the other."""
    slow, fast = _plan(16), _plan(16, node="gb200-nvl72", nodes=2)
    assert host_link_bytes_per_s(slow) == pytest.approx(32e9) and host_link_bytes_per_s(fast) == pytest.approx(225e9)
    copy = ao.layer_copy_s(slow, 32)
    assert copy == pytest.approx(rcp.chunk_stash_bytes(slow.training, 32, acts.layer_activations(slow)) / 32 / 32e9)
    # each offloaded layer waits for its copy less one layer's compute and blocking comm
    assert ao.activation_copies_s(slow, (32,), (copy / 4, copy / 4), (copy, 0.0)) == ((16 * copy / 2, 0.0),)
    assert ao.activation_copies_s(_plan(0), (32,), (0.0, 0.0), (0.0, 0.0)) == ()
    c = step_costs(slow)
    (fwd, bwd), = c.activation_copies_s
    assert 0 < fwd < 16 * copy and 0 <= bwd < fwd   # the backward (2x the compute) hides more
    (f_fast, b_fast), = step_costs(fast).activation_copies_s
    assert f_fast < fwd / 4 and b_fast == 0.0
    a, e = simulate(slow), simulate(slow, engine="des")
    m = slow.num_microbatches
    assert a.offload_s == pytest.approx(m * (fwd + bwd), rel=1e-9)
    assert e.step_time_s == pytest.approx(a.step_time_s, rel=0.05)
    assert e.time_s["activation_offload"] == pytest.approx(m * fwd, rel=1e-6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(model=st.sampled_from(("gpt-1.7b", "llama3-8b", "llama2-13b")),
       node=st.sampled_from(("dgx-a100-80gb", "dgx-h100", "gb200-nvl72")),
       zero=st.sampled_from([0, 1, 3]), recompute=st.sampled_from(["none", "selective", "full"]),
       off=st.integers(1, 24))
def test_offloading_activations_cannot_win_for_nothing(model, node, zero, recompute, off):
    """Fewer bytes on the GPU are paid for with host memory and copies: never faster, never
    more GPU memory, and more offloaded layers never take less time."""
    nodes = 2 if node == "gb200-nvl72" else 1
    try:
        plans = [_plan(k, model=model, node=node, nodes=nodes, zero=zero, recompute=recompute, seq_len=4096)
                 for k in (0, off, min(off + 4, 24))]
    except PlanError:
        return
    runs = [simulate(p) for p in plans]
    reports = [memory_report(p) for p in plans]
    for before, after, rb, ra in zip(runs, runs[1:], reports, reports[1:]):
        assert after.step_time_s >= before.step_time_s * (1 - 1e-12)
        assert after.memory_per_gpu_gib <= before.memory_per_gpu_gib * (1 + 1e-12)
        assert ra["host_offload_bytes_per_node"] >= rb["host_offload_bytes_per_node"]
    assert reports[1]["host_offload_bytes_per_node"] > 0


def test_the_field_reads_and_writes_and_refuses_in_one_sentence():
    assert plan_to_dict(_plan(16))["training"]["activation_offload"] == 16
    assert "activation_offload" not in plan_to_dict(_plan(0))["training"]
    for bad, words in (("half", "='half' must be a number of layers (0 or more) or 'all'"),
                       (-1, "=-1 must be a number of layers"), (40, "=40 exceeds model.layers=32")):
        with pytest.raises(PlanError, match=re.escape(words)):
            _plan(bad)
    doc = _doc(4)
    doc["parallel"]["pp"] = 2
    with pytest.raises(PlanError, match=r"needs parallel.pp=1 \(Megatron-Core refuses"):
        plan_from_dict(doc)


def test_megatron_says_it_and_reads_it_back_the_others_refuse():
    plan = plan_from_dict({**_doc(16, zero=1), "parallel": {"zero": 1}})
    text = export_plan(plan, "megatron")
    assert "--cpu-offloading-num-layers 16" in text.replace(" \\\n", " ").replace("  ", " ")
    assert read_megatron(text).fields["training.activation_offload"] == 16
    with pytest.raises(ValueError, match="does not work when activation recomputation is enabled"):
        export_plan(plan_from_dict({**_doc(16, zero=1, recompute="full"), "parallel": {"zero": 1}}), "megatron")
    with pytest.raises(ValueError, match="must be below model.layers=32"):
        export_plan(plan_from_dict({**_doc("all", zero=1), "parallel": {"zero": 1}}), "megatron")
    with pytest.raises(ValueError, match="training.activation_offload=16 has no DeepSpeed config option"):
        export_plan(plan, "deepspeed")


def test_the_megatron_export_passes_megatron_s_own_rules_which_catch_what_it_refuses():
    from tests.plan.test_megatron_args import broken_rules, parse_export

    text = export_plan(plan_from_dict({**_doc(16, zero=1), "parallel": {"zero": 1}}), "megatron")
    assert parse_export(text)[0]["cpu_offloading_num_layers"] == 16 and broken_rules(text) == []
    assert broken_rules(text.replace("--cpu-offloading-num-layers 16", "--cpu-offloading-num-layers 32")) == \
        ["cpu-offloading-layers"]
    assert broken_rules(text.replace("--cpu-offloading-num-layers 16", "--cpu-offloading-num-layers 16 "
                                     "--recompute-granularity full")) == ["cpu-offloading-no-recompute"]


def test_the_executor_runs_it_on_a_gpu_alone_and_without_recompute_in_one_sentence():
    from executors.support import check_executable

    check_executable(_plan(16), "cuda")
    with pytest.raises(ValueError, match=r"^training.activation_offload needs a GPU: it moves saved"):
        check_executable(_plan(16), "cpu")
    with pytest.raises(ValueError, match=r"^training.activation_offload=16 with training.recompute=selective is "
                                         r"not run by the executor"):
        check_executable(_plan(16, recompute="selective"), "cuda")


def test_the_planner_s_memory_table_holds_the_offloaded_bytes_in_host_memory():
    from dataclasses import replace

    from simcore.model import memory as mem
    from simcore.plan.spec import Offload, Recompute
    from simcore.planner.evaluate import memory_table

    plan = _plan(16)
    table = memory_table(plan, (Offload.NONE,), (Recompute.NONE, Recompute.FULL), {})
    for (_off, rc), (peak, host) in table.items():
        full = mem.memory_per_rank(replace(plan, training=replace(plan.training, recompute=rc)))
        assert peak == pytest.approx(max(m["total"] for m in full), rel=1e-12)
        assert host == pytest.approx(max(m["host"] for m in full) * 8, rel=1e-12) and host > 0


def test_the_search_offloads_the_fewest_layers_that_leave_headroom_where_recompute_was_needed():
    """Llama 3 70B on 64 GB200 as Megatron-Bridge runs it (Megatron-FSDP over 64, micro-batch 2,
    no recompute: 40 of 80 layers offloaded in their recipe): the search finds the offload."""
    from dataclasses import replace

    from simcore.plan.spec import ZeroStage
    from simcore.planner.headroom import memory_margin
    from simcore.planner.search import _layout_of, search
    from simcore.planner.space import base_plan, derive_space

    args = ({"name": "llama3-70b", "seq_len": 8192}, {"node": "gb200-nvl72", "nodes": 16}, 256)
    base = base_plan(*args)
    space = replace(derive_space(base), tp=(1,), pp=(1, 2), cp=(1,), zero=(ZeroStage.WEIGHTS,), micro_batch=(2,),
                    vpp=(2,))
    t = search(*args, top_k=0, progress=False, space=space).table
    off = t[t["activation_offload"] > 0]
    assert len(off) == 1 and (off["pp"] == 1).all() and (off["recompute"] == "none").all()
    assert (t.loc[(t["pp"] == 1) & (t["activation_offload"] == 0), "recompute"] != "none").all()
    row = off.iloc[0]
    n = int(row["activation_offload"])
    assert row["layout"].endswith(f"-rc:none-aoff:{n}") and 0 < n < 80
    plan = _layout_of(row).apply(base)
    assert plan.training.activation_offload == n
    limit = 186 / memory_margin().hi
    assert memory_report(plan)["memory_per_gpu_gib"] <= limit < memory_report(
        replace(plan, training=replace(plan.training, activation_offload=n - 1)))["memory_per_gpu_gib"]
    # NVLink-C2C hides the copies: it beats recomputing the same layout
    recomputed = t[(t["pp"] == 1) & (t["activation_offload"] == 0)]
    assert row["step_time_s"] < recomputed["step_time_s"].min()


def test_a_sweep_can_leave_the_offload_out_of_the_search():
    from dataclasses import replace

    from simcore.plan.spec import ZeroStage
    from simcore.planner.search import search
    from simcore.planner.space import base_plan, derive_space
    from simcore.planner.whatif import _space_of, sweep_from_dict

    args = ({"name": "llama3-70b", "seq_len": 8192}, {"node": "gb200-nvl72", "nodes": 16}, 256)
    base = base_plan(*args)
    sweep = sweep_from_dict({"name": "t", "model": args[0], "cluster": args[1], "global_batch": 256, "tokens": 1e9,
                             "grid": {"nodes": [16]}, "space": {"activation_offload": [False]}})
    assert _space_of(base, sweep, {"nodes": 16}).activation_offload == (False,)
    space = replace(derive_space(base), tp=(1,), pp=(1,), cp=(1,), zero=(ZeroStage.WEIGHTS,), micro_batch=(2,),
                    activation_offload=(False,))
    assert (search(*args, top_k=0, progress=False, space=space).table["activation_offload"] == 0).all()


def test_the_plan_command_can_rank_without_offload(tmp_path, capsys, monkeypatch):
    import json

    from trainplan.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["plan", "--model", "llama3-70b", "--cluster", "gb200-nvl72", "--nodes", "16", "--global-batch", "256",
            "--seq-len", "8192", "--top-k", "0", "--rows", "400", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)["table"]
    assert any(r["activation_offload"] > 0 for r in rows)
    assert main(args + ["--no-activation-offload"]) == 0
    rows = json.loads(capsys.readouterr().out)["table"]
    assert rows and all(r["activation_offload"] == 0 for r in rows)
