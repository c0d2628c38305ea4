"""A second opinion on memory from torch itself, at full scale, on a CPU machine.

The executor's model of a Plan (``executors.model.Transformer``) is built under
``FakeTensorMode`` (no bytes are allocated) in one process that stands for rank 0 of a
fake process group of the Plan's data-parallel size, sharded with FSDP2 as the executor
shards it, and two training steps are run under torch's ``FSDPMemTracker``
(``torch.distributed._tools.fsdp2_mem_tracker``), which counts every tensor storage by kind
(sharded and unsharded parameters, gradients, activations, temporaries, optimizer states,
all-gather and reduce-scatter buffers) and keeps the peak. The tracker follows one forward
per iteration, so the step traced (and compared with the analytic model) has one micro-batch. This is what torchtitan's
``scripts/estimate/estimation.py`` does (FakeStore, ``init_process_group("fake")``,
``FSDPMemTracker(mod=model, optm=optimizer)``, ``reset_mod_stats`` after the first step).

What it traces: FSDP2 layouts (``parallel.zero`` 2 or 3 over dp > 1), tensor parallel
(``parallel.tp``, with or without sequence parallelism: the executor's DTensor plan,
``executors.parallel.apply_tp``) and their combination on a (dp, tp) mesh; TP alone runs
under torch's generic ``MemTracker``. In bf16/fp16 with fp32 reduction (``MixedPrecisionPolicy``
as torchtitan sets it) or fp32, with the Plan's
recompute policy applied as the executor applies it (``executors.recompute``: ``layer:N`` and
``{layers: N, method: block}`` with ``checkpoint_wrapper`` on the chosen blocks, ``op`` with
torchtitan's per-op policy, the matmuls and SDPA saved except every second mm). The loss is the executor's eager
``F.cross_entropy(logits.float())``, under TP on vocabulary-sharded logits (torch's
``loss_parallel``, as the executor runs it). The
tracker counts tensors only: no allocator margin, no CUDA context. The mesh and the
parallel wrappers are built on the meta device outside ``FakeTensorMode`` (a DTensor mesh
computes its coordinates with real tensors), then materialised as fake tensors; DTensor's
sharding propagation gets a fake mode of its own (``_propagation_untracked``), so its
global-shape copies are not counted as memory.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
import torch.distributed as dist

from simcore.plan.spec import Kernels, Loss, Plan, Precision, Recompute, RecomputeMethod, ZeroStage

#: Training steps traced; the peak is the last one's (the first creates the optimizer
#: states; DTensor's first AdamW step also holds temporaries a steady step does not).
TRACED_STEPS = 2
#: Layers traced at most. Tracing costs per layer, not per byte (fake tensors allocate nothing):
#: on this 2-core host 0.4 s a layer for Llama 3 8B under FSDP2, 1.0 s for Llama 3 70B at tp 8
#: with SP, 0.75 s for Mixtral 8x7B's 8 experts, after 2-3 s of set-up; 8 layers answer within
#: about ten seconds. A deeper model is traced on its first ``TRACED_LAYERS`` (its dense ones
#: among them) and the analytic model compared on the same truncated model (``truncated``).
TRACED_LAYERS = 8
#: Expert modules traced at most (MoE layers x experts): Mixtral's 8 layers of 8 experts.
TRACED_EXPERT_LAYERS = 64


class TraceError(ValueError):
    """The Plan's layout is not one this tracer can run; one sentence naming the field."""


