"""Apply a Plan's parallel layout to the model with torch's own parallel APIs.

The composition order is torchtitan's (``torchtitan/models/llama/parallelize_llama.py``
and ``pipeline_llama.py``): split into pipeline stages first, then on each stage module
tensor parallel (DTensor ``parallelize_module``), activation recomputation
(``checkpoint_wrapper``), then data parallel (DDP, ``ZeroRedundancyOptimizer`` or FSDP2
``fully_shard``). One device mesh with named axes in the simulator's order
(``topologies.placement.rank_grid``: pp, dp, cp, tp; TP innermost) serves every step,
each taking only its slice of the mesh.

ZeRO stages map onto torch as DeepSpeed defines them (Rajbhandari et al. 2020):
0 = DDP all-reduce; 1 = DDP + ``ZeroRedundancyOptimizer`` (optimizer states sharded,
parameters broadcast after the step); 2 = FSDP2 with ``reshard_after_forward=False``
(gradients and optimizer states sharded, parameters kept gathered between forward and
backward); 3 = FSDP2 with ``reshard_after_forward=True``. Without pipelining, FSDP2
reduce-scatters after every micro-batch (sharded gradients cannot be accumulated
unsharded), DDP all-reduces after the last one only (``no_sync``), and so does the
FSDP2-based ``replicate`` that stands in for DDP (``set_requires_gradient_sync``).

Context parallel (``executors.ring_attention``) replaces each block's attention core by
ring attention and trains each rank on its head and tail chunks of every sequence; expert
parallel (``executors.moe``) keeps a rank's experts, which the data-parallel wrappers
leave to their own reduction; both come before tensor parallelism. The data-parallel
wrappers reduce over dp x cp (``executors.groups``). Tied embeddings are re-tied after
TP and summed over the pipeline's ends each step (``executors.tied``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed import pipelining
from torch.distributed._composable.replicate_with_fsdp import ReplicateModule, replicate
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleInputOutput,
                                               PrepareModuleOutput, RowwiseParallel, SequenceParallel,
                                               loss_parallel, parallelize_module)

from executors import groups, int8_hook, moe, tied
from executors.float8 import apply_float8, precompute_scales
from executors.fsdp_wrap import shard_groups
from executors.act_offload import apply_activation_offload
from executors.recompute import apply_recompute
from executors.ring_attention import apply_cp
from executors.support import check_executable, uses_replicate  # noqa: F401  (launch and the tests find them here)
from executors.zero1 import LocalShardZero
from executors.procs import idle_gloo_transport
from executors.model import Transformer, build_model, loss_fn
from simcore.model import ddp_hooks as hooks
from simcore.plan.spec import (
    FsdpRoot, GradCompression, Offload, Optimizer, Plan, Precision, Schedule, ZeroStage,
)
from topologies.placement import AXES

#: Optimizer hyper-parameters (not hardware figures): GPT-3's AdamW betas and weight
#: decay (Brown et al. 2020, appendix B); a learning rate suited to the tiny models here.
LEARNING_RATE = 1e-3
ADAM_BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.1
#: SGD's momentum: Megatron-LM's ``--sgd-momentum`` default (megatron/training/arguments.py), one state a parameter.
SGD_MOMENTUM = 0.9
#: PowerSGD's uncompressed first steps (its rank is the model's, ``simcore.model.ddp_hooks``).
POWERSGD_START_ITER = 2


def build_mesh(plan: Plan, device_type: str) -> DeviceMesh:
    """The (pp, dp, cp, tp) mesh; rank r sits at ``rank_grid(...).coords(r)``."""
    par = plan.parallel
    mesh = init_device_mesh(device_type, (par.pp, par.dp, par.cp, par.tp), mesh_dim_names=AXES)
    idle_gloo_transport()   # the mesh's groups' transport threads, as the default group's
    return mesh


# --------------------------------------------------------------------------- pipeline split

def stage_ids(plan: Plan, pp_rank: int) -> list[int]:
    """Virtual stages held by one pipeline rank, "loop" style (rank i: i, i+pp, ...), the
    assignment ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble expect, or "v" style for
    ScheduleDualPipeV (rank i: i and 2pp-1-i; torchtitan's ``_get_pp_rank_to_stage_indices_mapping``)."""
    return list(plan.parallel.rank_stages(pp_rank))


def build_stage_module(plan: Plan, stage: int, seed: int) -> Transformer:
    """The full model with every layer outside ``stage`` deleted (torchtitan's
    ``pipeline_module_split``): names stay those of the full model."""
    model = build_model(plan.model, seed)
    sizes = plan.layers_per_stage
    if len(sizes) == 1:
        return model
    start = sum(sizes[:stage])
    keep = {str(i) for i in range(start, start + sizes[stage])}
    for name in list(model.layers):
        if name not in keep:
            del model.layers[name]
    if stage != 0:
        model.embed = None
    if stage != len(sizes) - 1:
        model.norm, model.output = None, None
    return model


# --------------------------------------------------------------------------- tensor parallel

def apply_tp(model: Transformer, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Megatron-style TP (Shoeybi et al. 2019) with sequence parallelism (Korthikanti et al.
    2022): column-parallel QKV / w1 / w3, row-parallel wo / w2; with SP the norms run on
    sequence shards and the row-parallel outputs are reduce-scattered (torchtitan's plan)."""
    seq = Shard(1) if sequence_parallel else Replicate()
    top: dict = {}
    if model.embed is not None:
        top["embed.tok"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        if sequence_parallel:
            top["embed"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1))
    if model.output is not None:   # vocabulary-parallel logits for torch's loss_parallel (torchtitan's default)
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
        if sequence_parallel:
            top["norm"] = SequenceParallel()
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, _block_tp_plan(block, sequence_parallel))
    tied.retie(model)


def _block_tp_plan(block: nn.Module, sp: bool) -> dict:
    seq = Shard(1) if sp else Replicate()
    plan = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=seq)}
    # one Replicate DTensor input per sub-block, so that Q, K and V (and w1, w3) share it and
    # its gradient is all-reduced once (Megatron's "f" operator), not once per matrix
    plan["attention"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
    if sp:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    experts = getattr(block.feed_forward, "experts", None)
    if experts is None:
        plan.update({"feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=seq)})
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        plan["feed_forward"] = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
        return plan
    for e, expert in experts.items():  # each expert's MLP is TP-split; the router is replicated
        plan.update({f"feed_forward.experts.{e}.w1": ColwiseParallel(),
                     f"feed_forward.experts.{e}.w2": RowwiseParallel(output_layouts=Replicate())})
        if expert.w3 is not None:
            plan[f"feed_forward.experts.{e}.w3"] = ColwiseParallel()
    if sp:
        plan["feed_forward"] = PrepareModuleInputOutput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
            output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),))
    return plan


