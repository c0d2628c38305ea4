"""Key/value-head replication (``parallel.kv_replicator``) as AWS NeuronX Distributed (NxD) runs it.

Where tensor parallel is wider than the model's key/value heads, NxD's
``GQAQKVColumnParallelLinear(kv_size_multiplier=r)`` builds the K and V weights r times wider (each
head's weight copied r times, src/neuronx_distributed/modules/qkv_linear.py @fbac349b
``kv_output_size_per_partition = divide(output_sizes[1] * kv_size_multiplier, world_size)``) and splits
them over the TP ranks like any column-parallel weight: a rank holds, computes and keeps for the
backward kv_heads * r / tp heads. Its training scripts set r with ``--kv_replicator 4`` at TP 32 over
8 KV heads (examples/training/llama/tp_pp_llama_hf_pretrain/run_llama2_70B_tp_pp.sh,
run_llama3_70B_tp_pp.sh, tp_zero1_llama_hf_pretrain/tp_zero1_llama3_8B_hf_pretrain.sh @fbac349b).

So every per-rank figure of a replicated Plan is the figure of the model NxD builds (``as_run``: the
same Plan with kv_heads * r heads and no replication), with two exceptions:

- the copies' gradients are kept equal by one more collective per layer and micro-batch, in the
  backward: ``_qkvlinear_autograd_base_setup_bwd`` (src/neuronx_distributed/modules/qkv_linear_utils.py
  @fbac349b) all-reduces the K and V projections' output gradients, ``grad_output_k`` and
  ``grad_output_v`` ([sequence, batch, kv heads of the rank x head_dim], the whole sequence: the input
  is all-gathered under sequence parallel), in ``reduce_dtype`` (``torch.float32`` by default; the
  Llama example passes none) over ``get_kv_shared_replica_groups()``: the r ranks that hold the same
  head, spaced tp / r apart on Trn1 (parallel_state.py ``arrange_kv_groups``). Both copies' weight
  gradients are then computed from the summed output gradient, so they stay equal with no weight
  all-reduce. It precedes the input gradient (the backward's critical path): it is charged blocking.
- the model's FLOPs (MFU's numerator) and its parameter count stay the model's own: the copies are
  work the hardware does (the hardware FLOPs), not the model's.
"""
from __future__ import annotations

from dataclasses import replace

from simcore.model import collectives as coll
from simcore.model import workload as wl
from simcore.model.costs import StepCosts
from simcore.plan.spec import Plan, evolve

#: NxD all-reduces the K/V output gradients in ``reduce_dtype``, ``torch.float32`` unless the model
#: passes another (qkv_linear.py @fbac349b ``GQAQKVColumnParallelLinear.__init__``).
KV_SYNC_ELEMENT_BYTES = coll.FP32_ACT_BYTES
#: The collective's name in ``trainplan collectives`` (NxD's group: ``_KV_SHARED_GROUP``).
KV_AXIS, KV_ISSUER = "kv", "nxd"


def as_run(plan: Plan) -> Plan:
    """The Plan its ranks run: the model NxD builds (kv_heads * kv_replicator heads), no replication
    left; ``plan`` itself without replication."""
    r = plan.parallel.kv_replicator
    if r == 1:
        return plan
    return evolve(plan, model=evolve(plan.model, kv_heads=plan.model.kv_heads * r),
                  parallel=evolve(plan.parallel, kv_replicator=1))


def kv_heads_per_rank(plan: Plan) -> int:
    """Key/value heads one TP rank holds: kv_heads * kv_replicator / tp (at least one head's slice)."""
    m, par = plan.model, plan.parallel
    return m.kv_heads * par.kv_replicator // par.tp


def sync_bytes(plan: Plan) -> float:
    """The K and V output gradients one rank all-reduces per layer and micro-batch (0 without
    replication): 2 x micro-batch x (sequence / cp) x the rank's K/V width, in fp32."""
    m, par, tr = plan.model, plan.parallel, plan.training
    if par.kv_replicator == 1:
        return 0.0
    tokens = tr.micro_batch * (m.seq_len // par.cp)
    return 2.0 * tokens * kv_heads_per_rank(plan) * m.head_dim * KV_SYNC_ELEMENT_BYTES


def sync_s(plan: Plan, dev) -> float:
    """Seconds of that all-reduce over the kv shared group: kv_replicator ranks of the TP group,
    tp / kv_replicator apart (``arrange_kv_groups`` on Trn1)."""
    par = plan.parallel
    if par.kv_replicator == 1:
        return 0.0
    net = coll.group_net(plan.cluster, dev, par.kv_replicator, par.tp // par.kv_replicator)
    return coll.all_reduce_s(sync_bytes(plan), net)


def with_kv_sync(costs: StepCosts, plan: Plan, dev) -> StepCosts:
    """``costs`` of ``as_run(plan)`` as ``plan`` runs: each virtual stage's backward pays the kv
    shared group's all-reduce once per layer (its blocks, MTP's among them) and micro-batch, and the
    model FLOPs are the model's own (``model_flops``)."""
    one = sync_s(plan, dev)
    backward = tuple(b + n * one for b, n in zip(costs.backward_comm_s, costs.layers))
    detail = {**costs.time_detail_s, "kv_sync_per_layer_s": one}
    return replace(costs, plan=plan, backward_comm_s=backward, time_detail_s=detail,
                   model_flops_per_step=wl.model_flops_per_step(plan.model, plan.training.global_batch))


def sync_calls(plan: Plan, layers: int) -> list[tuple]:
    """(kind, axis, bytes, issuer, calls per step) of the kv shared group's all-reduce for a chunk of
    ``layers`` blocks (none without replication)."""
    if plan.parallel.kv_replicator == 1 or not layers:
        return []
    return [("all_reduce", KV_AXIS, int(sync_bytes(plan)), KV_ISSUER, layers * plan.num_microbatches)]