def check_traceable(plan: Plan) -> None:
    par, tr = plan.parallel, plan.training
    others = {k: getattr(par, k) for k in ("pp", "cp", "ep") if getattr(par, k) > 1}
    if others:
        names = ", ".join(f"parallel.{k}={v}" for k, v in others.items())
        raise TraceError(f"--torch traces FSDP2 and tensor parallel layouts only; this plan has {names}")
    if par.dp > 1 and par.zero < ZeroStage.GRADIENTS:
        raise TraceError(f"--torch traces data parallelism as FSDP2 (parallel.zero 2 or 3), "
                         f"not parallel.zero={int(par.zero)} with parallel.dp={par.dp}")
    if par.dp * par.tp < 2:
        raise TraceError("--torch traces a layout over more than one GPU (parallel.dp or parallel.tp > 1)")
    if tr.recompute == Recompute.FULL and tr.recompute_method == RecomputeMethod.UNIFORM and tr.recompute_layers > 1:
        raise TraceError("--torch cannot trace training.recompute {layers: N, method: uniform} with N > 1 "
                         "(the executor checkpoints single layers)")
    if tr.master_weights is False or tr.offload.value != "none":
        raise TraceError("--torch traces fp32 master weights without offload (training.master_weights, "
                         "training.offload)")


def apply_recompute(model, plan: Plan) -> None:
    """The Plan's recompute policy on the executor's blocks (``executors.recompute``)."""
    from executors.recompute import apply_recompute as apply

    apply(model, plan.training)


def _fsdp(plan: Plan) -> bool:
    """Whether FSDP2 wraps the traced model (data parallel), which also picks the tracker
    (``FSDPMemTracker``, else torch's generic ``MemTracker``) and the precision (FSDP2's
    ``MixedPrecisionPolicy``, else the executor's autocast over fp32 parameters)."""
    return plan.parallel.dp > 1


def _parallelize(plan: Plan, mesh, mp):
    """The executor's model of ``plan`` on the meta device, with TP, recompute and FSDP2
    applied in the executor's order (``executors.parallel.build_trainer``)."""
    from executors.fsdp_wrap import shard_groups
    from executors.model import Transformer
    from executors.parallel import apply_tp

    par = plan.parallel
    with torch.device("meta"):
        model = Transformer(plan.model)
    if par.tp > 1:
        apply_tp(model, mesh["tp"], par.sequence_parallel)
    apply_recompute(model, plan)
    if _fsdp(plan):
        shard_groups(model, par.fsdp_root, par.zero == ZeroStage.WEIGHTS, mesh=mesh["dp"], mp_policy=mp)
    return model


@contextlib.contextmanager
def _propagation_untracked():
    """DTensor's sharding propagation runs every op once more on fake tensors of the global
    shape to learn the output's metadata (``ShardingPropagator._propagate_tensor_meta_non_cached``,
    under ``detect_fake_mode() or FakeTensorMode()``). The trackers skip those ops by their fake
    mode not being the one active when tracking began (pytorch/pytorch#183970); under our
    outer ``FakeTensorMode`` ``detect_fake_mode`` finds that very mode, so the global-shape
    copies were counted as memory (at tp 4 the loss alone read 38 B per local logit where the
    ops hold 16). A mode of their own for the propagation, as in eager, puts them back outside."""
    from unittest import mock

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.tensor import _sharding_prop

    own = FakeTensorMode()
    with mock.patch.object(_sharding_prop, "detect_fake_mode", lambda *args, **kwargs: own):
        yield


