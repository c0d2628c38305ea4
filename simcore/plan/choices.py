"""The enumerated choices of a Plan and ``PlanError``; ``simcore.plan.spec`` re-exports them
with the section dataclasses that use them."""
from __future__ import annotations

import enum


class PlanError(ValueError):
    """A Plan is malformed or breaks a rule; the message is one sentence naming the field."""


class NoLayoutFits(PlanError):
    """A search found no layout that fits: none fits the GPUs' memory, none leaves the headroom
    asked for, or none that fits is one the stack runs (a what-if cell: "does not fit")."""


class _Choice(str, enum.Enum):
    @classmethod
    def parse(cls, value, where: str):
        for member in cls:
            if value == member.value:
                return member
        known = ", ".join(m.value for m in cls)
        raise PlanError(f"{where}={value!r} is not one of: {known}")

    def __str__(self) -> str:
        return self.value


class Schedule(_Choice):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved-1f1b"
    ZERO_BUBBLE = "zero-bubble"
    DUALPIPE_V = "dualpipev"
    """DeepSeek's DualPipe cut in half (arXiv 2412.19437 Sec. 3.2.1; torch ``ScheduleDualPipeV``): two
    stages a rank placed as a V, forwards and backwards of two micro-batches paired, the backward split."""


class CpComm(_Choice):
    """How context-parallel ranks exchange keys and values (Megatron-Core ``--cp-comm-type``,
    Transformer Engine's ``cp_comm_type``): ``p2p`` rotates K/V around the ring, overlapped
    with the attention of the chunk at hand; ``all_gather`` gathers the whole K/V before
    attention and reduce-scatters dK/dV after; ``a2a`` (DeepSpeed-Ulysses) re-shards Q, K, V
    and the output from sequence to heads with all-to-alls."""

    P2P = "p2p"
    ALL_GATHER = "all_gather"
    A2A = "a2a"


class MoeDispatcher(_Choice):
    """How an MoE layer sends its tokens to the expert-parallel ranks: ``alltoall`` (Megatron-Core's
    ``--moe-token-dispatcher-type alltoall``, torchtitan, trainplan's executor) sends a copy of a
    token for each of its top-k experts; ``deepep`` (DeepSeek's DeepEP, Megatron-Core's ``flex``
    dispatcher with ``--moe-enable-deepep``, NeMo AutoModel's ``dispatcher: deepep``) sends a token
    once to each rank holding one or more of its experts and expands it there (DeepEP README,
    "normal kernels": dispatch by rank, then by expert on the receiving rank)."""

    ALLTOALL = "alltoall"
    DEEPEP = "deepep"


class MoeRouting(_Choice):
    """Which experts a token's router picks, as the run's gate does: ``balanced`` draws its top-k
    experts at random, every expert equally likely (a trained router balanced on average;
    Megatron-Core's ``--moe-router-force-load-balancing`` replaces the logits by random normals,
    megatron/core/transformer/moe/router.py ``RandomSTE``); ``round_robin`` gives token t the
    experts tk .. tk+k-1 modulo the experts (NeMo AutoModel's ``fake_balanced_gate``,
    nemo_automodel/components/moe/layers.py ``FakeBalancedGate`` @e45812012), so a token's
    experts are consecutive and share ranks."""

    BALANCED = "balanced"
    ROUND_ROBIN = "round_robin"


class ZeroImpl(_Choice):
    """The stack that runs ZeRO: ``fsdp2`` (torch FSDP2 ``fully_shard``, what trainplan's
    executor runs; one all-gather per block, one block prefetched) or ``deepspeed``
    (DeepSpeed ZeRO-3: one all-gather per submodule, prefetch bounded by
    ``stage3_prefetch_bucket_size``)."""

    FSDP2 = "fsdp2"
    DEEPSPEED = "deepspeed"


class FsdpRoot(_Choice):
    """Which FSDP2 parameter groups stay unsharded from the forward's end into the backward,
    through the loss (``parallel.fsdp_root``; ZeRO-3 without a pipeline):

    - ``resharded``: none. Every group is resharded after its forward and the root group
      (embedding, final norm, output) is gathered again for the output's backward: trainplan's
      executor, which passes ``reshard_after_forward=True`` to the root explicitly (torch honours
      it since pytorch/pytorch#154704 of June 2025, torch 2.8: ``_auto_reshard_after_forward``).
    - ``output_kept``: torchtitan since July 2025 (llama3/infra/parallelize.py @2c8b5947):
      the embedding and every block are groups of their own, resharded; ``[norm, output]`` is
      one group with ``reshard_after_forward=False``, reduce-scattered right after its backward.
    - ``kept``: torchtitan before (parallelize_llama.py @54ef42221, @e7c0cae): the root group
      holds embedding, norm and output, and torch before that clamps the root to no reshard
      after forward (``_lazy_init``: ``post_forward_mesh_info = None``, #154655); the last block is not
      resharded either (``reshard_after_forward = layer_id < n_layers - 1``). The root's
      gradients are reduce-scattered together at the backward's end."""

    RESHARDED = "resharded"
    OUTPUT_KEPT = "output_kept"
    KEPT = "kept"


