"""Export a Plan on Ascend NPUs as a MindSpeed-LLM launch: its ``pretrain_gpt.py`` reads Megatron-LM's
arguments at the Megatron-LM it pins (core_v0.12.1, Ascend/MindSpeed-LLM README @c77308a1) and
its own and MindSpeed's on top (``mindspeed_args.yaml``). The Megatron export's options, then:

- ``--attention-backend`` (newer Megatron-LM) replaced by ``--use-flash-attn`` where the plan runs
  flash attention (MindSpeed's fused attention, torch_npu's ``npu_fusion_attention``), nothing where
  it does not (Megatron's unfused softmax);
- ``--use-mcore-models``, the fused RMSNorm, SwiGLU and rotary-embedding kernels where the model
  has them (the Megatron export refuses ``training.kernels: eager``: its layers run fused), and
  ``--no-gradient-accumulation-fusion`` (APEX's fused weight-gradient kernel is CUDA's), as
  MindSpeed-LLM's own launch sets them (examples/mcore/llama2/pretrain_llama2_13b_ptd.sh @c77308a1);
- TP's communication overlapped with its GEMMs (``parallel.tp_comm_overlap``) as MC2, ``--use-ascend-mc2``
  (MindSpeed-LLM docs/en/pytorch/features/mcore/mc2.md @c77308a1: "Set `--use-ascend-mc2` to enable the MC2
  operator", the fused Matmul and All-Gather/Reduce-Scatter under TP and SP), not Megatron's
  ``--tp-comm-overlap`` (Transformer Engine's userbuffers; MindSpeed turns it off, mindspeed/arguments.py
  @028de58c: ``if args.tp_comm_overlap: args.tp_comm_overlap = False``). MC2 leaves a MoE model's MLP out
  (mc2.md: "the MLP part of MoE models does not enable MC2"; the legacy models refuse it, "mc2 is not
  compatible with moe models", mindspeed/arguments.py), so a MoE plan with it is refused; MindSpeed-LLM leaves
  MC2 off until a line of its code is commented out (mc2.md: "MindSpeed LLM disables MC2 by default"): the
  launch says so (``MC2_NOTE``);
- context parallel as MindSpeed's ``--context-parallel-algo`` (``parallel.cp_comm`` p2p: the ring,
  ``megatron_cp_algo``; all_gather: ``kvallgather_cp_algo``; a2a: ``ulysses_cp_algo``; MindSpeed's
  context_parallel_feature.py and ulysses_context_parallel.py @028de58c) in place of ``--cp-comm-type``;
- the launch environment of that script: ``CUDA_DEVICE_MAX_CONNECTIONS=1`` and, where the plan's
  memory assumes expandable segments, torch_npu's ``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True``.

An option the plan needs that none of the three parsers defines is refused with one sentence, and so is a
plan on Ascend 910C packages: a package is two NPU devices (dies), which MindSpeed-LLM's degrees and
``NPUS_PER_NODE`` count (examples/mcore/qwen3/pretrain_qwen3_8b_4K_ptd_A3.sh @c77308a1: ``NPUS_PER_NODE=16``
on an 8-package Atlas 800T A3), and a plan of packages states no split of its degrees over the dies.
"""
from __future__ import annotations

import functools
from pathlib import Path

import yaml

from simcore.plan.model_props import Activation, Norm
from simcore.plan.spec import EXPANDABLE_SEGMENTS_MARGIN, CpComm, Plan

#: The options MindSpeed-LLM's parser accepts (``mindspeed_args.yaml``: Megatron-LM core_v0.12.1's,
#: MindSpeed's and MindSpeed-LLM's, each with the commit it was read at).
ARGS_FILE = Path(__file__).with_name("mindspeed_args.yaml")
#: NPU devices (dies) in one catalog "GPU" where the package holds several (gpus.yaml ``unit:``).
DIES_PER_PACKAGE = {"ascend-910c": 2}
#: ``parallel.cp_comm`` as MindSpeed's ``--context-parallel-algo``.
CP_ALGO = {CpComm.P2P: "megatron_cp_algo", CpComm.ALL_GATHER: "kvallgather_cp_algo", CpComm.A2A: "ulysses_cp_algo"}
#: The Megatron-LM options the export replaces (newer Megatron-LM's, or CUDA's).
_REPLACED = ("--attention-backend", "--cp-comm-type", "--tp-comm-overlap")
#: The launch's words where it turns MC2 on (mc2.md @c77308a1, "MindSpeed LLM disables MC2 by default").
MC2_NOTE = ("# --use-ascend-mc2 (the plan's TP overlap): MindSpeed-LLM runs MC2 only once "
            "`args.use_ascend_mc2 = False` in validate_args_decorator (mindspeed_llm/training/arguments.py) "
            "is commented out, as its mc2.md says.")
