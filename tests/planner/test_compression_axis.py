"""Communication compression as an opt-in search axis (simcore/planner/compression.py)."""
from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from simcore.plan.rules import check_plan
from simcore.plan.spec import PlanError, ZeroStage
from simcore.planner import compression as cmp
from simcore.planner.search import search
from simcore.planner.space import base_plan, derive_space, families
from simcore.planner.stacks import stack_base

#: DeepSpeed's ZeRO++ tutorial model (docs/_tutorials/zeropp.md) on 48 DGX-1 with one 100 Gbps NIC
#: each: ZeRO-3's gathers cross a thin network, where ZeRO++ pays.
MODEL = {"name": "gpt-18b-zeropp-tutorial", "layers": 40, "hidden": 6144, "heads": 32, "vocab": 50304,
         "seq_len": 512, "position_embedding": "learned", "tied_embeddings": True}
CLUSTER = {"node": "dgx1-v100-16gb", "nodes": 48, "nics_per_node": 1}


def _space(base):
    """The data-parallel corner of the space (ZeRO++ runs without model parallelism): quick."""
    return replace(derive_space(base), tp=(1,), pp=(1,), cp=(1,), micro_batch=(1, 2))


@pytest.fixture(scope="module")
def zeropp_search():
    base = base_plan(MODEL, CLUSTER, 768, {"precision": "fp16"})
    kw = dict(top_k=0, progress=False, training={"precision": "fp16"}, stack="deepspeed", space=_space(base))
    return search(MODEL, CLUSTER, 768, **kw), search(MODEL, CLUSTER, 768, compressions=["zeropp"], **kw)


def test_methods_are_checked_and_ordered():
    assert cmp.check_methods("zeropp,none,bf16,zeropp", "--compression") == ("none", "bf16", "zeropp")
    with pytest.raises(ValueError, match=r"--compression='zip' is not one of: none, bf16"):
        cmp.check_methods("zip", "--compression")


def test_no_layout_compresses_unless_asked(zeropp_search):
    plain, _ = zeropp_search
    assert (plain.table["compression"] == "").all()
    assert not any("compress" in line for line in plain.explanations)


def test_zeropp_wins_where_the_network_is_thin_and_says_its_price(zeropp_search):
    plain, squeezed = zeropp_search
    best = squeezed.table.iloc[0]
    assert best["compression"] == "zeropp"
    assert squeezed.best.parallel.zero_quantized_weights and squeezed.best.parallel.zero_quantized_gradients
    assert squeezed.best.parallel.zero_hpz_partition_size == 8   # one DGX-1
    assert best["step_time_s"] < plain.table.iloc[0]["step_time_s"] / 1.05
    # the uncompressed layouts are still ranked beside it, with their own times
    assert (squeezed.table["compression"] == "").any()
    note = next(line for line in squeezed.explanations if "compresses its communication (zeropp)" in line)
    assert "not its convergence" in note and "ahead of the best layout without compression" in note


def test_every_proposed_method_passes_the_plan_rules():
    """``applies`` mirrors the rules: no family the search proposes with a method breaks a rule of
    that method (other rules may still reject it, as for any layout)."""
    words = ("grad_compression", "onebit", "zero_quantized", "zero_hpz", "fp8_param_gather")
    for stack, training in (("deepspeed", {"precision": "fp16"}), (None, {"precision": "fp8"})):
        base = stack_base(base_plan("gpt-1.7b", {"node": "dgx-h100", "nodes": 2}, 64, training), stack)
        space = replace(derive_space(base), compression=cmp.METHODS, micro_batch=(1,), pp=(1, 2))
        seen = set()
        for lay in families(base, space, base.cluster.gpus):
            seen.add(lay.compression)
            try:
                check_plan(lay.apply(base))
            except PlanError as exc:
                assert not any(w in str(exc) for w in words), (lay.label(), str(exc))
        assert seen >= ({"", "bf16", "zeropp"} if stack else {"", "bf16", "powersgd", "int8", "onebit_adam",
                                                              "onebit_lamb", "zero_one_adam", "fp8_param_gather"})


def test_a_compressed_layout_within_the_models_resolution_is_not_recommended():
    df = pd.DataFrame({"layout": ["a-bf16", "a"], "compression": ["bf16", ""], "fit": ["fits", "fits"],
                       "step_time_s": [1.00, 1.02]})
    top, line = cmp.lossless_first(df, "step_time_s")
    assert list(top["layout"]) == ["a", "a-bf16"] and "compresses nothing" in line
    far = df.assign(step_time_s=[1.00, 1.30])
    top, line = cmp.lossless_first(far, "step_time_s")
    assert list(top["layout"]) == ["a-bf16", "a"] and "30% ahead" in line


