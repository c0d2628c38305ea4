"""How much of the s x s score block a flash attention kernel computes: causal masking and
sliding windows (``model.sliding_window`` tokens on ``model.sliding_window_layers`` of the layers).

A flash kernel walks key tiles and skips the ones its mask leaves empty (Dao 2023,
"FlashAttention-2", Sec. 3.1.1 "causal masking"): half the block under a causal mask. Under a
sliding window of w tokens a tile of queries touches the key tiles of its window and the one
its edge cuts, about w + one key tile of keys per query. The tile is FlashAttention-2's forward
key block (csrc/flash_attn/src/flash_fwd_launch_template.h: ``kBlockN`` 128 for head dims 64
and 128 on sm80/sm90); Transformer Engine's cuDNN kernels tile likewise. Megatron-Core's
``window_size`` / ``window_attn_skip_freq``, Hugging Face's ``sliding_window`` with
``layer_types`` (Gemma 2 and GPT-OSS alternate, Gemma 3 keeps one global layer in six,
Mistral 7B v0.1 and Phi-3 window every layer) name the same two numbers.
"""
from __future__ import annotations

from simcore.model import dsa

#: Fraction of the s x s attention block a causal FlashAttention kernel computes.
CAUSAL_FLASH_FRACTION = 0.5
#: Keys in one tile of FlashAttention-2's forward kernel (``kBlockN``, the module docstring).
FLASH_KEY_TILE = 128


def attention_fraction(model, s_kv: int) -> float:
    """The share of a (queries x ``s_kv`` keys) causal score block the flash kernel computes,
    averaged over the layers: windowed layers compute (w + tile) / s_kv of it, at most the
    causal half; the others the causal half; DeepSeek Sparse Attention's kernels each query's
    selected keys (``dsa.attention_share``)."""
    if model.sparse_attention is not None:
        return dsa.attention_share(model, s_kv)
    w = model.sliding_window
    if not w or w + FLASH_KEY_TILE >= s_kv * CAUSAL_FLASH_FRACTION:
        return CAUSAL_FLASH_FRACTION
    share = model.sliding_window_layers
    return share * (w + FLASH_KEY_TILE) / s_kv + (1.0 - share) * CAUSAL_FLASH_FRACTION
