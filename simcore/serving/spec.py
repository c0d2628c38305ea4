"""The serving plan: a model served by data-parallel replicas of tensor-parallel GPUs, their
precisions, the continuous-batching scheduler, the paged KV cache and the traffic.

The scheduler is vLLM's (vllm-project/vllm, ``vllm/v1/core/sched/scheduler.py`` @00024d3145,
``Scheduler.schedule``): each iteration first gives every running request the tokens it still
needs (one for a decoding request, the rest of its prompt in chunks for a prefilling one) out of
a token budget of ``max_num_batched_tokens``, allocating KV blocks as it goes and, where none
is free, preempting the most recently admitted running request (``self.running.pop()``; its
blocks freed and its tokens recomputed when it is admitted again); then it admits waiting
requests in arrival order while fewer than ``max_num_seqs`` run, the budget lasts and their
blocks fit. With ``chunked_prefill`` false a prompt is admitted only whole within the budget.

``capacity_policy`` picks how admission treats the KV cache, as the engines name it:

- ``on_demand``: vLLM's, above: blocks as tokens come, the newest request preempted when none is free.
- ``guaranteed_no_evict``: TensorRT-LLM's default (``CapacitySchedulerPolicy.GUARANTEED_NO_EVICT``;
  NVIDIA/TensorRT-LLM ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`` @cf6abc45,
  ``GuaranteedNoEvictScheduler::impl``): every running request keeps the blocks it needs to
  complete (``getRemainingBlocksToCompletion``: prompt plus its maximum new tokens), and a
  waiting request is admitted only while its own whole need fits beside them; nothing is ever
  preempted.
- ``static_batch``: TensorRT-LLM's ``STATIC_BATCH`` (the same ``impl<true>``): as
  ``guaranteed_no_evict``, but new requests are admitted only when none runs, so a batch runs to
  its end before the next is formed.

Dynamic batching, as request-level servers batch (``scheduler.batch_window_s`` with ``static_batch``):
a batch is formed when ``max_num_seqs`` requests wait, or when the oldest has waited the window,
then runs to its end. TorchServe's ``batchSize`` and ``maxBatchDelay`` ("the maximum delay for batch
aggregation ... TorchServe waits to receive batch_size number of requests", docs/batch_inference_with_ts.md)
and Triton's dynamic batcher's ``max_queue_delay_microseconds`` (docs/user_guide/model_configuration.md,
"Delayed Batching") name the same two numbers.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from simcore.plan.choices import PlanError, _Choice
from simcore.plan.spec import ClusterSpec, ModelSpec

__all__ = ["Arrival", "CapacityPolicy", "DisaggSpec", "Dtype", "KvCacheSpec", "PlanError", "PrecisionSpec", "Router",
           "SchedulerSpec", "ServingPlan", "SloSpec", "TrafficSpec", "DTYPE_BYTES", "WEIGHT_ONLY", "at_rate", "sized"]


class Dtype(_Choice):
    """Storage and GEMM formats of weights, activations and the KV cache; int8 and int4 are
    weight-only formats (W8A16, W4A16): the GEMMs dequantize them and run in 16 bits; fp32 is a
    CPU host's (the serving loop's on this machine: weights, GEMMs and KV cache in fp32)."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"
    INT8 = "int8"
    INT4 = "int4"
    FP32 = "fp32"


#: Bytes per element of each format (int4 before its group scales: ``PrecisionSpec.group_size``).
DTYPE_BYTES = {Dtype.FP32: 4.0, Dtype.BF16: 2.0, Dtype.FP16: 2.0, Dtype.FP8: 1.0, Dtype.INT8: 1.0, Dtype.INT4: 0.5}
#: Weight-only formats.
WEIGHT_ONLY = (Dtype.INT8, Dtype.INT4)


class Arrival(_Choice):
    """Poisson arrivals at ``rate`` requests per second; offline: every request at t = 0; a
    trace: the dataset's requests in order at its times (scaled to ``rate`` where one is given);
    or a closed loop of clients."""

    POISSON = "poisson"
    OFFLINE = "offline"
    TRACE = "trace"
    CONCURRENCY = "concurrency"
    """A closed loop: ``concurrency`` clients each send a request when their last one finishes
    (vLLM's ``benchmark_serving --max-concurrency``, LMDeploy's ``profile_throughput -c``)."""


