"""torchtitan 0.3's ``gpt_oss`` module as an export target and an import: which named config a Plan's
model is, what that module cannot run that the Plan asks, and what it builds that no Plan field states.

What the module builds was read from the torchtitan 0.3.0 wheel (the installed package):

- torchtitan/models/gpt_oss/config_registry.py: ``gpt_oss_20b`` and ``gpt_oss_120b`` call
  ``model_registry("20b"|"120b")`` with no converter and no model option (attention ``varlen``, MoE
  all-to-all ``standard``), local_batch_size 1, seq_len 8192, full activation checkpointing; its
  other configs build the 4-layer debug model, which no export writes.
- torchtitan/models/gpt_oss/__init__.py ``_20b``/``_120b``: 24 or 36 layers of width 2880, 64 query
  heads and 8 key/value heads of width 64, a fused QKV projection and an output projection, both
  biased, and a learned sink logit per head (``Attention.sinks``, model.py); even layers (0, 2, ...)
  attend to a 128-token window (varlen ``window_size`` (127, 0)), odd ones to the whole prefix; RoPE
  theta 150000 for 131072 positions with YaRN scaling (factor 32 over 4096 positions, beta_fast 32,
  beta_slow 1, untruncated; model.py multiplies the softmax scale by (1 + 0.1 ln 32)^2); RMSNorm; an
  untied, bias-free output layer; in every layer an MoE of 32 or 128 experts, top-4, a biased softmax
  router renormalised over the chosen experts (``route_norm``), no shared expert, dropless, balanced
  by the expert bias (``load_balance_coeff`` 1e-3, a buffer); each expert biased, of width 2880, with
  GPT-OSS's clamped GLU (moe.py ``swiglu``: alpha 1.702, limit 7, the linear half offset by 1), its
  grouped GEMMs cast to bfloat16 (``GptOssGroupedExperts.forward``). No dropout.
- torchtitan/models/gpt_oss/parallelize.py: TP (the sinks split over heads, sharding.py), EP, PP
  (``pipeline_llm``), activation checkpointing, compile, FSDP2/HSDP as llama3's and the experts' FSDP
  over ``efsdp`` where ep > 1; EP borrows ranks from FSDP and TP as in qwen3
  (torchtitan/config/configs.py ``expert_parallel_degree``, models/common/moe_sharding.py); context
  parallel raises for varlen attention (torchtitan/distributed/context_parallel/api.py
  ``apply_cp_to_forward``: "Variable-length attention CP is not yet supported"), which is flash-attn's
  kernel, the only one whose output the sinks rescale (model.py ``_apply_sinks``, by its log-sum-exp).
- torchtitan/models/common/decoder.py ``Decoder.Config.update_from_config``: TP must divide the 8
  key/value heads, and a training.seq_len above the RoPE's 131072 positions raises.

The Plan states the window as a share of the layers (``model.sliding_window_layers`` 0.5, as its
Hugging Face import reads ``layer_types``), not which layers: torchtitan's alternation is GPT-OSS's own
(``layer_types`` starts with ``sliding_attention``). No Plan field states RoPE scaling or how the
routers are balanced: the export says so in its comments (``gpt_oss_notes``). Copied key/value heads,
MTP modules and Gated DeltaNet layers every torchtitan export refuses (``simcore.plan.writers.export_plan``).
trainplan's parameter count (``simcore.model.params``) holds the routers' biases (one per expert a layer under
``model.bias: all``), so it is the count torchtitan and transformers build.
"""
from __future__ import annotations

from simcore.plan.spec import PlanError
from simcore.plan.torchtitan_named import config_of, expert_layout_refusals, shape_refusal