class Precision(_Choice):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    MXFP8 = "mxfp8"
    """The linear layers in OCP MXFP8 (E4M3, one E8M0 scale per 32 elements; Blackwell, CDNA 4)."""
    NVFP4 = "nvfp4"
    """The linear layers in NVFP4 (E2M1, one E4M3 scale per 16 and a per-tensor FP32 scale; Blackwell)."""


class Fp8Recipe(_Choice):
    """How the FP8 linear layers are scaled: Transformer Engine's ``delayed`` scaling (the
    amax history of earlier steps; TE before 2.0, Composer's amp_fp8) or ``current`` scaling
    (FP8-CS: this tensor's amax, one more pass over it), torchao float8 ``tensorwise``
    (dynamic per-tensor scales, as current) or ``rowwise`` (per-row scales and their GEMMs)."""

    DELAYED = "delayed"
    CURRENT = "current"
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"


class AttentionKernel(_Choice):
    """The flash-attention kernel the stack runs (with ``flash_attention: true``): ``auto``
    is the GPU's catalog attention entry (FlashAttention-2 class, or the cuDNN/TE fused kernel
    of that generation); ``flash2`` Dao's FlashAttention-2 CUDA kernels (the flash-attn 2.x
    package, as llm-foundry's ``attn_impl: flash`` runs them) where the catalog's own is
    another (Hopper: cuDNN); ``flash3`` FlashAttention-3 (Hopper); ``triton`` the 2022 Triton
    port of FlashAttention that llm-foundry's MPT configs ran (``attn_impl: triton``)."""

    AUTO = "auto"
    FLASH2 = "flash2"
    FLASH3 = "flash3"
    TRITON = "triton"


class Recompute(_Choice):
    """What activation recomputation re-runs (``simcore.model.recompute`` charges each)."""

    NONE = "none"
    SELECTIVE = "selective"
    """Megatron's core-attention recompute (Korthikanti et al. 2022, Sec. 5)."""
    FULL = "full"
    """Whole layers: every layer, or Megatron's ``--recompute-num-layers`` N with a method."""
    OP = "op"
    """torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``)."""
    LAYER = "layer"
    """torchtitan's every-Nth-layer checkpointing (``selective_ac_option = "N"``)."""
    DOTS = "dots"
    """JAX's ``checkpoint_dots_with_no_batch_dims``, MaxText's ``remat_policy: minimal``."""


class RecomputeMethod(_Choice):
    """Megatron's ``--recompute-method`` for full recompute of ``recompute_layers`` layers."""

    UNIFORM = "uniform"
    BLOCK = "block"


class Loss(_Choice):
    """How the loss holds the logits (``simcore.model.activations.loss_bytes``)."""

    EAGER = "eager"
    FUSED = "fused"
    CHUNKED = "chunked"


class Kernels(_Choice):
    """What the layers' element-wise work keeps for the backward (``workload.eager_activation_bytes``):
    ``fused`` kernels (torch.compile, Megatron's and Transformer Engine's fused norms and
    activations) keep the inputs they need; ``eager`` PyTorch ops (Hugging Face, torchtune or
    torchtitan without compile) keep every intermediate autograd needs: the gated MLP's
    activation output, and an RMSNorm written in Python its fp32 upcast input; and they move
    more bytes (``simcore.model.eager_ops``: the Python RMSNorm's fp32 chain, RoPE through fp32
    complex numbers, SwiGLU as two kernels)."""

    FUSED = "fused"
    EAGER = "eager"


class Offload(_Choice):
    NONE = "none"
    OPTIMIZER = "optimizer"
    OPTIMIZER_PARAMS = "optimizer+params"


