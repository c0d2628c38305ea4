"""A Megatron-LM launch (one command line, or a launch script) read as Plan keys.

The script is evaluated by ``simcore.plan.megatron_shell`` (variables, bash arrays, if
blocks, wrappers such as ``uv run``, ``sbatch`` here-documents) down to the training
script's options. The option semantics are Megatron-LM's megatron/training/arguments.py
(``validate_args``) at the commit in tool_options.yaml: ``--sequence-parallel`` at TP 1 is
turned off, the world is torchrun's ``--nnodes x --nproc-per-node`` (``--nproc_per_node``
spelt either way).
"""
from __future__ import annotations

import re

from simcore.plan.mindspeed_reader import read_mindspeed
from simcore.plan.megatron_moe import _moe_layer_fields, moe_layer_pattern  # noqa: F401  (re-exported)
from simcore.plan.megatron_block import read_block
from simcore.plan.model_props import unconventional
from simcore.plan.megatron_shell import _logical_lines, expand_script, options, split_command  # noqa: F401
from simcore.plan.readers import Reading
from simcore.plan.spec import MEGATRON_DROPOUT, PlanError


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


#: Megatron-LM's training scripts whose model is not the Plan's decoder-only transformer (the
#: repository's root at d98e8a64: pretrain_bert.py, pretrain_t5.py, pretrain_hybrid.py (Mamba
#: layers), pretrain_mamba.py, pretrain_vlm.py, pretrain_vision_*.py, pretrain_retro.py,
#: pretrain_ict.py; train_rl.py runs generation inside its loop).
OTHER_SCRIPTS = re.compile(r"(pretrain_(bert|t5|hybrid\w*|mamba\w*|vlm\w*|vision\w*|retro\w*|ict)|train_rl)\.py")


def read_megatron(text: str) -> Reading:
    """A Megatron-LM command line or launch script (pretrain_gpt.py arguments)."""
    pre, _env, opts = split_command(text)
    script = pre.pop("script", "").rsplit("/", 1)[-1]
    if OTHER_SCRIPTS.fullmatch(script):
        raise PlanError(f"megatron: {script} does not train a decoder-only transformer (pretrain_gpt.py's model), "
                        "the only model a Plan states")
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
    read_mindspeed(a, f, hints)   # a MindSpeed-LLM launch: its attention and context-parallel options
    for opt, key in (("--nnodes", "world.nnodes"), ("--nproc-per-node", "world.gpus_per_node")):
        if opt in pre:
            hints[key] = _to_int(pre[opt], f"torchrun {opt}")
    if "--num-layers-per-virtual-pipeline-stage" in opts:
        hints["megatron.layers_per_virtual_stage"] = a.value("--num-layers-per-virtual-pipeline-stage")
    account = (a.flag("--account-for-embedding-in-pipeline-split"), a.flag("--account-for-loss-in-pipeline-split"))
    if any(account):
        hints["megatron.account"] = account
    first = a.value("--decoder-first-pipeline-num-layers")
    last = a.value("--decoder-last-pipeline-num-layers")
    if first is not None or last is not None:
        hints["megatron.first_last"] = (first, last)
    if (layout := a.value("--pipeline-model-parallel-layout", str)) is not None:
        hints["megatron.layout"] = read_layout(layout)
    if f.get("parallel.sequence_parallel") and (f.get("parallel.tp") or 1) == 1:
        # validate_args: "if args.tensor_model_parallel_size == 1: ... args.sequence_parallel = False"
        del f["parallel.sequence_parallel"]
        hints["note.megatron_sp"] = "--sequence-parallel at tensor-model-parallel-size 1 is off (as Megatron turns it off)"
    ignored = tuple(o for o in opts if o not in a.used)
    return Reading(source="megatron", fields=f, defaults=d, hints=hints, ignored=ignored)


def read_layout(layout: str) -> tuple[tuple[int, ...], int]:
    """(decoder layers per virtual stage, MTP modules) of ``--pipeline-model-parallel-layout``,
    unrolled as Megatron's ``PipelineParallelLayerLayout.parse_str_to_list`` does (@d98e8a64)."""
    import re

    text = layout.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    if set(text) - set("ELtm|"):
        raise PlanError(f"megatron --pipeline-model-parallel-layout={layout!r} has a layer other than E, t, m, L "
                        "(embedding, decoder, MTP, loss)")
    stages = text.split("|")
    return tuple(st.count("t") for st in stages), text.count("m")


