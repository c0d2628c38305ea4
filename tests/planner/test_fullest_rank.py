"""The search judges a layout's fit on its fullest pipeline rank. An MoE model's first layers are
dense and hold fewer parameters, so where every stage holds as many layers (DeepSeek-V3's split
around its MTP module), the first rank is not the fullest: the ranked table's fit class must be
the one of the memory each row reports, never a layout ranked on a peak below its own."""
from __future__ import annotations

from pathlib import Path

import pytest

from simcore.model import memory as mem
from simcore.plan.spec import Offload, Recompute, Schedule, ZeroStage
from simcore.planner import evaluate as ev
from simcore.planner.headroom import fit_class
from simcore.planner.search import search
from simcore.planner.space import Layout, base_plan

HF_V3 = str(Path(__file__).resolve().parents[2] / "examples" / "hf" / "deepseek-v3" / "config.json")
MODEL = {"hf_config": HF_V3, "seq_len": 32768}


def test_the_peak_is_the_fullest_ranks_where_the_dense_layers_sit_on_the_first():
    base = base_plan(MODEL, {"node": "dgx-h100", "nodes": 128}, 512)
    lay = Layout(tp=8, pp=16, dp=4, cp=2, ep=16, vpp=1, zero=ZeroStage(0), schedule=Schedule("1f1b"), micro_batch=1,
                 recompute=Recompute("none"), offload=Offload("none"), sequence_parallel=True, split="mtp",
                 expert_tp=1)
    plan = lay.apply(base, True)
    totals = mem.rank_totals(plan)[0]
    assert totals.index(max(totals)) == 1   # the first rank holds the three dense layers
    table = ev.memory_table(plan, (Offload.NONE,), (Recompute.NONE,), {}, ev._shared_parts(plan, {}))
    assert table[Offload.NONE, Recompute.NONE][0] == pytest.approx(max(totals))


def test_every_ranked_row_is_in_the_fit_class_of_its_own_memory():
    model = {**MODEL, "layers": 12, "seq_len": 16384}
    res = search(model, {"node": "dgx-h100", "nodes": 8}, 64, jobs=1, top_k=0, progress=False)
    hbm = res.best.cluster.node.gpu.hbm_bytes
    df = res.table
    assert len(df) > 100 and (df.pp > 1).any()
    wrong = df[[fit_class(g * 2**30, hbm) != f for g, f in zip(df.memory_per_gpu_gib, df.fit)]]
    assert wrong.empty, wrong[["layout", "memory_per_gpu_gib", "fit"]].head().to_string()