# --------------------------------------------------------------------------- data parallel

def apply_dp(model: nn.Module, plan: Plan, dp_mesh: DeviceMesh, device: torch.device,
             ignored: frozenset = frozenset()) -> nn.Module:
    """DDP (zero 0/1), FSDP2-based replicate (zero 0 with TP) or FSDP2 fully_shard (zero 2/3);
    ``ignored`` parameters (an expert-parallel rank's experts) are left to ``executors.moe``."""
    par = plan.parallel
    if par.dp * par.cp == 1 and plan.training.offload == Offload.NONE:
        return model
    if par.zero >= ZeroStage.GRADIENTS:   # offload on one rank too: FSDP2 over a mesh of one
        offload = CPUOffloadPolicy() if plan.training.offload != Offload.NONE else OffloadPolicy()
        sharded = apply_fsdp2(model, dp_mesh, par.zero == ZeroStage.WEIGHTS, offload, set(ignored), par.fsdp_root)
        return int8_hook.fsdp_int8(sharded, bits) if (bits := plan.training.grad_compression.bits) else sharded
    if uses_replicate(plan):
        return replicate(model, mesh=dp_mesh, ignored_params=set(ignored))
    if ignored:
        names = [n for n, p in model.named_parameters() if p in ignored]
        nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    ddp = nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        process_group=dp_mesh.get_group())   # MoE too: every expert runs its padded capacity buffer
    _register_comm_hook(ddp, plan.training.grad_compression, dp_mesh.get_group())
    return ddp


