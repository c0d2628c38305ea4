"""The serving loop's model side: a paged KV cache and one batched forward pass over an iteration.

The KV cache is a pool of blocks of ``block_size`` token slots per layer (Kwon et al., SOSP 2023,
"PagedAttention"): ``k[layer]`` and ``v[layer]`` are ``(blocks x block_size, kv_heads, head_dim)``
tensors, a request holds a list of block ids (its block table), and token ``p`` of a request sits
in slot ``table[p // block_size] * block_size + p % block_size``. The pool holds as many blocks
as the scheduler can ever hand out at once (``physical_blocks``); the scheduler's accounting
(``executors.serving_loop``) is over the plan's block count.

``forward_iteration`` runs one iteration of vLLM-style continuous batching on the executor's
``Transformer`` (``executors.model``), its modules called directly: the iteration's new tokens
packed into one row (every prefill chunk's tokens, then one token per decoding request), the
linear layers and norms over all of them at once; each layer writes its K and V into the pool at
the tokens' slots, then attends in two padded groups (as vLLM's v0 attention backends split an
iteration's metadata into its prefills and its decodes): the decoding requests (one query each,
their contexts gathered from the pool through their block tables, padded to the longest with a
mask) and the prefill chunks (each chunk's queries padded to the longest chunk, causal after the
chunk's cached tokens), each group one ``scaled_dot_product_attention`` call a layer. The output
layer runs on the rows that emit a token; the next token is the argmax (greedy sampling). Padding
costs what it computes: a group's padded queries and keys are computed and masked.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from executors.model import Transformer
from simcore.plan.spec import ModelSpec, PositionEmbedding


def physical_blocks(kv_blocks: int, max_num_seqs: int, longest: int, block_size: int) -> int:
    """Blocks the pool must hold: the plan's count, or fewer where no schedule can use them all
    (at most ``max_num_seqs`` requests run, none holding more than its longest context)."""
    return max(1, min(kv_blocks, max_num_seqs * -(-longest // block_size)))


class KVPool:
    """K and V slots of every layer, ``blocks`` blocks of ``block_size`` tokens."""

    def __init__(self, spec: ModelSpec, blocks: int, block_size: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu"):
        slots = blocks * block_size
        shape = (spec.layers, slots, spec.kv_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.free_ids = list(range(blocks - 1, -1, -1))

    def take(self, n: int) -> list[int]:
        """``n`` free block ids (the scheduler has checked its own count first)."""
        return [self.free_ids.pop() for _ in range(n)]

    def give_back(self, ids: list[int]) -> None:
        self.free_ids.extend(ids)


@dataclass(slots=True)
class Batch:
    """One iteration's inputs: per prefill chunk (block table, cached tokens, its tokens, emits a
    token), then per decoding request (block table, cached tokens, its last token)."""

    chunks: list[tuple[list[int], int, list[int], bool]]
    decodes: list[tuple[list[int], int, int]]


def _slots(tables: list[list[int]], lengths: list[int], bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's first ``length`` slots from its block table, padded (slot 0) to the longest,
    and the (rows, longest) mask of the real ones."""
    width = max(-(-n // bs) for n in lengths)
    table = torch.tensor([t[:width] + [0] * (width - len(t[:width])) for t in tables], dtype=torch.long)
    slots = (table[:, :, None] * bs + torch.arange(bs)).reshape(len(tables), -1)[:, :max(lengths)]
    mask = torch.arange(slots.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    return slots, mask


class _Inputs:
    """The packed tokens, their positions and slots, and each attention group's gathers and masks,
    built on the host and copied to the model's device (``to``)."""

    def __init__(self, batch: Batch, bs: int):
        toks, pos, new_slots, emit = [], [], [], []
        for table, cached, tokens, emits in batch.chunks:
            toks += tokens
            pos += range(cached, cached + len(tokens))
            if emits:
                emit.append(len(toks) - 1)
        self.prefill_tokens = len(toks)
        for table, cached, token in batch.decodes:
            emit.append(len(toks))
            toks.append(token)
            pos.append(cached)
        for table, cached, tokens, _ in batch.chunks:
            new_slots += [table[p // bs] * bs + p % bs for p in range(cached, cached + len(tokens))]
        for table, cached, _ in batch.decodes:
            new_slots.append(table[cached // bs] * bs + cached % bs)
        long = torch.long
        self.tokens, self.positions = torch.tensor(toks, dtype=long), torch.tensor(pos, dtype=long)
        self.slots, self.emit = torch.tensor(new_slots, dtype=long), torch.tensor(emit, dtype=long)
        self.dec = self.pre = None
        if batch.decodes:
            keys, mask = _slots([t for t, _, _ in batch.decodes], [c + 1 for _, c, _ in batch.decodes], bs)
            self.dec = (keys, mask[:, None, None, :])
        if batch.chunks:
            self.pre = self._prefill_group(batch, bs)

    def to(self, device: torch.device) -> "_Inputs":
        """The index tensors on ``device`` (a GPU's copies queued behind the host's work)."""
        if device.type == "cpu":
            return self
        move = lambda t: t.to(device, non_blocking=True)   # noqa: E731
        self.tokens, self.positions, self.slots, self.emit = map(move, (self.tokens, self.positions, self.slots,
                                                                       self.emit))
        self.dec = None if self.dec is None else tuple(map(move, self.dec))
        self.pre = None if self.pre is None else tuple(map(move, self.pre))
        return self

    @staticmethod
    def _prefill_group(batch: Batch, bs: int):
        lens = [len(t) for _, _, t, _ in batch.chunks]
        q_max, starts = max(lens), [0]
        for n in lens[:-1]:
            starts.append(starts[-1] + n)
        keys, _ = _slots([t for t, _, _, _ in batch.chunks], [c + n for (_, c, _, _), n in zip(batch.chunks, lens)], bs)
        qi = torch.arange(q_max)
        real = qi[None, :] < torch.tensor(lens)[:, None]                                 # (R, Q)
        gather = torch.where(real, torch.tensor(starts)[:, None] + qi[None, :], 0)
        cached = torch.tensor([c for _, c, _, _ in batch.chunks])
        # query i of a chunk sees its cached tokens and its own first i + 1; a padded query sees slot 0
        last = torch.where(real, cached[:, None] + qi[None, :], 0)
        mask = torch.arange(keys.shape[1])[None, None, :] <= last[:, :, None]            # (R, Q, C)
        return keys, gather, real.reshape(-1), mask[:, None]


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (``executors.model.apply_rope``) at per-token angles: x (T, heads, hd)."""
    half = x.shape[-1] // 2
    return x * cos[:, None, :] + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin[:, None, :]


def _attend(q: torch.Tensor, pool_k: torch.Tensor, pool_v: torch.Tensor, inp: _Inputs, gqa: bool) -> torch.Tensor:
    """Both groups' attention for one layer; (T, heads x hd) in the packed order."""
    parts = []
    if inp.pre is not None:
        keys, gather, real, mask = inp.pre
        qp = q[gather].transpose(1, 2)                                      # (R, heads, Q, hd)
        k, v = pool_k[keys].transpose(1, 2), pool_v[keys].transpose(1, 2)  # (R, kv_heads, C, hd)
        y = F.scaled_dot_product_attention(qp, k, v, attn_mask=mask, enable_gqa=gqa)
        parts.append(y.transpose(1, 2).reshape(-1, q.shape[1] * q.shape[2])[real])
    if inp.dec is not None:
        keys, mask = inp.dec
        qd = q[inp.prefill_tokens:, :, None, :]                             # (R, heads, 1, hd)
        k, v = pool_k[keys].transpose(1, 2), pool_v[keys].transpose(1, 2)
        y = F.scaled_dot_product_attention(qd, k, v, attn_mask=mask, enable_gqa=gqa)
        parts.append(y.reshape(y.shape[0], -1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


#: The attention kernels the loop lets SDPA pick on a GPU: not cuDNN's, which builds an execution
#: graph for each new shape (an iteration's padded groups change shape nearly every time: 0.48 ms of
#: host time a call on an H200, against 7 us of kernel) where the engines run kernels of fixed shapes.
LOOP_SDPA_BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH)


def forward_iteration(model: Transformer, pool: KVPool, batch: Batch) -> list[int]:
    """Run one iteration; the next token of each emitting row (finishing chunks, then decodes)."""
    with torch.inference_mode(), sdpa_kernel(list(LOOP_SDPA_BACKENDS)):
        return _forward(model, pool, batch)


def _forward(model: Transformer, pool: KVPool, batch: Batch) -> list[int]:
    spec = model.spec
    inp = _Inputs(batch, pool.block_size).to(pool.k.device)
    x = model.embed.tok(inp.tokens)
    if model.embed.pos is not None:
        x = x + model.embed.pos(inp.positions)
    rope = spec.position_embedding == PositionEmbedding.ROPE
    gqa = spec.kv_heads != spec.heads
    hd = spec.head_dim
    for i, layer in enumerate(model.layers.values()):
        att = layer.attention
        h = layer.attention_norm(x)
        q = att.wq(h).view(-1, spec.heads, hd)
        k = att.wk(h).view(-1, spec.kv_heads, hd)
        v = att.wv(h).view(-1, spec.kv_heads, hd)
        if rope:
            cos, sin = att.rope_cos[inp.positions], att.rope_sin[inp.positions]
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        pool.k[i].index_copy_(0, inp.slots, k)
        pool.v[i].index_copy_(0, inp.slots, v)
        x = x + att.wo(_attend(q, pool.k[i], pool.v[i], inp, gqa))
        x = x + layer.feed_forward(layer.ffn_norm(x))
    if not len(inp.emit):
        return []
    logits = model.output(model.norm(x[inp.emit]))
    return logits.argmax(-1).tolist()


def reference_tokens(model: Transformer, prompt: list[int], n: int) -> list[int]:
    """``n`` greedy tokens after ``prompt`` by the model's own full forward each time (no cache)."""
    tokens, out = list(prompt), []
    for _ in range(n):
        out.append(reference_next_tokens(model, tokens))
        tokens.append(out[-1])
    return out


def reference_next_tokens(model: Transformer, tokens: list[int]) -> int:
    """The model's own full forward over ``tokens``: the greedy next token (a check on the cache)."""
    with torch.inference_mode():
        return int(model(torch.tensor([tokens], device=model.output.weight.device))[0, -1].argmax())
