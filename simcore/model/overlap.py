"""Communication hidden behind compute: the exposed part of an overlapped transfer, and
tensor parallelism's communication overlap (``parallel.tp_comm_overlap``: Megatron-Core
``--tp-comm-overlap`` through Transformer Engine's userbuffers).
"""
from __future__ import annotations

import functools
from dataclasses import replace

from simcore.model import compute as cmp
from simcore.model import linear_attention as la
from simcore.plan.spec import Plan


def lost_share(interference: float) -> float:
    """Compute time lost per second of communication hidden behind it: compute runs at 1/k of
    its rate while a NCCL kernel shares the SMs and HBM (k = the GPU's
    ``comm_compute_interference``), so hiding T seconds of communication costs T (1 - 1/k)."""
    return 1.0 - 1.0 / interference


#: The GEMMs whose inputs TP's all-gathers feed (qkv, mlp_in) and whose outputs its
#: reduce-scatters take (attn_proj, mlp_out) under sequence parallelism.
TP_OVERLAP_OPS = frozenset({"qkv", "attn_proj", "mlp_in", "mlp_out"})


@functools.lru_cache(maxsize=1024)
def tp_gemm_times(model, b, s, tp, cp, ep, flash, dev) -> tuple[float, float, float, float]:
    """TP's GEMMs of one layer: (forward, backward) device time, and the (forward, backward)
    time their split into ``tp`` chunks adds under ``tp_comm_overlap`` (Transformer Engine
    runs each as tp smaller GEMMs, one per chunk of the collective it overlaps,
    transformer_engine/pytorch/module/base.py ``initialize_ub``; the weight gradient is the
    bulk-overlap partner and stays whole)."""
    if la.mixed(model):   # a hybrid model: the mean of its softmax and Gated DeltaNet layers'
        return la.mix(model, lambda v: tp_gemm_times(v, b, s, tp, cp, ep, flash, dev))
    ops = [o for o in la.layer_forward_ops(model, b=b, s=s, tp=tp, cp=cp, ep=ep, sequence_parallel=True, flash=flash)
           if o.name in TP_OVERLAP_OPS]
    f = sum(cmp.op_forward_s(o, dev) for o in ops)
    bi, bw = (sum(x) for x in zip(*(cmp.op_backward_s(o, dev) for o in ops))) if ops else (0.0, 0.0)
    chunks = [replace(o, flops=o.flops / tp, bytes=o.bytes / tp, count=o.count * tp) for o in ops]
    fc = sum(cmp.op_forward_s(o, dev) for o in chunks)
    bic = sum(cmp.op_backward_s(o, dev)[0] for o in chunks)
    return f, bi + bw, max(0.0, fc - f), max(0.0, bic - bi)


def overlapped_s(comm: float, partner: float, first_chunk: float, lost: float) -> float:
    """Exposed time of ``comm`` overlapped with ``partner`` compute: the ``first_chunk``
    share that must finish before any compute can start, what the compute cannot hide, and
    the slow-down of the compute it hides behind (``lost`` of the hidden time)."""
    head = comm * first_chunk
    rest = comm - head
    return head + max(0.0, rest - partner) + lost * min(rest, partner)


#: The share of a layer's (forward, backward) TP traffic whose userbuffers kernels run on SMs
#: and so slow the GEMM they hide behind as a NCCL kernel does. Transformer Engine's defaults
#: (transformer_engine/pytorch/module/base.py ``initialize_ub`` @d0067d0da): "ring_exchange"
#: (qkv_fprop and fc1_fprop all-gathers, proj_dgrad and fc2_dgrad all-gathers of the output
#: gradient) moves the chunks with the copy engines (``use_ce``, one SM); "pipeline" (the
#: proj/fc2 forward reduce-scatters) and "bulk" (qkv/fc1 dgrad reduce-scatters and the wgrad
#: re-gathers) take 16 SMs each. Forward: 2 of 4 transfers on SMs; backward: 4 of 6.
UB_SM_SHARE = (2 / 4, 4 / 6)


#: The share of a layer's (forward, backward) TP traffic that waits for one of its tp chunks
#: whatever the GEMMs (transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp):
#: a ring-exchange all-gather's first GEMM runs on the local chunk (``split_overlap_ag``: "the
#: initial input chunk is stored _ubuf[rank]"), so none waits; a pipelined reduce-scatter sends
#: chunk i under GEMM i+1 (``split_gemm_overlap_rs``), so its last chunk's is exposed; the bulk
#: overlaps (``bulk_gemm_overlap``) run whole beside another GEMM. Forward: two ring all-gathers
#: and two pipelined reduce-scatters of equal bytes; backward: ring all-gathers and bulk transfers.
UB_TAIL_SHARE = (2 / 4, 0.0)


def tp_exposed(plan: Plan, dev: cmp.DeviceModel, lc: dict, lost: float) -> tuple[float, float]:
    """TP's exposed (forward, backward) communication of one layer: all of it, or with
    ``tp_comm_overlap`` the pipelined reduce-scatters' last chunk (``UB_TAIL_SHARE``), what
    the layer's TP GEMMs cannot hide, the slow-down of the GEMMs that hide it, and the cost of
    running those GEMMs in tp chunks (Megatron-Core ``--tp-comm-overlap``; Wang et al. 2023,
    "Overlap Communication with Dependent Computation via Decomposition", ASPLOS)."""
    par = plan.parallel
    if not par.tp_comm_overlap or par.tp == 1:
        return lc["tp_f"], lc["tp_b"]
    m, tr = plan.model, plan.training
    gf, gb, split_f, split_b = tp_gemm_times(m, tr.micro_batch, m.seq_len // par.cp, par.tp, par.cp, par.ep,
                                              tr.flash_attention, dev)
    return (overlapped_s(lc["tp_f"], gf, UB_TAIL_SHARE[0] / par.tp, lost * UB_SM_SHARE[0]) + split_f,
            overlapped_s(lc["tp_b"], gb, UB_TAIL_SHARE[1] / par.tp, lost * UB_SM_SHARE[1]) + split_b)
