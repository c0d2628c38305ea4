"""Mixture-of-experts routing with a capacity, and expert parallelism over an ep group.

Routing (token choice): softmax gates over the experts, each token's ``top_k`` experts,
their weights renormalised to sum to one (Shazeer et al. 2017; Fedus et al. 2021, "Switch
Transformers"). Each expert takes at most ``capacity = ceil(capacity_factor * tokens *
top_k / experts)`` tokens of one call: first choices in token order, then second choices
(GShard's priority, Lepikhin et al. 2021, Algorithm 1); a token beyond it is dropped by that
expert (the residual carries it), and each expert runs a full ``capacity`` buffer, padded
with zero rows ("drop and pad", Megatron-Core's ``moe_pad_expert_input_to_capacity``), which
is what the simulator charges (``simcore.model.workload``: tokens x top_k x capacity_factor).
The router's auxiliary load-balancing loss, ``experts * sum_e f_e * P_e`` (Switch eq. 4-6),
is added to the training objective through its gradient, as Megatron-Core's
``MoEAuxLossAutoScaler`` does (``megatron/core/transformer/moe/moe_utils.py``): the
layer's output is unchanged and backward adds ``aux_scale`` x the loss's gradient.

Expert parallel: an ep rank holds ``experts / ep`` consecutive experts; the (experts,
capacity) dispatch buffer is sent to the experts' ranks with one ``all_to_all_single`` of
equal splits, the outputs come back with another (the dispatch and combine of torchtitan's
``torchtitan/models/moe.py`` and GShard); backward sends the gradients back the same way
(``_AllToAll``: ``torch.distributed.nn.functional.all_to_all_single`` did this and is deprecated;
the functional collectives' autograd all-to-all issues its backward in C++, out of the
recorder's sight). Each exchange is the functional ``all_to_all_single``, the op that
torchtitan's per-op selective checkpointing saves (``comm_ops`` in
torchtitan/distributed/activation_checkpoint.py), so a recomputed block does not send again.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F
from torch import nn

#: Switch Transformer's auxiliary loss coefficient alpha = 1e-2 (Fedus et al. 2021, sec. 2.2);
#: a training hyper-parameter, not a hardware figure.
AUX_LOSS_COEFF = 1e-2


def capacity(tokens: int, experts: int, top_k: int, factor: float) -> int:
    """Token slots per expert and call."""
    return max(1, math.ceil(factor * tokens * top_k / experts))


def route(logits: torch.Tensor, top_k: int, cap: int):
    """(token index, slot in the (experts * cap) buffer, weight) of every one of the N x k
    assignments, and the auxiliary loss. ``logits`` (N, E). A dropped assignment has slot
    ``experts * cap`` (one row past the buffer, which ``moe_forward`` discards) and weight 0:
    the shapes do not depend on the routing, so the model also runs on fake tensors
    (``executors.memory_trace``), where selecting the kept ones would be data-dependent."""
    n, e = logits.shape
    gates = F.softmax(logits, dim=-1, dtype=torch.float32)          # (N, E)
    weights, chosen = torch.topk(gates, top_k, dim=-1)               # (N, k)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    onehot = F.one_hot(chosen, e)                                    # (N, k, E)
    # position of each assignment in its expert's queue: slot-major, then token order
    order = onehot.transpose(0, 1).reshape(top_k * n, e)             # (k*N, E)
    position = (order.cumsum(0) - 1).view(top_k, n, e).transpose(0, 1)
    position = (position * onehot).sum(-1)                           # (N, k)
    keep = position < cap
    tok = torch.arange(n, device=logits.device)[:, None].expand(n, top_k).reshape(-1)
    slot = torch.where(keep, chosen * cap + position, e * cap).reshape(-1)
    fraction = onehot.sum(1).float().mean(0) / top_k                 # f_e: share of assignments
    aux = e * (fraction * gates.mean(0)).sum()
    return tok, slot, (weights * keep).reshape(-1), aux


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of equal splits over ``group``; its gradient is the same exchange."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group), None


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    out = funcol.all_to_all_single(x.contiguous(), None, None, group)
    return out.wait() if isinstance(out, funcol.AsyncCollectiveTensor) else out


class _AuxLoss(torch.autograd.Function):
    """Identity on ``out``; backward also sends ``scale`` into the auxiliary loss."""

    @staticmethod
    def forward(ctx, out, aux, scale: float):
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full((), ctx.scale, device=grad.device), None


def moe_forward(moe, x: torch.Tensor) -> torch.Tensor:
    """``executors.model.MoE``'s forward: route, dispatch (all-to-all over ``moe.ep_group``
    when set), run the local experts on their capacity buffers, combine."""
    shape, e = x.shape, moe.num_experts
    tokens = x.reshape(-1, shape[-1])                                # (N, H)
    cap = capacity(tokens.shape[0], e, moe.top_k, moe.capacity_factor)
    tok, slot, weight, aux = route(moe.router(tokens), moe.top_k, cap)
    buf = tokens.new_zeros(e * cap + 1, shape[-1]).index_copy(0, slot, tokens[tok])[:e * cap]   # + the dropped row
    group = moe.ep_group
    ep = dist.get_world_size(group) if group is not None else 1
    if ep > 1:
        buf = _AllToAll.apply(buf, group)
    # rows: (source rank, local expert, slot); each local expert runs its rows of every source
    local = e // ep
    rows = buf.view(ep, local, cap, -1).transpose(0, 1)
    outs = [expert(rows[i].reshape(ep * cap, -1)).view(ep, cap, -1) for i, expert in enumerate(moe.experts.values())]
    done = torch.stack(outs, 1).reshape(e * cap, -1)                 # (source, local expert, slot)
    if ep > 1:
        done = _AllToAll.apply(done, group)
    done = torch.cat([done, done.new_zeros(1, done.shape[-1])])      # the dropped assignments' row
    out = torch.zeros_like(tokens).index_add(0, tok, (done[slot] * weight[:, None]).to(tokens.dtype))
    if torch.is_grad_enabled():
        out = _AuxLoss.apply(out, aux, moe.aux_scale)
    return out.view(shape)


def apply_ep(model: nn.Module, ep_group) -> None:
    """Keep only this ep rank's experts in every MoE layer of ``model`` (names unchanged; an MoE
    model's dense layers have none)."""
    ep, me = dist.get_world_size(ep_group), dist.get_rank(ep_group)
    for block in model.layers.values():
        moe = block.feed_forward
        if not hasattr(moe, "experts"):
            continue
        local = moe.num_experts // ep
        keep = {str(i) for i in range(me * local, (me + 1) * local)}
        for name in list(moe.experts):
            if name not in keep:
                del moe.experts[name]
        moe.ep_group = ep_group