def test_ties_prefer_no_compression():
    from simcore.planner.search import merge_ties

    row = {"tp": 1, "pp": 1, "dp": 8, "cp": 1, "ep": 1, "vpp": 1, "zero": 1, "micro_batch": 1, "gpus": 8,
           "step_time_s": 1.0, "memory_per_gpu_gib": 10.0}
    df = pd.DataFrame([{**row, "layout": "x-bf16", "compression": "bf16"}, {**row, "layout": "x", "compression": ""}])
    assert list(merge_ties(df)["layout"]) == ["x"]


def test_cli_names_the_flag(tmp_path, capsys):
    from trainplan.cli import main

    assert main(["plan", "--model", "gpt-1.7b", "--cluster", "dgx-h100", "--nodes", "1", "--global-batch", "8",
                 "--compression", "zip", "--out", str(tmp_path / "p.yaml")]) == 2
    assert capsys.readouterr().err.strip().endswith("--compression='zip' is not one of: none, bf16, fp16, powersgd, "
                                                    "int8, int8_ef, int4, onebit_adam, onebit_lamb, zero_one_adam, zeropp, "
                                                    "fp8_param_gather")
    assert not (tmp_path / "p.yaml").exists()


def test_whatif_takes_compression_as_an_axis():
    from simcore.planner.whatif import _space_of, sweep_from_dict

    sweep = sweep_from_dict({"model": MODEL, "cluster": CLUSTER, "global_batch": 768, "tokens": 1e9,
                             "grid": {"parallel.compression": ["none", "zeropp"]}})
    base = base_plan(MODEL, CLUSTER, 768)
    assert _space_of(base, sweep, {"parallel.compression": "zeropp"}).compression == ("zeropp",)
    with pytest.raises(PlanError, match="compression='zip' is not one of"):
        _space_of(base, sweep, {"parallel.compression": "zip"})


def test_the_recommendation_without_compression_is_timed_on_both_engines():
    """Where a compressed layout is passed over (within the model's resolution), the uncompressed one
    put first is re-simulated on the event engine like the layouts it displaced."""
    cluster = {"node": "dgx-a100-80gb", "nodes": 4}
    base = base_plan("gpt-1.7b", cluster, 512)
    space = replace(derive_space(base), tp=(1,), pp=(1,), cp=(1,), micro_batch=(16,))
    res = search("gpt-1.7b", cluster, 512, top_k=1, progress=False, space=space, compressions=["bf16"])
    first = res.table.iloc[0]
    assert first["compression"] == "" and not pd.isna(first["des_step_time_s"])
    assert any("the recommendation compresses nothing" in line for line in res.explanations)


def test_fp8_gathers_follow_the_layouts_own_precision_and_recipe():
    """A bf16 base searched in fp8 under torchao's tensorwise recipe (torchtitan's, ``space.fp8_recipe``):
    its FSDP2 ZeRO-2/3 layouts take FP8 gathers, as the rule lets them; not under delayed scaling."""
    base = base_plan("gpt-1.7b", {"node": "dgx-h100", "nodes": 2}, 64)
    space = replace(derive_space(base), compression=("none", "fp8_param_gather"), micro_batch=(1,), pp=(1,),
                    precision=("fp8",))
    def zeros(recipe):
        return {lay.zero for lay in families(base, replace(space, fp8_recipe=recipe), base.cluster.gpus)
                if lay.compression == "fp8_param_gather"}
    assert {ZeroStage.GRADIENTS, ZeroStage.WEIGHTS} <= zeros("tensorwise")
    assert zeros("delayed") == {ZeroStage.OPTIMIZER_STATES}


@pytest.mark.parametrize("method", cmp.OPTIMIZERS)
def test_the_deepspeed_optimizers_swap_the_optimizer_and_say_their_price(method):
    """1-bit Adam, 1-bit LAMB and 0/1 Adam are optimizers: the method sets ``training.optimizer``, only on
    DDP layouts (DeepSpeed refuses them with ZeRO), and states its accuracy price and need."""
    assert cmp.fields(method, 8) == ({}, {"optimizer": cmp.Optimizer(method)})
    assert "arXiv" in cmp.ACCURACY[method] or "ICML" in cmp.ACCURACY[method]
    assert "not compatible with ZeRO" in cmp.NEEDS[method]
    base = base_plan("gpt-1.7b", {"node": "dgx-h100", "nodes": 2}, 64, {"precision": "fp16"})
    lays = families(base, replace(derive_space(base), compression=(method,), micro_batch=(1,), pp=(1,)),
                    base.cluster.gpus)
    took = [lay for lay in lays if lay.compression == method]
    assert took and all(lay.zero == ZeroStage.NONE for lay in took)
