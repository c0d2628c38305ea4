"""Context parallelism: ring attention over the cp group, forward and backward.

torch's own ``torch.distributed.tensor.experimental.context_parallel`` (torch 2.13,
``_context_parallel/_attention.py``) replaces only the CUDA SDPA kernels (flash,
memory-efficient and cuDNN attention and their backwards, the table ``_sdpa_handler``
dispatches); on a CPU the attention runs ``_scaled_dot_product_flash_attention_for_cpu``,
which it does not handle, so each rank would attend to its own chunk only. This module is
the ring its kernels implement, written for any backend (gloo included) with
``torch.distributed`` point-to-point calls (Liu et al. 2023, "Ring Attention with Blockwise
Transformers"; Megatron-Core's ``TEDotProductAttention`` with ``cp_comm_type="p2p"``):

- Sequence split with causal load balancing: the sequence is cut into ``2 * cp`` chunks and
  rank i holds chunks i and ``2cp - 1 - i`` (a head and a tail), so every rank has the same
  causal work (torch's ``_HeadTailLoadBalancer``, Megatron's ``get_batch_on_this_cp_rank``).
  Where ``2 * cp`` does not divide the sequence, rank i holds the i-th contiguous chunk.
- Forward: ``cp - 1`` rotations of this rank's K and V (one buffer) around the ring, each
  sent while the previous block is computed; the blocks' partial results are merged with
  the online softmax (running max and sum, Milakov & Gimelshein 2018; FlashAttention).
- Backward (FlashAttention-2's, from the saved output and log-sum-exp): K and V rotate again;
  the gradient of each visiting K/V block travels with it and arrives home after ``cp``
  hops, as in torch's ``_templated_ring_attention_backward``.

Per attention call and micro-batch a rank sends ``cp - 1`` K/V buffers forward, and
``cp - 1`` K/V buffers and ``cp`` K/V-gradient buffers backward, receiving as many.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn


def cp_positions(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """Global token positions held by ``cp_rank`` (head and tail chunks where they fit)."""
    if seq_len % (2 * cp) == 0:
        n = seq_len // (2 * cp)
        tail = 2 * cp - 1 - cp_rank
        return torch.cat([torch.arange(cp_rank * n, (cp_rank + 1) * n), torch.arange(tail * n, (tail + 1) * n)])
    n = seq_len // cp
    return torch.arange(cp_rank * n, (cp_rank + 1) * n)


def _runs(pos: torch.Tensor) -> list[tuple[int, int, int]]:
    """Contiguous runs of positions: (start index, end index, first position)."""
    cuts = [0] + [i for i in range(1, len(pos)) if pos[i] != pos[i - 1] + 1] + [len(pos)]
    return [(a, b, int(pos[a])) for a, b in zip(cuts, cuts[1:])]


def _blocks(q_pos: torch.Tensor, k_pos: torch.Tensor) -> list[tuple[slice, slice, torch.Tensor | None]]:
    """The (query rows, key rows, mask or None) pairs with any causal work (skipped: none)."""
    out = []
    for qa, qb, q0 in _runs(q_pos):
        for ka, kb, k0 in _runs(k_pos):
            q_last, k_last = q0 + qb - qa - 1, k0 + kb - ka - 1
            if k0 > q_last:
                continue                                      # every key after every query
            mask = None if k_last <= q0 else q_pos[qa:qb, None] >= k_pos[None, ka:kb]
            out.append((slice(qa, qb), slice(ka, kb), mask))
    return out


class _Ring:
    """Rotate a buffer one step around the cp ring (send to next, receive from previous)."""

    def __init__(self, group):
        self.group = group
        size, me = dist.get_world_size(group), dist.get_rank(group)
        self.next = dist.get_global_rank(group, (me + 1) % size)
        self.prev = dist.get_global_rank(group, (me - 1) % size)

    def start(self, buf: torch.Tensor):
        recv = torch.empty_like(buf)
        ops = [dist.P2POp(dist.isend, buf.contiguous(), self.next, self.group),
               dist.P2POp(dist.irecv, recv, self.prev, self.group)]
        return recv, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(works) -> None:
        for w in works:
            w.wait()


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.repeat_interleave(groups, dim=1) if groups > 1 else x


def _fold(x: torch.Tensor, groups: int) -> torch.Tensor:
    """The gradient of ``_expand``: sum each K/V head's query group."""
    if groups == 1:
        return x
    b, h, t, d = x.shape
    return x.view(b, h // groups, groups, t, d).sum(2)


def _diagonal(q_pos: torch.Tensor, k_pos: torch.Tensor) -> bool:
    """The block is one run against the same run: plain causal attention."""
    return len(q_pos) == len(k_pos) and bool((q_pos == k_pos).all())


def _forward_block(q, k, v, mask, causal: bool, scale: float):
    """One block's (output, log-sum-exp (B, H, Tq) fp32); rows with no key get -inf. On a
    CPU the fused kernel SDPA itself runs (``_scaled_dot_product_flash_attention_for_cpu``,
    which returns the log-sum-exp); elsewhere, or under a general mask, the math."""
    if q.device.type == "cpu" and (mask is None or causal):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q.contiguous(), k.contiguous(), v.contiguous(), 0.0, causal, scale=scale)
        return out, lse
    s = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return torch.matmul(p.to(v.dtype), v), lse


