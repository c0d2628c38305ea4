"""A model's shape as a Hugging Face config.json object (``hf_config_from_model``), in the field
names of the family that builds it; ``simcore.plan.writers`` re-exports it beside the launch files."""
from __future__ import annotations


def hf_config_from_model(model) -> dict:
    """A Hugging Face config.json object with ``model``'s shape (a ModelSpec): Llama
    field names for dense RoPE models, Mixtral's for MoE, GPT-2's for learned positions,
    GPT-NeoX's for ungated RoPE models."""
    m = model
    rope = m.position_embedding.value == "rope"
    if not rope:
        if m.gated_mlp or m.kv_heads != m.heads or m.moe:
            raise ValueError(f"model {m.name}: no Hugging Face family here has learned positions with "
                             "gated MLP, grouped-query attention or experts")
        return {"model_type": "gpt2", "n_layer": m.layers, "n_embd": m.hidden, "n_head": m.heads,
                "n_inner": m.ffn_hidden, "vocab_size": m.vocab, "n_positions": m.seq_len,
                "tie_word_embeddings": m.tied_embeddings,
                "resid_pdrop": m.dropout, "embd_pdrop": m.dropout, "attn_pdrop": m.dropout}
    cfg = {"model_type": "llama" if m.gated_mlp else "gpt_neox", "num_hidden_layers": m.layers,
           "hidden_size": m.hidden, "num_attention_heads": m.heads, "num_key_value_heads": m.kv_heads,
           "intermediate_size": m.ffn_hidden, "vocab_size": m.vocab, "max_position_embeddings": m.seq_len,
           "tie_word_embeddings": m.tied_embeddings, "rope_theta": m.rope_base,
           "attention_dropout": m.dropout}   # the rotary families' one dropout field (NeoX: also hidden)
    if cfg["model_type"] == "gpt_neox":
        cfg["hidden_dropout"] = m.dropout
    if m.kv_channels:
        cfg["head_dim"] = m.kv_channels
    if m.mla:  # DeepSeek-V3's field names (configuration_deepseek_v3.py)
        cfg.update(model_type="deepseek_v3", n_routed_experts=m.experts, num_experts_per_tok=m.top_k,
                   moe_intermediate_size=m.ffn_hidden, intermediate_size=m.dense_ffn_hidden or m.ffn_hidden,
                   n_shared_experts=m.shared_ffn_hidden // m.ffn_hidden if m.moe else 0,
                   first_k_dense_replace=_dense_prefix(m), q_lora_rank=m.q_lora_rank or None,
                   kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.kv_channels,
                   qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim, num_nextn_predict_layers=m.mtp_layers)
        cfg.pop("head_dim", None)
        if (sa := m.sparse_attention) is not None:   # DeepSeek-V3.2's (configuration_deepseek_v32.py)
            cfg.update(model_type="deepseek_v32", index_topk=sa.topk, index_n_heads=sa.heads, index_head_dim=sa.head_dim)
        return cfg
    if m.moe and (m.shared_ffn_hidden or m.dense_count or m.dense_ffn_hidden):  # Qwen2-MoE's names
        cfg.update(model_type="qwen2_moe", num_experts=m.experts, num_experts_per_tok=m.top_k,
                   moe_intermediate_size=m.ffn_hidden, intermediate_size=m.dense_ffn_hidden or m.ffn_hidden,
                   shared_expert_intermediate_size=m.shared_ffn_hidden, decoder_sparse_step=1,
                   mlp_only_layers=[i for i in range(m.layers) if m.is_dense_layer(i)])
        return cfg
    if m.moe:
        if not m.gated_mlp:
            raise ValueError(f"model {m.name}: an ungated MoE model has no Hugging Face family here")
        cfg.update(model_type="mixtral", num_local_experts=m.experts, num_experts_per_tok=m.top_k)
    if m.sliding_window:   # Mistral and Mixtral window every layer (modeling_mistral, modeling_mixtral)
        if m.sliding_window_layers < 1.0 or not m.gated_mlp:
            raise ValueError(f"model {m.name}: model.sliding_window_layers={m.sliding_window_layers:g} has no "
                             "Hugging Face family here (Mistral and Mixtral window every layer)")
        cfg.update(model_type="mixtral" if m.moe else "mistral", sliding_window=m.sliding_window)
    return cfg


def _dense_prefix(m) -> int:
    """DeepSeek's ``first_k_dense_replace``: the dense layers as a prefix (ValueError where they interleave)."""
    mask, k = [m.is_dense_layer(i) for i in range(m.layers)], m.dense_count
    if mask != [True] * k + [False] * (m.layers - k):
        raise ValueError(f"model {m.name}: model.moe_layers interleaves dense layers, which DeepSeek-V3's "
                         "first_k_dense_replace cannot state")
    return k
