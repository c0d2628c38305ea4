"""The kernels eager PyTorch stacks run beyond the fused 16-bit set the workload model counts
(``workload.layer_forward_ops``: Megatron-Core / Transformer Engine fusions, torch.compile).
Two stacks: the executor's eager autocast (``layer_ops``) and the uncompiled modules of
``training.kernels: eager`` (``python_layer_ops``).

On a GPU in bf16 or fp16 the executor (``executors.model``) runs torch autocast over fp32 master
weights, uncompiled: the embedding's output and so the residual stream stay fp32, the norms run
in fp32 (autocast's fp32 list), every linear casts its own input to 16 bits (the attention
norm's output three times, for wq, wk and wv; the MLP norm's for w1 and w3), every weight is
cast to 16 bits once per micro-batch (autocast's cache lives for one forward), rotary embeddings
run as five eager kernels on q and on k (``apply_rope``: neg, cat, two muls, add), SwiGLU as
``silu`` then ``mul``, the attention output is transposed back into a copy, and the loss upcasts
the logits to fp32. Each is a memory-bound pass whose bytes are counted here, as the extra over
what the fused set already charges. Their launches are not counted (``Op.uncounted``): the
profile's per-kernel host and launch costs are per modelled kernel of an eager layer
(``executors.calibrate.probes.bench_host_overhead``). That probe layer is GPT-style and fp32, so
autocast's casts and the RoPE and SwiGLU kernels launch more than it carries (on torch's CPU
dispatch, 22 and 34 aten kernels forward and backward under autocast against its 12 and 22):
where the host bounds a phase (micro-batch 1) the prediction stays 27-38% fast. ``trainplan
calibrate`` now also times the probe layer under autocast on a GPU (``autocast_host_factor``,
``host_factor``); the H100 and H200 profiles predate it.

Measured (bench/RESULTS.md, twenty-fifth session): the bf16 steps of the 0.9B Llama-style
matrix ran 26% (H200) and 30% (H100) longer than the fused set predicts, 11-13 ms per
micro-batch forward and 16-22 ms backward; these counts give 8-11 and 12-17 ms.

``training.kernels: eager`` (torchtitan without ``compile``, Hugging Face, torchtune), 16-bit
parameters and no autocast: the RMSNorm written in Python (torchtitan/models/norms.py
``RMSNorm`` @ba2469780, Hugging Face's ``LlamaRMSNorm``: ``x.float()``, ``pow``, ``mean``,
``x * rsqrt``, ``type_as``, ``* weight``), rotary embeddings through fp32 complex numbers
(torchtitan/models/llama/model.py ``apply_rotary_emb`` @ba2469780: ``xq.float()``, the complex
product, ``type_as``), SwiGLU as ``silu`` then ``mul`` and the attention output's
``transpose(1, 2).contiguous()``. torchtitan's own table (benchmarks/llama3_h100_202412_torchtitan.md:
Llama 3.1 8B, FSDP, 8 and 128 H100) has torch.compile 1.16x faster than eager;
``bench/torchtitan_fleet.py`` prints these counts' figure beside it.
"""
from __future__ import annotations

from simcore.model import params as pm
from simcore.model.workload import Op
from simcore.plan.spec import ModelSpec, PositionEmbedding

#: Bytes of an fp32 and of a 16-bit element.
FP32, HALF = 4, 2
#: Bytes per element of width w the eager rotate-half RoPE moves (``executors.model.apply_rope``):
#: neg of one half (read and write half the tensor), cat (read and write it), x * cos and
#: rotated * sin (read and write it each), the add (read two, write one), all 16-bit.
ROPE_BYTES = HALF * (1 + 2 + 2 + 2 + 3)
#: Bytes per element of casting an fp32 tensor to 16 bits (read 4, write 2).
CAST_BYTES = FP32 + HALF
#: Bytes per element of a Python RMSNorm over a 16-bit input, beyond the fused kernel's read and
#: write (4): upcast (read 2, write 4), pow (4, 4), mean (read 4), x * rsqrt (4, 4), type_as
#: (4, 2), * weight (2, 2).
PYTHON_RMSNORM_BYTES = (HALF + FP32) + 2 * FP32 + FP32 + 2 * FP32 + (FP32 + HALF) + 2 * HALF - 2 * HALF
#: Bytes per element of q or k of rotary embeddings through fp32 complex numbers: upcast (read 2,
#: write 4), the complex product (read 8 and write 8 per element pair: 4 and 4 an element, the
#: frequencies broadcast), type_as (read 4, write 2).
COMPLEX_ROPE_BYTES = (HALF + FP32) + 2 * FP32 + (FP32 + HALF)