def _merge(state, out, lse) -> None:
    """Fold a block's normalised output into the running (output, log-sum-exp), in place."""
    acc, acc_lse = state
    new = torch.logaddexp(acc_lse, lse)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    acc.mul_(torch.exp(acc_lse - safe)[..., None]).add_(out.float() * torch.exp(lse - safe)[..., None])
    acc_lse.copy_(new)


def _backward_block(q, k, v, out, do, lse, mask, causal: bool, scale: float):
    """FlashAttention-2's backward of one block from the final output and log-sum-exp:
    (dq, dk, dv). On a CPU the fused kernel's backward, elsewhere the math (fp32)."""
    if q.device.type == "cpu" and (mask is None or causal):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), out.contiguous(), lse.contiguous(),
            0.0, causal, scale=scale)
    s = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    p = torch.exp(s - lse[..., None])
    if mask is not None:
        p = p.masked_fill(~mask, 0.0)
    delta = (do.float() * out.float()).sum(-1)
    dv = torch.matmul(p.transpose(-1, -2), do.float())
    dp = torch.matmul(do.float(), v.float().transpose(-1, -2))
    ds = p * (dp - delta[..., None]) * scale
    return torch.matmul(ds, k.float()), torch.matmul(ds.transpose(-1, -2), q.float()), dv


class RingAttentionFn(torch.autograd.Function):
    """softmax(QK^T / sqrt(d)) V, causal over global positions, K/V spread over the ring.
    q (B, H, T, D), k and v (B, Hkv, T, D): this rank's tokens; ``positions`` (cp, T) the
    global positions every cp rank holds."""

    @staticmethod
    def forward(ctx, q, k, v, ring: _Ring, positions: torch.Tensor, me: int):
        cp, groups, scale = positions.shape[0], q.shape[1] // k.shape[1], 1.0 / math.sqrt(q.shape[-1])
        b, h, t, _ = q.shape
        state = (torch.zeros(q.shape, dtype=torch.float32, device=q.device),
                 torch.full((b, h, t), float("-inf"), device=q.device))
        kv = torch.stack([k, v])
        for step in range(cp):
            src = (me - step) % cp
            pending = ring.start(kv) if step < cp - 1 else None
            ke, ve = _expand(kv[0], groups), _expand(kv[1], groups)
            for qs, ks, mask in _blocks(positions[me], positions[src]):
                causal = mask is not None and _diagonal(positions[me][qs], positions[src][ks])
                out, lse = _forward_block(q[:, :, qs], ke[:, :, ks], ve[:, :, ks], mask, causal, scale)
                _merge([x[:, :, qs] for x in state], out, lse)
            if pending is not None:
                _Ring.wait(pending[1])
                kv = pending[0]
        out = state[0].to(q.dtype)
        ctx.save_for_backward(q, k, v, out, state[1])
        ctx.ring, ctx.positions, ctx.me = ring, positions, me
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring, positions, me = ctx.ring, ctx.positions, ctx.me
        cp, groups, scale = positions.shape[0], q.shape[1] // k.shape[1], 1.0 / math.sqrt(q.shape[-1])
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv, dkv_pending = torch.stack([k, v]), None
        for step in range(cp):
            src = (me - step) % cp
            pending = ring.start(kv) if step < cp - 1 else None
            ke, ve = _expand(kv[0], groups), _expand(kv[1], groups)
            dk = torch.zeros(ke.shape, dtype=torch.float32, device=q.device)
            dv = torch.zeros_like(dk)
            for qs, ks, mask in _blocks(positions[me], positions[src]):
                causal = mask is not None and _diagonal(positions[me][qs], positions[src][ks])
                bq, bk, bv = _backward_block(q[:, :, qs], ke[:, :, ks], ve[:, :, ks], out[:, :, qs], dout[:, :, qs],
                                             lse[:, :, qs], mask, causal, scale)
                dq[:, :, qs] += bq
                dk[:, :, ks] += bk
                dv[:, :, ks] += bv
            dkv = torch.stack([_fold(dk, groups), _fold(dv, groups)])
            if dkv_pending is not None:     # the gradient of this K/V block from the ranks before
                _Ring.wait(dkv_pending[1])
                dkv += dkv_pending[0]
            dkv_pending = ring.start(dkv)   # on to the next rank; home after cp hops
            if pending is not None:
                _Ring.wait(pending[1])
                kv = pending[0]
        _Ring.wait(dkv_pending[1])
        dk, dv = dkv_pending[0]
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


class RingAttention(nn.Module):
    """Drop-in for ``executors.model.CoreAttention`` on a context-parallel rank."""

    def __init__(self, group, seq_len: int):
        super().__init__()
        self.ring = _Ring(group)
        cp, self.me = dist.get_world_size(group), dist.get_rank(group)
        # a plain attribute, not a buffer: DDP would broadcast buffers before every forward
        self.positions = torch.stack([cp_positions(seq_len, cp, r) for r in range(cp)])

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return RingAttentionFn.apply(q, k, v, self.ring, self.positions, self.me)


def apply_cp(model: nn.Module, cp_mesh, seq_len: int) -> torch.Tensor:
    """Make ``model`` (an ``executors.model.Transformer`` chunk) a context-parallel rank's:
    ring attention in every block, rotary and learned positions of this rank's tokens.
    Returns those positions (the columns of the batch this rank trains on)."""
    group = cp_mesh.get_group()
    positions = cp_positions(seq_len, dist.get_world_size(group), dist.get_rank(group))
    for block in model.layers.values():
        block.attention.core = RingAttention(group, seq_len)
        block.attention.positions = positions
    if model.embed is not None:
        model.embed.positions = positions
    return positions
