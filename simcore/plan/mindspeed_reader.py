"""A MindSpeed-LLM launch read by ``trainplan import --megatron``: its pretrain_gpt.py takes
Megatron-LM's arguments and MindSpeed's (``mindspeed_writer``), and two of the latter change what
the Megatron reading would say:

- attention: MindSpeed runs its fused (flash) attention only under ``--use-flash-attn``; without
  it, and with no ``--attention-backend``, the core attention is Megatron's unfused softmax, where
  Megatron-LM alone would default to Transformer Engine's flash kernel (``megatron_reader``);
- context parallel: ``--context-parallel-algo`` (megatron_cp_algo: the ring, kvallgather_cp_algo,
  ulysses_cp_algo), not ``--cp-comm-type``; the hybrid and adaptive algorithms have no Plan value;
- TP's overlap: MC2 (``--use-ascend-mc2``, or the older ``--use-mc2`` it replaces:
  mindspeed_llm/features_manager/arguments/deprecated_args.py @c77308a1) is ``parallel.tp_comm_overlap``;
  Megatron's ``--tp-comm-overlap`` is not (MindSpeed turns it off: ``mindspeed_writer``), read as off with a note.

The fused-kernel switches MindSpeed-LLM's own launches set (RMSNorm, SwiGLU, RoPE; no APEX
gradient-accumulation fusion; mcore models) are what the Plan's fused kernels assume: read, not
reported as unmapped. A launch is MindSpeed's where it names an option only MindSpeed or
MindSpeed-LLM defines (``mindspeed_only``).
"""
from __future__ import annotations

import functools

import yaml

from simcore.plan.choices import PlanError
from simcore.plan.mindspeed_writer import ARGS_FILE, CP_ALGO, args_data

#: Options MindSpeed-LLM's launches set that the Plan's fused kernels and mcore model already assume.
IMPLIED = ("--use-mcore-models", "--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb",
           "--no-gradient-accumulation-fusion")


@functools.cache
def mindspeed_only() -> frozenset[str]:
    """The options only MindSpeed or MindSpeed-LLM defines: neither Megatron-LM core_v0.12.1 nor the
    Megatron-LM the Megatron export writes for (``megatron_args.yaml``; newer options such as
    ``--padded-vocab-size`` are both MindSpeed-LLM's and Megatron-LM's)."""
    ours = args_data()["mindspeed"]["options"]
    megatron = yaml.safe_load(ARGS_FILE.with_name("megatron_args.yaml").read_text())["options"]
    return frozenset(ours) - frozenset(megatron)


def read_mindspeed(a, f: dict, hints: dict) -> None:
    """Where ``a`` (``megatron_reader._Args``) is a MindSpeed-LLM launch, its attention and context
    parallel into ``f`` (the module docstring) and a note into ``hints``."""
    if not any(o in mindspeed_only() for o in a.opts):
        return
    for option in IMPLIED:
        a.flag(option)
    if "--attention-backend" not in a.opts:
        f["training.flash_attention"] = a.flag("--use-flash-attn")
    algo = a.value("--context-parallel-algo", str)
    if algo is not None:
        by_algo = {v: k.value for k, v in CP_ALGO.items()}
        if algo not in by_algo:
            raise PlanError(f"megatron --context-parallel-algo={algo!r} (MindSpeed) is not one of "
                            f"{', '.join(by_algo)} (parallel.cp_comm)")
        f["parallel.cp_comm"] = by_algo[algo]
    megatron_overlap = "--tp-comm-overlap" in a.opts
    mc2 = a.flag("--use-ascend-mc2") | a.flag("--use-mc2")
    if mc2 or megatron_overlap:
        f["parallel.tp_comm_overlap"] = mc2
    hints["note.mindspeed"] = ("read as a MindSpeed-LLM launch: flash attention only under --use-flash-attn, context "
                               "parallel by --context-parallel-algo, TP's overlap by MC2 (--use-ascend-mc2)"
                               + ("; --tp-comm-overlap read as off: MindSpeed turns Megatron's off"
                                  if megatron_overlap and not mc2 else ""))
