"""The MaxText export (issue 54, item 5): a TPU plan's mesh as MaxText's ici_/dcn_ axes, its batch as
MaxText counts it, every key one base.yml defines, and what MaxText's options here cannot state refused
in one sentence naming the field. Checked against the mesh of MaxText's own published configs."""
from __future__ import annotations

import math
import re
import shlex
import sys
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.plan.load import plan_from_dict
from simcore.plan.maxtext_writer import REMAT_NOTE, maxtext_args, mesh
from simcore.plan.spec import Recompute
from simcore.plan.readers import load_tool_options
from simcore.plan.writers import export_plan
from tests.plan.layouts import ALL
from tests.plan.test_interop import _export_or_refusal

ROOT = Path(__file__).resolve().parents[2]
ACCELERATORS = ROOT.parent / "shared" / "validation" / "dev_accelerators.csv"


def _tpu(tp=4, dp=32, zero=3, replicate=2, micro_batch=2, **training):
    return plan_from_dict({"name": "llama3-8b-v5p", "model": {"name": "llama3-8b", "seq_len": 8192},
                           "cluster": {"node": "tpu-v5p-host", "nodes": tp * dp // 4, "nvlink_domain_gpus": 64},
                           "parallel": {"tp": tp, "dp": dp, "zero": zero, "dp_replicate": replicate,
                                        "sequence_parallel": tp > 1},
                           "training": {"global_batch": 256, "micro_batch": micro_batch, "precision": "bf16",
                                        "recompute": "dots", "flash_attention": True, **training}})


def _args(text: str) -> dict[str, str]:
    return dict(a.split("=", 1) for a in shlex.split(text, comments=True) if "=" in a)


def test_two_v5p_slices_of_an_fsdp_plan():
    args = _args(export_plan(_tpu(), "maxtext"))
    assert (args["ici_tensor_parallelism"], args["ici_fsdp_parallelism"], args["ici_data_parallelism"],
            args["dcn_data_parallelism"]) == ("4", "16", "1", "2")
    # MaxText trains devices x per_device_batch_size x gradient_accumulation_steps sequences a step
    assert 128 * float(args["per_device_batch_size"]) * int(args["gradient_accumulation_steps"]) == 256
    assert (args["remat_policy"], args["attention"], args["mlp_activations"]) == ("minimal", "flash", "[silu,linear]")
    known = load_tool_options()["maxtext"]["options"]
    assert all(k in known for k in args)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), slices=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 3]),
       replicate=st.sampled_from([1, 2, 4, 8]))
def test_the_mesh_covers_every_device_and_a_slice_holds_its_ici_axes(tp, slices, zero, replicate):
    dp = 64 * slices // tp
    if dp % replicate or dp == replicate or (zero != 3 and replicate > 1):   # replicas of what ZeRO-3 shards
        return
    plan = _tpu(tp=tp, dp=dp, zero=zero, replicate=replicate, micro_batch=1)
    try:
        axes = dict(mesh(plan))
    except ValueError as exc:   # a shard group that tiles no slice: one sentence naming the field
        assert str(exc).startswith("parallel.dp_replicate=") and "\n" not in str(exc)
        return
    assert math.prod(axes.values()) == plan.parallel.gpus
    assert math.prod(v for k, v in axes.items() if k.startswith("ici_")) == 64
    if zero == 3:   # the shard group is the fsdp axis, the replicas the data axis
        assert axes["ici_fsdp_parallelism"] * axes.get("dcn_fsdp_parallelism", 1) == dp // replicate


