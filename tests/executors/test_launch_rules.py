"""What one host refuses to start: a cluster plan without its GPUs, or too many CPU ranks."""
from __future__ import annotations

import os

import pytest

from executors.launch import MAX_CPU_RANKS_PER_CORE, check_one_host
from simcore.plan.load import plan_from_dict

TINY = {"name": "t", "layers": 2, "hidden": 32, "heads": 2, "vocab": 64, "seq_len": 8, "tied_embeddings": False}


def test_a_cluster_plan_points_to_torchrun():
    plan = plan_from_dict({"model": "gpt3-175b", "cluster": {"node": "dgx-a100-80gb", "nodes": 2},
                           "parallel": {"tp": 8, "dp": 2}, "training": {"global_batch": 16}})
    with pytest.raises(ValueError, match=r"needs 16 GPUs .* `torchrun"):
        check_one_host(plan, cuda=False)


def test_localhost_rank_limit():
    limit = MAX_CPU_RANKS_PER_CORE * (os.cpu_count() or 1)
    ok = plan_from_dict({"model": TINY, "cluster": {"node": "localhost", "gpus_per_node": 4},
                         "parallel": {"dp": 4}, "training": {"global_batch": 4}})
    check_one_host(ok, cuda=False)
    too_many = plan_from_dict({"model": TINY, "cluster": {"node": "localhost", "gpus_per_node": limit + 1},
                               "parallel": {"dp": limit + 1}, "training": {"global_batch": limit + 1}})
    with pytest.raises(ValueError, match=f"needs {limit + 1} ranks but this host runs at most {limit}"):
        check_one_host(too_many, cuda=False)
