"""Export a Plan as a MaxText training launch: ``python3 -m maxtext.trainers.pre_train.train
src/maxtext/configs/base.yml`` and the key=value overrides MaxText reads on its command line
(AI-Hypercomputer/maxtext @e591f30c, docs/guides/data_input_pipeline/data_input_grain.md's launch;
every key one that base.yml defines, ``tool_options.yaml`` ``maxtext``).

- **The mesh.** MaxText's ``ici_*`` axes lie inside a slice (a TPU slice's ICI torus; a GPU node's
  NVLink: the cluster's NVLink domain), its ``dcn_*`` axes across slices; its data axis outside its
  fsdp axis, as the Plan's hybrid-sharding replicas lie outside its shards. ``ici_tensor_parallelism``
  = tp, inside a slice. Under ZeRO-3 the Plan's shard group (dp / dp_replicate) is MaxText's fsdp axis
  (parameters, gradients and optimizer states sharded) and its replicas the data axis, each inside a
  slice as far as the slice holds it, the rest across slices (as ``bench/published_accelerators.py``
  reads MaxText's tables: ``ici_fsdp_parallelism`` in a slice, ``dcn_data_parallelism`` across).
  Under ZeRO-0 and ZeRO-1 every data-parallel rank is on the data axis, ZeRO-1 with
  ``shard_optimizer_over_data`` ("Enable ZeRO-1 optimizer sharding over data axis", base.yml).
- **Context parallelism.** ``ici_context_parallelism`` = cp inside a slice (MaxText's context axis
  lies between fsdp and tensor, as the Plan's CP group between its data-parallel ranks and TP), with
  ``context_parallel_strategy`` ``all_gather`` (base.yml's default: every rank gathers the keys and
  values, the Plan's ``cp_comm: all_gather``) or ``ring`` (``cp_comm: p2p``; on a TPU through
  Tokamax's splash kernel, ``use_tokamax_splash``, which types.py requires with ``attention=flash``,
  an even context axis under its default load balancing, a sequence divisible by its square and no
  dropout), ``context_parallel_load_balance`` base.yml's true. MaxText shards parameters over its
  context axis as over fsdp (the ``embed`` logical rule), so context parallelism is written under
  ZeRO-3 only, where the Plan's shards are dp x cp alike.
- **The hardware.** A TPU is base.yml's ``hardware: tpu``; any other chip ``hardware=gpu``, its flash
  attention MaxText's cuDNN kernel through Transformer Engine (``attention=cudnn_flash_te``).
- **The batch.** MaxText trains devices x ``per_device_batch_size`` x ``gradient_accumulation_steps``
  sequences a step (configs/types.py ``calculate_global_batch_sizes``): the accumulation steps are the
  Plan's micro-batches a step, ``per_device_batch_size`` = micro_batch / (tp x pp x cp), a fraction
  under TP (MaxText shards a batch over its data and fsdp axes, not the tensor axis).
- **The model.** The ``llama2`` decoder block (RMSNorm, RoPE, bias-free projections), its MLP's
  ``mlp_activations`` from the Plan's activation (SwiGLU ``["silu", "linear"]``, base.yml's default);
  the ``base_*`` widths, ``head_dim``, ``vocab_size``, ``logits_via_embedding`` for tied embeddings,
  ``max_target_length``, ``rope_max_timescale``, dropout.
- **Precision and memory.** ``dtype`` bfloat16 (fp32 for an fp32 Plan) over fp32 ``weight_dtype``
  (the master copy); ``remat_policy`` full for full recompute, ``minimal`` for ``dots`` (JAX's
  ``checkpoint_dots_with_no_batch_dims``: the projections' outputs saved, attention and elementwise
  ops recomputed, ``simcore.model.recompute``), ``minimal_with_context`` for none (base.yml's
  fastest policy); Megatron's selective (the attention core alone) has no MaxText policy: it is
  written as ``minimal`` with a comment line saying so (``REMAT_NOTE``), and reads back as dots;
  optimizer and parameter offload as ``optimizer_memory_host_offload`` / ``parameter_memory_host_offload``; flash attention as ``attention=flash``; ``opt_type`` adamw or
  sgd. torch's own settings (fused or eager kernels, the caching allocator, the attention kernel's
  backend) have no meaning under XLA and are not written.

What MaxText has no option for here, or trainplan does not write yet, is refused in one sentence
naming the field (``ValueError``): pipeline and expert parallelism (MaxText has them: their
options are not written yet), Ulysses context parallelism and context parallelism across slices or
without ZeRO-3, ZeRO-2, experts, multi-latent attention, LayerNorm, learned
positions, biases, QK norm, sinks, other attention variants, MTP, FP8 and fp16, activation offload.
"""
from __future__ import annotations

