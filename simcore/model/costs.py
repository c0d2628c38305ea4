"""StepCosts: the per-stage work of one training step, the hand-off between the math and the paths.

The pure math (workload, memory, compute, collectives) reduces a Plan to a ``StepCosts``;
the analytic path (closed forms) and the event engine (SimPy) both consume it, so the
two answer from the same numbers and differ only in how they schedule the work.

All tuples are indexed by *virtual* stage ``v`` in model order (``pp * vpp`` of them);
virtual stage ``v`` runs on pipeline rank ``v % pp`` (the interleaved layout of
Narayanan et al. 2021, Sec. 2.2.2), or for DualPipeV on the rank of its V
(``ParallelSpec.stage_rank``). Times are seconds for ONE micro-batch unless the
name says ``per_step``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from simcore.plan.spec import Plan


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCosts:
    plan: Plan
    layers: tuple[int, ...]
    """Transformer layers of each virtual stage."""
    forward_s: tuple[float, ...]
    """Forward compute of one micro-batch (kernels only, no communication)."""
    backward_input_s: tuple[float, ...]
    """Backward w.r.t. activations (the zero-bubble "B"/"I" part)."""
    backward_weight_s: tuple[float, ...]
    """Backward w.r.t. weights (the zero-bubble "W" part)."""
    recompute_s: tuple[float, ...]
    """Extra forward recomputed before the backward (0 without recompute)."""
    forward_comm_s: tuple[float, ...]
    """Blocking TP/CP/EP communication inside the forward of one micro-batch."""
    backward_comm_s: tuple[float, ...]
    """Blocking TP/CP/EP communication inside the backward (and recompute) of one micro-batch."""
    p2p_s: float
    """Send one micro-batch's activations (or their gradients) to the next pipeline stage."""
    forward_gather_s: tuple[float, ...]
    """FSDP2 (ZeRO-2/3) parameter all-gathers in the forward, per micro-batch (the step's
    gathers spread over its micro-batches), prefetched layer by layer behind the compute."""
    backward_gather_s: tuple[float, ...]
    """The same in the backward (ZeRO-3 resharded the forward's parameters; ZeRO-2 kept them)."""
    grad_reduce_per_step_s: tuple[float, ...]
    """Gradient all-reduce (ZeRO 0) or reduce-scatter (ZeRO >= 1) per step, overlappable with backward."""
    grad_buckets: tuple[int, ...]
    """Buckets the gradient reduction is issued in (DDP buckets / FSDP2 layers)."""
    grad_reduce_per_microbatch: bool = False
    """FSDP2 without pipelining: every micro-batch's backward reduce-scatters its gradients
    layer by layer (``grad_reduce_per_step_s`` is the sum over the step's micro-batches);
    otherwise the reduction follows the stage's last backward."""
    param_sync_per_step_s: tuple[float, ...]
    """ZeRO-1/2 all-gather of updated parameters after the optimizer step (not overlapped)."""
    optimizer_per_step_s: tuple[float, ...]
    """Optimizer step on the GPU (or on the host with optimizer offload)."""
    offload_per_step_s: tuple[float, ...]
    """Host-device copies per step for offload (gradients down, parameters up)."""
    model_flops_per_step: float
    """Model FLOPs of one step over the whole cluster (no recompute)."""
    hardware_flops_per_step: float
    """FLOPs actually executed in one step over the whole cluster (recompute included)."""
    memory_bytes: dict[str, float] = field(default_factory=dict)
    """Bytes per GPU by kind on the most loaded rank."""
    memory_per_rank_bytes: tuple[float, ...] = ()
    """Total bytes on each pipeline rank."""
    time_detail_s: dict[str, float] = field(default_factory=dict)
    """Per-kind totals for the report (tp_comm, cp_comm, ep_comm, ...), per step on the critical rank."""
    notes: tuple[str, ...] = ()
    forward_send_s: tuple[float, ...] = ()
    """CPU host: the sender's blocking call of one forward pipeline send (gloo), per micro-batch
    (empty: none, as on GPUs, where sends are asynchronous)."""
    backward_send_s: tuple[float, ...] = ()
    """The same for the gradient sent back."""
    forward_recv_wait_s: tuple[float, ...] = ()
    """CPU host: the receiving rank's wait for a forward message's hand-over before its chunk
    runs (gloo moves a message once the receiver posts its receive, and the busy sender's
    thread then waits for a core). Idle time: the executor, which does not draw receives,
    measures it as bubble, and so does the simulator."""
    backward_recv_wait_s: tuple[float, ...] = ()
    """The same for the gradient received."""
    p2p_post_s: float = 0.0
    """CPU host: the call that posts one receive (gloo). Where torch issues it together with
    a send (``schedules.fused_p2p``: Schedule1F1B's steady phase) it runs on the sender
    right after the send and is comm, as the executor's recorder times the joint call; the
    receive wait above, which holds a post, is that much shorter for a receive posted so."""
    activation_copies_s: tuple[tuple[float, float], ...] = ()
    """``training.activation_offload``, per virtual stage: the (forward, backward) wait of one
    micro-batch for its offloaded activations' copies to and from host memory, the part the
    layers' compute does not hide (empty: no offload)."""
    grad_sync_holds_send: bool = False
    """A stage's backward that reduces its gradients sends its input gradient upstream only
    once the reduction is complete. torch.distributed.pipelining runs DDP's reduction inside
    the stage's last backward call (``PipelineStage.backward_maybe_with_nosync``) and DDP's
    reducer waits for its buckets before ``backward`` returns, so the pipeline's drain passes
    every stage's gradient sync in turn. Set for DDP under pipelining on a calibrated profile,
    where trainplan's executor is what runs; catalog hardware keeps the reduction off the
    pipeline (the published Megatron-LM runs the model is checked against reduce that way)."""

    @property
    def stages(self) -> int:
        return len(self.layers)

    def backward_s(self, v: int) -> float:
        return self.backward_input_s[v] + self.backward_weight_s[v]

    def copies_s(self, v: int) -> tuple[float, float]:
        """(forward, backward) activation-offload wait of virtual stage ``v``'s micro-batch."""
        return self.activation_copies_s[v] if self.activation_copies_s else (0.0, 0.0)

    def host_p2p_s(self, v: int, forward: bool) -> tuple[float, float]:
        """(blocking send call, receive wait) of virtual stage ``v``'s forward or backward chunk."""
        send, wait = (self.forward_send_s, self.forward_recv_wait_s) if forward else \
            (self.backward_send_s, self.backward_recv_wait_s)
        return (send[v] if send else 0.0), (wait[v] if wait else 0.0)
