"""DeepSeek-V3's multi-token prediction (MTP) modules as Megatron-Core runs them: the work, the
bytes and the parameters beside their blocks.

DeepSeek-V3 (arXiv 2412.19437, Sec. 2.2) appends D sequential modules to the model; module k
takes the previous depth's hidden state and the embedding of the tokens shifted by k, normalises
each (RMSNorm), projects their concatenation from 2h to h (M_k), runs one transformer block and
the shared output layer, and adds its cross-entropy (weighted by lambda) to the loss. Megatron-Core
builds the same (megatron/core/transformer/multi_token_prediction.py @d98e8a64
``MultiTokenPredictionLayer``: ``enorm``, ``hnorm``, ``eh_proj`` a column-parallel 2h -> h linear,
the block, ``final_layernorm``; ``process_mtp_loss`` runs the output layer and the loss per depth)
and places it with the loss on the last pipeline stage (Megatron-Bridge's DeepSeek-V3 layouts end
in ``mtp``, ``loss``: src/megatron/bridge/recipes/deepseek/deepseek_v3.py @21d102f5e).

Each module's block is one more block of the model's last-layer kind on the last virtual stage
(``Plan.layers_per_stage``), so its time, collectives, parameters and activations are the
per-layer figures'. This module holds the rest of a module: its norms, projection, logits and loss
(``head_ops``), what they keep for the backward (``kept_bytes``) and the projection's and
norms' parameters on the last stage (``head_params_per_gpu``). The loss weight lambda scales a gradient
and costs no time.
"""
from __future__ import annotations

from simcore.model import workload as wl
from simcore.model.params import MTP_NORMS, MTP_PROJECTION_INPUTS, mtp_head_params
from simcore.plan.spec import ModelSpec

#: Bytes per token, in units of 16-bit h-wide activations, that one module keeps beside its block
#: for the backward: the two norms' inputs (hidden state, embedding), the projection's 2h-wide
#: input, and the final norm's input and output (the output layer's input), as the main model's
#: final norm keeps (``activations``: 4 s b h).
MTP_KEPT_ACTIVATIONS = 2 + MTP_PROJECTION_INPUTS + 2


def head_ops(m: ModelSpec, *, b: int, s: int, tp: int = 1) -> list[wl.Op]:
    """The forward kernels of the ``m.mtp_layers`` modules beside their blocks, one micro-batch on
    one GPU: the norms (read and write h per token each), the 2h -> h projection (column-parallel
    over TP) and the output layer and its cross entropy again (``workload.logits_forward_ops``)."""
    if not m.mtp_layers:
        return []
    tokens, h = b * s, m.hidden
    one = [wl.Op(name="mtp_norm", flops=0.0, bytes=wl.ACT_BYTES * tokens * h * 2, matmul=False, count=MTP_NORMS),
           wl.Op(name="mtp_proj", flops=2.0 * tokens * (h / tp) * MTP_PROJECTION_INPUTS * h,
                 bytes=wl.ACT_BYTES * (tokens * MTP_PROJECTION_INPUTS * h + MTP_PROJECTION_INPUTS * h * h / tp
                                       + tokens * h / tp), matmul=True),
           *wl.logits_forward_ops(m, b=b, s=s, tp=tp)]
    return one * m.mtp_layers


def kept_bytes(m: ModelSpec, *, b: int, s: int, sp: int) -> float:
    """Bytes the modules keep beside their blocks and logits on the last stage for one micro-batch:
    their norms' and projections' inputs (``MTP_KEPT_ACTIVATIONS``, split by sequence parallel
    ``sp``); each depth's logits are kept as the main loss's (``activations.loss_bytes``)."""
    return m.mtp_layers * MTP_KEPT_ACTIVATIONS * wl.ACT_BYTES * s * b * m.hidden / sp


def head_params_per_gpu(m: ModelSpec, tp: int) -> float:
    """The modules' parameters beside their blocks on one GPU of the last virtual stage's rank
    (``memory.stage_params`` adds them to its ends, beside the output layer): the projections
    column-parallel over TP, the norms whole (``mtp_head_params``); their blocks are blocks of
    that stage already (``Plan.layers_per_stage``)."""
    projection = m.mtp_layers * MTP_PROJECTION_INPUTS * m.hidden ** 2
    return projection / tp + mtp_head_params(m) - projection