@pytest.mark.skipif(not ACCELERATORS.exists(), reason="../shared/validation is not beside this checkout")
def test_maxtexts_own_tables_come_back_with_their_mesh_and_batch():
    """Each MaxText row of dev_accelerators.csv, as the bench reads it into a Plan, exports with the
    published tensor and fsdp degrees inside a slice, its slices over DCN, and its per-device batch."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import published_accelerators as acc
    finally:
        sys.path.remove(str(ROOT / "bench"))
    rows = pd.read_csv(ACCELERATORS)
    checked = 0
    for _, row in rows[rows.source.isin(acc.MAXTEXT)].iterrows():
        plan = plan_from_dict(acc.base_doc(row))
        args = dict(maxtext_args(plan))
        slices = acc.slices(row)
        assert args["ici_tensor_parallelism"] == int(row.tp)
        assert args["ici_fsdp_parallelism"] == int(row.fsdp)
        assert args["dcn_data_parallelism"] == slices
        if m := re.search(r"dcn_data_parallelism=(\d+)", str(row.notes)):
            assert int(m.group(1)) == slices
        assert args["per_device_batch_size"] * args["gradient_accumulation_steps"] == pytest.approx(row.micro_batch)
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("change, field", [
    ({"parallel": {"zero": 2}}, "parallel.zero=2"),
    ({"training": {"optimizer_in_backward": True, "micro_batch": 8}}, "training.optimizer_in_backward=True"),
    ({"training": {"optimizer": "adam"}}, "training.optimizer=adam"),
    ({"training": {"precision": "fp8"}}, "training.precision=fp8"),
])
def test_what_maxtext_cannot_state_is_refused_in_one_sentence(change, field):
    from simcore.plan.load import plan_to_dict

    doc = plan_to_dict(_tpu())
    for section, values in change.items():
        doc[section].update(values)
    with pytest.raises(ValueError) as err:
        export_plan(plan_from_dict(doc), "maxtext")
    assert str(err.value).startswith(field) and "has no MaxText option" in str(err.value)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- the launch read back

def _held(plan) -> tuple:
    """What a MaxText launch states of a Plan: the model's shape and block, the mesh, the batch, precision,
    remat, attention, optimizer, offload."""
    m, par, tr = plan.model, plan.parallel, plan.training
    model = tuple(getattr(m, k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab",
                                          "seq_len", "gated_mlp", "activation", "tied_embeddings", "rope_base",
                                          "dropout", "norm", "bias", "position_embedding"))
    # selective is written as MaxText's nearest policy, minimal, which reads back as dots (the launch says so)
    recompute = Recompute.DOTS if tr.recompute == Recompute.SELECTIVE else tr.recompute
    return (model, (par.tp, par.dp, par.zero, par.dp_replicate), (recompute,),
            tuple(getattr(tr, k) for k in ("global_batch", "micro_batch", "precision",
                                           "flash_attention", "optimizer", "offload", "master_weights")))


EXPORTABLE = sorted(n for n, p in ALL.items() if _export_or_refusal(p, "maxtext")[0] is not None)


@pytest.mark.parametrize("name", ["tpu", *EXPORTABLE])
def test_import_of_the_export_gives_back_the_plan(name):
    from simcore.plan.interop import import_plan

    plan = _tpu() if name == "tpu" else ALL[name]
    doc, _ = import_plan(maxtext=export_plan(plan, "maxtext"), cluster=plan.cluster.node.name,
                         nodes=plan.cluster.nodes)
    assert _held(plan_from_dict(doc)) == _held(plan)


def test_selective_is_written_as_minimal_and_the_launch_says_what_maxtext_runs():
    """MaxText has no core-attention-only remat: a selective plan is written as remat_policy=minimal (JAX's
    checkpoint_dots_with_no_batch_dims) with a comment line, and the import reads minimal as recompute: dots,
    which keeps fewer bytes than selective and re-runs the attention."""
    from simcore.engine.predict import simulate
    from simcore.plan.interop import import_plan

    plan = _tpu(dp=16, replicate=1, recompute="selective")   # one slice of 64 chips (the DCN's figures are gaps)
    text = export_plan(plan, "maxtext")
    assert REMAT_NOTE in text.splitlines() and _args(text)["remat_policy"] == "minimal"
    assert REMAT_NOTE not in export_plan(_tpu(), "maxtext")           # a dots plan is written as it is
    doc, _ = import_plan(maxtext=text, cluster=plan.cluster.node.name, nodes=plan.cluster.nodes)
    back = plan_from_dict(doc)
    assert back.training.recompute == Recompute.DOTS
    sel, dots = simulate(plan), simulate(back)
    assert dots.memory_bytes["activations"] < sel.memory_bytes["activations"] and dots.step_time_s > sel.step_time_s


def test_base_ymls_auto_axes_fill_the_devices():
    """Left out, ici_fsdp_parallelism and dcn_data_parallelism are base.yml's -1: MaxText sizes them to the
    devices left; two v5p slices (num_slices) of 64 chips under tensor parallelism 4."""
    from simcore.plan.interop import import_plan

    text = ("python3 -m maxtext.trainers.pre_train.train src/maxtext/configs/base.yml base_emb_dim=4096 "
            "base_num_query_heads=32 base_num_kv_heads=8 head_dim=128 base_mlp_dim=14336 base_num_decoder_layers=32 "
            "vocab_size=128256 max_target_length=8192 ici_tensor_parallelism=4 num_slices=2 per_device_batch_size=1 "
            "run_name=x")
    doc, warnings = import_plan(maxtext=text, cluster="tpu-v5p-host", nodes=32)
    assert doc["parallel"] == {"tp": 4, "dp": 32, "zero": 3, "dp_replicate": 2, "sequence_parallel": True}
    assert doc["cluster"]["nvlink_domain_gpus"] == 64 and doc["training"]["global_batch"] == 128
    assert doc["training"]["recompute"] == "full" and any("run_name" in w for w in warnings)   # base.yml's remat


@pytest.mark.parametrize("extra, words", [
    ("decoder_block=mixtral", "decoder_block=mixtral: the import reads the llama2 block"),
    ("model_name=llama3-8b", "model_name=llama3-8b: the import reads the llama2 block"),
    ("ici_pipeline_parallelism=2", "ici_pipeline_parallelism=2: the import reads MaxText's tensor, context, fsdp"),
    ("ici_context_parallelism=2 context_parallel_strategy=ulysses", "context_parallel_strategy=ulysses: the import "
     "reads all_gather, ring"),
    ("remat_policy=save_qkv_proj", "remat_policy=save_qkv_proj: the import reads full, minimal"),
    ("per_device_batch_size=0.5", "per_device_batch_size=0.5: a data-parallel rank's micro-batch"),
])
def test_what_the_plan_cannot_hold_is_refused_naming_the_key(extra, words):
    from simcore.plan.interop import import_plan
    from simcore.plan.spec import PlanError

    text = f"base_emb_dim=1024 base_num_query_heads=8 base_num_decoder_layers=4 vocab_size=32000 {extra}"
    with pytest.raises(PlanError) as err:
        import_plan(maxtext=text, cluster="tpu-v5p-host", nodes=2)
    assert str(err.value).startswith(words) and "\n" not in str(err.value)


# --------------------------------------------------------------------------- context parallelism

PER_NODE = {"tpu-v5p-host": 4, "dgx-h100": 8}


def _cp(cp=4, comm="all_gather", zero=3, node="tpu-v5p-host", nodes=32, seq_len=8192, slice_=None, **parallel):
    return plan_from_dict({"name": "cp", "model": {"name": "llama3-8b", "seq_len": seq_len},
                           "cluster": {"node": node, "nodes": nodes,
                                       **({"nvlink_domain_gpus": slice_} if slice_ else {})},
                           "parallel": {"tp": 2, "cp": cp, "dp": nodes * PER_NODE[node] // (2 * cp), "zero": zero,
                                        "sequence_parallel": True, "cp_comm": comm, **parallel},
                           "training": {"global_batch": 256, "micro_batch": 2, "recompute": "selective",
                                        "flash_attention": True}})


@pytest.mark.parametrize("comm, node, nodes, extra", [
    ("all_gather", "tpu-v5p-host", 32, {"context_parallel_strategy": "all_gather"}),
    ("p2p", "tpu-v5p-host", 32, {"context_parallel_strategy": "ring", "use_tokamax_splash": "true"}),
    ("p2p", "dgx-h100", 16, {"context_parallel_strategy": "ring", "hardware": "gpu", "attention": "cudnn_flash_te"}),
])
def test_context_parallelism_is_written_on_the_context_axis_and_read_back(comm, node, nodes, extra):
    from simcore.plan.interop import import_plan

    plan = _cp(comm=comm, node=node, nodes=nodes)
    text = export_plan(plan, "maxtext")
    args = _args(text)
    assert args["ici_context_parallelism"] == "4" and all(args[k] == v for k, v in extra.items())
    # the context axis holds the sequence, so a device's share of the micro-batch is 1 / (tp x cp) of it
    assert float(args["per_device_batch_size"]) == 2 / (2 * 4)
    assert all(k in load_tool_options()["maxtext"]["options"] for k in args)
    doc, _ = import_plan(maxtext=text, cluster=node, nodes=nodes)
    back = plan_from_dict(doc)
    assert _held(back) == _held(plan) and (back.parallel.cp, back.parallel.cp_comm) == (4, plan.parallel.cp_comm)


@pytest.mark.parametrize("change, words", [
    ({"zero": 1}, "parallel.zero=1 has no MaxText option: MaxText shards parameters over its context axis"),
    ({"comm": "a2a"}, "parallel.cp_comm=a2a has no MaxText option"),
    ({"cp": 32, "slice_": 32}, "parallel.cp=32 has no MaxText option: ici_context_parallelism is written inside "
     "a slice"),   # tp 2 x cp 32 over two slices of 32 chips
    ({"comm": "p2p", "seq_len": 8200}, "parallel.cp=4 has no MaxText option: MaxText's ring on a TPU needs an even"),
])
def test_context_parallelism_maxtext_cannot_state_is_one_sentence(change, words):
    with pytest.raises(ValueError) as err:
        export_plan(_cp(**change), "maxtext")
    assert str(err.value).startswith(words) and "\n" not in str(err.value)
