"""A Megatron-LM launch (one command line, or a launch script) read as Plan keys.

Megatron-LM's own example scripts (examples/gpt3/train_gpt3_175b_distributed.sh,
examples/llama/train_llama3_8b_h100_fp8.sh, examples/mixtral/train_mixtral_8x7b_distributed.sh
at NVIDIA/Megatron-LM 157006d6 / 0a40979e) build the command from shell variables and bash
arrays: ``NAME=value``, ``NAME=${NAME:-default}``, ``ARGS=( --opt $VAR ... )``,
``ARGS+=( "--opt value" )`` and ``torchrun ${DISTRIBUTED_ARGS[@]} "$PRETRAIN_SCRIPT_PATH"
${MODEL_ARGS[@]} ...``. ``expand_script`` evaluates that much of bash (assignments,
arrays, ``${...}`` expansion, ``$((...))`` arithmetic of integers); an ``if`` block
contributes its first branch (the examples' defaults). The command is the first line whose
first word is a launcher (torchrun, python, deepspeed, srun, ...) or a .py script.

The option semantics are Megatron-LM's megatron/training/arguments.py (``validate_args``) at
the commit in tool_options.yaml: ``--sequence-parallel`` at TP 1 is turned off, the world is
torchrun's ``--nnodes x --nproc-per-node`` (``--nproc_per_node`` spelt either way).
"""
from __future__ import annotations

import re
import shlex

from simcore.plan.readers import Reading
from simcore.plan.spec import MEGATRON_DROPOUT, PlanError

_LAUNCHERS = {"torchrun", "python", "python3", "deepspeed", "srun", "mpirun", "bash"}
_SKIP_WORDS = {"if", "then", "else", "elif", "fi", "for", "do", "done", "echo", "mkdir", "export", "set",
               "exit", "cd", "source", ".", "[", "[[", "while", "case", "esac", "unset", "shift"}
_VAR = re.compile(r"\$\{(\w+)(?:\[@\]|\[\*\])?(?::?-([^}]*))?\}|\$(\w+|[0-9])")


