"""Ranking for the stack a team runs: a layout its launcher cannot express is no recommendation.

Each stack's test is its exporter (``simcore.plan.writers``, ``simcore.plan.torchtitan_writer``):
the sentence with which it refuses a layout (Megatron-LM refuses ZeRO-3 with FSDP2 gathers per
block, torchtitan ZeRO-1 and activation offload, DeepSpeed's ds_config tensor parallelism, ...)
is the reason the layout leaves the ranking. ``trainplan`` adds its own executor as a stack.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from typing import Callable

import pandas as pd

from dataclasses import replace

from simcore.plan.choices import NoLayoutFits
from simcore.plan.mindspeed_writer import DIES_PER_PACKAGE
from simcore.plan.nxd_writer import CORES_PER_CHIP, llama_model
from simcore.plan.rules import kv_copies
from simcore.plan.spec import (EXPANDABLE_SEGMENTS_MARGIN, AttentionKernel, CpComm, Fp8Recipe, Plan, PlanError, Precision,
                               Recompute, ZeroImpl)

#: The stacks whose exporters judge a layout (``trainplan export --to``'s launch targets).
STACKS = ("megatron", "deepspeed", "torchtitan", "torchtitan-0.2", "maxtext", "mindspeed", "nxd")
#: The stacks that run bf16 DDP and one-device layouts under torch.autocast over fp32 parameters
#: (``torchtitan_writer.torchtitan_autocasts``; a search sets ``SearchSpace.ddp_autocast``).
DDP_AUTOCAST_STACKS = ("torchtitan", "torchtitan-0.2")
#: What a search for Megatron-LM turns on where a layout can take it, as NVIDIA's recipes do:
#: Megatron-Bridge's Llama recipes overlap TP communication with the GEMMs (``CommOverlapConfig(
#: tp_comm_overlap=True)``, src/megatron/bridge/recipes/llama/llama3.py @0d5f5558) and every recipe
#: runs the distributed optimizer with ``overlap_param_gather=True`` (``DistributedDataParallelConfig``);
#: the export writes them as ``--tp-comm-overlap`` and ``--overlap-param-gather``.
MEGATRON_RECIPE_SWITCHES = {"tp_comm_overlap": True, "overlap_param_gather": True}
#: MindSpeed-LLM's TP overlap, MC2 (``mindspeed_writer``: ``--use-ascend-mc2``), which a search for it turns on
#: where a layout can take it (TP with sequence parallelism, a dense model): "When TP and SP are enabled, we
#: recommend enabling MC2" (docs/en/pytorch/features/mcore/mc2.md @c77308a1), and MindSpeed-LLM's published
#: throughput table is "measured with mc2 enabled" (README.md @a27b45f00).
MINDSPEED_SWITCHES = {"tp_comm_overlap": True}
#: The stacks whose launchers run PyTorch's allocator with expandable segments: torchtitan's
#: run_train.sh exports PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", and Megatron-Bridge's
#: performance launcher does for every job (``PERF_ENV_VARS`` in scripts/performance/utils/executors.py
#: @21d102f5e); a search for them charges its margin (``spec.EXPANDABLE_SEGMENTS_MARGIN``) unless the
#: Plan sets one, and their exports write the setting.
EXPANDABLE_SEGMENTS_STACKS = ("megatron", "torchtitan", "torchtitan-0.2")
#: The FP8 scaling a stack runs where the Plan leaves Transformer Engine's delayed default: torchtitan's
#: float8 is torchao's, tensorwise unless ``float8.recipe_name`` says rowwise (an FP8 search for it
#: prices that, not the delayed scaling its exporter refuses; ``SearchSpace.fp8_recipe``).
STACK_FP8_RECIPE = {"torchtitan": "tensorwise", "torchtitan-0.2": "tensorwise"}
#: The layer splits over pipeline stages each stack's launcher writes (``space.SPLITS``): torchtitan's
#: own rule (its exporter expresses it and the even split where the stages divide the layers).
STACK_SPLITS = {"torchtitan": ("even", "titan"), "torchtitan-0.2": ("even", "titan")}
#: The stacks that recompute every layer or none (no Megatron block method: torchtitan checkpoints
#: every layer or every Nth, DeepSpeed's and Hugging Face's checkpointing wraps every layer; MaxText's
#: remat_policy applies to every layer of its scanned stack).
WHOLE_RECOMPUTE_STACKS = ("torchtitan", "torchtitan-0.2", "deepspeed", "maxtext", "nxd")
#: The stacks whose attention is torch SDPA or the flash-attn package, FlashAttention-2 where the
#: catalog has its figures (``readers.sdpa_attention_kernel``): torchtitan, Hugging Face under
#: DeepSpeed or Megatron-DeepSpeed, trainplan's executor. Megatron-LM's is TE's (the catalog's own).
FA2_STACKS = ("torchtitan", "torchtitan-0.2", "deepspeed", "executor")
#: The recompute policies a stack's launch writes where they are not Megatron's none / selective /
#: full, lightest first as ``space.RECOMPUTE_ORDER``: MaxText's remat policies minimal_with_context,
#: minimal (JAX's dots saved) and full (``maxtext_writer.REMAT``); NeuronX Distributed's examples
#: checkpoint the selected modules or every layer, never nothing (``nxd_writer``): a search that tried
#: none first would keep it where it fits and lose the selective twin the launch runs.
STACK_RECOMPUTE = {"maxtext": (Recompute.NONE, Recompute.DOTS, Recompute.FULL),
                   "nxd": (Recompute.SELECTIVE, Recompute.FULL)}
#: The stacks that copy key/value heads over a TP group wider than them (NeuronX Distributed's
#: ``--kv_replicator``, ``parallel.kv_replicator``), with their TP ranks a chip (NxD's TP counts
#: NeuronCores, two a Trainium chip: ``nxd_writer.CORES_PER_CHIP``): their searches copy the heads
#: until each rank holds whole ones, and take TP degrees past the heads.
KV_REPLICATING_STACKS = {"nxd": CORES_PER_CHIP}
#: How the sentences name a stack.
LABELS = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed", "torchtitan": "torchtitan 0.3",
          "torchtitan-0.2": "torchtitan 0.2", "executor": "trainplan's executor", "maxtext": "MaxText",
          "mindspeed": "MindSpeed-LLM", "nxd": "NeuronX Distributed"}
#: The stack a chip's own software runs where a search names none (by the catalog's vendor): a TPU
#: runs JAX, and MaxText is the JAX trainer trainplan exports; an Ascend NPU runs torch_npu, and
#: MindSpeed-LLM is the trainer trainplan exports for it; none of the other stacks trainplan exports
#: launches there (their launches are CUDA or ROCm ones: torchrun with NCCL/RCCL).
HARDWARE_STACKS = {"google": "maxtext", "huawei": "mindspeed"}
#: A search's stack for every layout, whatever stack runs it, where the chip has its own (``hardware_stack``).
ANY = "any"
#: The stacks whose launches run on GPUs only.
GPU_ONLY_STACKS = ("megatron", "deepspeed", "torchtitan", "torchtitan-0.2", "executor")


def hardware_stack(base: Plan, stack: str | None) -> tuple[str | None, str]:
    """(the stack a search ranks for, the sentence that says so where the chip chose it): the one
    named (``ANY``: every layout), else the chip's own (``HARDWARE_STACKS``; on Trainium NeuronX
    Distributed, for the Llama models its examples build); a GPU-only stack on a TPU is one sentence."""
    if stack == ANY:
        return None, ""
    gpu = base.cluster.node.gpu
    own = HARDWARE_STACKS.get(gpu.vendor)
    if own and stack in GPU_ONLY_STACKS:
        raise PlanError(f"stack={stack}: {LABELS[stack]} launches on GPUs, not on {gpu.name} "
                        f"(stack={own} ranks the layouts {LABELS[own]} runs there)")
    if stack == "mindspeed" and gpu.vendor != "huawei":   # its launch is torch_npu's
        raise PlanError(f"stack=mindspeed: MindSpeed-LLM launches on Ascend NPUs, not on {gpu.name}")
    if own == "mindspeed" and stack is None and gpu.name in DIES_PER_PACKAGE:   # no launch of packages written
        return None, (f"Ranked over every layout: trainplan writes no MindSpeed-LLM launch for {gpu.name} packages "
                      f"({DIES_PER_PACKAGE[gpu.name]} NPU dies each, which MindSpeed-LLM counts), so some ranked "
                      "layouts may be ones it does not run (ZeRO-3: Megatron-FSDP).")
    if own and stack is None:
        chip = "a TPU" if gpu.vendor == "google" else "an Ascend NPU"
        return own, (f"Ranked for {LABELS[own]}, the stack trainplan exports for {gpu.name} (no other stack it "
                     f"exports launches on {chip}): only layouts its launch writes are ranked; stack=any ranks "
                     "every layout.")
    if gpu.vendor == "aws" and stack is None:   # Trainium: NxD where its examples build the model (Llama)
        if llama_model(base.model):
            return "nxd", (f"Ranked for NeuronX Distributed, the stack trainplan exports for {gpu.name} (its Llama "
                           "examples: ZeRO-1, selective or full recompute, key/value heads copied onto every "
                           "NeuronCore): only layouts its launch writes are ranked; stack=any ranks every layout.")
        return None, (f"Ranked over every layout, some of which no Neuron stack may run on {gpu.name} (ZeRO-2/3: "
                      "NeuronX Distributed shards optimizer states only, and its examples build Llama models only).")
    return stack, ""


def stack_base(base: Plan, stack: str | None) -> Plan:
    """``base`` as ``stack`` runs what the Plan leaves open, so a ranking for it prices that:
    the attention kernel torch SDPA or the flash-attn package runs on the GPU (``FA2_STACKS``,
    ``readers.sdpa_attention_kernel``); Megatron's recipes' overlaps (``MEGATRON_RECIPE_SWITCHES``),
    MindSpeed-LLM's MC2 on a dense model (``MINDSPEED_SWITCHES``);
    DeepSpeed's own ZeRO and Ulysses' all-to-all for a sequence split (what ``deepspeed_writer``
    requires); torch's context parallel gathering K/V for torchtitan (``torchtitan_writer._cp_rotate``)."""
    from simcore.plan.readers import sdpa_attention_kernel

    par, tr = base.parallel, base.training
    if stack in FA2_STACKS and tr.attention_kernel == AttentionKernel.AUTO and tr.flash_attention:
        kernel = sdpa_attention_kernel(base.cluster.node.gpu)
        if kernel != "auto":
            base = replace(base, training=replace(tr, attention_kernel=AttentionKernel(kernel)))
    if stack in STACK_FP8_RECIPE and tr.precision == Precision.FP8 and tr.fp8_recipe == Fp8Recipe.DELAYED:
        base = replace(base, training=replace(base.training, fp8_recipe=Fp8Recipe(STACK_FP8_RECIPE[stack])))
    if stack in EXPANDABLE_SEGMENTS_STACKS and tr.allocator_margin is None:
        base = replace(base, training=replace(base.training, allocator_margin=EXPANDABLE_SEGMENTS_MARGIN))
    if stack == "megatron":   # the recipes' switches, which each layout takes where it can (space.SWITCHES)
        base = replace(base, parallel=replace(par, **MEGATRON_RECIPE_SWITCHES))
    elif stack == "mindspeed" and base.model.experts <= 1:   # MC2 leaves a MoE MLP out (mindspeed_writer)
        base = replace(base, parallel=replace(par, **MINDSPEED_SWITCHES))
    elif stack == "deepspeed":
        base = replace(base, parallel=replace(par, zero_impl=ZeroImpl.DEEPSPEED, cp_comm=CpComm.A2A))
    elif stack in ("torchtitan", "maxtext"):   # MaxText's context_parallel_strategy default: all_gather
        base = replace(base, parallel=replace(par, cp_comm=CpComm.ALL_GATHER))
    return base


