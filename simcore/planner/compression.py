"""Communication compression as a search axis: each method the stacks ship, the Plan fields it
sets, where a layout can take it, and what its sources say it costs in accuracy.

A search tries a method only when asked (``search(..., compressions=...)``, ``trainplan plan
--compression``, a what-if's ``compression`` axis): every method but ``none`` changes the numbers
the model trains on, and the model prices its time and memory (``simcore.model.zeropp``,
``ddp_hooks``, ``onebit``, ``collectives.grad_wire_bytes``), not its convergence. Each layout takes
a method only where ``simcore.plan.rules`` accepts it (``applies``), so the search does not count
what no stack could run as a broken rule; a stack's exporter then keeps the rows it writes
(``stacks.keep_runnable``: DeepSpeed writes ZeRO++, 1-bit Adam, 1-bit LAMB and 0/1 Adam, Megatron-LM
``--grad-reduce-in-bf16`` and ``--fp8-param-gather``, torchtitan the bf16 gradient reduction,
trainplan's executor PowerSGD and its int8 hook, with or without error feedback).
"""
from __future__ import annotations

import pandas as pd

from simcore.plan.rules import fp8_gather_runs, fsdp2_one_group
from simcore.plan.spec import Fp8Recipe, GradCompression, Optimizer, Plan, Precision, ZeroImpl, ZeroStage

#: The methods, in the order a table lists them.
METHODS = ("none", "bf16", "fp16", "powersgd", "int8", "int8_ef", "int4", "onebit_adam", "onebit_lamb", "zero_one_adam", "zeropp",
           "fp8_param_gather")
#: The methods that are DeepSpeed optimizers (``ONEBIT_OPTIMIZERS``): the plan's optimizer becomes the method.
OPTIMIZERS = ("onebit_adam", "onebit_lamb", "zero_one_adam")
#: What each method's source says of its convergence (the price the model does not price).
ACCURACY = {
    "bf16": "16-bit gradient sums round away low bits (Megatron-LM --grad-reduce-in-bf16, DeepSpeed "
            "communication_data_type)",
    "fp16": "16-bit gradient sums round away low bits and may overflow without loss scaling",
    "powersgd": "rank-r gradient approximation with error feedback; Vogels et al. (NeurIPS 2019) report "
                "test accuracy on par with SGD on their image and language-model tasks",
    "int8": "int8 gradient sums with an fp32 scale a group of 8,000 elements and no error feedback "
            "(executors/int8_hook.py); on the tiny model over 4 ranks its loss after 300 steps was 1.95% above "
            "none's as DDP's hook (two roundings), 0.75% as FSDP2's reduce-scatter (one) (bench/compression_loss.py, "
            "bench/RESULTS.md)",
    "int8_ef": "the int8 hook with error feedback, each quantization's residual added to the next step's (Seide "
               "et al. 2014; Karimireddy et al. 2019, arXiv 1901.09847: error feedback recovers the uncompressed "
               "convergence); on the tiny model over 4 ranks its loss after 300 steps was 2.04% above none's, "
               "int8's without it 1.95% (bench/compression_loss.py): there it does not close int8's gap",
    "int4": "int4 gradient sums (two values a byte, an fp32 scale a group of 8,000, no error feedback: qgZ's "
            "width, executors/int8_hook.py); on the tiny model over 4 ranks its loss after 300 steps was 8.7% above "
            "none's as DDP's hook (two roundings), 3.6% as FSDP2's reduce-scatter (one) (bench/compression_loss.py)",
    "onebit_adam": "1-bit momentum with error feedback after an uncompressed warm-up; Tang et al. (ICML "
                   "2021) report the same convergence as Adam on BERT pre-training",
    "onebit_lamb": "LAMB in place of Adam (layer-wise learning rates), its momentum 1-bit with error feedback after "
                   "an uncompressed LAMB warm-up; Li et al. (arXiv 2104.06069) report the same sample-wise "
                   "convergence speed as uncompressed LAMB on BERT pre-training, and DeepSpeed's tutorial advises a "
                   "warm-up of 15-25% of the steps (docs/_tutorials/onebit-lamb.md)",
    "zero_one_adam": "a frozen variance, local steps and a 1-bit all-reduce every 16 steps at most; Lu et al. "
                     "(arXiv 2202.06009) report the same statistical convergence speed and end-task accuracy "
                     "(GLUE, ImageNet) as their 1-bit Adam baseline",
    "zeropp": "int8 weights and int4 gradients on the wire; Wang et al. (2023, arXiv 2306.10209) report "
              "loss curves matching ZeRO-3 on their GPT runs",
    "fp8_param_gather": "the FP8 weights the GEMMs use, gathered before the cast rather than after it",
}
for _method in ("onebit_adam", "onebit_lamb", "zero_one_adam"):   # beside the price: the stack that has them
    ACCURACY[_method] += "; DeepSpeed 0.19.6 or earlier runs it (PyPI's 0.19.8 has no runtime/fp16/onebit)"