def expert_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters of an expert-parallel rank's experts, which the data-parallel wrappers
    leave alone (``reduce_expert_grads`` reduces them). Read after tensor parallelism, which
    replaces every parameter it shards by a new DTensor parameter."""
    return [p for block in model.layers.values() if getattr(block.feed_forward, "ep_group", None) is not None
            for p in block.feed_forward.experts.parameters()]


def set_aux_scale(model: nn.Module, microbatches: int) -> None:
    """The auxiliary loss's weight per call: ``AUX_LOSS_COEFF`` over the micro-batches whose
    gradients a rank sums unscaled (gradient accumulation divides each loss by their
    number; torch's pipeline schedules scale the gradients afterwards: ``microbatches=1``)."""
    for block in getattr(model, "layers", {}).values():
        if hasattr(block.feed_forward, "aux_scale"):
            block.feed_forward.aux_scale = AUX_LOSS_COEFF / microbatches


def reduce_expert_grads(params: list[nn.Parameter], edp_group, dp_cp: int) -> None:
    """The experts' gradients as the data-parallel wrappers leave the others: summed over the
    ranks that hold the same experts (one flat all-reduce), divided by the dp x cp ranks whose
    tokens they saw."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    if edp_group is not None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=edp_group)
        for g, new in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            g.copy_(new)
    for g in grads:
        g.div_(dp_cp)
