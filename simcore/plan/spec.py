"""The Plan: one immutable, validated value that every stage of trainplan consumes.

A Plan file (YAML, schema in DESIGN.md "The Plan file") has four sections: ``model``,
``cluster``, ``parallel`` and ``training``. ``load_plan`` is the only reader of Plan
YAML; everything downstream takes the ``Plan`` dataclass. Every wrong input raises
``PlanError`` with one sentence that names the field and the rule.

This module holds the value: the four section dataclasses and ``Plan`` (``simcore.plan.choices``
and ``stages`` re-exported); building one from a document is ``load``, its rules ``rules``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from simcore.plan.choices import (
    ONEBIT_FREEZE_STEP, AttentionKernel, CpComm, Fp8Recipe, FsdpRoot, GradCompression, Kernels, Loss, MoeDispatcher,
    MoeRouting, Offload, Optimizer, PlanError, PositionEmbedding, Precision, Recompute, RecomputeMethod, Schedule,
    StateDtype, ZeroImpl, ZeroStage,
)
from simcore.plan.linear_attention import LinearAttention
from simcore.plan.model_props import Activation, Bias, Norm, QkNorm, resolve
from simcore.plan.sparse_attention import SparseAttention
from simcore.plan.stages import even_split, rank_stages, rank_sums, stage_rank
from topologies.components import Fabric, Node, Storage

__all__ = ["AttentionKernel", "CpComm", "Fp8Recipe", "FsdpRoot", "GradCompression", "Kernels", "Loss", "MoeDispatcher",
           "Offload", "MoeRouting", "Optimizer", "PlanError", "PositionEmbedding", "Precision", "Recompute",
           "RecomputeMethod", "Schedule", "StateDtype", "ZeroImpl", "ZeroStage", "MEGATRON_DROPOUT", "ModelSpec",
           "ClusterSpec", "ParallelSpec", "TrainingSpec", "Plan", "even_split", "evolve", "rank_stages", "rank_sums",
           "stage_rank"]


#: Megatron-LM's --hidden-dropout and --attention-dropout default (arguments.py), the Plan's.
MEGATRON_DROPOUT = 0.1
#: ``training.allocator_margin`` under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: one growing
#: segment per stream of 20 MiB pages (c10/cuda/CUDACachingAllocator.cpp ``ExpandableSegment``), every
#: whole free page unmapped before an out-of-memory (``release_cached_blocks``): under a page lost at
#: each free block's ends; torchtitan's, torchao's reserved peaks under it are the tensors' (6%); the exports set _ENV.
EXPANDABLE_SEGMENTS_MARGIN = 0.0
EXPANDABLE_SEGMENTS_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer (plan key ``model``)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    """Key/value heads; fewer than ``heads`` means grouped-query attention."""
    ffn_hidden: int
    vocab: int
    seq_len: int
    """Tokens per sequence."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three matrices."""
    experts: int = 0
    """Experts per MoE layer (0: dense)."""
    top_k: int = 0
    capacity_factor: float = 1.0
    tied_embeddings: bool = True
    position_embedding: PositionEmbedding = PositionEmbedding.LEARNED
    source: str = ""
    kv_channels: int = 0
    """Width of one attention head (Megatron's --kv-channels, Hugging Face's ``head_dim``);
    0 means hidden // heads. Gemma 2 and Qwen3 set it wider than hidden // heads. With
    multi-latent attention it is the non-rotary part of a query/key head (``qk_nope_head_dim``)."""
    rope_base: float = 10000.0
    """Rotary base (Hugging Face ``rope_theta``, Megatron --rotary-base)."""
    dropout: float = MEGATRON_DROPOUT
    """Hidden and attention dropout probability (Megatron --hidden-dropout and
    --attention-dropout, default 0.1; Hugging Face ``hidden_dropout``/``resid_pdrop``,
    ``attention_dropout``/``attn_pdrop``). At 0 no mask is kept: torch's dropout returns its
    input when p is 0 (aten/src/ATen/native/Dropout.cpp ``_dropout_impl``). Llama-family
    models train without dropout."""
    dense_ffn_hidden: int = 0
    """MoE models: the MLP width of the dense layers (0: ffn_hidden, which is the expert width)."""
    dense_layers: int = 0
    """MoE models: the first layers that are dense (DeepSeek's ``first_k_dense_replace``,
    Megatron's --moe-layer-freq [0]*k+[1]*(L-k))."""
    moe_layers: tuple[int, ...] = ()
    """MoE models whose dense and MoE layers interleave: the indices of the MoE layers, the rest
    dense (Llama 4 Maverick's ``moe_layers``, every ``interleave_moe_layer_step``-th; Qwen2-MoE's
    ``decoder_sparse_step`` / ``mlp_only_layers``; Megatron's --moe-layer-freq N or a list).
    Empty: every layer from ``dense_layers`` on is MoE."""
    shared_ffn_hidden: int = 0
    """MoE models: the total width of the shared experts every token runs (Megatron's
    --moe-shared-expert-intermediate-size; Qwen2-MoE ``shared_expert_intermediate_size``,
    DeepSeek ``n_shared_experts * moe_intermediate_size``); 0: none."""
    q_lora_rank: int = 0
    """Multi-latent attention (DeepSeek-V2/V3): the query down-projection rank (0: none)."""
    kv_lora_rank: int = 0
    """Multi-latent attention: the compressed key/value rank; 0 means ordinary attention."""
    qk_rope_head_dim: int = 0
    """Multi-latent attention: the rotary part of a query/key head."""
    v_head_dim: int = 0
    """Multi-latent attention: the width of a value head."""
    sliding_window: int = 0
    """Tokens a query of a windowed layer attends to (Hugging Face ``sliding_window``,
    Megatron --window-size); 0: every layer attends to the whole causal prefix."""
    sliding_window_layers: float = 1.0
    """Share of the layers that are windowed (Gemma 2, GPT-OSS: 0.5; Gemma 3: 5/6; Megatron
    --window-attn-skip-freq N: (N-1)/N); the rest attend to the whole prefix."""
    mtp_layers: int = 0
    """Multi-token prediction depth D (DeepSeek-V3, arXiv 2412.19437 Sec. 2.2; Hugging Face
    ``num_nextn_predict_layers``, Megatron --mtp-num-layers): D modules after the model, each two
    RMSNorms, a 2h -> h projection, one block of the last layer's kind, and the shared output
    layer and loss again (``simcore.model.mtp``); 0: none."""
    linear_attention: LinearAttention | None = None
    """Gated DeltaNet layers among the softmax ones, and the latter's output gate (Qwen3-Next, Qwen3.5:
    ``simcore.plan.linear_attention``); None: every layer softmax attention, ungated."""
    sparse_attention: SparseAttention | None = None
    """DeepSeek Sparse Attention's indexer on every layer (``simcore.plan.sparse_attention``); None: dense."""
    norm: Norm | None = None
    bias: Bias | None = None
    activation: Activation | None = None
    qk_norm: QkNorm = QkNorm.NONE
    attention_sinks: bool = False
    """The block's properties (``simcore.plan.model_props``); None: position_embedding's and gated_mlp's convention."""

    def __post_init__(self) -> None:
        resolve(self)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def head_dim(self) -> int:
        """Width of one head. With multi-latent attention, the mean of the query/key head
        (kv_channels + qk_rope_head_dim) and the value head, so that the score and context
        GEMMs together count their true FLOPs."""
        if self.mla:
            return (self.kv_channels + self.qk_rope_head_dim + self.v_head_dim) // 2
        return self.kv_channels or self.hidden // self.heads

    moe = property(lambda self: self.experts > 0)

    @property
    def dense_count(self) -> int:
        """Dense layers of an MoE model (0 for a dense model, whose layers are all alike)."""
        return sum(dense_layer_mask(self)) if self.moe else 0

    def is_dense_layer(self, index: int) -> bool:
        """Whether layer ``index`` of an MoE model runs a dense MLP (False for a dense model); an
        MTP module's block (``index`` >= layers) is of the last layer's kind."""
        return self.moe and dense_layer_mask(self)[min(index, self.layers - 1)]