def stack_space(space, stack: str | None, base: Plan | None = None):
    """The search space (``space.SearchSpace``) as ``stack`` runs it: torchtitan's DDP under
    autocast, its float8 recipe and layer split; no block recompute where the stack has none;
    NeuronX Distributed's copies of the key/value heads where tp outgrows them (given ``base``)."""
    if stack in DDP_AUTOCAST_STACKS:
        space = replace(space, ddp_autocast=True)
    if stack in WHOLE_RECOMPUTE_STACKS:
        space = replace(space, block_recompute=False)
    if stack in STACK_FP8_RECIPE:
        space = replace(space, fp8_recipe=STACK_FP8_RECIPE[stack])
    if stack in STACK_SPLITS:
        space = replace(space, splits=STACK_SPLITS[stack])
    if stack in STACK_RECOMPUTE:
        space = replace(space, recompute=STACK_RECOMPUTE[stack])
    if stack in KV_REPLICATING_STACKS and base is not None:
        space = kv_replicated_tp(base, space, KV_REPLICATING_STACKS[stack])
    return space


def kv_replicated_tp(base: Plan, space, ranks: int):
    """``space`` with the key/value heads copied until each TP rank holds whole ones
    (``SearchSpace.kv_replicate``: ``ranks`` TP ranks a chip): tp also each divisor of the query heads
    and the FFN width up to two NVLink domains (a Trainium instance's NeuronLink torus), where the
    query heads a rank's copies serve divide evenly (``rules._kv_head_rules``)."""
    from simcore.planner.space import _divisors as divisors

    m = base.model
    if m.mla or not m.kv_heads:
        return space
    limit = min(2 * base.cluster.nvlink_domain, base.cluster.gpus)   # as space.derive_space bounds tp
    wider = [d for d in divisors(math.gcd(m.heads, m.ffn_hidden)) if d <= limit
             and m.heads % (m.kv_heads * kv_copies(ranks * d, m.kv_heads)) == 0]
    return replace(space, kv_replicate=ranks, tp=tuple(sorted(set(space.tp) | set(wider))))