class CapacityPolicy(_Choice):
    """How admission treats the KV cache (module docstring)."""

    ON_DEMAND = "on_demand"
    GUARANTEED_NO_EVICT = "guaranteed_no_evict"
    STATIC_BATCH = "static_batch"


class Router(_Choice):
    """How requests reach the replicas: in turn, or to the one with the fewest outstanding
    (routed and unfinished) requests, the rule of Envoy's and NGINX's ``least_request``/``least_conn``."""

    ROUND_ROBIN = "round_robin"
    LEAST_OUTSTANDING = "least_outstanding"


@dataclass(frozen=True, slots=True, kw_only=True)
class SloSpec:
    """Latency targets: the TTFT and TPOT each request should meet, and the percentile of the
    requests at which each must hold for the SLO to hold (DistServe's goodput: requests per second
    that meet both; Zhong et al., OSDI 2024). An absent target is no limit."""

    ttft_s: float = float("inf")
    tpot_s: float = float("inf")
    percentile: float = 99.0

    def holds(self, ttft_at_p: float, tpot_at_p: float) -> bool:
        return ttft_at_p <= self.ttft_s and tpot_at_p <= self.tpot_s

    def describe(self) -> str:
        parts = [f"{name} <= {v * 1e3:g} ms" for name, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s))
                 if v != float("inf")]
        return f"{' and '.join(parts)} at p{self.percentile:g}"


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionSpec:
    weights: Dtype = Dtype.BF16
    activations: Dtype = Dtype.BF16
    """fp8 activations with fp8 weights run the linear layers' GEMMs at the FP8 peak."""
    kv_cache: Dtype = Dtype.BF16
    group_size: int = 128
    """int4 weights: input channels per group sharing an fp16 scale and a packed int4 zero point
    (AWQ's layout as vLLM loads it, ``vllm/model_executor/layers/quantization/awq.py``
    ``AWQLinearMethod.create_weights``: qweight, qzeros and scales; AWQ's and GPTQ's default group
    of 128); int8 weights carry one scale per output channel (negligible)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerSpec:
    """Continuous batching (vLLM's scheduler), or TensorRT-LLM's capacity policies (module docstring)."""

    max_num_seqs: int = 256
    """Requests running at once (vLLM ``--max-num-seqs``, default 256)."""
    max_num_batched_tokens: int = 8192
    """Tokens one iteration computes (vLLM ``--max-num-batched-tokens``)."""
    chunked_prefill: bool = True
    capacity_policy: CapacityPolicy = CapacityPolicy.ON_DEMAND
    batch_window_s: float = 0.0
    """Dynamic batching (``static_batch`` only): how long the oldest waiting request may wait for a
    batch to fill (module docstring); 0: a batch of whatever waits, as soon as none runs."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KvCacheSpec:
    """The paged KV cache (Kwon et al., SOSP 2023, "PagedAttention")."""

    block_size: int = 16
    """Tokens per KV block (vLLM ``--block-size``, default 16)."""
    gpu_memory_utilization: float = 0.9
    """Share of a GPU's memory for weights, activations and the KV cache (vLLM's default 0.9)."""
    free_memory_fraction: float | None = None
    """Instead, the share of the memory left after the weights and activations that holds the KV
    cache (TensorRT-LLM's ``kv_cache_free_gpu_mem_fraction``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficSpec:
    arrival: Arrival
    rate: float = 0.0
    """Requests per second (Poisson)."""
    num_requests: int
    prompt_len: int
    """Every request's prompt tokens; with a dataset, the dataset's mean (rounded)."""
    output_len: int
    """Every request's output tokens; with a dataset, the dataset's mean (rounded)."""
    seed: int = 0
    dataset: tuple[tuple[int, int], ...] | None = None
    """(prompt, output) token counts each request draws from, uniformly with the seed
    (``simcore.serving.dataset``); None: every request has the fixed lengths."""
    dataset_path: str = ""
    concurrency: int = 0
    """Closed-loop clients (``Arrival.CONCURRENCY``); spread over the replicas in turn."""
    times: tuple[float, ...] | None = None
    """With a timed dataset: each line's arrival, seconds after the first (``Arrival.TRACE``)."""

    @property
    def trace_rate(self) -> float:
        """The trace's own mean request rate over its first ``num_requests`` requests."""
        span = self.times[self.num_requests - 1] if self.times and self.num_requests > 1 else 0.0
        return (self.num_requests - 1) / span if span > 0 else math.inf

    @property
    def max_prompt(self) -> int:
        return max(p for p, _ in self.dataset) if self.dataset else self.prompt_len

    @property
    def max_total(self) -> int:
        """The longest context a request reaches: its prompt and its output."""
        return max(p + o for p, o in self.dataset) if self.dataset else self.prompt_len + self.output_len


@dataclass(frozen=True, slots=True, kw_only=True)
class DisaggSpec:
    """Prefill/decode disaggregation (DistServe, Zhong et al., OSDI 2024; vLLM's disaggregated
    prefill, SGLang's and TensorRT-LLM's disaggregated serving): prompts run on prefill
    instances, which make each request's first token and send its KV cache to a decode instance
    (the plan's ``parallel`` replicas); the decode instances only decode."""

    prefill_tp: int
    prefill_replicas: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingPlan:
    name: str
    model: ModelSpec
    cluster: ClusterSpec
    """The nodes that hold the replicas (``hardware`` in the file)."""
    tp: int
    replicas: int
    precision: PrecisionSpec
    scheduler: SchedulerSpec
    kv_cache: KvCacheSpec
    traffic: TrafficSpec
    router: Router = Router.ROUND_ROBIN
    slo: SloSpec | None = None
    disaggregation: DisaggSpec | None = None
    """Prefill instances beside the plan's replicas, which then only decode."""

    @property
    def gpus(self) -> int:
        d = self.disaggregation
        return self.tp * self.replicas + (d.prefill_tp * d.prefill_replicas if d else 0)


def at_rate(plan: ServingPlan, rate: float) -> ServingPlan:
    """The plan's traffic at ``rate``: a trace replayed faster or slower, anything else Poisson;
    the same requests (count, lengths or dataset, seed)."""
    t = plan.traffic
    return replace(plan, traffic=replace(t, arrival=Arrival.TRACE if t.arrival == Arrival.TRACE else Arrival.POISSON,
                                         rate=rate))


def sized(plan: ServingPlan) -> ServingPlan:
    """The plan on as many of its nodes as its GPUs (both pools of a disaggregated plan) take."""
    nodes = max(1, math.ceil(plan.gpus / plan.cluster.gpus_per_node))
    return replace(plan, cluster=replace(plan.cluster, nodes=nodes))


def check_serving(plan: ServingPlan) -> None:
    """The cross-field rules: one sentence naming the field for the first broken."""
    m, s = plan.model, plan.scheduler
    if m.linear_attention is not None:   # cost.py prices every layer's paged K/V and softmax attention
        raise PlanError("model.linear_attention is refused for serving: a Gated DeltaNet layer keeps a fixed "
                        "recurrent state per sequence, not the paged KV cache the serving model holds for every layer")
    if m.sparse_attention is not None:   # cost.py reads every cached token's K/V at each decode step
        raise PlanError("model.sparse_attention is refused for serving: the serving model reads every cached token's "
                        "K/V at each step, where DeepSeek Sparse Attention reads the indexer's top-k (not priced)")
    if m.heads % plan.tp:
        raise PlanError(f"parallel.tp={plan.tp} does not divide model.heads={m.heads}")
    if plan.tp > plan.cluster.gpus_per_node:
        raise PlanError(f"parallel.tp={plan.tp} exceeds the {plan.cluster.gpus_per_node} GPUs of one "
                        f"{plan.cluster.node.name} node (a TP group stays inside a node)")
    _check_precision(plan)
    if not s.chunked_prefill and s.max_num_batched_tokens < plan.traffic.max_prompt:
        where = "the dataset's longest prompt" if plan.traffic.dataset else "traffic.prompt_len"
        raise PlanError(f"scheduler.max_num_batched_tokens={s.max_num_batched_tokens} is below "
                        f"{where}={plan.traffic.max_prompt}, which chunked_prefill false must fit whole")
    if s.batch_window_s < 0:
        raise PlanError(f"scheduler.batch_window_s={s.batch_window_s:g} must be 0 or more seconds")
    if s.batch_window_s and (s.capacity_policy != CapacityPolicy.STATIC_BATCH or plan.disaggregation is not None):
        raise PlanError(f"scheduler.batch_window_s={s.batch_window_s:g} is dynamic batching's window: it needs "
                        "capacity_policy static_batch (batches formed whole) and no disaggregation")
    if s.max_num_batched_tokens < s.max_num_seqs:
        raise PlanError(f"scheduler.max_num_batched_tokens={s.max_num_batched_tokens} must be at least "
                        f"scheduler.max_num_seqs={s.max_num_seqs} (vLLM's rule: every running request's token fits)")
    if not 0 < plan.kv_cache.gpu_memory_utilization <= 1:
        raise PlanError(f"kv_cache.gpu_memory_utilization={plan.kv_cache.gpu_memory_utilization} "
                        "must be in (0, 1]")
    frac = plan.kv_cache.free_memory_fraction
    if frac is not None and not 0 < frac <= 1:
        raise PlanError(f"kv_cache.free_memory_fraction={frac} must be in (0, 1]")
    d = plan.disaggregation
    if d is not None:
        if m.heads % d.prefill_tp or d.prefill_tp > plan.cluster.gpus_per_node:
            raise PlanError(f"disaggregation.prefill_tp={d.prefill_tp} must divide model.heads={m.heads} and stay "
                            f"within one {plan.cluster.node.name} node ({plan.cluster.gpus_per_node} GPUs)")
        if plan.traffic.arrival == Arrival.CONCURRENCY:
            raise PlanError("traffic.arrival=concurrency with disaggregation is not simulated (a closed loop couples "
                            "the two pools); use poisson, offline or trace")
    _check_traffic(plan.traffic)


def _check_precision(plan: ServingPlan) -> None:
    pr, m = plan.precision, plan.model
    if pr.activations in WEIGHT_ONLY or pr.kv_cache in WEIGHT_ONLY:
        which = "activations" if pr.activations in WEIGHT_ONLY else "kv_cache"
        raise PlanError(f"precision.{which}={getattr(pr, which)} is a weight-only format; {which} take bf16, fp16 or fp8")
    if pr.weights in WEIGHT_ONLY and pr.activations == Dtype.FP8:
        raise PlanError(f"precision.weights={pr.weights} is weight-only (W{8 if pr.weights == Dtype.INT8 else 4}A16): "
                        "precision.activations must be bf16 or fp16")
    if pr.weights == Dtype.INT4:
        widths = {"model.hidden": m.hidden, "model.ffn_hidden / parallel.tp": m.ffn_hidden // plan.tp,
                  "the attention output's width / parallel.tp": m.heads * m.head_dim // plan.tp}
        for what, width in widths.items():
            if width % pr.group_size:
                raise PlanError(f"precision.group_size={pr.group_size} does not divide {what} = {width} (an int4 "
                                "layer's input channels come in whole groups: vLLM's AWQ and GPTQ loaders refuse it)")
    if (pr.weights == Dtype.FP32) != (pr.activations == Dtype.FP32):
        raise PlanError(f"precision.weights={pr.weights} with precision.activations={pr.activations}: fp32 "
                        "serving takes both in fp32")
    if pr.activations == Dtype.FP8 and pr.weights != Dtype.FP8:
        raise PlanError("precision.activations=fp8 needs precision.weights=fp8 (an FP8 GEMM takes both inputs in FP8)")


def _check_traffic(t: TrafficSpec) -> None:
    if t.arrival == Arrival.TRACE:
        if t.times is None:
            raise PlanError("traffic.arrival=trace needs traffic.dataset with each request's arrival "
                            "(an Azure trace's TIMESTAMP, or arrival_s)")
        if t.num_requests > len(t.times):
            raise PlanError(f"traffic.num_requests={t.num_requests} exceeds the trace's {len(t.times)} requests")
    if t.arrival == Arrival.CONCURRENCY and not 1 <= t.concurrency:
        raise PlanError("traffic.arrival=concurrency needs traffic.concurrency, the clients (at least 1)")
    if t.arrival == Arrival.POISSON and t.rate <= 0:
        raise PlanError("traffic.rate must be positive for traffic.arrival=poisson")