def check_methods(values, where: str) -> tuple[str, ...]:
    """The methods named by ``values`` (a list or a comma-separated string), each once, ``none``
    first; one sentence naming ``where`` for an unknown one."""
    names = values.split(",") if isinstance(values, str) else list(values)
    out = []
    for name in (str(n).strip() for n in names):
        if name not in METHODS:
            raise ValueError(f"{where}={name!r} is not one of: {', '.join(METHODS)}")
        if name not in out:
            out.append(name)
    return tuple(sorted(out, key=METHODS.index))


def applies(method: str, base: Plan, lay) -> bool:
    """Whether layout ``lay`` (``space.Layout``: its degrees, ZeRO stage, and the precision and FP8
    recipe where they are not ``base``'s) can take ``method``: the rules of ``simcore.plan.rules``
    for it."""
    if method == "none":
        return True
    if lay.dp * lay.cp == 1:
        return False   # nothing to compress without data parallel
    if method in ("bf16", "fp16"):
        return True
    if method in ("int8", "int4"):   # the DDP hook, or FSDP2's reduce-scatter (rules.int8_scatters)
        return lay.zero == ZeroStage.NONE or fsdp2_one_group(lay.zero, base.parallel.zero_impl, lay.ep)
    if method in ("powersgd", "int8_ef"):
        return lay.zero == ZeroStage.NONE
    if method in OPTIMIZERS:
        return lay.zero == ZeroStage.NONE and lay.ep == 1 and base.training.grad_compression.value == "none"
    if method == "zeropp":
        gpus, node = lay.tp * lay.pp * lay.cp * lay.dp, base.cluster.gpus_per_node
        return (lay.zero == ZeroStage.WEIGHTS and base.parallel.zero_impl == ZeroImpl.DEEPSPEED
                and lay.tp == lay.pp == lay.cp == 1 and gpus % node == 0 and gpus > node)
    tr = base.training
    return fp8_gather_runs(Precision(lay.precision) if lay.precision else tr.precision, base.parallel.zero_impl,
                           lay.zero, Fp8Recipe(lay.fp8_recipe) if lay.fp8_recipe else tr.fp8_recipe)


def fields(method: str, gpus_per_node: int) -> tuple[dict, dict]:
    """(parallel, training) fields of a Plan that runs ``method``: ZeRO++ with all three switches
    and hpZ's secondary partition over one node, as DeepSpeed's ZeRO++ tutorial sets them
    (docs/_tutorials/zeropp.md @edaa7221: ``zero_hpz_partition_size`` the GPUs of a node)."""
    if method == "zeropp":
        return ({"zero_quantized_weights": True, "zero_hpz_partition_size": gpus_per_node,
                 "zero_quantized_gradients": True}, {})
    if method in ("bf16", "fp16", "powersgd", "int8", "int8_ef", "int4"):
        return {}, {"grad_compression": GradCompression(method)}
    if method in OPTIMIZERS:
        return {}, {"optimizer": Optimizer(method)}
    if method == "fp8_param_gather":
        return {}, {"fp8_param_gather": True}
    return {}, {}