class GradCompression(_Choice):
    """The gradients' wire dtype: ``none`` the stack's default (fp32 under 16-bit mixed
    precision, DeepSpeed's model dtype: ``collectives.grad_wire_bytes``), ``fp16``/``bf16``
    16-bit reductions (DDP's compress hooks, Megatron's ``--grad-reduce-in-bf16``, FSDP2's
    ``reduce_dtype``, DeepSpeed's ``communication_data_type``), ``powersgd`` DDP's hook, ``int8``
    the executor's own DDP hook: the bucket quantized to int8 (an fp32 scale a group), all-to-all,
    summed, quantized again and all-gathered, as ZeRO++'s qgZ (``executors.int8_hook``; under FSDP2's
    zero 2-3 its reduce-scatter: all-to-all'd and summed, ``simcore.model.int8_scatter``); ``int8_ef``
    the same with error feedback: each quantization's residual kept and added to the next step's
    (the worker's bucket and the server's sum, as DeepSpeed's compressed all-reduce keeps them);
    ``int4`` int8's steps with 4-bit values, two packed a byte (qgZ's width), no error feedback."""

    NONE = "none"
    FP16 = "fp16"
    BF16 = "bf16"
    POWERSGD = "powersgd"
    INT8 = "int8"
    INT8_EF = "int8_ef"
    INT4 = "int4"

    @property
    def bits(self) -> int:
        """The quantized hook's bits a value (8 or 4; 0: not quantized)."""
        return {"int8": 8, "int8_ef": 8, "int4": 4}.get(self.value, 0)


class Optimizer(_Choice):
    """The optimizer and the states it keeps per parameter (``memory.optimizer_bytes_per_param``)."""

    ADAMW = "adamw"
    ADAM = "adam"
    SGD = "sgd"
    """With momentum (Megatron's ``--sgd-momentum`` 0.9): one state."""
    ADAMW8BIT = "adamw8bit"
    """AdamW with block-wise 8-bit states (bitsandbytes ``AdamW8bit``, torchao ``AdamW8bit``)."""
    ADAFACTOR = "adafactor"
    """Adafactor with factored second moments and no first moment (Shazeer & Stern 2018;
    torch.optim.Adafactor, Hugging Face's ``optim="adafactor"``)."""
    ONEBIT_ADAM = "onebit_adam"
    """DeepSpeed's 1-bit Adam in its compression stage: Adam's states, the momentum all-reduced
    as signs with error feedback in place of the gradients (``simcore.model.onebit``)."""
    ONEBIT_LAMB = "onebit_lamb"
    """DeepSpeed's 1-bit LAMB in its compression stage: 1-bit Adam's all-reduce of the flat momentum,
    LAMB's layer-wise coefficients from a fresh variance (``simcore.model.onebit``)."""
    ZERO_ONE_ADAM = "zero_one_adam"
    """DeepSpeed's 0/1 Adam past its variance freeze: local steps, the momentum accumulator 1-bit
    all-reduced every 16 steps (``simcore.model.onebit``)."""


#: DeepSpeed 1-bit Adam's default warm-up (``OnebitAdam(freeze_step=100000)``, runtime/fp16/onebit/adam.py @edaa7221),
#: 1-bit LAMB's (lamb.py ``freeze_step=100000``) and 0/1 Adam's last variance update (zoadam.py
#: ``var_freeze_step=100000``): ``training.onebit_freeze_step`` holds whichever the optimizer has.
ONEBIT_FREEZE_STEP = 100_000
#: DeepSpeed's compressed-communication optimizers (runtime/fp16/onebit/ @edaa7221), each by the name
#: engine.py's refusal gives it ("... is not compatible with ZeRO", ``_configure_basic_optimizer``).
ONEBIT_OPTIMIZERS = {Optimizer.ONEBIT_ADAM: "1bit-Adam", Optimizer.ONEBIT_LAMB: "1bit-Lamb",
                     Optimizer.ZERO_ONE_ADAM: "0/1 Adam"}


class StateDtype(_Choice):
    """The dtype Adam's two moments are kept in beside the fp32 master weights: ``fp32`` (the
    stacks' default), ``bf16`` or ``fp16`` (Megatron-Core's ``--use-precision-aware-optimizer``
    with ``--exp-avg-dtype`` and ``--exp-avg-sq-dtype``, Transformer Engine's FusedAdam;
    DeepSeek-V3 tracked both moments in BF16, arXiv:2412.19437 Sec. 3.3.3)."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


class ZeroStage(enum.IntEnum):
    """ZeRO stages are cumulative (DeepSpeed's convention): compare with >=."""

    NONE = 0
    OPTIMIZER_STATES = 1
    GRADIENTS = 2
    WEIGHTS = 3


class PositionEmbedding(_Choice):
    LEARNED = "learned"
    ROPE = "rope"
