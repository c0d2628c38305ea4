"""Each (plan, export target) pair of tests/plan/layouts.py is written, or refused in one sentence
naming the field (issue 55, item 6): listed pair by pair, so a change of what an exporter writes
or refuses shows by name. The consumer suites (tests/plan/consumers*) load the written ones with
the tools' own parsers and check these refusals there too."""
import re

import pytest

from tests.plan.layouts import ALL
from tests.plan.test_interop import TARGETS, _export_or_refusal


#: The field each target refuses each plan over; every pair not listed is written. A change of
#: what an exporter writes or refuses shows here, pair by pair (no share of exportable pairs).
REFUSED = {
    "gpt3-175b-a100": {"deepspeed": "parallel.pp", "torchtitan": "parallel.sequence_parallel",
                       "torchtitan-0.2": "parallel.sequence_parallel"},
    "llama3-70b-h100": {"deepspeed": "parallel.pp", "torchtitan": "parallel.zero", "torchtitan-0.2": "parallel.zero"},
    "llama3-8b-fsdp-h100": {"deepspeed": "parallel.zero_impl"},
    "tiny-localhost": {"deepspeed": "parallel.pp", "torchtitan": "model.gated_mlp", "torchtitan-0.2": "model.gated_mlp"},
    "v-ddp-pp-even": {"deepspeed": "parallel.pp"},
    "v-ds-zero1-fp16-tp-ulysses": {"megatron": "parallel.zero_impl", "slurm": "parallel.zero_impl",
                                   "deepspeed": "parallel.cp", "torchtitan": "parallel.zero",
                                   "torchtitan-0.2": "parallel.zero"},
    "v-ds-zero2-offload": {"megatron": "parallel.zero_impl", "slurm": "parallel.zero_impl",
                           "torchtitan": "parallel.zero_impl", "torchtitan-0.2": "parallel.zero_impl"},
    "v-ds-zero3-paramoffload": {"megatron": "parallel.zero_impl", "slurm": "parallel.zero_impl",
                                "torchtitan": "parallel.zero_impl", "torchtitan-0.2": "parallel.zero_impl"},
    "v-hsdp-zero1": {"deepspeed": "parallel.dp_replicate", "torchtitan": "parallel.zero", "torchtitan-0.2": "parallel.zero"},
    "v-hsdp-zero3": {"deepspeed": "parallel.dp_replicate"},
    "v-interleaved-tp": {"deepspeed": "parallel.pp"},
    "v-mixtral-ep": {"deepspeed": "parallel.pp", "torchtitan": "parallel.zero", "torchtitan-0.2": "parallel.zero"},
    "v-pp-uneven": {"deepspeed": "parallel.pp"},
    "v-qwen2-moe": {"deepspeed": "parallel.pp", "torchtitan": "parallel.zero", "torchtitan-0.2": "parallel.zero"},
    "v-zero-bubble-cp": {"megatron": "parallel.schedule", "slurm": "parallel.schedule",
                         "deepspeed": "parallel.zero_impl", "torchtitan": "parallel.cp_comm"},
    "v-zero1-fp16-tp-cp": {"deepspeed": "parallel.cp", "torchtitan": "parallel.zero", "torchtitan-0.2": "parallel.zero"},
    "v-zero2-offload-fp8": {"deepspeed": "parallel.zero_impl", "torchtitan": "training.offload",
                            "torchtitan-0.2": "training.offload"},
    "v-zero3-eager": {"megatron": "training.kernels", "slurm": "training.kernels", "deepspeed": "parallel.zero_impl"},
    "v-zero3-optim-in-bwd": {"megatron": "training.optimizer_in_backward", "slurm": "training.optimizer_in_backward",
                             "deepspeed": "parallel.zero_impl", "torchtitan": "training.optimizer_in_backward"},
    "v-zero3-paramoffload": {"megatron": "training.offload", "slurm": "training.offload",
                             "deepspeed": "parallel.zero_impl"},
}

#: MaxText's (simcore/plan/maxtext_writer.py: no pipeline written yet, no ZeRO-2, ZeRO-1 under hybrid sharding,
#: no fp16, no optimizer stepped in the backward).
MAXTEXT_REFUSED = {
    "gpt3-175b-a100": "parallel.pp", "llama3-70b-h100": "parallel.pp", "tiny-localhost": "parallel.pp",
    "v-ddp-pp-even": "parallel.pp", "v-ds-zero1-fp16-tp-ulysses": "training.precision", "v-ds-zero2-offload": "parallel.zero",
    "v-hsdp-zero1": "parallel.dp_replicate", "v-interleaved-tp": "parallel.pp", "v-mixtral-ep": "parallel.pp",
    "v-pp-uneven": "parallel.pp", "v-qwen2-moe": "parallel.pp", "v-zero-bubble-cp": "parallel.pp",
    "v-zero1-fp16-tp-cp": "training.precision", "v-zero2-offload-fp8": "parallel.zero",
    "v-zero3-optim-in-bwd": "training.optimizer_in_backward",
}
for _name, _field in MAXTEXT_REFUSED.items():
    REFUSED[_name]["maxtext"] = _field


def assert_one_sentence_naming(refusal: str, field: str) -> None:
    """A refusal is one sentence that opens with the field and its value: ``parallel.pp=4 has no
    DeepSpeed config option: ...`` (no second sentence, no line break)."""
    assert re.match(rf"{re.escape(field)}=\S+ has no [\w .-]+ option(: |$)", refusal), refusal
    assert "\n" not in refusal and not re.search(r"[.!?;] [A-Z]", refusal.rstrip(".")), refusal


def test_the_refusal_table_lists_every_plan():
    assert sorted(REFUSED) == sorted(ALL)   # a new plan in tests/plan/layouts.py gets its row here


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("target", TARGETS)
def test_each_pair_is_written_or_refused_naming_its_field(name, target):
    text, refusal = _export_or_refusal(ALL[name], target)
    field = REFUSED.get(name, {}).get(target)
    if field is None:
        assert refusal is None, f"{name} -> {target} is now refused: {refusal}"
        assert text.strip()
    else:
        assert refusal is not None, f"{name} -> {target} is now written (it was refused over {field})"
        assert_one_sentence_naming(refusal, field)