def apply_fsdp2(model: Transformer, dp_mesh: DeviceMesh, reshard_after_forward: bool,
                offload: OffloadPolicy | None = None, ignored: set | None = None,
                root: FsdpRoot = FsdpRoot.RESHARDED) -> Transformer:
    """FSDP2 as the Plan's stack groups it (``executors.fsdp_wrap``): one group per block, the
    rest (embedding, final norm, output) in the root group or, as torchtitan wraps them, in
    groups of their own."""
    return shard_groups(model, root, reshard_after_forward, mesh=dp_mesh, offload_policy=offload or OffloadPolicy(),
                        ignored_params=ignored or None)


def _register_comm_hook(ddp, compression: GradCompression, group) -> None:
    if compression in (GradCompression.FP16, GradCompression.BF16):   # torch's 16-bit compress hooks
        ddp.register_comm_hook(group, getattr(default_hooks, f"{compression.value}_compress_hook"))
    elif compression == GradCompression.POWERSGD:
        state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=hooks.POWERSGD_RANK,
                                            start_powerSGD_iter=POWERSGD_START_ITER)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif compression.bits:   # ours (torch's int8 hook fails on gloo); int8_ef keeps its errors in the state
        ddp.register_comm_hook(int8_hook.Int8State(group=group, bits=compression.bits,
                                                   feedback=compression.value == "int8_ef"), int8_hook.int8_hook)
    else:  # torch's Python all-reduce hook, so that the measured all-reduces are visible
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)


def build_optimizer(params: list[nn.Parameter], plan: Plan, dp_mesh: DeviceMesh, lr: float,
                    edp_group=None) -> torch.optim.Optimizer:
    """The plan's optimizer; ZeRO-1 shards its states over the dp (x cp) ranks, or under expert
    parallelism over the ranks that hold the same experts (``edp_group``; none: not sharded),
    since the others hold other experts."""
    opt = plan.training.optimizer
    cls, kwargs = {
        Optimizer.ADAMW: (torch.optim.AdamW, {"betas": ADAM_BETAS, "weight_decay": WEIGHT_DECAY}),
        Optimizer.ADAM: (torch.optim.Adam, {"betas": ADAM_BETAS}),
        Optimizer.SGD: (torch.optim.SGD, {"momentum": SGD_MOMENTUM}),
        Optimizer.ADAFACTOR: (torch.optim.Adafactor, {"weight_decay": WEIGHT_DECAY}),
    }[opt]   # adamw8bit is refused (executors.support)
    par = plan.parallel
    zero1 = par.zero == ZeroStage.OPTIMIZER_STATES and par.dp * par.cp > 1   # (hybrid sharding's 2-D mesh: zero 2-3)
    group = (dp_mesh.get_group() if par.ep == 1 else edp_group) if zero1 else None
    if group is not None:
        # bucket view: one broadcast per rank after the step instead of one per tensor
        if uses_replicate(plan):   # DTensor parameters: their local shards, updated in place (executors.zero1)
            return LocalShardZero(params, optimizer_class=cls, process_group=group, lr=lr, **kwargs)
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=group,
                                       parameters_as_bucket_view=True, lr=lr, **kwargs)
    return cls(params, lr=lr, **kwargs)


# --------------------------------------------------------------------------- schedules

_SCHEDULES = {
    Schedule.GPIPE: "ScheduleGPipe",
    Schedule.ONE_F_ONE_B: "Schedule1F1B",
    Schedule.INTERLEAVED_1F1B: "ScheduleInterleaved1F1B",
    Schedule.ZERO_BUBBLE: "ScheduleInterleavedZeroBubble",
    Schedule.DUALPIPE_V: "ScheduleDualPipeV",
}