#: Where a layout can take each method (``applies``), as its sentence says it.
NEEDS = {
    "bf16": "data parallel", "fp16": "data parallel",
    "powersgd": "DDP (parallel.zero=0): it is a DDP communication hook",
    "int8": "DDP (parallel.zero=0) or FSDP2's zero 2-3 without experts' groups or replicas: it is trainplan's "
            "executor's communication hook or reduce-scatter (--stack executor)",
    "int8_ef": "DDP (parallel.zero=0): it is trainplan's executor's DDP communication hook (--stack executor)",
    "int4": "DDP (parallel.zero=0) or FSDP2's zero 2-3 without experts' groups or replicas: it is trainplan's "
            "executor's communication hook or reduce-scatter (--stack executor)",
    "onebit_adam": "DDP (parallel.zero=0) without experts: DeepSpeed's 1-bit Adam is not compatible with ZeRO",
    "onebit_lamb": "DDP (parallel.zero=0) without experts: DeepSpeed's 1-bit LAMB is not compatible with ZeRO",
    "zero_one_adam": "DDP (parallel.zero=0) without experts: DeepSpeed's 0/1 Adam is not compatible with ZeRO",
    "zeropp": "DeepSpeed's ZeRO-3 (--stack deepspeed) without tensor, pipeline or context parallelism, on "
              "whole nodes",
    "fp8_param_gather": "fp8 training (--precision fp8) with Megatron's distributed optimizer (zero 1) or FSDP2 "
                        "with tensorwise scaling",
}


def absent_notes(methods, ranked) -> list[str]:
    """A sentence for each method asked for (``methods``) that no ranked layout (the ``compression``
    column of ``ranked``) takes, saying what it needs."""
    used = set(ranked) if ranked is not None else set()
    missing = [m for m in methods if m != "none" and m not in used]
    return [f"No ranked layout compresses with {m}: it needs {NEEDS[m]}." for m in missing]


def lossless_first(df: pd.DataFrame, col: str) -> tuple[pd.DataFrame, str]:
    """The ranked table (recommendation first) with the best layout that compresses nothing on top
    where the recommended one compresses and is not ahead of it by more than the model resolves
    (``uncertainty.RANK_MIN_GAP`` on ``col``, the ranking's figure, from the engine both were timed
    with; both of the recommendation's fit class or better), and the sentence saying which way it
    went ('' where nothing compresses)."""
    from simcore.planner.headroom import CLASS_ORDER
    from simcore.planner.ranking import engine_prefix
    from simcore.planner.uncertainty import RANK_MIN_GAP

    if "compression" not in df or df.empty or not df.iloc[0]["compression"]:
        return df, ""
    best = df.iloc[0]
    method = best["compression"]
    ok = CLASS_ORDER[:CLASS_ORDER.index(best["fit"]) + 1] if "fit" in df else CLASS_ORDER
    plain = df.index[(df["compression"] == "") & df.get("fit", pd.Series(ok[0], index=df.index)).isin(ok)]
    note = (f"The best layout compresses its communication ({method}): the model prices its time and memory, "
            f"not its convergence; {ACCURACY[method]}.")
    if not len(plain):
        return df, note
    other = df.loc[plain[0]]
    col = engine_prefix(best, other) + col
    gain = other[col] / best[col] - 1
    if gain > RANK_MIN_GAP:
        return df, f"{note} It is {gain:.0%} ahead of the best layout without compression, {other['layout']}."
    top = pd.concat([df.loc[[plain[0]]], df.drop(index=plain[0])]).reset_index(drop=True)
    return top, (f"{best['layout']} ({method}) is only {gain:.1%} ahead of {other['layout']}, within the "
                 f"{RANK_MIN_GAP:.0%} the model's ranking resolves: the recommendation compresses nothing.")
