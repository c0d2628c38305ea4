"""Where an MoE layer's tokens travel, and how much of it another micro-batch's compute hides.

A token's top-k experts lie on some of the expert-parallel ranks, and those on some of the
NVLink domains (nodes) the expert-parallel group spans; which, depends on the gate
(``training.moe_routing``):

- ``balanced``: k distinct experts drawn uniformly (Megatron-Core's load-balanced benchmarks
  draw random logits, router.py ``RandomSTE``): of g equal groups of consecutive experts a token
  reaches g (1 - C(E - E/g, k) / C(E, k)) in expectation.
- ``round_robin``: token t runs experts tk .. tk+k-1 modulo E (NeMo AutoModel's
  ``FakeBalancedGate``), so they are consecutive: the groups that window covers, averaged over t.

The all-to-all dispatcher sends a token once per expert (k copies, the capacity factor's
padding included); DeepEP and HybridEP once per destination rank, and across domains once per
destination domain over RDMA, forwarded over NVLink there: "each token is first transmitted via
IB to the GPUs with the same in-node index on its target nodes ... then forwarded via NVLink"
(DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.2; DeepEP csrc/kernels/internode.cu carries a
token once per RDMA rank with a bit per NVLink peer, ``SourceMeta``).

``parallel.moe_a2a_overlap`` (Megatron-Core's combined 1F1B): "the forward pass of Transformer
layers for one micro-batch runs in parallel with the backward pass of another ... EP A2A in
forward step is hidden by the attention/mlp computation in the backward step, and vice versa";
"the forward step for the first microbatch is executed alone, no a2a overlapping"
(megatron/core/pipeline_parallel/combined_1f1b.py @d98e8a64).
"""
from __future__ import annotations

import functools
import math

from simcore.model import collectives as coll
from simcore.model import overlap as ov
from simcore.model.activations import schedule_peaks
from simcore.plan.spec import MoeDispatcher, Plan


@functools.lru_cache(maxsize=1024)
def groups_hit(experts: int, top_k: int, groups: int, routing: str = "balanced") -> float:
    """Expected groups, of ``groups`` equal runs of consecutive experts, that a token's ``top_k``
    experts fall in under ``routing`` (module docstring). At least 1, at most min(top_k, groups)."""
    if groups <= 1:
        return 1.0
    if routing == "balanced":
        return groups * (1.0 - math.comb(experts - experts // groups, top_k) / math.comb(experts, top_k))
    size, step = experts // groups, math.gcd(top_k, experts)
    starts = range(0, experts, step)   # t * top_k mod E takes every multiple of gcd(top_k, E) equally often
    return sum(len({((s + i) % experts) // size for i in range(top_k)}) for s in starts) / len(starts)


def dispatch_ranks(experts: int, top_k: int, ep: int) -> float:
    """Ranks a balanced token reaches when it travels once per rank (DeepEP): ``groups_hit``
    over the ``ep`` ranks."""
    return groups_hit(experts, top_k, ep)


def ep_bytes(plan: Plan, act: float, net: coll.GroupNet) -> tuple[float, float | None]:
    """(bytes a rank sends in one all-to-all, of them the bytes bound for other NVLink domains;
    None: the all-to-all's even share) for one micro-batch's ``act`` activation bytes."""
    m, par = plan.model, plan.parallel
    sp = par.tp if par.sequence_parallel else 1
    if par.moe_dispatcher != MoeDispatcher.DEEPEP:
        return act * m.top_k * m.capacity_factor / sp, None
    routing = plan.training.moe_routing.value
    routed = act * groups_hit(m.experts, m.top_k, par.ep, routing) / sp
    if net.nodes <= 1:
        return routed, None
    domains = groups_hit(m.experts, m.top_k, net.nodes, routing)
    return routed, act * domains * (net.nodes - 1) / net.nodes / sp


def unpaired_share(plan: Plan) -> float:
    """The share of a rank's chunk forwards (and backwards) that the combined 1F1B runs alone:
    the first forward without a pipeline, else the interleaved warm-up (and cool-down) of the
    first rank, the longest (``activations.schedule_peaks``: its chunks in flight)."""
    par = plan.parallel
    total = plan.num_microbatches * par.vpp
    if par.pp == 1:
        return 1.0 / total
    flights = schedule_peaks(par.schedule, par.pp, plan.num_microbatches, par.vpp, par.microbatch_group)[0][0]
    return min(1.0, flights / total)


def a2a_exposed(plan: Plan, ep: tuple[float, float], compute: tuple[float, float], interference: float
                ) -> tuple[float, float]:
    """A layer's exposed (forward, backward) expert all-to-alls ``ep`` under ``parallel.moe_a2a_overlap``:
    the forward's beside the paired micro-batch's backward compute, the backward's beside the
    forward's (``compute``: one layer's (forward, backward)), the hidden part slowing that compute
    as any overlapped communication kernel does; the unpaired share whole."""
    if not plan.parallel.moe_a2a_overlap:
        return ep
    u, lost = unpaired_share(plan), ov.lost_share(interference)
    return (u * ep[0] + (1 - u) * ov.overlapped_s(ep[0], compute[1], 0.0, lost),
            u * ep[1] + (1 - u) * ov.overlapped_s(ep[1], compute[0], 0.0, lost))