def _logical_lines(text: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    return [ln for ln in joined.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


class _Shell:
    """The variables and arrays of a script, and ``${...}`` expansion."""

    def __init__(self):
        self.vars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.exported: dict[str, str] = {}

    def expand(self, text: str) -> str:
        def sub(match):
            name, default, plain = match.group(1), match.group(2), match.group(3)
            name = name or plain
            if name in self.arrays:  # unquoted ${A[@]}: bash splits each element into words
                return " ".join(self.arrays[name])
            value = self.vars.get(name)
            return value if value else (self._default(default) if default is not None else "")
        text = re.sub(r"\$\(\((.*?)\)\)", lambda m: self._arith(self.expand_plain(m.group(1))), text)
        return _VAR.sub(sub, text)

    def expand_plain(self, text: str) -> str:
        return _VAR.sub(lambda m: self.vars.get(m.group(1) or m.group(3), ""), text)

    def _default(self, default: str) -> str:
        return self.expand(default).strip("\"'")

    @staticmethod
    def _arith(expr: str) -> str:
        if not re.fullmatch(r"[\d\s+\-*/()]+", expr):
            return "0"
        return str(eval(expr.replace("/", "//"), {"__builtins__": {}}))  # digits and + - * / only


def expand_script(text: str) -> tuple[list[list[str]], dict[str, str]]:
    """Each command line of a script after variable and array expansion, as words, and
    the variables the script exports."""
    sh, out, skip_branch, depth = _Shell(), [], False, 0
    lines = _logical_lines(text)
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        head = re.match(r"^(\w+)(\+?)=\($", line) or re.match(r"^(\w+)(\+?)=\((.*)\)$", line)
        if head:
            body = head.group(3) if head.lastindex == 3 else ""
            if head.lastindex != 3:
                while i < len(lines) and lines[i].strip() != ")":
                    body += "\n" + lines[i]
                    i += 1
                i += 1
            if not skip_branch:
                words = shlex.split(sh.expand(body), comments=True)
                sh.arrays[head.group(1)] = (sh.arrays.get(head.group(1), []) if head.group(2) else []) + words
            continue
        first = line.split()[0]
        if first in ("if", "for", "while", "case"):
            depth += 1
            continue
        if first in ("else", "elif") and depth:
            skip_branch = True
            continue
        if first in ("fi", "done", "esac") and depth:
            depth -= 1
            skip_branch = False if depth == 0 else skip_branch
            continue
        if skip_branch:
            continue
        assign = re.match(r"^(export\s+)?(\w+)=(.*)$", line)
        words = shlex.split(sh.expand(assign.group(3)), comments=True) if assign else []
        if assign and len(words) <= 1:
            sh.vars[assign.group(2)] = words[0] if words else ""
            if assign.group(1):
                sh.exported[assign.group(2)] = sh.vars[assign.group(2)]
            continue
        if first in _SKIP_WORDS:
            continue
        out.append(shlex.split(sh.expand(line), comments=True))
    return out, sh.exported


def split_command(text: str) -> tuple[dict, dict[str, str], dict[str, list[str]]]:
    """The launcher's options, its environment (``export NAME=value`` lines) and the
    training script's options, of a command line or a launch script."""
    commands, exported = expand_script(text)
    for words in commands:
        env = dict(exported)
        while words and re.match(r"^\w+=", words[0]):  # NAME=value before the command
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        if not words or (words[0] not in _LAUNCHERS and not words[0].endswith(".py")):
            continue
        script = next((i for i, t in enumerate(words) if t.endswith(".py")), None)
        if script is None:
            continue
        pre = {}
        for i, tok in enumerate(words[:script]):
            key, _, val = tok.partition("=")
            if key.startswith("--"):
                pre[key.replace("_", "-")] = val or (words[i + 1] if i + 1 < script else "")
        return pre, env, options(words[script + 1:], "megatron")
    raise PlanError("megatron: no training script (a .py file such as pretrain_gpt.py) in the command")


def options(tokens: list[str], where: str) -> dict[str, list[str]]:
    """``--name v1 v2`` / ``--name=v`` / ``--flag`` into {name: values}; last one wins."""
    opts: dict[str, list[str]] = {}
    name = None
    for tok in tokens:
        if tok.startswith("--"):
            name, _, value = tok.partition("=")
            opts[name] = [value] if value else []
        elif name is None:
            raise PlanError(f"{where}: unexpected argument {tok!r} before the first option")
        else:
            opts[name].append(tok)
    return opts


class _Args:
    """Typed access to parsed options that records which ones were used."""

    def __init__(self, opts: dict, where: str):
        self.opts, self.where, self.used = opts, where, set()

    def flag(self, name: str) -> bool:
        self.used.add(name) if name in self.opts else None
        return name in self.opts

    def value(self, name: str, conv=int):
        if name not in self.opts:
            return None
        self.used.add(name)
        values = self.opts[name]
        if len(values) != 1:
            raise PlanError(f"{self.where} option {name} needs one value, got {len(values)}")
        try:
            return conv(values[0])
        except ValueError:
            raise PlanError(f"{self.where} option {name}={values[0]!r} is not a {conv.__name__}") from None


def _read_window(a, f: dict) -> None:
    """--window-size (left, right) and --window-attn-skip-freq N (``writers._window_args``)."""
    window = a.value("--window-size", str)
    if window is None:
        return
    f["model.sliding_window"] = int(window.strip("()").split(",")[0]) + 1
    freq = a.value("--window-attn-skip-freq", str)
    if freq is not None:
        if not freq.isdigit() or int(freq) < 2:
            raise PlanError(f"megatron --window-attn-skip-freq={freq!r}: only an integer N >= 2 (one full layer "
                            "in N) has a model.sliding_window_layers equivalent")
        f["model.sliding_window_layers"] = (int(freq) - 1) / int(freq)


def read_megatron(text: str) -> Reading:
    """A Megatron-LM command line or launch script (pretrain_gpt.py arguments)."""
    pre, _env, opts = split_command(text)
    a = _Args(opts, "megatron")
    f: dict = {}
    # Megatron's defaults: fp32, no recompute, --attention-backend auto (Transformer Engine
    # picks its flash or cuDNN fused kernel, both O(s) memory).
    d: dict = {"training.precision": "fp32", "parallel.zero": 0, "parallel.sequence_parallel": False,
               "training.recompute": "none", "training.flash_attention": True}
    _megatron_model(a, f)
    _megatron_parallel(a, f)
    _megatron_training(a, f)
    hints = {}
    if "--nnodes" in pre:
        hints["world.nnodes"] = _to_int(pre["--nnodes"], "torchrun --nnodes")
    if "--nproc-per-node" in pre:
        hints["world.gpus_per_node"] = _to_int(pre["--nproc-per-node"], "torchrun --nproc-per-node")
    if "--num-layers-per-virtual-pipeline-stage" in opts:
        hints["megatron.layers_per_virtual_stage"] = a.value("--num-layers-per-virtual-pipeline-stage")
    first = a.value("--decoder-first-pipeline-num-layers")
    last = a.value("--decoder-last-pipeline-num-layers")
    if first is not None or last is not None:
        hints["megatron.first_last"] = (first, last)
    if f.get("parallel.sequence_parallel") and (f.get("parallel.tp") or 1) == 1:
        # validate_args: "if args.tensor_model_parallel_size == 1: ... args.sequence_parallel = False"
        del f["parallel.sequence_parallel"]
        hints["note.megatron_sp"] = "--sequence-parallel at tensor-model-parallel-size 1 is off (as Megatron turns it off)"
    ignored = tuple(o for o in opts if o not in a.used)
    return Reading(source="megatron", fields=f, defaults=d, hints=hints, ignored=ignored)


def _to_int(value: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise PlanError(f"{where}={value!r} is not an integer") from None


def _megatron_model(a: _Args, f: dict) -> None:
    if "--num-layers" not in a.opts:
        return
    f["model.layers"] = a.value("--num-layers")
    f["model.hidden"] = a.value("--hidden-size")
    f["model.heads"] = a.value("--num-attention-heads")
    f["model.ffn_hidden"] = a.value("--ffn-hidden-size")
    if a.flag("--group-query-attention"):
        f["model.kv_heads"] = a.value("--num-query-groups")
    elif f["model.heads"] is not None:
        f["model.kv_heads"] = f["model.heads"]
    f["model.vocab"] = a.value("--vocab-size") or _tokenizer_vocab(a)
    f["model.kv_channels"] = a.value("--kv-channels")
    f["model.rope_base"] = a.value("--rotary-base", float)
    drops = [a.value(o, float) for o in ("--hidden-dropout", "--attention-dropout")]
    if any(d is not None for d in drops):   # unset: Megatron's default, the Plan's
        f["model.dropout"] = max(MEGATRON_DROPOUT if d is None else d for d in drops)
    a.value("--normalization", str), a.flag("--disable-bias-linear")  # RMSNorm, no biases: implied by rope
    f["model.seq_len"] = a.value("--seq-length")
    a.value("--max-position-embeddings")  # a capacity; the run uses --seq-length
    f["model.gated_mlp"] = a.flag("--swiglu")
    _read_window(a, f)
    f["model.tied_embeddings"] = not a.flag("--untie-embeddings-and-output-weights")
    pos = a.value("--position-embedding-type", str) or "learned_absolute"
    rope = pos == "rope" or a.flag("--use-rotary-position-embeddings")
    f["model.position_embedding"] = "rope" if rope else "learned"
    if "--num-experts" in a.opts:
        f["model.experts"] = a.value("--num-experts")
        f["model.top_k"] = a.value("--moe-router-topk") or 2  # Megatron's default top-k
        f["model.capacity_factor"] = a.value("--moe-expert-capacity-factor", float)  # none: dropless
        f["model.shared_ffn_hidden"] = a.value("--moe-shared-expert-intermediate-size")
        if "--moe-ffn-hidden-size" in a.opts:  # the experts' width; --ffn-hidden-size the dense layers'
            f["model.dense_ffn_hidden"] = f["model.ffn_hidden"]
            f["model.ffn_hidden"] = a.value("--moe-ffn-hidden-size")
        freq = a.value("--moe-layer-freq", str)
        if freq is not None:
            pattern = re.fullmatch(r"\(?\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*\d+\)?", freq.strip())
            if freq.strip() != "1" and not pattern:
                raise PlanError(f"megatron --moe-layer-freq={freq!r} has no model.dense_layers equivalent "
                                "(only '([0]*k+[1]*n)': the first k layers dense)")
            f["model.dense_layers"] = int(pattern.group(1)) if pattern else None


#: Vocabulary sizes of the tokenizers Megatron's examples name without --vocab-size: the
#: GPT-2 BPE files (gpt2-vocab.json; openai-community/gpt2 config.json vocab_size) and the
#: Llama 2 SentencePiece model (meta-llama/Llama-2-7b-hf config.json vocab_size).
TOKENIZER_VOCAB = {"GPT2BPETokenizer": 50257, "Llama2Tokenizer": 32000}


def _tokenizer_vocab(a: _Args) -> int | None:
    kind = a.value("--tokenizer-type", str)
    if kind is None and a.value("--vocab-file", str) and a.value("--merge-file", str):
        kind = "GPT2BPETokenizer"  # Megatron's default tokenizer with BPE vocab and merge files
    return TOKENIZER_VOCAB.get(kind)


def _megatron_parallel(a: _Args, f: dict) -> None:
    f["parallel.tp"] = a.value("--tensor-model-parallel-size")
    f["parallel.pp"] = a.value("--pipeline-model-parallel-size")
    f["parallel.cp"] = a.value("--context-parallel-size")
    f["parallel.ep"] = a.value("--expert-model-parallel-size")
    f["parallel.expert_tp"] = a.value("--expert-tensor-parallel-size")
    f["parallel.vpp"] = a.value("--num-virtual-stages-per-pipeline-rank")
    f["parallel.microbatch_group"] = a.value("--microbatch-group-size-per-virtual-pipeline-stage")
    if (f["parallel.ep"] or 1) > 1:
        dispatcher = a.value("--moe-token-dispatcher-type", str)
        backend = a.value("--moe-flex-dispatcher-backend", str)
        if dispatcher == "flex" and (a.flag("--moe-enable-deepep") or backend == "deepep"):
            f["parallel.moe_dispatcher"] = "deepep"   # DeepEP: a token once per destination rank
        if a.flag("--overlap-moe-expert-parallel-comm"):   # the combined 1F1B schedule
            f["parallel.moe_a2a_overlap"] = True
    if a.flag("--sequence-parallel"):
        f["parallel.sequence_parallel"] = True
    if a.flag("--tp-comm-overlap"):
        f["parallel.tp_comm_overlap"] = True
    a.flag("--overlap-grad-reduce")   # the model overlaps the reduction with the last backward always
    if a.flag("--overlap-param-gather"):
        f["parallel.overlap_param_gather"] = True
    cp_comm = a.value("--cp-comm-type", str)
    if cp_comm:
        kinds = {"p2p": "p2p", "allgather": "all_gather", "a2a": "a2a"}
        if cp_comm not in kinds:   # a2a+p2p (hierarchical) has no Plan value
            raise PlanError(f"megatron --cp-comm-type={cp_comm!r} is not one of {', '.join(kinds)} (parallel.cp_comm)")
        f["parallel.cp_comm"] = kinds[cp_comm]
    if (f["parallel.pp"] or 1) > 1:
        interleaved = (f["parallel.vpp"] or 1) > 1 or "--num-layers-per-virtual-pipeline-stage" in a.opts
        f["parallel.schedule"] = "interleaved-1f1b" if interleaved else "1f1b"
    strategies = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
    if a.flag("--use-megatron-fsdp"):
        strategy = a.value("--data-parallel-sharding-strategy", str) or "no_shard"
        if strategy not in strategies:
            raise PlanError(f"megatron --data-parallel-sharding-strategy={strategy!r} is not one of: "
                            f"{', '.join(strategies)}")
        f["parallel.zero"] = strategies[strategy]
        a.flag("--use-distributed-optimizer"), a.flag("--no-gradient-accumulation-fusion")
        a.value("--ckpt-format", str)  # fsdp_dtensor: part of the Megatron-FSDP recipe
    elif a.flag("--use-torch-fsdp2"):
        f["parallel.zero"] = 2 if a.flag("--torch-fsdp2-no-reshard-after-forward") else 3
    elif a.flag("--use-distributed-optimizer"):
        f["parallel.zero"] = 1


def _megatron_training(a: _Args, f: dict) -> None:
    f["training.micro_batch"] = a.value("--micro-batch-size")
    f["training.global_batch"] = a.value("--global-batch-size")
    fp16, bf16 = a.flag("--fp16"), a.flag("--bf16")
    if fp16 and bf16:
        raise PlanError("megatron gives both --fp16 and --bf16 for training.precision")
    fp4 = a.value("--fp4-format", str) and (a.value("--fp4-recipe", str) or "nvfp4")
    if fp4:
        if fp4 != "nvfp4":
            raise PlanError(f"megatron --fp4-recipe={fp4!r} has no training.precision (nvfp4)")
        f["training.precision"] = "nvfp4"
    elif a.value("--fp8-format", str):
        f["training.precision"] = "fp8"
        recipe = a.value("--fp8-recipe", str) or "delayed"   # Megatron's tensorwise is TE's current scaling
        if recipe not in ("delayed", "tensorwise", "mxfp8"):
            raise PlanError(f"megatron --fp8-recipe={recipe!r} has no training.fp8_recipe (delayed, tensorwise) "
                            "or training.precision (mxfp8)")
        if recipe == "mxfp8":
            f["training.precision"] = "mxfp8"
        else:
            f["training.fp8_recipe"] = "current" if recipe == "tensorwise" else "delayed"
    elif fp16 or bf16:
        f["training.precision"] = "fp16" if fp16 else "bf16"
    granularity = a.value("--recompute-granularity", str)
    if granularity or a.flag("--recompute-activations"):
        f["training.recompute"] = granularity or "selective"
        a.value("--recompute-method", str), a.value("--recompute-num-layers")
    offloaded = a.value("--cpu-offloading-num-layers")
    if offloaded:   # N > 0 turns cpu_offloading on (arguments.py)
        f["training.activation_offload"] = offloaded
    if a.flag("--optimizer-cpu-offload"):
        f["training.offload"] = "optimizer"
        a.value("--optimizer-offload-fraction", float)
    f["training.fp8_param_gather"] = a.flag("--fp8-param-gather") or None
    _precision_aware_optimizer(a, f)
    backend = a.value("--attention-backend", str)  # AttnBackend: flash, fused, unfused, local, auto
    if backend is not None or a.flag("--use-flash-attn"):
        f["training.flash_attention"] = backend in (None, "flash", "fused", "auto")
    optimizer = a.value("--optimizer", str)
    if optimizer in ("adam", "sgd"):
        f["training.optimizer"] = "adamw" if optimizer == "adam" else "sgd"
    elif optimizer is not None:
        a.used.discard("--optimizer")
    if a.flag("--grad-reduce-in-bf16"):   # DDP's all-reduce or the distributed optimizer's reduce-scatter
        f["training.grad_compression"] = "bf16"


def _precision_aware_optimizer(a: _Args, f: dict) -> None:
    """``--use-precision-aware-optimizer`` (Transformer Engine's FusedAdam): Adam's moments in
    ``--exp-avg-dtype``/``--exp-avg-sq-dtype``; bf16 ``--main-grads-dtype`` leaves the gradient
    buffer in bf16 (arguments.py keeps ``accumulate_allreduce_grads_in_fp32`` off)."""
    if not a.flag("--use-precision-aware-optimizer"):
        return
    moments = {a.value("--exp-avg-dtype", str) or "fp32", a.value("--exp-avg-sq-dtype", str) or "fp32"}
    if len(moments) > 1 or moments - {"fp32", "bf16", "fp16"}:
        raise PlanError(f"megatron --exp-avg-dtype/--exp-avg-sq-dtype {sorted(moments)} have no "
                        "training.optimizer_state_dtype (one of fp32, bf16, fp16 for both)")
    f["training.optimizer_state_dtype"] = moments.pop()
    if (a.value("--main-params-dtype", str) or "fp32") != "fp32":
        raise PlanError("megatron --main-params-dtype fp16 has no Plan field (the master weights are fp32)")
    if a.value("--main-grads-dtype", str) == "bf16":
        f["training.grad_compression"] = "bf16"