def trace_peak(plan: Plan) -> dict:
    """Peak bytes per kind (and ``Total``) on one rank of ``plan``, as torch's tracker counts them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from executors.model import loss_context, loss_fn

    check_traceable(plan)
    if dist.is_initialized():
        raise TraceError("--torch needs a process without a process group of its own")
    par, tr, m = plan.parallel, plan.training, plan.model
    dist.init_process_group("fake", rank=0, world_size=par.dp * par.tp, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (par.dp, par.tp), mesh_dim_names=("dp", "tp"))
        low = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}.get(tr.precision)
        mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None)
        model = _parallelize(plan, mesh, mp)
        # TP alone keeps fp32 parameters and runs its forward under autocast, as the executor does
        # (``executors.parallel.Trainer.autocast``); FSDP2 casts by its MixedPrecisionPolicy
        fsdp = _fsdp(plan)
        cast = torch.autocast("cpu", dtype=low) if not fsdp and low is not None else contextlib.nullcontext()
        with FakeTensorMode(allow_non_fake_inputs=True), _propagation_untracked():
            model.to_empty(device="cpu")
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
            tracker = FSDPMemTracker(mod=model, optm=opt) if fsdp else MemTracker()
            if not fsdp:
                tracker.track_external(model, opt)
            tokens = torch.randint(0, m.vocab, (tr.micro_batch, m.seq_len))
            if fsdp:
                tracker.track_inputs((tokens, tokens))
            for _ in range(TRACED_STEPS):
                with tracker:   # entering resets the peak: the last step is the steady state
                    with cast:
                        out = model(tokens)
                    with loss_context(out):
                        loss = loss_fn(out, tokens)
                        del out
                        loss.backward()
                    opt.step()
                    opt.zero_grad()
                tracker.reset_mod_stats()
            snap = tracker.get_tracker_snapshot("peak")
    finally:
        dist.destroy_process_group()
    (per_kind,) = snap.values()   # one device: fake tensors all live on the CPU
    return {str(getattr(k, "value", k)): float(v) for k, v in per_kind.items() if v or k == "Total"}


def truncated(plan: Plan) -> Plan:
    """The Plan's model cut to the layers ``--torch`` traces within seconds (``TRACED_LAYERS``,
    ``TRACED_EXPERT_LAYERS``): its dense layers first, then as many MoE layers as fit."""
    m = plan.model
    if m.moe and m.experts > TRACED_EXPERT_LAYERS:
        raise TraceError(f"--torch traces at most {TRACED_EXPERT_LAYERS} experts' modules within seconds, and one "
                         f"MoE layer of this model holds model.experts={m.experts}")
    if m.moe:   # to the last MoE layer the expert budget holds, past the first MoE layer
        moe = [i for i in range(m.layers) if not m.is_dense_layer(i)]
        last = moe[min(len(moe), max(1, TRACED_EXPERT_LAYERS // m.experts)) - 1]
        keep = min(m.layers, max(TRACED_LAYERS, moe[0] + 1), last + 1)
    else:
        keep = min(m.layers, TRACED_LAYERS)
    cut = replace(m, layers=keep, moe_layers=tuple(i for i in m.moe_layers if i < keep))
    return plan if keep == m.layers else replace(plan, model=cut)


def one_microbatch(plan: Plan) -> Plan:
    """The Plan with one micro-batch per step: FSDPMemTracker follows one forward per
    iteration (it refuses gradient accumulation), so that is the step traced and compared."""
    tr = plan.training
    return replace(plan, training=replace(tr, global_batch=plan.parallel.dp * tr.micro_batch))


def compare(plan: Plan, whole: bool = False) -> dict:
    """The analytic model's tensors on the fullest rank against the tracker's peak, both for
    ``one_microbatch(truncated(plan))`` with the executor's eager loss and eager kernels (its per-op SAC
    stores every MUST_SAVE output, w2's too) and, where FSDP2 does not cast, its autocast over
    fp32 parameters (``training.autocast``). ``whole``: every layer, however long it takes."""
    from simcore.model.step_costs import memory_report

    one = one_microbatch(plan if whole else truncated(plan))
    traced = trace_peak(one)
    # the loss the executor runs and, without FSDP2, its autocast over fp32 parameters
    amp = not _fsdp(plan) and plan.training.precision in (Precision.BF16, Precision.FP16)
    eager = replace(one, training=replace(one.training, loss=Loss.EAGER, kernels=Kernels.EAGER,
                                          autocast=amp or one.training.autocast))
    rank = max(memory_report(eager)["ranks"], key=lambda r: r["total"])
    analytic = rank["total"] - rank["terms"]["allocator_margin"] - rank["terms"]["cuda_context"]
    return {"analytic_tensor_bytes": analytic, "torch_peak_bytes": traced["Total"], "torch_by_kind": traced,
            "tracker": "FSDPMemTracker" if _fsdp(plan) else "MemTracker",
            "difference": (analytic - traced["Total"]) / traced["Total"],
            "microbatches_traced": 1, "layers_traced": one.model.layers, "layers": plan.model.layers,
            "traced_loss_differs": plan.training.loss != Loss.EAGER,
            "traced_autocast_differs": amp and not plan.training.autocast}
