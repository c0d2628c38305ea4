"""Hybrid sharding as a search axis (``plan --hybrid``, ``SearchSpace.hybrid``): off by default,
as the stacks' recipes leave it; where asked, every ZeRO layout whose data-parallel ranks span
NVLink domains also with one domain a shard group, and the search's answer no worse for it."""
from __future__ import annotations

from dataclasses import replace

from simcore.plan.spec import ZeroStage
from simcore.planner.search import search
from simcore.planner.space import base_plan, derive_space, families, hybrid_replicas

CLUSTER = {"node": "dgx-h100", "nodes": 4, "fabric": "eth-100"}


def test_the_shard_group_is_one_nvlink_domain():
    base = base_plan("llama3-8b", CLUSTER, 64)
    space = replace(derive_space(base), hybrid=(False, True))
    fams = families(base, space, 32)
    hybrid = [f for f in fams if f.dp_replicate > 1]
    assert hybrid and all(f.zero >= ZeroStage.OPTIMIZER_STATES and f.ep == 1 for f in hybrid)
    assert all(f.dp // f.dp_replicate * f.cp * f.tp == 8 for f in hybrid)    # one 8-GPU node a shard group
    assert {f.label() for f in hybrid} <= {replace(f, dp_replicate=1).label() + f"-hsdp{f.dp_replicate}" for f in hybrid}
    assert not [f for f in families(base, derive_space(base), 32) if f.dp_replicate > 1]   # off by default
    for f in hybrid[::97]:
        assert f.apply(base).parallel.shard_ranks * f.tp == 8


def test_layouts_that_cannot_take_it_are_left_alone():
    base = base_plan("llama3-8b", CLUSTER, 64)
    space = replace(derive_space(base), hybrid=(False, True))
    lay = next(f for f in families(base, space, 32) if f.tp == 1 and f.pp == 1 and f.cp == 1 and f.zero == 3)
    assert hybrid_replicas(base, lay) == 4
    assert hybrid_replicas(base, replace(lay, zero=ZeroStage.NONE)) == 1            # DDP replicates already
    assert hybrid_replicas(base, replace(lay, dp=8)) == 1                          # one node: no second domain
    ds = base_plan("llama3-8b", CLUSTER, 64, parallel={"zero_impl": "deepspeed"})
    assert hybrid_replicas(ds, lay) == 1                                           # DeepSpeed's is MiCS


def test_asking_for_it_never_makes_the_answer_slower():
    plain = search("llama3-8b", CLUSTER, 64, top_k=0, progress=False, explain=0)
    hybrid = search("llama3-8b", CLUSTER, 64, top_k=0, progress=False, explain=0, hybrid=True)
    assert (plain.table["dp_replicate"] == 1).all() and (hybrid.table["dp_replicate"] > 1).any()
    assert hybrid.table["step_time_s"].min() <= plain.table["step_time_s"].min()
    assert len(hybrid.table) > len(plain.table)
