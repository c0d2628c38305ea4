"""One layer's blocking tensor-, context- and expert-parallel communication per micro-batch.

``layer_comm`` is what ``step_costs`` charges each layer on the wire before overlap
(``step_costs._layer_blocking`` decides what of it blocks): Megatron's TP all-reduces (or
SP's all-gather and reduce-scatter; DSA's indexer-loss all-reduce, ``simcore.model.dsa``), the CP
variants' K/V traffic (``cp_comm``) and the MoE dispatch and combine all-to-alls; on a calibrated CPU
host the measured layer costs.
"""
from __future__ import annotations

from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import dsa
from simcore.model import moe_dispatch as md
from simcore.model import workload as wl
from simcore.plan.spec import CpComm, Plan


def layer_comm(plan: Plan, dev: cmp.DeviceModel) -> dict[str, float]:
    """Blocking TP / CP / EP communication of one layer and one micro-batch (seconds), and
    (CPU host) the host compute TP's DTensor dispatch adds to it (``host_f``, ``host_b``).
    An MoE model's layer is an MoE layer; its dense layers are ``moe_layers.dense_plan``'s."""
    m, par, tr, cl = plan.model, plan.parallel, plan.training, plan.cluster
    b, s = tr.micro_batch, m.seq_len // par.cp
    act = coll.tp_act_bytes(plan)
    out = dict.fromkeys(("tp_f", "tp_b", "cp", "cp_f", "cp_b", "ep_f", "ep_b", "host_f", "host_b"), 0.0)
    if par.tp > 1:   # Megatron: 2 all-reduces forward, 2 backward; with SP each becomes AG + RS,
        # the same bytes (Korthikanti et al. 2022, Sec. 4.2.2: an all-reduce is a reduce-scatter
        # and an all-gather)
        net = coll.group_net(cl, dev, par.tp, 1)
        gathered = coll.sp_gathered_bytes(plan)   # FP8 under TE
        one = coll.all_gather_s(gathered, net) + coll.reduce_scatter_s(act, net) if par.sequence_parallel \
            else coll.all_reduce_s(act, net)
        out["tp_f"] = out["tp_b"] = 2 * one
        if m.moe and par.etp < par.tp:   # folded experts: the MoE block's AG + RS over expert_tp ranks only
            enet = coll.group_net(cl, dev, par.etp, 1)
            expert = coll.all_gather_s(act, enet) + coll.reduce_scatter_s(act, enet) if par.etp > 1 else 0.0
            out["tp_f"] = out["tp_b"] = one + expert
        (tf, tb), (hf, hb) = dev.parallel_split_s("tp_sp" if par.sequence_parallel else "tp")
        if tf + tb + hf + hb > 0:  # measured DTensor layer cost (latency, dispatch) plus the bandwidth term
            wire = 4 * coll.ring_bytes_s(act, net)
            out["tp_f"], out["tp_b"] = tf + wire, tb + wire
            out["host_f"], out["host_b"] = hf, hb   # DTensor's dispatch: host compute
        if m.sparse_attention is not None:   # DSA's indexer loss: the heads' attention sums, forward and backward
            loss = coll.all_reduce_s(dsa.loss_all_reduce_bytes(m, b, s), net)
            out["tp_f"], out["tp_b"] = out["tp_f"] + loss, out["tp_b"] + loss
    if par.cp > 1:
        out.update(cp_comm(plan, dev, b, s))
    if m.moe and par.ep > 1:  # dispatch and combine all-to-alls (Lepikhin et al. 2021, GShard)
        net = coll.group_net(cl, dev, par.ep, par.etp if par.etp < par.tp else par.tp * par.cp)   # folded: across TP
        routed, remote = md.ep_bytes(plan, act, net)   # per dispatcher and routing (``moe_dispatch``)
        one = coll.all_to_all_s(routed, net, remote)
        if dev.measured("ep"):
            # CPU host: the EP probe's measured layer cost (``host_costs``) already holds the
            # four all-to-alls' latency and dispatch; only the bytes' term is added, as for
            # TP's DTensor probe and the CP ring's
            one = coll.ring_bytes_s(routed, net)
        out["ep_f"] = out["ep_b"] = 2 * one
    return out


def cp_comm(plan: Plan, dev: cmp.DeviceModel, b: int, s: int) -> dict[str, float]:
    """Context parallel's K/V traffic of one layer and micro-batch, by ``parallel.cp_comm``:
    ``cp`` the ring's exchanges (overlapped with the attention core, in ``_layer_blocking``),
    ``cp_f``/``cp_b`` the blocking collectives of the all-gather and all-to-all variants.

    - p2p: cp-1 exchanges of the local K and V (ring attention, Liu et al. 2023; Transformer
      Engine's ``AttnFuncWithCPAndKVP2P``).
    - all_gather: one all-gather of the whole sequence's K/V before the attention and one
      reduce-scatter of dK/dV after its backward, not overlapped (Transformer Engine's
      ``AttnFuncWithCPAndKVAllGather``; the Llama 3 paper's CP, arXiv 2407.21783 Sec. 3.3.2).
    - a2a: DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509): all-to-alls turn Q, K,
      V from sequence- to head-sharded before the attention and the output back after it;
      the backward runs the mirror ones. Not overlapped.
    """
    m, par, cl = plan.model, plan.parallel, plan.cluster
    net = coll.group_net(cl, dev, par.cp, par.tp)
    kv = 2 * coll.comm_act_bytes(plan.training.precision) * b * s * wl.kv_width(m) / par.tp   # this rank's K and V
    if par.cp_comm == CpComm.P2P:
        # each exchange is a point-to-point send and receive: the hop latency, as a pipeline
        # stage's send (``step_costs._p2p_s``), not a collective's base latency; on a calibrated CPU host
        # the ring probe's measured layer cost already holds each exchange's latency
        # (``host_costs``), so only the bytes' term is added, as for TP's DTensor probe
        hop = 0.0 if dev.measured("cp") else net.hop_s
        return {"cp": (par.cp - 1) * coll.send_recv_s(kv, net.bus_bytes_per_s, hop)}
    if par.cp_comm == CpComm.ALL_GATHER:
        one = coll.all_gather_s(kv * par.cp, net)
        return {"cp_f": one, "cp_b": 2 * one}   # the backward gathers K/V again and reduce-scatters dK/dV
    qo = 2 * coll.comm_act_bytes(plan.training.precision) * b * s * wl.attention_out_width(m) / par.tp   # Q, output
    one = coll.all_to_all_s(kv + qo, net)
    return {"cp_f": one, "cp_b": one}