def dense_layer_mask(m: ModelSpec) -> tuple[bool, ...]:
    """Per layer of MoE model ``m``: whether it is dense (``layer_mask``)."""
    return layer_mask(m.dense_layers, m.moe_layers, m.layers)


@functools.lru_cache(maxsize=512)
def layer_mask(dense_layers: int, moe_layers: tuple[int, ...], layers: int) -> tuple[bool, ...]:
    """Per layer: whether it is dense: outside ``moe_layers`` where it lists any, else among the
    first ``dense_layers`` (kept by these three fields: the searches ask per plan)."""
    moe = set(moe_layers)
    return tuple(i not in moe if moe else i < dense_layers for i in range(layers))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """The hardware (plan key ``cluster``), resolved from the catalog."""

    node: Node
    nodes: int
    fabric: Fabric | None
    storage: Storage
    gpus_per_node: int
    price_per_gpu_hour: float | None = None
    """Overrides the catalog's on-demand price, $ per GPU-hour."""
    nvlink_domain_gpus: int | None = None
    """Overrides the node's NVLink domain (catalog ``nvlink_domain_gpus``): GPUs that one
    NVLink switch fabric joins, a whole number of nodes."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def nvlink_domain(self) -> int:
        """GPUs of one NVLink domain: the node's GPUs, or a rack-scale domain of several
        nodes (GB200/GB300 NVL72: 72), never more than the cluster's GPUs."""
        domain = self.nvlink_domain_gpus or self.node.nvlink_domain_gpus or self.gpus_per_node
        return max(self.gpus_per_node, min(domain, self.gpus))


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelSpec:
    """The parallel layout (plan key ``parallel``). GPUs used = tp * pp * dp * cp.

    Expert parallel does not multiply the GPUs: as in Megatron-Core and torchtitan,
    the ``ep`` ranks of an MoE layer are carved out of the data (x context) parallel ranks.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tp: int = 0
    """Tensor parallel of the MoE experts (Megatron-Core ``--expert-tensor-parallel-size``);
    0: the same as ``tp``. With it below ``tp``, the expert grid is folded over the dense
    one (Liu et al. 2025, MoE Parallel Folding, arXiv 2504.14960): ep * expert_tp ranks
    out of tp * cp * dp, the ep group running across TP ranks."""
    vpp: int = 1
    """Virtual stages (model chunks) per pipeline rank, for the interleaved schedule."""
    stage_layers: tuple[int, ...] | None = None
    """Layers per virtual stage, in model order; None spreads them as evenly as possible."""
    zero: ZeroStage = ZeroStage.NONE
    zero_impl: ZeroImpl = ZeroImpl.FSDP2
    dp_replicate: int = 1
    """Hybrid sharding: ZeRO shards over dp / dp_replicate ranks (x cp), the replicas all-reduce each shard
    (FSDP2's 2-D mesh, torchtitan's replicate degree, Megatron's optimizer instances); 1: off."""
    zero_quantized_weights: bool = False
    """ZeRO++ qwZ (DeepSpeed ZeRO-3 ``zero_quantized_weights``): each parameter all-gather moves
    int8 values and an fp32 scale per group of at most 8,000 (``simcore.model.zeropp``)."""
    zero_hpz_partition_size: int = 1
    """ZeRO++ hpZ: a secondary copy of the parameters sharded over groups of this many
    data-parallel ranks, which the backward's all-gathers read; 1: off."""
    zero_quantized_gradients: bool = False
    """ZeRO++ qgZ (``zero_quantized_gradients``): gradients reduce-scattered as int4 by two
    all-to-alls, inside each node and then across nodes, in place of the reduce-scatter."""
    sequence_parallel: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    cp_comm: CpComm = CpComm.P2P
    fsdp_root: FsdpRoot = FsdpRoot.RESHARDED
    """FSDP2 groups left unsharded through the loss (``FsdpRoot``): torchtitan's wrapping."""
    tp_comm_overlap: bool = False
    """Overlap TP's all-gathers and reduce-scatters with the GEMMs they feed (Megatron-Core
    ``--tp-comm-overlap`` through Transformer Engine's userbuffers; needs sequence_parallel)."""
    overlap_param_gather: bool = False
    """ZeRO-1's parameter all-gather overlapped with the next step's forward, bucket by
    bucket (Megatron-Core ``--overlap-param-gather`` with the distributed optimizer; off by
    default there; Megatron-Bridge's recipes set it); otherwise it runs after the step."""
    moe_a2a_overlap: bool = False
    """MoE all-to-alls under another micro-batch's compute (Megatron-Core
    ``--overlap-moe-expert-parallel-comm``): 1F1B's steady phase pairs one forward with another's
    backward layer by layer (pipeline_parallel/combined_1f1b.py @d98e8a64); warm-up, cool-down alone."""
    moe_dispatcher: MoeDispatcher = MoeDispatcher.ALLTOALL
    """How MoE tokens travel to the expert-parallel ranks (``MoeDispatcher``)."""
    microbatch_group: int = 0
    """Interleaved 1F1B: micro-batches a chunk runs in a row (Megatron-Core
    ``--microbatch-group-size-per-virtual-pipeline-stage``, Llama 3's N, arXiv:2407.21783 3.3.2): rank r
    warms up with (vpp - 1) N + 2 (pp - 1 - r) forwards. 0: the schedule's own (pp)."""
    kv_replicator: int = 1
    """Copies of each key/value head across the TP group (AWS NeuronX Distributed's ``--kv_replicator``,
    ``GQAQKVColumnParallelLinear(kv_size_multiplier=...)``): the K and V weights are built this many times
    wider and split over tp, kv_heads * kv_replicator / tp heads a rank, and the copies' output gradients
    all-reduced over the "kv shared group" of kv_replicator ranks (``simcore.model.kv_replication``). 1: off."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def shard_ranks(self) -> int:
        """The ranks ZeRO shards over: dp x cp, or one replica's share of them (``dp_replicate``)."""
        return self.dp // self.dp_replicate * self.cp

    @property
    def etp(self) -> int:
        """The experts' tensor-parallel size (``expert_tp``, or ``tp``)."""
        return self.expert_tp or self.tp

    @property
    def v_shape(self) -> bool:
        """Whether the virtual stages sit on the ranks as a V (``rank_stages``): DualPipeV's placement."""
        return self.schedule == Schedule.DUALPIPE_V

    def rank_stages(self, rank: int) -> tuple[int, ...]:
        """The virtual stages pipeline rank ``rank`` holds (``rank_stages``)."""
        return rank_stages(rank, self.pp, self.vpp, self.v_shape)

    def stage_rank(self, stage: int) -> int:
        """The pipeline rank that holds virtual stage ``stage`` (``stage_rank``)."""
        return stage_rank(stage, self.pp, self.v_shape)

    def by_rank(self, per_stage) -> tuple:
        """Per pipeline rank, the sum of its virtual stages' entries of ``per_stage`` (``rank_sums``)."""
        return rank_sums(per_stage, self.pp, self.v_shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingSpec:
    """How one optimizer step is run (plan key ``training``)."""

    global_batch: int
    """Sequences per optimizer step."""
    micro_batch: int = 1
    """Sequences per micro-batch per data-parallel rank."""
    precision: Precision = Precision.BF16
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED
    """With ``precision: fp8``: the scaling of its linear layers."""
    recompute: Recompute = Recompute.NONE
    recompute_layers: int = 1
    """Full: Megatron's ``--recompute-num-layers`` (uniform: layers per checkpointed group;
    block: checkpointed layers per model chunk); layer: checkpoint every Nth layer."""
    recompute_method: RecomputeMethod = RecomputeMethod.UNIFORM
    offload: Offload = Offload.NONE
    activation_offload: int = 0
    """Layers per model chunk whose saved activations wait in host memory between their forward
    and backward (Megatron-Core ``--cpu-offloading-num-layers``; torchtune's
    ``enable_activation_offloading`` offloads every layer: ``all`` in a Plan file)."""
    flash_attention: bool = False
    attention_kernel: AttentionKernel = AttentionKernel.AUTO
    """With ``flash_attention``: which kernel (its efficiency is catalog data per GPU)."""
    attention_unpad: bool = False
    """With ``flash_attention``: each layer unpads Q, K and V before flash-attn's varlen kernel and
    pads its output after (llm-foundry's MPT ``attn_impl: flash``; Hugging Face's
    ``flash_attention_2`` whenever an attention mask is passed): three gathers, a zero fill and a
    scatter a layer, their backward, and the unpadded output flash-attn keeps."""
    optimizer: Optimizer = Optimizer.ADAMW
    grad_compression: GradCompression = GradCompression.NONE
    master_weights: bool = True
    """False: pure 16-bit training (torchtune's ``dtype: bf16``): no fp32 master copy, the
    optimizer's states in the 16-bit dtype."""
    autocast: bool = False
    """torch.autocast over fp32 parameters (torch AMP; Hugging Face Trainer ``fp16``/``bf16=True``)
    instead of 16-bit parameters with an fp32 master copy (Megatron, DeepSpeed): fp32 weights and
    gradients, the optimizer's states without a master copy, every weight cast to 16 bits once a
    forward and the copies cached to its end, and the tensors autocast keeps in fp32 (norms,
    softmax, the residual stream). ``training.precision`` is the 16-bit compute dtype."""
    loss: Loss = Loss.FUSED
    """Fused by default: what the large-scale stacks run (Megatron's vocab-parallel cross
    entropy, llm-foundry's flash-attn fused cross entropy, torchtitan's compiled loss)."""
    moe_routing: MoeRouting = MoeRouting.BALANCED
    """Which experts an MoE layer's gate picks for a token (``MoeRouting``): what a token's
    dispatch reaches under DeepEP, which sends it once a rank and once a node."""
    kernels: Kernels = Kernels.FUSED
    """Fused (compiled) or eager element-wise kernels: what a layer saves for its backward, and the
    HBM passes its element-wise work makes (``simcore.model.eager_ops.python_layer_ops``)."""
    optimizer_in_backward: bool = False
    """Each parameter stepped in its post-accumulate-grad hook and its gradient freed
    (torchtune ``optimizer_in_bwd``, torchtitan ``optimizer.early_step_in_backward``)."""
    grads_to_none: bool = True
    """``optimizer.zero_grad(set_to_none=True)``, torch's default since 2.0: gradients are freed
    between steps; False keeps them allocated (zeroed), as torch 1.x's default did."""
    fp8_param_gather: bool = False
    """With ``precision: fp8``: the blocks' linear weights are FP8 tensors (no 16-bit copy; the
    fp32 master copy in the distributed optimizer re-quantizes them after each step) and are
    all-gathered in FP8 (Megatron-Core ``--fp8-param-gather``, Transformer Engine's
    ``fp8_model_init``)."""
    optimizer_state_dtype: StateDtype = StateDtype.FP32
    """Adam's moments' dtype beside the fp32 master weights (``StateDtype``)."""
    onebit_freeze_step: int = ONEBIT_FREEZE_STEP
    """1-bit Adam's warm-up: its first steps run as Adam, uncompressed (DeepSpeed's ``freeze_step``,
    default 100,000 in ``runtime/fp16/onebit/adam.py``); ``trainplan cost`` charges them."""
    allocator_margin: float | None = None
    """Share of the tensor bytes the caching allocator reserves beyond them (fragmentation);
    None takes ``simcore.model.memory``'s stated default; ``EXPANDABLE_SEGMENTS_MARGIN`` is what
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True leaves (the exports then set it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    model: ModelSpec
    cluster: ClusterSpec
    parallel: ParallelSpec
    training: TrainingSpec
    name: str = ""

    @property
    def num_microbatches(self) -> int:
        """Micro-batches per pipeline per step (gradient accumulation steps without PP)."""
        return self.training.global_batch // (self.parallel.dp * self.training.micro_batch)

    @property
    def model_layers_per_stage(self) -> tuple[int, ...]:
        """The model's layers of each virtual stage (pp * vpp of them), in model order: the split
        ``parallel.stage_layers`` gives and the stacks' launch options write."""
        if self.parallel.stage_layers is not None:
            return self.parallel.stage_layers
        return even_split(self.model.layers, self.parallel.pp * self.parallel.vpp)

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        """Blocks each virtual stage runs: its layers and, on the last, the ``model.mtp_layers``
        MTP modules' blocks (Megatron-Bridge's DeepSeek-V3 layout puts them with the loss:
        src/megatron/bridge/recipes/deepseek/deepseek_v3.py @21d102f5e, ``last_layer``)."""
        stages = self.model_layers_per_stage
        return (*stages[:-1], stages[-1] + self.model.mtp_layers) if self.model.mtp_layers else stages


def evolve(value, /, **changes):
    """``dataclasses.replace`` for the Plan's frozen, slotted sections, without re-running their
    ``__init__`` (none has a ``__post_init__``): the layout search derives hundreds of thousands of
    Plans, and ``replace`` was a sixth of its time."""
    cls = type(value)
    new = object.__new__(cls)
    for name in cls.__slots__:
        object.__setattr__(new, name, changes.pop(name) if name in changes else getattr(value, name))
    if changes:
        raise TypeError(f"{cls.__name__} has no field {next(iter(changes))!r}")
    return new