from simcore.plan.load import recompute_doc
from simcore.plan.spec import CpComm, Offload, Plan, Precision, Recompute, RecomputeMethod, ZeroStage

#: MaxText's launch module and base config at the commit read (the module docstring).
LAUNCH = "python3 -m maxtext.trainers.pre_train.train src/maxtext/configs/base.yml"
COMMIT = "AI-Hypercomputer/maxtext @e591f30cbbf2"
#: The Plan's MLP activation as MaxText's ``mlp_activations`` (two entries: a gated MLP).
ACTIVATIONS = {"swiglu": ["silu", "linear"], "geglu": ["gelu", "linear"], "gelu": ["gelu"], "relu": ["relu"]}
REMAT = {Recompute.FULL: "full", Recompute.DOTS: "minimal", Recompute.SELECTIVE: "minimal",
         Recompute.NONE: "minimal_with_context"}
#: What the launch says where MaxText runs another policy than the Plan's (``REMAT``).
REMAT_NOTE = ("# training.recompute=selective (the attention core alone) has no MaxText policy: written as its "
              "nearest, remat_policy=minimal, which keeps the projections' outputs only and re-runs the norms and the "
              "attention (recompute: dots prices what it runs; the import reads it so)")
DTYPE = {Precision.BF16: "bfloat16", Precision.FP32: "float32"}
#: The Plan's optimizers MaxText's ``opt_type`` names alike (base.yml: "adamw", "adam_pax", "sgd", "muon").
OPTIMIZERS = {"adamw": "adamw", "sgd": "sgd"}
#: The Plan's context-parallel exchange as MaxText's ``context_parallel_strategy``.
CP_STRATEGY = {CpComm.ALL_GATHER: "all_gather", CpComm.P2P: "ring"}


def on_tpu(plan: Plan) -> bool:
    """Whether the plan's chip is a TPU (MaxText's ``hardware: tpu``)."""
    return plan.cluster.node.gpu.vendor == "google"


def _cp_refusals(plan: Plan) -> list[tuple[bool, str, object, str]]:
    """What MaxText's context axis here cannot state (the module docstring)."""
    m, par, tr = plan.model, plan.parallel, plan.training
    if par.cp == 1:
        return []
    ring_tpu = par.cp_comm == CpComm.P2P and on_tpu(plan)
    return [
        (par.cp_comm not in CP_STRATEGY, "parallel.cp_comm", par.cp_comm.value,
         "context_parallel_strategy all_gather (all_gather) and ring (p2p) are written"),
        (par.zero != ZeroStage.WEIGHTS, "parallel.zero", int(par.zero),
         "MaxText shards parameters over its context axis as over fsdp (the embed rule): ZeRO-3 with parallel.cp"),
        (par.tp * par.cp > min(plan.cluster.nvlink_domain, par.gpus), "parallel.cp", par.cp,
         "ici_context_parallelism is written inside a slice (dcn_context_parallelism is not)"),
        (ring_tpu and not tr.flash_attention, "training.flash_attention", False,
         "MaxText's ring strategy on a TPU runs Tokamax's splash kernel (attention=flash)"),
        (ring_tpu and (par.cp % 2 or m.seq_len % (par.cp * par.cp)), "parallel.cp", par.cp,
         "MaxText's ring on a TPU needs an even context axis whose square divides max_target_length"),
        (ring_tpu and m.dropout > 0, "model.dropout", m.dropout, "MaxText's ring on a TPU runs without dropout"),
    ]