def _to_int(value: str, where: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise PlanError(f"{where}={value!r} is not an integer") from None


def _megatron_model(a: _Args, f: dict) -> None:
    # The training sequence is the run's, whoever gives the model's shape (--hf or the command)
    f["model.seq_len"] = a.value("--seq-length")
    a.value("--max-position-embeddings")  # a capacity; the run uses --seq-length
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
    # --padded-vocab-size: the embedding's exact rows, not padded further (argument_utils.py
    # gpt_config_from_args, should_pad_vocab=False @d98e8a64); --vocab-size (or the tokenizer's)
    # is padded to a multiple of --make-vocab-size-divisible-by (128) x TP (vocab_utils.py
    # calculate_padded_vocab_size), the rows Megatron builds
    vocab = a.value("--vocab-size") or _tokenizer_vocab(a)
    multiple = (a.value("--make-vocab-size-divisible-by") or VOCAB_DIVISOR) * (a.value("--tensor-model-parallel-size") or 1)
    f["model.vocab"] = a.value("--padded-vocab-size") or (-(-vocab // multiple) * multiple if vocab else None)
    f["model.kv_channels"] = a.value("--kv-channels")
    f["model.rope_base"] = a.value("--rotary-base", float)
    drops = [a.value(o, float) for o in ("--hidden-dropout", "--attention-dropout")]
    if any(d is not None for d in drops):   # unset: Megatron's default, the Plan's
        f["model.dropout"] = max(MEGATRON_DROPOUT if d is None else d for d in drops)
    # --quick-geglu is a gated MLP too (argument_utils.py: gated_linear_unit=True, quick_gelu
    # @d98e8a64): three matrices, as --swiglu
    f["model.gated_mlp"] = a.flag("--swiglu") | a.flag("--quick-geglu")
    _read_mla(a, f)
    _read_window(a, f)
    # the MTP modules, on the last pipeline stage (multi_token_prediction.py @d98e8a64); the loss
    # weight --mtp-loss-scaling-factor scales a gradient, no work: read, nothing to map
    f["model.mtp_layers"], _ = a.value("--mtp-num-layers"), a.value("--mtp-loss-scaling-factor", float)
    f["model.tied_embeddings"] = not a.flag("--untie-embeddings-and-output-weights")
    pos = a.value("--position-embedding-type", str) or "learned_absolute"
    rope = pos == "rope" or a.flag("--use-rotary-position-embeddings")
    f["model.position_embedding"] = "rope" if rope else "learned"
    f.update({f"model.{k}": v for k, v in unconventional(read_block(a, bool(f.get("model.kv_lora_rank"))), rope,
                                                             f["model.gated_mlp"]).items()})
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
            f.update(_moe_layer_fields(moe_layer_pattern(freq, f["model.layers"] or 0)))


def _read_mla(a: _Args, f: dict) -> None:
    """Multi-latent attention as Megatron-LM defines it (arguments.py ``_add_mla_args`` and
    MLATransformerConfig @d98e8a64): --qk-head-dim is the query/key head *without* its rotary
    part ("q_head_dim = qk_head_dim + qk_pos_emb_head_dim"), the Plan's kv_channels under MLA
    (Hugging Face ``qk_nope_head_dim``); --qk-pos-emb-head-dim the rotary part; no
    --q-lora-rank (None) projects queries without compression. Unset options take
    Megatron's argparse defaults (kv-lora-rank 32, qk-head-dim 128, qk-pos-emb-head-dim 64,
    v-head-dim 128). --kv-channels is not used by MLA. Without --multi-latent-attention the
    MLA options do nothing (Megatron builds ordinary attention) and are listed as not mapped."""
    if not a.flag("--multi-latent-attention"):
        return
    if f.get("model.kv_heads") not in (None, f.get("model.heads")):
        raise PlanError("megatron --multi-latent-attention with --group-query-attention: Megatron refuses the "
                        "pair (validate_args: 'Group query attention is mutually exclusive with multi latent attention')")
    f["model.q_lora_rank"] = a.value("--q-lora-rank")
    f["model.kv_lora_rank"] = a.value("--kv-lora-rank") or 32
    f["model.kv_channels"] = a.value("--qk-head-dim") or 128
    f["model.qk_rope_head_dim"] = a.value("--qk-pos-emb-head-dim") or 64
    f["model.v_head_dim"] = a.value("--v-head-dim") or 128


#: Megatron's --make-vocab-size-divisible-by default (megatron/training/arguments.py).
VOCAB_DIVISOR = 128
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
    expert_tp = a.value("--expert-tensor-parallel-size")   # unset: the dense TP (arguments.py@d98e8a64, 587)
    dense = "--num-layers" in a.opts and "--num-experts" not in a.opts   # a dense model has no experts to split
    f["parallel.expert_tp"] = expert_tp if expert_tp != (f["parallel.tp"] or 1) and not dense else None
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
    _distributed_optimizer(a, f)


def _distributed_optimizer(a: _Args, f: dict) -> None:
    """The distributed optimizer's options (megatron/training/arguments.py@d98e8a64ddf34856e74b24714e3bedb2f5a39553).
    --num-distributed-optimizer-instances N: N instances (Megatron-FSDP: HSDP) each shard over dp*cp/N ranks
    and all-reduce the shards (parallel_state.py, fsdp/mcore_fsdp_adapter.py ``enable_hsdp``): the Plan's
    parallel.dp_replicate; --use-torch-fsdp2 shards over all of dp, so there it is listed as not mapped.
    --overlap-param-gather: validate_args accepts it "with distributed optimizer, megatron fsdp, or dist_muon"
    (line 1024). Under the distributed optimizer it is the Plan's parallel.overlap_param_gather; under
    Megatron-FSDP (NVIDIA's examples/megatron_fsdp recipes set it) it is the layer-by-layer gather
    ahead of each layer's compute that the Plan's ZeRO-2/3 already models, so nothing more."""
    n = (a.value("--num-distributed-optimizer-instances") if "--use-torch-fsdp2" not in a.opts else None) or 1
    fsdp = "--use-megatron-fsdp" in a.opts
    if n > 1 and not (fsdp or "--use-distributed-optimizer" in a.opts):
        raise PlanError(f"megatron --num-distributed-optimizer-instances {n} needs --use-distributed-optimizer "
                        "(distributed_data_parallel.py: 'Partial DistOpt cannot be used without DistOpt')")
    if n > 1 and fsdp and a.value("--outer-dp-sharding-strategy", str) not in (None, "no_shard"):
        raise PlanError("megatron --outer-dp-sharding-strategy optim shards the optimizer states over the "
                        "replicas too, which parallel.dp_replicate does not model")
    f["parallel.dp_replicate"] = n if n > 1 else None
    if not a.flag("--overlap-param-gather"):
        return
    if f.get("parallel.zero") == 1:
        f["parallel.overlap_param_gather"] = True
    elif not ({"--use-megatron-fsdp", "--use-distributed-optimizer"} & set(a.opts)
              or a.opts.get("--optimizer") == ["dist_muon"]):
        raise PlanError("megatron --overlap-param-gather needs --use-distributed-optimizer or --use-megatron-fsdp "
                        "(validate_args: 'only supported with distributed optimizer, megatron fsdp, or dist_muon')")


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
    _recompute(a, f)
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
    elif a.value("--transformer-impl", str) == "local":
        # the local layer spec's core attention is DotProductAttention, which forms softmax(QK^T)
        # (megatron/core/models/gpt/gpt_layer_specs.py get_gpt_layer_local_spec @d98e8a64)
        f["training.flash_attention"] = False
    optimizer = a.value("--optimizer", str)
    if optimizer in ("adam", "sgd"):
        f["training.optimizer"] = "adamw" if optimizer == "adam" else "sgd"
    elif optimizer is not None:
        a.used.discard("--optimizer")
    if a.flag("--grad-reduce-in-bf16"):   # DDP's all-reduce or the distributed optimizer's reduce-scatter
        f["training.grad_compression"] = "bf16"


def _recompute(a, f: dict) -> None:
    """``--recompute-granularity`` with its method and layer count, under Megatron's rules
    (megatron/core/transformer/transformer_config.py ``__post_init__``): full recompute needs
    ``--recompute-method`` (uniform or block) and ``--recompute-num-layers``; selective takes no
    layer count. ``--recompute-activations`` is selective."""
    granularity = a.value("--recompute-granularity", str)
    method, layers = a.value("--recompute-method", str), a.value("--recompute-num-layers")
    if not (granularity or a.flag("--recompute-activations")):
        return
    if granularity == "full":
        if method not in ("uniform", "block"):
            raise PlanError("megatron --recompute-granularity full needs --recompute-method uniform or block "
                            "(Megatron's TransformerConfig refuses it without)")
        if layers is None:
            raise PlanError("megatron --recompute-granularity full needs --recompute-num-layers "
                            "(Megatron's TransformerConfig refuses it without)")
        f["training.recompute"] = "full" if (layers, method) == (1, "uniform") else {"layers": layers, "method": method}
        return
    if layers is not None:
        raise PlanError("megatron --recompute-num-layers is for --recompute-granularity full; "
                        "Megatron's TransformerConfig refuses it with selective")
    f["training.recompute"] = granularity or "selective"


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