#: The two named configs an export writes, as Plan fields (``head_dim`` is ``model.kv_channels``, MoE
#: ``ffn_hidden`` an expert's width): torchtitan/models/gpt_oss/__init__.py ``_20b``, ``_120b``.
CONFIGS = {
    "gpt_oss_20b": {"flavor": "20b", "layers": 24, "hidden": 2880, "heads": 64, "kv_heads": 8, "head_dim": 64,
                    "ffn_hidden": 2880, "vocab": 201088, "tied_embeddings": False, "experts": 32, "top_k": 4},
    "gpt_oss_120b": {"flavor": "120b", "layers": 36, "hidden": 2880, "heads": 64, "kv_heads": 8, "head_dim": 64,
                     "ffn_hidden": 2880, "vocab": 201088, "tied_embeddings": False, "experts": 128, "top_k": 4},
}
ROPE_THETA, MAX_SEQ_LEN = 150_000.0, 131072   # every config's CosSinRoPE.Config (theta, max_seq_len)
YARN = {"rope_factor": 32, "original_seq_len": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
WINDOW, WINDOWED_SHARE = 128, 0.5   # sliding_window_size 128 where layer_id % 2 == 0
#: What each config function sets beyond the dataclass defaults, as ``torchtitan_configs.yaml`` holds the
#: other modules' (bench/dump_torchtitan_configs.py reads llama3, deepseek_v3 and qwen3 only).
_SOURCE = "torchtitan/models/gpt_oss/config_registry.py (torchtitan 0.3.0 wheel)"
REGISTRY = {name: {"module": "gpt_oss", "source": _SOURCE, "flavor": c["flavor"],
                   "sections": {"training": {"local_batch_size": 1, "seq_len": 8192, "steps": 10000},
                                "parallelism": {"expert_parallel_degree": 1},
                                "activation_checkpoint": {"mode": "full"}}}
            for name, c in CONFIGS.items()}
_INIT = "torchtitan/models/gpt_oss/__init__.py"
_DECODER = "torchtitan/models/common/decoder.py"
_BLOCK = (f"torchtitan 0.3's gpt_oss model is RMSNorm, with biased attention, experts and router, a learned "
          f"sink per head, GPT-OSS's clamped GLU, RoPE theta 150000, a {WINDOW}-token window on every other "
          f"layer and no dropout ({_INIT}, model.py, moe.py)")


def is_gpt_oss(m) -> bool:
    """Whether a Plan's model goes to torchtitan's gpt_oss module: GPT-OSS's clamped GLU, an MoE with
    attention sinks, or a model named GPT-OSS (the llama3 and qwen3 modules build none of these)."""
    name = m.name.lower().rsplit("/", 1)[-1]
    return m.activation.value == "oss_glu" or (m.attention_sinks and m.moe) or name.startswith(("gpt-oss", "gpt_oss"))


def gpt_oss_config(m) -> str | None:
    """The named config that builds this model's shape, or None."""
    return config_of(m, CONFIGS)


def _block_refusals(m) -> list[tuple]:
    """The block both configs build (the module docstring); the first the Plan's model breaks."""
    return [(m.norm.value != "rmsnorm", "model.norm", m.norm.value, _BLOCK),
            (m.bias.value != "all", "model.bias", m.bias.value, _BLOCK),
            (not m.gated_mlp, "model.gated_mlp", "false", _BLOCK),
            (m.activation.value != "oss_glu", "model.activation", m.activation.value, _BLOCK),
            (m.qk_norm.value != "none", "model.qk_norm", m.qk_norm.value, _BLOCK),
            (not m.attention_sinks, "model.attention_sinks", "false", _BLOCK),
            (m.position_embedding.value != "rope", "model.position_embedding", m.position_embedding.value, _BLOCK),
            (m.rope_base != ROPE_THETA, "model.rope_base", m.rope_base, _BLOCK),
            (m.sliding_window != WINDOW, "model.sliding_window", m.sliding_window, _BLOCK),
            (m.sliding_window_layers != WINDOWED_SHARE, "model.sliding_window_layers", m.sliding_window_layers,
             _BLOCK + ": half the layers windowed"),
            (m.kv_lora_rank > 0, "model.kv_lora_rank", m.kv_lora_rank, _BLOCK + ": grouped-query attention"),
            (m.dropout != 0, "model.dropout", m.dropout, _BLOCK)]


def _moe_refusals(plan, name: str) -> list[tuple]:
    """The config's MoE and how torchtitan lays its experts out (the module docstring)."""
    m, par = plan.model, plan.parallel
    moe = (f"{name} routes every layer's tokens to {m.top_k} of {m.experts} experts, dropless, with no shared "
           f"expert ({_INIT})")
    dense = "model.moe_layers" if m.moe_layers else "model.dense_layers"
    return [
        (m.shared_ffn_hidden > 0, "model.shared_ffn_hidden", m.shared_ffn_hidden, moe),
        (m.dense_count > 0, dense, list(m.moe_layers) if m.moe_layers else m.dense_layers, moe),
        (m.capacity_factor != 1.0, "model.capacity_factor", m.capacity_factor, moe),
        (par.moe_dispatcher.value != "alltoall", "parallel.moe_dispatcher", par.moe_dispatcher.value,
         f"{name}'s config_registry function leaves moe_comm_backend at standard, torch's all-to-all "
         f"({_INIT} model_registry), and the command line cannot change it"),
        (par.moe_a2a_overlap, "parallel.moe_a2a_overlap", "true", "its expert all-to-alls block (Megatron-Core's "
         "combined 1F1B schedule pairs them)"),
    ] + expert_layout_refusals(plan, "gpt_oss",
                               "torchtitan/models/gpt_oss/sharding.py, models/common/moe_sharding.py")


def _run_refusals(plan, name: str) -> list[tuple]:
    """What the config builds that the Plan's layout or training cannot run as it says."""
    m, par, tr = plan.model, plan.parallel, plan.training
    return [
        (par.cp > 1, "parallel.cp", par.cp,
         f"{name} attends through varlen (model_registry's attn_backend, which the command line cannot change) "
         "and torchtitan 0.3 raises \"Variable-length attention CP is not yet supported\" "
         "(torchtitan/distributed/context_parallel/api.py apply_cp_to_forward)"),
        (not tr.flash_attention, "training.flash_attention", "false",
         f"{name} attends only through flash-attn's variable-length kernel, whose log-sum-exp its sinks rescale "
         "(torchtitan/models/gpt_oss/model.py Attention._apply_sinks)"),
        (tr.precision.value == "fp32", "training.precision", "fp32",
         f"{name}'s experts cast their grouped GEMMs to bfloat16 whatever the parameters' dtype "
         "(torchtitan/models/gpt_oss/moe.py GptOssGroupedExperts.forward)"),
        (m.seq_len > MAX_SEQ_LEN, "model.seq_len", m.seq_len,
         f"{name}'s RoPE is built for {MAX_SEQ_LEN} positions and a longer training.seq_len raises ({_DECODER})"),
    ]


def gpt_oss_refusals(plan) -> list[tuple]:
    """(broken, field, value, why) for what torchtitan 0.3's gpt_oss module cannot build or run as the
    Plan says: the block, then the shape (the nearest config named), then the MoE and the run."""
    m = plan.model
    block = _block_refusals(m)
    if any(bad for bad, *_ in block):
        return block
    name = gpt_oss_config(m)
    if name is None:
        return [shape_refusal(m, CONFIGS, "gpt_oss")]
    return _moe_refusals(plan, name) + _run_refusals(plan, name)


def gpt_oss_notes(m) -> list[str]:
    """Comment lines for the script: what the config builds beside the Plan's fields (no Plan field
    states it), so that the command says which model it builds."""
    name = gpt_oss_config(m)
    return [f"# {name} builds what the Plan's model states (torchtitan/models/gpt_oss/__init__.py: sinks, biases, "
            f"clamped GLU, a {WINDOW}-token window on even layers), and beside it, with no Plan field:",
            f"#   RoPE theta {ROPE_THETA:.0f} with YaRN scaling (factor {YARN['rope_factor']} over "
            f"{YARN['original_seq_len']} positions, beta_fast {YARN['beta_fast']:g}, beta_slow "
            f"{YARN['beta_slow']:g}; the softmax scale times (1 + 0.1 ln {YARN['rope_factor']})^2);",
            "#   softmax routers renormalised over the top-k, balanced by an expert bias (load_balance_coeff 1e-3), "
            "not an auxiliary loss."]


def gpt_oss_registry(name: str) -> dict:
    """``REGISTRY`` for the reader, which reads ``torchtitan_configs.yaml`` for the other modules; a
    gpt_oss config other than the two is refused in one sentence (any other name the reader refuses)."""
    if name.startswith("gpt_oss") and name not in REGISTRY:
        raise PlanError(f"torchtitan --config {name}: trainplan reads the gpt_oss module's {' and '.join(CONFIGS)} "
                        f"only, the shapes of {_INIT} (its other configs build the debug model)")
    return REGISTRY


def gpt_oss_fields(flavor: str) -> dict | None:
    """A ``--module gpt_oss`` flavor as Plan keys (``CONFIGS`` and the block both build), or None."""
    c = next((c for c in CONFIGS.values() if c["flavor"] == flavor), None)
    if c is None:
        return None
    keys = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "tied_embeddings", "experts", "top_k")
    return {**{f"model.{k}": c[k] for k in keys}, "model.kv_channels": c["head_dim"], "model.gated_mlp": True,
            "model.position_embedding": "rope", "model.rope_base": ROPE_THETA, "model.dropout": 0.0,
            "model.sliding_window": WINDOW, "model.sliding_window_layers": WINDOWED_SHARE, "model.bias": "all",
            "model.activation": "oss_glu", "model.attention_sinks": True}
