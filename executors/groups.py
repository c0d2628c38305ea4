"""The process groups a layout needs beyond the mesh's four axes, and their axis names.

- ``dp_replicate`` x ``dp_shard``: hybrid sharding's mesh (the dp axis unflattened).
- ``dp_cp``: the data-parallel gradient reduction when ``cp > 1``. Context-parallel ranks
  hold the same parameters and see different tokens, so their gradients are reduced
  together with the data-parallel ones, as Megatron-Core's ``get_data_parallel_group(
  with_context_parallel=True)`` and torchtitan's flattened ``dp_shard_cp`` mesh do
  (torchtitan ``torchtitan/distributed/parallel_dims.py``). It is the mesh's (dp, cp)
  slice flattened (``DeviceMesh._flatten``), named ``dp`` for the recorder.
- the embedding group: with tied embeddings and ``pp > 1`` the first stage's token
  embedding and the last stage's output layer are two copies of one weight, and their
  gradients are all-reduced between the two ranks that hold them (Megatron-Core
  ``megatron/core/parallel_state.py`` ``_EMBEDDING_GROUP``, ``finalize_model_grads.py``
  ``_allreduce_word_embedding_grads``); named ``pp``.
- ``ep`` and expert data parallel: expert ranks carved out of the flattened (dp, cp) ranks,
  consecutive ones forming an expert group (torchtitan's ``dp_shard_in_ep`` x ``cp``);
  the experts' gradients are reduced over the ranks that hold the same experts, named ``dp``.

``extra_axes()`` tells ``executors.record.axis_map`` the names of the groups created last.
"""
from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from simcore.plan.spec import Plan
from topologies.placement import rank_grid

_AXES: dict[frozenset, str] = {}


def extra_axes() -> dict[frozenset, str]:
    """frozenset of global ranks -> axis name, for the groups of the last ``build_groups``."""
    return dict(_AXES)


def _subgroup(groups: list[list[int]], name: str):
    """Create every group of ``groups`` (each rank must call this with the same lists) and
    return the one this rank belongs to (None if none)."""
    mine = None
    for ranks in groups:
        group = dist.new_group(ranks)
        _AXES[frozenset(ranks)] = name
        if dist.get_rank() in ranks:
            mine = group
    return mine


def dp_cp_mesh(plan: Plan, mesh: DeviceMesh) -> DeviceMesh:
    """The mesh the data-parallel wrappers reduce gradients over: dp, or dp x cp flattened; under
    hybrid sharding (``parallel.dp_replicate``, cp 1) dp unflattened into (dp_replicate, dp_shard),
    torchtitan's HSDP mesh, on which ``fully_shard`` shards over dp_shard and all-reduces over
    dp_replicate."""
    par = plan.parallel
    if par.dp_replicate > 1:
        two = mesh._unflatten("dp", (par.dp_replicate, par.dp // par.dp_replicate), ("dp_replicate", "dp_shard"))
        hsdp = two["dp_replicate", "dp_shard"]
        for name in ("dp_replicate", "dp_shard"):
            _AXES[frozenset(dist.get_process_group_ranks(hsdp.get_group(name)))] = name
        return hsdp
    if par.cp == 1:
        return mesh["dp"]
    flat = mesh["dp", "cp"]._flatten("dp_cp")
    ranks = frozenset(dist.get_process_group_ranks(flat.get_group()))
    _AXES[ranks] = "dp" if plan.parallel.dp > 1 else "cp"
    return flat


def embedding_groups(plan: Plan) -> list[list[int]]:
    """For each (dp, cp, tp) coordinate: the first and the last pipeline rank."""
    par = plan.parallel
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    return [[grid.rank(pp=0, dp=d, cp=c, tp=t), grid.rank(pp=par.pp - 1, dp=d, cp=c, tp=t)]
            for d in range(par.dp) for c in range(par.cp) for t in range(par.tp)]


def embedding_group(plan: Plan):
    """This rank's embedding group (None without tied embeddings under pipelining, and under
    DualPipeV, whose V puts both ends on rank 0: ``tied.sum_local_copies``)."""
    if not (plan.model.tied_embeddings and plan.parallel.pp > 1) or plan.parallel.v_shape:
        return None
    return _subgroup(embedding_groups(plan), "pp")


def expert_groups(plan: Plan) -> tuple[list[list[int]], list[list[int]]]:
    """(expert-parallel groups, expert data-parallel groups) in global ranks: the (dp, cp)
    ranks of each (pp, tp) coordinate in mesh order, ``ep`` consecutive ones an ep group."""
    par = plan.parallel
    grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
    ep_groups, edp_groups = [], []
    for p in range(par.pp):
        for t in range(par.tp):
            ranks = [grid.rank(pp=p, dp=d, cp=c, tp=t) for d in range(par.dp) for c in range(par.cp)]
            ep_groups += [ranks[i:i + par.ep] for i in range(0, len(ranks), par.ep)]
            edp_groups += [ranks[i::par.ep] for i in range(par.ep)]
    return ep_groups, edp_groups


def clear() -> None:
    """Forget the names of earlier layouts' groups (a new trainer is being built)."""
    _AXES.clear()


def expert_group(plan: Plan):
    """(this rank's ep group, its expert data-parallel group or None when it is alone);
    (None, None) without expert parallelism."""
    if plan.parallel.ep == 1:
        return None, None
    ep_groups, edp_groups = expert_groups(plan)
    ep = _subgroup(ep_groups, "ep")
    edp = _subgroup(edp_groups, "dp") if len(edp_groups[0]) > 1 else None
    return ep, edp