def runs_eager(entry: dict, vendor: str, precision: str) -> bool:
    """Whether a GPU's efficiency ``entry`` is a profile of the executor's own runs (its memory is
    counted on the executor's tensors, ``executor_activations``) at a 16-bit autocast precision."""
    return vendor != "cpu" and precision in ("bf16", "fp16") and bool((entry.get("memory") or {}).get(
        "executor_activations"))


def host_factor(entry: dict, vendor: str, precision: str) -> float:
    """The executor's host time per modelled kernel under autocast over its fp32 time: the probe
    layer timed both ways by ``trainplan calibrate`` on a GPU (``autocast_host_factor``; 1 for
    profiles calibrated before it was measured, and for every other stack)."""
    return float(entry.get("autocast_host_factor", 1.0)) if runs_eager(entry, vendor, precision) else 1.0


def _pass(name: str, bytes_: float) -> Op:
    return Op(name=name, flops=0.0, bytes=bytes_, matmul=False, uncounted=True)


def _unfused_ops(m: ModelSpec, tokens: int, tp: int, rope_bytes: float) -> list[Op]:
    """The passes both eager stacks make: the attention output's copy back from its transpose,
    RoPE (``rope_bytes`` an element of q and k) and a gated MLP's silu then mul (read, write; read
    two, write one: 5 passes where the fused kernel makes 3)."""
    ops = [_pass("eager_attention_out_copy", 2 * HALF * tokens * pm.attention_out_width(m) / tp)]
    if m.position_embedding == PositionEmbedding.ROPE:
        ops.append(_pass("eager_rope", rope_bytes * tokens * (pm.q_width(m) + pm.kv_width(m)) / tp))
    if m.gated_mlp:
        ops.append(_pass("eager_swiglu", 2 * HALF * tokens * m.ffn_hidden * (m.top_k if m.moe else 1) / tp))
    return ops


def autocast_ops(m: ModelSpec, *, b: int, s: int, tp: int = 1) -> list[Op]:
    """One layer's forward, one micro-batch: what torch.autocast over fp32 parameters adds to the
    fused 16-bit set (``training.autocast``; the executor's GPU stack too): fp32 norms and residual
    adds, a 16-bit cast of each linear's input and of every weight, once a forward."""
    tokens, h = b * s, m.hidden
    readers = 3 + (2 if m.gated_mlp else 1)          # the linears that cast a norm's output apart
    pc = pm.param_counts(m)
    return [
        # fused LayerNorm/RMSNorm: 16-bit in and out (4 B an element); eager autocast: fp32 (8 B)
        _pass("eager_norms_fp32", 2 * (2 * FP32 - 2 * HALF) * tokens * h),
        _pass("eager_input_casts", readers * CAST_BYTES * tokens * h),
        # residual add: fused reads two 16-bit tensors, writes one (6 B); eager: fp32 x + 16-bit y -> fp32 (10 B)
        _pass("eager_residual_fp32", 2 * (FP32 + HALF + FP32 - 3 * HALF) * tokens * h),
        _pass("eager_weight_casts", CAST_BYTES * (pc.attention + pc.mlp) / tp),
    ]


def layer_ops(m: ModelSpec, *, b: int, s: int, tp: int = 1) -> list[Op]:
    """One layer's forward, one micro-batch: the executor's eager autocast stack's passes beyond
    the fused set (autocast's, and eager RoPE, SwiGLU and the attention output's copy)."""
    return [*autocast_ops(m, b=b, s=s, tp=tp), *_unfused_ops(m, b * s, tp, ROPE_BYTES)]


def logits_ops(m: ModelSpec, *, b: int, s: int, tp: int = 1) -> list[Op]:
    """The loss's upcast of the 16-bit logits to fp32 (``F.cross_entropy(logits.float(), ...)``)."""
    return [_pass("eager_logits_upcast", (HALF + FP32) * b * s * m.vocab / tp)]


def python_layer_ops(m: ModelSpec, *, b: int, s: int, tp: int = 1, sequence_parallel: bool = False) -> list[Op]:
    """One layer's forward, one micro-batch, of uncompiled PyTorch modules (``training.kernels:
    eager``) beyond the fused set. A LayerNorm model runs torch's native kernels (as fused)."""
    tokens = b * s
    ops = _unfused_ops(m, tokens, tp, COMPLEX_ROPE_BYTES)
    if m.gated_mlp:   # Llama-style: RMSNorm in Python, two a layer, over s/tp tokens with SP
        norm_tokens = tokens / tp if sequence_parallel else tokens
        ops.append(_pass("eager_python_rmsnorm", 2 * PYTHON_RMSNORM_BYTES * norm_tokens * m.hidden))
    return ops
