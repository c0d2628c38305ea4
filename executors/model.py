"""A decoder-only transformer built from a ``ModelSpec`` (GPT-2 / Llama style).

The module layout follows torchtitan's ``torchtitan/models/llama/model.py`` so that its
parallelisation recipes apply unchanged: ``embed`` (token + optional learned position
embedding), ``layers`` as an ``nn.ModuleDict`` keyed "0".."L-1" (a pipeline stage deletes
the layers it does not own and keeps the others' names, so checkpoints and the
single-process reference share parameter names), then ``norm`` and ``output``. A stage
that lacks ``embed`` takes hidden states as input; one that lacks ``output`` returns them.

Attention is causal grouped-query attention (Ainslie et al. 2023, "GQA") through
``F.scaled_dot_product_attention``; rotary embeddings follow Su et al. 2021 ("RoFormer",
eq. 34, rotate-half form). The MLP is GELU (GPT-2) or SwiGLU (Shazeer 2020, "GLU
Variants Improve Transformer", eq. 6). MoE layers route each token to its ``top_k``
experts by softmax gate (Shazeer et al. 2017; Fedus et al. 2021), each expert taking at most
its capacity (``model.capacity_factor``) of a call's tokens (``executors.moe``).
Projections use ``bias=False`` as Llama does; ``CoreAttention`` is a parameter-free
module so that selective recomputation (Korthikanti et al. 2022, sec. 4.2) can
checkpoint exactly the attention core.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from executors.moe import AUX_LOSS_COEFF, moe_forward
from simcore.plan.model_props import Activation, Bias, Norm, QkNorm
from simcore.plan.spec import ModelSpec, PositionEmbedding


def rope_tables(seq_len: int, head_dim: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (seq_len, head_dim) for rotate-half RoPE (RoFormer eq. 34)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)  # (T, hs/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, hs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, nh, hs); rotate pairs (i, i + hs/2) by position-dependent angles; cos and
    sin hold at least T rows, those of x's positions first."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    t = x.shape[1]
    return x * cos[:t, None, :].to(x.dtype) + rotated * sin[:t, None, :].to(x.dtype)


class CoreAttention(nn.Module):
    """softmax(QK^T / sqrt(d)) V, causal; the part selective recomputation recomputes."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        hd = spec.head_dim
        self.head_dim = hd
        self.wq = nn.Linear(spec.hidden, spec.heads * hd, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_heads * hd, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_heads * hd, bias=False)
        self.wo = nn.Linear(spec.heads * hd, spec.hidden, bias=False)
        self.core = CoreAttention()
        self.positions: torch.Tensor | None = None
        """A context-parallel rank's token positions (``executors.ring_attention``); None: 0..T-1."""
        self.rope = spec.position_embedding == PositionEmbedding.ROPE
        if self.rope:
            cos, sin = rope_tables(spec.seq_len, hd)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp of them
        q = self.wq(x).view(b, t, -1, self.head_dim)  # (B, T, nh, hs)
        k = self.wk(x).view(b, t, -1, self.head_dim)  # (B, T, nkv, hs)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        if self.rope:
            cos, sin = self.rope_cos, self.rope_sin
            if self.positions is not None:
                cos, sin = cos[self.positions], sin[self.positions]
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = self.core(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, nh, T, hs)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, hidden: int, ffn_hidden: int, gated: bool):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False) if gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))  # SwiGLU
        return self.w2(F.gelu(self.w1(x)))


class MoE(nn.Module):
    """Top-k routed experts with a capacity per expert and the router's auxiliary loss
    (``executors.moe``). ``experts`` is keyed by the global expert index, so that an
    expert-parallel rank that keeps only its experts keeps their names."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.top_k, self.num_experts, self.capacity_factor = spec.top_k, spec.experts, spec.capacity_factor
        self.router = nn.Linear(spec.hidden, spec.experts, bias=False)
        self.experts = nn.ModuleDict({str(e): FeedForward(spec.hidden, spec.ffn_hidden, spec.gated_mlp)
                                      for e in range(spec.experts)})
        self.ep_group = None
        """The expert-parallel group (``executors.moe.apply_ep``); None: every expert here."""
        self.aux_scale = AUX_LOSS_COEFF
        """Weight of this call's auxiliary loss in the objective's gradient (set per layout)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return moe_forward(self, x)


