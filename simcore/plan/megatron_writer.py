"""The model's Megatron-LM options (pretrain_gpt.py, NVIDIA/Megatron-LM commit d98e8a64, options as
its parser defines them: ``megatron_args.yaml``), and what the export says of what a Plan cannot state.

A ModelSpec states the shapes (layers, widths, heads, experts, MLA ranks, windows), whether the MLP
is gated, the positions, tied embeddings, the rotary base, dropout and the block's properties
(``simcore.plan.model_props``): the norm (--normalization), the biased linear layers
(--disable-bias-linear, --add-qkv-bias), the MLP's activation (--swiglu, --quick-geglu with GPT-OSS's
--glu-linear-offset and --activation-func-clamp-value, --squared-relu; Megatron's default F.gelu), QK
norm (--qk-layernorm, --qk-l2-norm) and sinks (--softmax-type learnable), each as
``core_transformer_config_from_args`` (megatron/training/argument_utils.py @d98e8a64) builds it. A
property Megatron has no option for (GeGLU, ReLU, attention-only biases, OLMo 2's whole-projection QK
norm) is refused in one sentence naming the field (``megatron_block``).
"""
from __future__ import annotations

from simcore.plan.megatron_block import activation_args, block_args
from simcore.plan.spec import MEGATRON_DROPOUT, Plan, PlanError


def _refuse(field_: str, value, why: str) -> ValueError:
    return ValueError(f"{field_}={value} has no Megatron-LM option: {why}")


def megatron_model_note(plan: Plan) -> list[str]:
    """Comment lines for the script's head: the block as written, and what the Plan cannot state."""
    m = plan.model
    return [f"# The block: {m.norm.value}, linear biases {m.bias.value}, {m.activation.value} MLP, QK norm "
            f"{m.qk_norm.value}, {'learned' if m.attention_sinks else 'no'} attention sinks (the Plan's model fields);",
            "# the Plan has no field for the residual layout: written pre-norm and sequential (not GPT-NeoX's parallel",
            "# attention and MLP, nor Gemma's norms after attention and MLP)."]


def megatron_model_args(plan: Plan) -> list:
    m = plan.model
    dense_ffn = m.dense_ffn_hidden or m.ffn_hidden  # --ffn-hidden-size is the dense layers' width
    args = [("--num-layers", m.layers), ("--hidden-size", m.hidden), ("--ffn-hidden-size", dense_ffn),
            ("--num-attention-heads", m.heads)]
    if m.kv_heads != m.heads:
        args += [("--group-query-attention", None), ("--num-query-groups", m.kv_heads)]
    if m.kv_channels and not m.mla:
        args.append(("--kv-channels", m.kv_channels))
    args += [("--seq-length", m.seq_len), ("--max-position-embeddings", m.seq_len), ("--padded-vocab-size", m.vocab),
             ("--position-embedding-type", "rope" if m.position_embedding.value == "rope" else "learned_absolute")]
    if m.position_embedding.value == "rope":  # the model's rotary base
        if m.rope_base != int(m.rope_base):
            raise _refuse("model.rope_base", m.rope_base, "--rotary-base takes an integer")
        args.append(("--rotary-base", int(m.rope_base)))
    args += block_args(m)
    if m.dropout != MEGATRON_DROPOUT:   # Megatron's default for both
        args += [("--hidden-dropout", m.dropout), ("--attention-dropout", m.dropout)]
    args += activation_args(m)
    args += _window_args(m)
    if not m.tied_embeddings:
        args.append(("--untie-embeddings-and-output-weights", None))
    if m.mla:
        args += [("--multi-latent-attention", None), ("--q-lora-rank", m.q_lora_rank or None),
                 ("--kv-lora-rank", m.kv_lora_rank), ("--qk-head-dim", m.kv_channels),
                 ("--qk-pos-emb-head-dim", m.qk_rope_head_dim), ("--v-head-dim", m.v_head_dim)]
        args = [(o, v) for o, v in args if not (o == "--q-lora-rank" and v is None)]
    if m.moe:
        args += _moe_args(m)
    if m.mtp_layers:   # on the last pipeline stage, Megatron-Core's default (multi_token_prediction.py @d98e8a64)
        args.append(("--mtp-num-layers", m.mtp_layers))
    return args


def _moe_args(m) -> list:
    """MoE options. A capacity factor of 1.0 is the plan's balanced routing, which Megatron
    runs dropless (no --moe-expert-capacity-factor: its default, token dropping off)."""
    args = [("--num-experts", m.experts), ("--moe-router-topk", m.top_k)]
    if m.capacity_factor != 1.0:
        args.append(("--moe-expert-capacity-factor", m.capacity_factor))
    if m.dense_ffn_hidden:
        args = [("--moe-ffn-hidden-size", m.ffn_hidden)] + args
    if m.shared_ffn_hidden:
        args.append(("--moe-shared-expert-intermediate-size", m.shared_ffn_hidden))
    if m.moe_layers:   # Megatron evaluates a list expression (arguments.py ``moe_freq_type``)
        args.append(("--moe-layer-freq", "[" + ",".join("0" if m.is_dense_layer(i) else "1" for i in range(m.layers)) + "]"))
    elif m.dense_layers:
        args.append(("--moe-layer-freq", f"([0]*{m.dense_layers}+[1]*{m.layers - m.dense_layers})"))
    return args


def _window_args(m) -> list:
    """Megatron-Core's sliding window: ``window_size`` (left, right) keys beside the query's own,
    and ``window_attn_skip_freq`` N, one full-attention layer in N (transformer/utils.py)."""
    if not m.sliding_window:
        return []
    args = [("--window-size", f"{m.sliding_window - 1},0")]
    if m.sliding_window_layers < 1.0:
        n = round(1.0 / (1.0 - m.sliding_window_layers))
        if abs((n - 1) / n - m.sliding_window_layers) > 1e-9:
            raise _refuse("model.sliding_window_layers", m.sliding_window_layers,
                          "--window-attn-skip-freq N windows N-1 layers in N")
        args.append(("--window-attn-skip-freq", n))
    return args


def account_split(layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> list[int]:
    """Megatron's split with the embedding and the loss counted as a layer each
    (``--account-for-embedding/loss-in-pipeline-split``): L + e + l over pp x vpp virtual stages,
    uniform, the first one short of the embedding and the last of the loss (transformer_layer.py
    ``get_transformer_layer_offset``; the divisibility is transformer_config.py's, 2369-2413, @d98e8a64)."""
    total = layers + embedding + loss
    if total % pp or (total // pp) % vpp:
        raise PlanError(f"megatron --account-for-embedding/loss-in-pipeline-split: {layers} layers + "
                        f"{embedding + loss} do not divide over pipeline-model-parallel-size {pp}"
                        + (f" x {vpp} virtual stages" if vpp > 1 else "") + " (Megatron's ValueError)")
    per = total // (pp * vpp)
    split = [per] * (pp * vpp)
    split[0] -= embedding
    split[-1] -= loss
    return split