def build_schedule(stages: list, plan: Plan, loss):
    """torch.distributed.pipelining's schedule for the plan; ValueError if torch refuses it."""
    name = _SCHEDULES[plan.parallel.schedule]
    cls = getattr(pipelining, name)
    multi = issubclass(cls, pipelining.schedules.PipelineScheduleMulti)
    try:
        return cls(stages if multi else stages[0], plan.num_microbatches, loss_fn=loss)
    except (ValueError, AssertionError, RuntimeError) as exc:
        reason = str(exc).split("\n")[0].strip() or type(exc).__name__
        raise ValueError(f"parallel.schedule={plan.parallel.schedule.value}: torch's {name} cannot run "
                         f"{plan.num_microbatches} micro-batches on pp={plan.parallel.pp} x vpp="
                         f"{plan.parallel.vpp} stages ({reason})") from None


# --------------------------------------------------------------------------- the trainer

@dataclass(kw_only=True)
class Trainer:
    """This rank's share of the model, its optimizer and its pipeline schedule."""

    plan: Plan
    mesh: DeviceMesh
    device: torch.device
    parts: list[nn.Module]
    """Model chunks on this rank (one without pipelining, vpp with it)."""
    optimizer: torch.optim.Optimizer
    stages: list = field(default_factory=list)
    schedule: object | None = None
    scaler: object | None = None
    embedding_group: object | None = None
    cp_positions: torch.Tensor | None = None
    """Under context parallelism: the sequence positions this rank trains on."""
    experts: list = field(default_factory=list)
    """Under expert parallelism: this rank's expert parameters, and their reduction group."""
    edp_group: object | None = None
    """With tied embeddings under pipelining: the first and last stages' group (``executors.tied``)."""

    @property
    def is_last_stage(self) -> bool:
        par = self.plan.parallel
        return self.mesh.get_local_rank("pp") == par.stage_rank(par.pp * par.vpp - 1)

    def autocast(self):
        prec = self.plan.training.precision
        if prec == Precision.FP32:
            return contextlib.nullcontext()
        dtype = torch.float16 if prec == Precision.FP16 else torch.bfloat16   # fp8: the rest of the model in bf16
        return torch.autocast(self.device.type, dtype=dtype)

    def loss_context(self):
        """Under TP the logits stay sharded over the vocabulary and the cross-entropy runs on
        the shards (``torch.distributed.tensor.parallel.loss_parallel``, torchtitan's default;
        Megatron's vocab-parallel cross entropy): forward and backward run inside it."""
        return loss_parallel() if self.plan.parallel.tp > 1 else contextlib.nullcontext()

    def step(self, tokens: torch.Tensor, labels: torch.Tensor, span=None) -> float | None:
        """One optimizer step on this rank's (global_batch / dp) sequences; returns the mean
        loss on last-stage ranks, None elsewhere. ``span(kind, name)`` (optional) returns
        a context manager that times one piece of compute."""
        span = span or (lambda kind, name: contextlib.nullcontext())
        for opt_part in self.parts:
            opt_part.zero_grad(set_to_none=self.plan.training.grads_to_none)
        if self.cp_positions is not None:   # this context-parallel rank's share of each sequence
            tokens, labels = tokens[:, self.cp_positions], labels[:, self.cp_positions]
        with self.loss_context():
            loss = self._pipeline_step(tokens, labels) if self.schedule is not None \
                else self._accumulate(tokens, labels, span)
        tied.allreduce_shared_grad(tied.shared_weight(self.parts), self.embedding_group)
        if self.plan.parallel.v_shape and self.plan.model.tied_embeddings:
            tied.sum_local_copies(self.parts)
        if self.experts:
            moe.reduce_expert_grads(self.experts, self.edp_group, self.plan.parallel.dp * self.plan.parallel.cp)
        with span("optimizer", "optimizer"):
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            precompute_scales(self.plan, self.parts)   # torchao's, under fp8_param_gather
        return loss

    def _accumulate(self, tokens, labels, span) -> float:
        """Gradient accumulation over micro-batches (no pipeline)."""
        model = self.parts[0]
        n = self.plan.num_microbatches
        total = 0.0
        for mb, (x, y) in enumerate(zip(tokens.chunk(n), labels.chunk(n))):
            last = mb == n - 1
            sync = model.no_sync() if isinstance(model, nn.parallel.DistributedDataParallel) and not last \
                else contextlib.nullcontext()
            if isinstance(model, ReplicateModule):
                model.set_requires_gradient_sync(last)   # ZeRO 0/1: one all-reduce per step, as DDP's
            with sync:
                with span("forward", f"F{mb}"), self.autocast():
                    loss = loss_fn(model(x), y) / n
                with span("backward", f"B{mb}"):
                    (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total += loss.item()
        return total

    def _pipeline_step(self, tokens, labels) -> float | None:
        losses: list = []
        first = self.mesh.get_local_rank("pp") == 0
        with self.autocast():
            if first:
                self.schedule.step(tokens, target=labels, losses=losses)
            else:
                self.schedule.step(target=labels, losses=losses)
        if not losses:
            return None
        mean = torch.stack([l.detach().float() for l in losses]).mean().item()
        return mean / self.scaler.get_scale() if self.scaler is not None else mean


def build_trainer(plan: Plan, mesh: DeviceMesh, device: torch.device, seed: int = 0,
                  lr: float = LEARNING_RATE) -> Trainer:
    """Split, parallelise and wrap this rank's part of the model (torchtitan's order)."""
    check_executable(plan, device.type)
    par = plan.parallel
    groups.clear()
    dp_mesh = groups.dp_cp_mesh(plan, mesh)
    embedding_group = groups.embedding_group(plan)
    ep_group, edp_group = groups.expert_group(plan)
    idle_gloo_transport()   # the transport threads of the groups just made (dp x cp, embedding, ep)
    pp_rank = mesh.get_local_rank("pp")
    ids = stage_ids(plan, pp_rank) if par.pp > 1 else [0]
    parts, positions, experts = [], None, []
    for sid in ids:
        module = build_stage_module(plan, sid, seed).to(device)
        if plan.training.precision == Precision.FP8:
            apply_float8(module, plan.training.fp8_recipe, all_gather=plan.training.fp8_param_gather)
        moe.set_aux_scale(module, 1 if par.pp > 1 else plan.num_microbatches)
        if par.cp > 1:
            positions = apply_cp(module, mesh["cp"], plan.model.seq_len)
        if ep_group is not None:
            moe.apply_ep(module, ep_group)
        if par.tp > 1:
            apply_tp(module, mesh["tp"], par.sequence_parallel)
        apply_recompute(module, plan.training)
        apply_activation_offload(module, plan.training, device)
        mine = moe.expert_params(module)
        experts += mine
        parts.append(apply_dp(module, plan, dp_mesh, device, frozenset(mine)))
    params = [p for part in parts for p in part.parameters()]
    optimizer = build_optimizer(params, plan, dp_mesh, lr, edp_group)
    scaler = torch.amp.GradScaler(device.type) if plan.training.precision == Precision.FP16 else None
    trainer = Trainer(plan=plan, mesh=mesh, device=device, parts=parts, optimizer=optimizer, scaler=scaler,
                      embedding_group=embedding_group, cp_positions=positions, experts=experts,
                      edp_group=edp_group)
    if par.pp > 1:
        num_stages = par.pp * par.vpp
        trainer.stages = [pipelining.PipelineStage(part, sid, num_stages, device, group=mesh["pp"].get_group())
                          for sid, part in zip(ids, parts)]
        loss = loss_fn if scaler is None else (lambda out, y: scaler.scale(loss_fn(out, y)))
        trainer.schedule = build_schedule(trainer.stages, plan, loss)
    return trainer
