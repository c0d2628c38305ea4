"""What each stack runs, exported and imported as it runs it: torch's context parallel (torchtitan)
gathers K/V unless torchtitan 0.2 asks for the ring; torchtitan's float8 is torchao's, tensorwise or
rowwise (tests/planner/test_stacks.py ranks layouts for each stack)."""
from dataclasses import replace

import pytest

from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict
from simcore.plan.writers import export_plan
from tests.plan.layouts import EXAMPLES


def test_torchtitan_context_parallel_gathers_unless_0_2_asks_for_the_ring():
    """torch's context parallel SDPA all-gathers K/V by default; torchtitan 0.2's
    context_parallel_rotate_method = "alltoall" is the ring; 0.3 has the gather alone."""
    text = (EXAMPLES / "torchtitan" / "llama3_70b.toml").read_text()
    text = text.replace("context_parallel_degree = 1", "context_parallel_degree = 2", 1)
    doc, _ = import_plan(torchtitan=text, cluster="dgx-h100", nodes=8)
    assert doc["parallel"]["cp"] == 2 and doc["parallel"]["cp_comm"] == "all_gather"
    ring = text.replace("[parallelism]", '[parallelism]\ncontext_parallel_rotate_method = "alltoall"', 1)
    doc, _ = import_plan(torchtitan=ring, cluster="dgx-h100", nodes=8)
    assert doc["parallel"]["cp_comm"] == "p2p"
    plan = plan_from_dict(doc)
    assert 'context_parallel_rotate_method = "alltoall"' in export_plan(plan, "torchtitan-0.2")
    with pytest.raises(ValueError, match=r"^parallel.cp_comm=p2p has no torchtitan option: its context parallel "
                                         r"all-gathers K/V \(parallel.cp_comm: all_gather\)$"):
        export_plan(plan, "torchtitan")


def test_torchtitan_float8_is_torchao_s_tensorwise_or_rowwise_and_reads_back():
    from simcore.plan.spec import Fp8Recipe, Precision
    from tests.plan.layouts import ALL

    base = ALL["llama3-8b-fsdp-h100"]
    for recipe in ("tensorwise", "rowwise"):
        plan = replace(base, training=replace(base.training, precision=Precision.FP8, fp8_recipe=Fp8Recipe(recipe)))
        doc, _ = import_plan(torchtitan=export_plan(plan, "torchtitan-0.2"), cluster="dgx-h100", nodes=1)
        assert (doc["training"]["precision"], doc["training"]["fp8_recipe"]) == ("fp8", recipe)
    delayed = replace(base, training=replace(base.training, precision=Precision.FP8, fp8_recipe=Fp8Recipe.DELAYED))
    with pytest.raises(ValueError, match=r"^training.fp8_recipe=delayed has no torchtitan option: its float8 "
                                         r"converter \(torchao\) scales tensorwise or rowwise"):
        export_plan(delayed, "torchtitan-0.2")
