"""Megatron's attention softmax without flash attention: its fused causal scale-mask-softmax
kernel runs only for some shapes; the others fall back to torch ops in fp32, with more kernels,
more traffic and an fp32 output kept for the backward (``workload.attention_core_ops``,
``workload.activation_bytes_per_layer``)."""
from __future__ import annotations


#: Megatron's unfused softmax (``FusedScaleMaskSoftmax.forward_torch_softmax``, taken when the
#: fused kernel cannot run): with query-key layer scaling the softmax runs in fp32, so five
#: kernels (upcast 2+4 bytes, scale 4+4, in-place causal mask fill 4+1+4, softmax 4+4, downcast
#: 4+2: 37 bytes an element) where the fused kernel reads and writes 16 bits once.
FP32_SOFTMAX_KERNELS = 5
FP32_SOFTMAX_BYTES = 37.0


def fused_softmax(attn_batches: int, sq: int, sk: int) -> bool:
    """Whether Megatron's fused causal scale-mask-softmax kernel runs for ``attn_batches`` =
    micro-batch x local heads score matrices of sq x sk (``FusedScaleMaskSoftmax.is_kernel_available``,
    Megatron-LM megatron/model/fused_softmax.py @e1c334b076, unchanged in
    megatron/core/fusions/fused_softmax.py @d98e8a64): 16 < sk <= 4096, sq and sk multiples of 4,
    attn_batches a multiple of 4 and of the kernel's batches per block (128 threads of warps of
    min(32, pow2(sk)) lanes, two batches a warp up to 128 keys). Else it falls back to torch ops."""
    if not (16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and attn_batches % 4 == 0):
        return False
    pow2 = 1 << (sk - 1).bit_length()
    per_block = (128 // min(32, pow2)) * (2 if pow2 <= 128 else 1)
    return attn_batches % per_block == 0