def built_block(spec: ModelSpec) -> dict:
    """The block this module builds, whatever the Plan's ``model.norm``, ``bias``, ``activation``,
    ``qk_norm`` and ``attention_sinks`` say (``simcore.plan.model_props``' terms): RMSNorm with a gated
    MLP (Llama), else a LayerNorm without its shift (GPT-2 style; None: no Plan value names it); no
    linear biases; SwiGLU or GeLU (``FeedForward``); no QK norm, no sinks."""
    gated = spec.gated_mlp
    return {"norm": Norm.RMSNORM if gated else None, "bias": Bias.NONE,
            "activation": Activation.SWIGLU if gated else Activation.GELU, "qk_norm": QkNorm.NONE,
            "attention_sinks": False}


def _norm(spec: ModelSpec) -> nn.Module:
    if built_block(spec)["norm"] == Norm.RMSNORM:
        return nn.RMSNorm(spec.hidden, eps=1e-5)
    return nn.LayerNorm(spec.hidden, bias=False)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x)). Block ``index`` of an
    MoE model is dense among its first ``dense_layers`` (DeepSeek's ``first_k_dense_replace``) or outside
    its ``moe_layers`` (Llama 4 Maverick's alternate layers), with
    an MLP of ``dense_ffn_hidden``; without an index, an MoE model's block is an MoE block."""

    def __init__(self, spec: ModelSpec, index: int | None = None):
        super().__init__()
        self.attention_norm = _norm(spec)
        self.attention = Attention(spec)
        self.ffn_norm = _norm(spec)
        if spec.moe and (index is None or not spec.is_dense_layer(index)):
            self.feed_forward = MoE(spec)
        else:
            width = (spec.dense_ffn_hidden or spec.ffn_hidden) if spec.moe else spec.ffn_hidden
            self.feed_forward = FeedForward(spec.hidden, width, spec.gated_mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Embedding(nn.Module):
    """Token embedding plus, for GPT-2 style models, a learned position embedding."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab, spec.hidden)
        learned = spec.position_embedding == PositionEmbedding.LEARNED
        self.pos = nn.Embedding(spec.seq_len, spec.hidden) if learned else None
        self.positions: torch.Tensor | None = None
        """A context-parallel rank's token positions; None: 0..T-1."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)  # (B, T, H)
        if self.pos is not None:
            pos = self.positions if self.positions is not None else torch.arange(tokens.shape[1])
            h = h + self.pos(pos.to(tokens.device))
        return h


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.spec = spec
        self.embed: Embedding | None = Embedding(spec)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.layers)})
        self.norm: nn.Module | None = _norm(spec)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.embed.tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) if self.embed is not None else x  # tokens (B, T) or hidden (B, T, H)
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h  # (B, T, V) or (B, T, H)


def init_weights(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Deterministic GPT-2 initialisation: N(0, 0.02) for matrices and embeddings, ones for
    norms. Parameters are visited in name order, so every rank and the single-process
    reference draw the same numbers."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def build_model(spec: ModelSpec, seed: int = 0) -> Transformer:
    """The full model on the CPU, initialised from ``seed``."""
    model = Transformer(spec)
    init_weights(model, seed)
    return model


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy; logits (B, T, V), labels (B, T). Logits that TP left
    sharded over the vocabulary (a DTensor) need ``loss_context`` around this and the backward."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def loss_context(logits: torch.Tensor):
    """torch's ``loss_parallel`` for vocabulary-sharded logits (``executors.parallel.apply_tp``),
    nothing for whole ones."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel() if isinstance(logits, DTensor) else contextlib.nullcontext()


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())
