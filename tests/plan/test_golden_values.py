"""Issue 52: Megatron-LM's functional tests (validation/megatron_golden) are stated by the
Megatron importer as the arguments say, and what the Plan cannot state is refused in one
sentence (bench/golden_values.py predicts them)."""
from __future__ import annotations

import importlib.util
import re

import pytest

from simcore.plan.spec import PlanError
from tests.plan.layouts import ROOT
from trainplan.common import UsageError

DATA = ROOT / "validation" / "megatron_golden" / "cases.yaml"

#: (case, golden file): dense and MoE, A100/H100/GB200, 1 and 2 nodes, interleaved, CP, EP
STATED = [("gpt/gpt3_mcore_te_tp1_pp4_vp1", "golden_values_dev_dgx_h100.json"),
          ("gpt/gpt3_mcore_te_tp2_pp1_frozen_resume_torch_dist_cp2_nondeterministic",
           "golden_values_lts_dgx_a100.json"),
          ("gpt/gpt3_mcore_te_tp2_pp2_resume_torch_dist_cp2_nondeterministic",
           "golden_values_dev_dgx_gb200.json"),
          ("moe/gpt3_mcore_cp2_pp2_ep2_te_4experts2parallel_nondeterministic_dp_last",
           "golden_values_dev_dgxa100_dracooci.json"),
          ("moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_resume_torch_dist_dist_optimizer",
           "golden_values_dev_dgx_gb200.json")]
#: cases the importer or the Plan refuse: Megatron's a2a+p2p hierarchical CP, blockwise FP8
REFUSED = [("gpt/gpt3_mcore_te_tp1_pp2_cp4_a2a_p2p_nondeterministic", "a2a+p2p"),
           ("moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph", "blockwise")]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("golden_values", ROOT / "bench" / "golden_values.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows(bench):
    return {(r["case"], r["file"]): r for r in bench.golden_rows(DATA)}


def test_the_stored_file_parses(rows):
    assert len(rows) > 800 and len({case for case, _ in rows}) > 200
    for r in rows.values():
        assert re.fullmatch(r"[0-9a-f]{40}", r["commit"]) and r["args"].startswith("--")
        assert re.fullmatch(r"golden_values_(dev|lts)(_.+)?\.json", r["file"]) and r["run"] in (1, 2)
        assert r["iteration_time_s"] or r["mem_max_allocated_bytes"]
        assert r["iteration_time_s"] is None or 0 < r["iteration_time_s"] < 600
        assert r["mem_max_allocated_bytes"] is None or 2**20 < r["mem_max_allocated_bytes"] < 300 * 2**30
        assert (r["nodes"] is None) == (r["layout_from"] == "")
    assert DATA.stat().st_size < 700_000


@pytest.mark.parametrize("case,file", STATED)
def test_cases_import_with_the_arguments_layout(bench, rows, case, file):
    row = rows[(case, file)]
    assert bench.not_stated(row) is None
    plan, _ = bench.state(row)
    want, got = bench.expected_layout(row), bench.read_back(plan)
    assert got == {k: (got[k] if v is None else v) for k, v in want.items()}
    assert plan.cluster.node.name == bench.CLUSTER[row["hardware"]]
    assert plan.cluster.nodes * plan.cluster.node.gpus_per_node == row["nodes"] * row["gpus_per_node"]
    step, tensors = bench.predict(plan)
    assert step > 0 and 0 < tensors < plan.cluster.node.gpu.hbm_bytes


@pytest.mark.parametrize("case,word", REFUSED)
def test_refusals_are_one_sentence(bench, rows, case, word):
    row = next(r for (c, _), r in rows.items() if c == case and r["nodes"])
    with pytest.raises((PlanError, UsageError)) as exc:
        bench.state(row)
    text = str(exc.value)
    assert word in text and "\n" not in text and text.count(". ") == 0


def test_every_refusal_is_counted_under_a_one_line_reason(bench, rows):
    sample = list(rows.values())[::3]   # the bench runs them all
    results, refused, _ = bench.evaluate(sample)
    assert sum(refused.values()) + sum(r["stated"] for r in results) == len(sample)
    assert sum(r["stated"] for r in results) > len(sample) / 2
    assert all("\n" not in reason for reason in refused)
    assert all(re.match(r"(PlanError|UsageError|CatalogError): ", reason) or "does not train" in reason
               or "names no hardware" in reason or "nodes x GPUs" in reason for reason in refused)
