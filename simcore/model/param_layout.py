"""The parameter tensors of the executor's model (``executors.model.Transformer``).

Which tensors each pipeline rank's model chunks hold, in forward-use order (the order
DDP's buckets and FSDP2's units follow), and the shapes a tensor-parallel rank and an
FSDP2 shard hold of each; ``simcore.model.collective_plan`` sizes the collectives from them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from simcore.plan.spec import ModelSpec, Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class ParamTensor:
    """One parameter tensor of ``executors.model.Transformer``."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None = None
    """Tensor dim that tensor parallelism shards (0 column/vocab-parallel, 1 row-parallel)."""
    norm: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class StagePart:
    """One model chunk held by a pipeline rank (the whole model without pipelining)."""

    stage: int
    layers: tuple[int, ...]
    embed: bool
    head: bool


# --------------------------------------------------------------------------- model structure

def block_params(spec: ModelSpec, i: int) -> list[ParamTensor]:
    """Block ``i``'s parameters in forward-use order (registration order differs only in
    that w3 is registered after w2). An MoE model's first ``dense_layers`` blocks hold a dense
    MLP of ``dense_ffn_hidden`` (``simcore.model.moe_layers``)."""
    p, h, hd, f = f"layers.{i}.", spec.hidden, spec.head_dim, spec.ffn_hidden
    out = [ParamTensor(name=p + "attention_norm.weight", shape=(h,), norm=True),
           ParamTensor(name=p + "attention.wq.weight", shape=(spec.heads * hd, h), tp_dim=0),
           ParamTensor(name=p + "attention.wk.weight", shape=(spec.kv_heads * hd, h), tp_dim=0),
           ParamTensor(name=p + "attention.wv.weight", shape=(spec.kv_heads * hd, h), tp_dim=0),
           ParamTensor(name=p + "attention.wo.weight", shape=(h, spec.heads * hd), tp_dim=1),
           ParamTensor(name=p + "ffn_norm.weight", shape=(h,), norm=True)]
    if spec.moe and not spec.is_dense_layer(i):
        out.append(ParamTensor(name=p + "feed_forward.router.weight", shape=(spec.experts, h)))
        prefixes = [f"{p}feed_forward.experts.{e}." for e in range(spec.experts)]
    else:
        prefixes, f = [p + "feed_forward."], (spec.dense_ffn_hidden or f) if spec.moe else f
    for q in prefixes:
        out.append(ParamTensor(name=q + "w1.weight", shape=(f, h), tp_dim=0))
        if spec.gated_mlp:
            out.append(ParamTensor(name=q + "w3.weight", shape=(f, h), tp_dim=0))
        out.append(ParamTensor(name=q + "w2.weight", shape=(h, f), tp_dim=1))
    return out


def embed_params(spec: ModelSpec) -> list[ParamTensor]:
    out = [ParamTensor(name="embed.tok.weight", shape=(spec.vocab, spec.hidden), tp_dim=0)]
    if spec.position_embedding.value == "learned":
        out.append(ParamTensor(name="embed.pos.weight", shape=(spec.seq_len, spec.hidden)))
    return out


def head_params(spec: ModelSpec, tied_copy: bool = False) -> list[ParamTensor]:
    """Final norm and output projection (none when tied to the token embedding, except the
    copy a last pipeline stage without the embedding holds: ``tied_copy``)."""
    out = [ParamTensor(name="norm.weight", shape=(spec.hidden,), norm=True)]
    if not spec.tied_embeddings or tied_copy:
        out.append(ParamTensor(name="output.weight", shape=(spec.vocab, spec.hidden), tp_dim=0))
    return out


def part_params(spec: ModelSpec, part: StagePart) -> list[ParamTensor]:
    """A chunk's parameters in forward-use order (``model.parameters()`` deduplicates a tied one)."""
    out = embed_params(spec) if part.embed else []
    for i in part.layers:
        out += block_params(spec, i)
    return out + (head_params(spec, tied_copy=not part.embed) if part.head else [])


def num_parameter_tensors(spec: ModelSpec) -> int:
    """``sum(1 for _ in build_model(spec).parameters())``."""
    return len(part_params(spec, StagePart(stage=0, layers=tuple(range(spec.layers)), embed=True, head=True)))


def stage_parts(plan: Plan, pp_rank: int) -> list[StagePart]:
    """The chunks of one pipeline rank, loop style or DualPipeV's V (``executors.parallel.stage_ids``)."""
    par, sizes = plan.parallel, plan.layers_per_stage
    ids = par.rank_stages(pp_rank) if par.pp > 1 else [0]
    out = []
    for s in ids:
        start = sum(sizes[:s])
        out.append(StagePart(stage=s, layers=tuple(range(start, start + sizes[s])), embed=s == 0,
                             head=s == len(sizes) - 1))
    return out


def local_shape(p: ParamTensor, tp: int, tp_rank: int) -> tuple[int, ...]:
    """The shape this TP rank holds (DTensor ``Shard`` follows ``torch.chunk``)."""
    if tp == 1 or p.tp_dim is None:
        return p.shape
    n = p.shape[p.tp_dim]
    chunk = math.ceil(n / tp)
    shape = list(p.shape)
    shape[p.tp_dim] = max(0, min(chunk, n - tp_rank * chunk))
    return tuple(shape)


def _numel(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


def fsdp_padded_numel(shape: tuple[int, ...], dp: int) -> int:
    """FSDP2 shards dim 0 with ``torch.chunk`` and pads every shard to the first one's size."""
    return math.ceil(shape[0] / dp) * dp * _numel(shape[1:])