def _refusals(plan: Plan) -> list[tuple[bool, str, object, str]]:
    """(refused, field, value, why) for everything MaxText's options here cannot state."""
    m, par, tr = plan.model, plan.parallel, plan.training
    later = "MaxText has it; trainplan does not write its options yet"
    return [
        (par.pp > 1, "parallel.pp", par.pp, later + " (ici_pipeline_parallelism, num_layers_per_pipeline_stage)"),
        (m.moe, "model.experts", m.experts, later + " (its MoE decoder blocks and ici_expert_parallelism)"),
        (par.zero == ZeroStage.GRADIENTS, "parallel.zero", 2, "its fsdp axis shards parameters too (ZeRO-3) and "
         "shard_optimizer_over_data the optimizer states only (ZeRO-1)"),
        (m.mla, "model.kv_lora_rank", m.kv_lora_rank, "the llama2 block is grouped-query attention"),
        (m.norm.value != "rmsnorm", "model.norm", m.norm.value, "the llama2 block is RMSNorm"),
        (m.position_embedding.value != "rope", "model.position_embedding", m.position_embedding.value,
         "the llama2 block is RoPE"),
        (m.bias.value != "none", "model.bias", m.bias.value, "the llama2 block's projections have no bias"),
        (m.qk_norm.value != "none", "model.qk_norm", m.qk_norm.value, "the llama2 block has no QK norm"),
        (m.attention_sinks, "model.attention_sinks", True, "the llama2 block has no sinks"),
        (m.activation.value not in ACTIVATIONS, "model.activation", m.activation.value,
         f"mlp_activations written: {', '.join(ACTIVATIONS)}"),
        (bool(m.sliding_window or m.linear_attention or m.sparse_attention), "model.sliding_window", m.sliding_window,
         "other attention variants are not written"),
        (m.mtp_layers > 0, "model.mtp_layers", m.mtp_layers, "the llama2 block has no MTP modules"),
        (tr.precision not in DTYPE, "training.precision", tr.precision.value, "bf16 or fp32 are written"),
        (tr.recompute not in REMAT or tr.recompute == Recompute.FULL and (tr.recompute_layers, tr.recompute_method)
         != (1, RecomputeMethod.UNIFORM), "training.recompute", recompute_doc(tr),
         "remat_policy full (every layer), minimal (recompute: dots; selective's nearest) and minimal_with_context "
         "(none) are written"),
        (tr.activation_offload > 0, "training.activation_offload", tr.activation_offload,
         "its offloading remat policies are not written"),
        (par.kv_replicator > 1, "parallel.kv_replicator", par.kv_replicator, "MaxText copies no key/value heads"),
        (par.zero == ZeroStage.OPTIMIZER_STATES and par.dp_replicate > 1, "parallel.dp_replicate", par.dp_replicate,
         "shard_optimizer_over_data shards the optimizer states over the whole data axis"),
        (tr.optimizer.value not in OPTIMIZERS, "training.optimizer", tr.optimizer.value,
         f"opt_type written: {', '.join(OPTIMIZERS)}"),
        (tr.optimizer_in_backward, "training.optimizer_in_backward", True, "its optimizer steps after the backward"),
        (tr.grad_compression.value != "none", "training.grad_compression", tr.grad_compression.value,
         "its gradients are reduced in grad_dtype"),
        *_cp_refusals(plan),
    ]