def checked_stack(value, where: str) -> str | None:
    """A sweep's or candidates file's ``stack`` (None: any layout), or one sentence naming ``where``."""
    if value is None or value in (*STACKS, ANY):
        return value
    raise PlanError(f"{where}={value!r} is not one of: {', '.join((*STACKS, ANY))}")


def refusal_of(run: Callable[[Plan], object]) -> Callable[[Plan], str | None]:
    """A check that raises ValueError with its sentence (an exporter, the executor's
    ``check_executable``) as one that returns the sentence, or None where ``run`` passes."""
    def check(plan: Plan) -> str | None:
        try:
            run(plan)
        except ValueError as exc:
            return str(exc)
        return None
    return check


def exporter_check(stack: str) -> Callable[[Plan], str | None]:
    """Why ``stack``'s exporter refuses a plan (its sentence), or None where it writes one."""
    from simcore.plan.writers import export_plan

    checked_stack(stack, "stack")
    return refusal_of(lambda plan: export_plan(plan, stack))


def keep_runnable(df: pd.DataFrame, plan_of: Callable[[pd.Series], Plan], refuses: Callable[[Plan], str | None],
                  stack: str, what: str) -> tuple[pd.DataFrame, str]:
    """The ranked rows whose plan (``plan_of(row)``) ``stack`` runs, and a sentence on those it
    does not; one PlanError sentence naming ``what`` when it runs none."""
    reasons = [refuses(plan_of(row)) for _, row in df.iterrows()]
    keep = [r is None for r in reasons]
    refused = Counter(_kind(r) for r in reasons if r is not None)
    name = LABELS.get(stack, stack)
    if not any(keep):
        raise NoLayoutFits(f"{name} runs no layout of {what} that fits (most often: {refused.most_common(1)[0][0]})")
    if not refused:
        return df, ""
    common = "; ".join(f"{reason} ({n})" for reason, n in refused.most_common(3))
    return (df[keep].reset_index(drop=True),
            f"{sum(refused.values())} layouts that fit were left out because {name} cannot run them: {common}")


def _kind(reason: str) -> str:
    """A refusal without the value it names (``parallel.zero=1`` as ``parallel.zero``), to count
    refusals by kind."""
    return re.sub(r"(\b[a-z_]+\.[a-z_]+)=[^\s:;,)]+", r"\1", reason)