SOURCE = ("Ascend/MindSpeed-LLM @c77308a1 (pretrain_gpt.py on Megatron-LM core_v0.12.1; options as "
          "simcore/plan/mindspeed_args.yaml lists them)")


@functools.cache
def args_data() -> dict:
    """``mindspeed_args.yaml``, read once."""
    return yaml.safe_load(ARGS_FILE.read_text())


@functools.cache
def accepted() -> frozenset[str]:
    """Every option MindSpeed-LLM's parser defines (``mindspeed_args.yaml``)."""
    return frozenset(args_data()["megatron"]["options"]) | frozenset(args_data()["mindspeed"]["options"])


def mindspeed_args(plan: Plan, megatron: list[tuple[str, object]]) -> list[tuple[str, object]]:
    """MindSpeed-LLM's ``pretrain_gpt.py`` options from the Megatron export's ``megatron`` (the module
    docstring's rules); ValueError with one sentence for a plan it cannot run."""
    gpu = plan.cluster.node.gpu
    if gpu.vendor != "huawei":
        raise ValueError(f"cluster.node={plan.cluster.node.name} is not an Ascend NPU: MindSpeed-LLM runs on Ascend "
                         "(export --to megatron for GPUs)")
    if gpu.name in DIES_PER_PACKAGE:
        raise ValueError(f"cluster.node={plan.cluster.node.name} holds {gpu.name} packages of "
                         f"{DIES_PER_PACKAGE[gpu.name]} dies each, which MindSpeed-LLM counts as NPUs: a plan of "
                         "packages states no split of its degrees over the dies, so no launch is written")
    m, par, tr = plan.model, plan.parallel, plan.training
    args = [(k, v) for k, v in megatron if k not in _REPLACED]
    args.insert(0, ("--use-mcore-models", None))
    if tr.flash_attention:
        args.append(("--use-flash-attn", None))
    args += [(flag, None) for flag, has in (("--use-fused-rmsnorm", m.norm == Norm.RMSNORM),
                                             ("--use-fused-swiglu", m.activation == Activation.SWIGLU),
                                             ("--use-fused-rotary-pos-emb", m.position_embedding.value == "rope")) if has]
    args.append(("--no-gradient-accumulation-fusion", None))
    if par.cp > 1:
        args.append(("--context-parallel-algo", CP_ALGO[par.cp_comm]))
    if par.tp_comm_overlap:
        if m.experts > 1:
            raise ValueError("parallel.tp_comm_overlap on a MoE model: MindSpeed's MC2 (--use-ascend-mc2) leaves a MoE "
                             "model's MLP out ('the MLP part of MoE models does not enable MC2', MindSpeed-LLM mc2.md "
                             "@c77308a1), where the plan overlaps it")
        args.append(("--use-ascend-mc2", None))
    unknown = [k for k, _ in args if k not in accepted()]
    if unknown:
        raise ValueError(f"the plan needs Megatron-LM's {unknown[0]}, which neither Megatron-LM core_v0.12.1 nor "
                         "MindSpeed nor MindSpeed-LLM defines (MindSpeed-LLM @c77308a1)")
    return args


def mindspeed_env(plan: Plan) -> dict[str, str]:
    """The launch environment of MindSpeed-LLM's scripts (the module docstring)."""
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    if plan.training.allocator_margin == EXPANDABLE_SEGMENTS_MARGIN:
        env["PYTORCH_NPU_ALLOC_CONF"] = "expandable_segments:True"
    return env