def mesh(plan: Plan) -> list[tuple[str, int]]:
    """MaxText's mesh axes for ``plan`` (the module docstring); ValueError where a group would straddle
    slices in a way MaxText's axes cannot hold."""
    par = plan.parallel
    slice_ = min(plan.cluster.nvlink_domain, plan.parallel.gpus)
    inner = par.tp * par.cp   # the tensor and context axes, inside a slice
    if slice_ % inner:
        raise ValueError(f"parallel.tp={par.tp} has no MaxText option: ici_tensor_parallelism"
                         f"{' x ici_context_parallelism' if par.cp > 1 else ''} must divide the {slice_} devices "
                         "of a slice")
    head = [("ici_tensor_parallelism", par.tp)] + ([("ici_context_parallelism", par.cp)] if par.cp > 1 else [])
    room = slice_ // inner   # data-parallel ranks in a slice
    if par.zero != ZeroStage.WEIGHTS:
        return head + [("ici_data_parallelism", room), ("dcn_data_parallelism", par.dp // room)]
    shards, replicas = par.dp // par.dp_replicate, par.dp_replicate
    if room % shards == 0 and replicas % (room // shards) == 0:   # the shard group inside a slice
        return head + [("ici_fsdp_parallelism", shards), ("ici_data_parallelism", room // shards),
                       ("dcn_data_parallelism", replicas // (room // shards))]
    if shards % room == 0:                                          # the shard group spans slices
        return head + [("ici_fsdp_parallelism", room), ("dcn_fsdp_parallelism", shards // room),
                       ("dcn_data_parallelism", replicas)]
    raise ValueError(f"parallel.dp_replicate={replicas} has no MaxText option: its shard groups of {shards} do not "
                     f"tile slices of {room} data-parallel ranks")


def maxtext_args(plan: Plan) -> list[tuple[str, object]]:
    """The (key, value) overrides of ``plan``; ValueError naming the first field MaxText cannot hold."""
    for refused, field_, value, why in _refusals(plan):
        if refused:
            raise ValueError(f"{field_}={value} has no MaxText option: {why}")
    m, par, tr = plan.model, plan.parallel, plan.training
    args = [("decoder_block", "llama2"), ("base_emb_dim", m.hidden), ("base_num_query_heads", m.heads),
            ("base_num_kv_heads", m.kv_heads), ("head_dim", m.head_dim), ("base_mlp_dim", m.ffn_hidden),
            ("base_num_decoder_layers", m.layers), ("vocab_size", m.vocab),
            ("mlp_activations", ACTIVATIONS[m.activation.value]), ("logits_via_embedding", m.tied_embeddings),
            ("max_target_length", m.seq_len), ("rope_max_timescale", int(m.rope_base)),
            ("enable_dropout", m.dropout > 0), ("dropout_rate", m.dropout),
            *mesh(plan), ("shard_optimizer_over_data", par.zero == ZeroStage.OPTIMIZER_STATES),
            ("per_device_batch_size", tr.micro_batch / (par.tp * par.pp * par.cp)),
            ("gradient_accumulation_steps", plan.num_microbatches),
            ("dtype", DTYPE[tr.precision]), ("weight_dtype", "float32" if tr.master_weights else DTYPE[tr.precision]),
            ("opt_type", OPTIMIZERS[tr.optimizer.value]), ("remat_policy", REMAT[tr.recompute]),
            ("attention", ("flash" if on_tpu(plan) else "cudnn_flash_te") if tr.flash_attention else "dot_product")]
    if not on_tpu(plan):
        args.append(("hardware", "gpu"))
    if par.cp > 1:
        args.append(("context_parallel_strategy", CP_STRATEGY[par.cp_comm]))
        if par.cp_comm == CpComm.P2P and on_tpu(plan):
            args.append(("use_tokamax_splash", True))
    if tr.offload != Offload.NONE:
        args += [("optimizer_memory_host_offload", True),
                 ("parameter_memory_host_offload", tr.offload == Offload.OPTIMIZER_PARAMS)]
    return args


def _value(v) -> str:
    """A value as MaxText's command line takes it (OmegaConf-style: lists in brackets, booleans lower case)."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list):   # OmegaConf.from_cli reads [a,b] as a list of strings: no quotes for the shell
        return "[" + ",".join(str(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def export_maxtext(plan: Plan) -> str:
    """The launch (a shell command) for ``plan``: MaxText's module, base.yml and the overrides."""
    args = maxtext_args(plan)
    head = [f"# trainplan export (maxtext): {plan.name or 'plan'} on {plan.cluster.gpus} x "
            f"{plan.cluster.node.gpu.name}; keys as base.yml defines them at {COMMIT}",
            "# add run_name, base_output_directory and the dataset (dataset_type, ...) of your run"]
    if plan.training.recompute == Recompute.SELECTIVE:
        head.append(REMAT_NOTE)
    lines = [LAUNCH] + [f"{k}={_value(v)}" for k, v in args]
    return "\n".join(head) + "\n" + " \\\n    ".join(lines) + "\n"
