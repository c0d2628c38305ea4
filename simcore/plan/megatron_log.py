"""A Megatron-LM log's ``arguments`` block read back as the command line that ran it.

Megatron prints every argument it trained with (``megatron/training/arguments.py``,
``_print_args``: ``  name ....... value`` between ``---- arguments ----`` and ``---- end of
arguments ----``), each under its argparse ``dest``. Each becomes the option Megatron's own
parser defines for it (``megatron_args.yaml``): a ``store_true`` flag where it printed True; a
``store_false`` flag (``--no-<dest>``, or the irregular names below) where it printed False; a
value option with its value. The tokenizer's ``padded vocab ... (new size: N)`` line, printed
after the block, gives the embedding's rows (``--padded-vocab-size``). Values Megatron computed (``world_size``, ``data_parallel_size``,
``params_dtype``) are no options: the world size sizes the cluster. The command is then read by
the same reader as a launch script (``megatron_reader.read_megatron``), so an option it cannot
state is refused or listed as for a script.
"""
from __future__ import annotations

import functools
import re
import shlex
from pathlib import Path

import yaml

from simcore.plan.megatron_reader import read_megatron
from simcore.plan.readers import Reading
from simcore.plan.spec import PlanError

ARGS_FILE = Path(__file__).with_name("megatron_args.yaml")
#: ``store_false`` options whose name is not ``--no-<dest>`` (arguments.py @d98e8a64).
STORE_FALSE = {"add_bias_linear": "--disable-bias-linear", "add_position_embedding": "--no-position-embedding"}
#: A printed enum member (``AttnBackend.auto``, ``MoeDispatcher.alltoall``).
ENUM = re.compile(r"^[A-Z][A-Za-z]*\.(\w+)$")
#: Printed values that are no value at all.
UNSET = {"None", "", "[]", "{}"}
#: One ``  name ..... value`` line of the block (``_print_args``: the dest, dots, the value).
ARG = re.compile(r"^\s*([A-Za-z_0-9]+) \.{2,}\s*(\S.*?)\s*$")
BLOCK = ("------------------------ arguments ------------------------", "end of arguments")
#: The tokenizer's line (megatron/training/tokenizer/tokenizer.py ``_vocab_size_with_padding``):
#: the embedding's rows once padded to a multiple of make_vocab_size_divisible_by x TP.
PADDED = re.compile(r"> padded vocab \(size: \d+\) with \d+ dummy tokens \(new size: (\d+)\)")


@functools.lru_cache(maxsize=1)
def _options() -> dict:
    return yaml.safe_load(ARGS_FILE.read_text())["options"]


def argument_values(text: str) -> dict[str, str]:
    """Every line of the log's arguments block, dest -> the value as printed ({} without one).
    (``simcore.runlogs.megatron.arguments`` reads the layout of the same block for ``compare``;
    the plan room cannot import the run-log room.)"""
    start = text.find(BLOCK[0])
    if start < 0:
        return {}
    end = text.find(BLOCK[1], start)
    return {m.group(1): m.group(2) for line in text[start:end if end > 0 else len(text)].splitlines()
            if (m := ARG.match(line))}


def log_command(text: str) -> tuple[list[str], int | None]:
    """The training script's options the log's arguments block gives, and the world size it
    printed (None where it printed none). PlanError where the log has no arguments block."""
    values = argument_values(text)
    if not values:
        raise PlanError("log: no Megatron-LM arguments block ('---- arguments ----' ... 'end of arguments') in it; "
                        "import --log reads the arguments Megatron prints at start-up")
    opts, tokens = _options(), []
    for dest, value in values.items():
        name = "--" + dest.replace("_", "-")
        spec = opts.get(name)
        if spec is not None and spec.get("flag"):
            tokens += [name] if value == "True" else []
        elif spec is not None:   # an enum prints as its class and member (AttnBackend.auto): the option takes the member
            tokens += [] if value in UNSET else [name, ENUM.sub(r"\1", value)]
        elif value == "False":
            negative = STORE_FALSE.get(dest, "--no-" + dest.replace("_", "-"))
            tokens += [negative] if (opts.get(negative) or {}).get("flag") else []
    padded = PADDED.search(text)
    if padded and "--padded-vocab-size" not in tokens:
        tokens += ["--padded-vocab-size", padded.group(1)]
    world = values.get("world_size")
    return tokens, int(world) if world and world.isdigit() else None


def read_megatron_log(text: str) -> Reading:
    """The Plan keys of a Megatron-LM log (its arguments block), with ``world.size`` as a hint."""
    tokens, world = log_command(text)
    reading = read_megatron(" ".join(["pretrain_gpt.py", *map(shlex.quote, tokens)]))
    if world:
        reading.hints["world.size"] = world
    return reading
