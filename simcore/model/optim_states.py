"""Bytes per parameter of the weights and of what the optimizer keeps (K of the ZeRO paper).

Rajbhandari et al. (SC'20, Sec. 3.1): mixed-precision Adam keeps K = 12 bytes per parameter,
the fp32 master copy (4) and the fp32 momentum and variance (8). The other optimizers keep:

- SGD: its momentum (4; Megatron's ``--sgd-momentum`` 0.9, the executor's too).
- 1-bit Adam: Adam's (8); its error-feedback buffers are a memory term of their own
  (``simcore.model.onebit.error_bytes``: they depend on the data-parallel size).
- 1-bit LAMB: Adam's and ``exp_avg_sq_fresh`` (12; DeepSpeed runtime/fp16/onebit/lamb.py @edaa7221, its
  state initialization); 0/1 Adam: Adam's and ``momentum_accumulator`` (12; zoadam.py @edaa7221). Their
  error buffers and 1-bit LAMB's ``exp_avg_last_step`` clone: ``simcore.model.onebit.memory_terms``.
- 8-bit AdamW: momentum and variance as uint8 codes with one fp32 scale per block
  (torchao ``torchao/optim/adam.py`` @36027d82 ``AdamW8bit(block_size=256)``,
  ``subclass_8bit.py``: ``codes`` uint8, ``scale`` fp32 of ``numel // block_size``;
  bitsandbytes' block-wise 8-bit states are alike): 2 + 8/256.
- Adafactor (Shazeer & Stern 2018; ``torch.optim.Adafactor``, Hugging Face's default
  ``beta1=None``): no momentum, and for an r x c matrix a row and a column accumulator of
  its squared gradients (fp32, r + c), at most 8/h per parameter when every side is at least
  the hidden size h; vectors keep a whole accumulator, a few thousand parameters a layer,
  left out. Where the optimizer steps flat 1-D partitions instead of the parameters
  (DeepSpeed's ZeRO 1-3: ``single_partition_of_fp32_groups``, the flattened fp32 groups its
  optimizer's param_groups hold), nothing is a matrix and the accumulator is whole: 4.

Pure 16-bit training (``master_weights: false``, torchtune's ``dtype: bf16``) keeps no master
copy and its 32-bit states in the 16-bit dtype; 8-bit states stay 8-bit. Adam's moments alone in
16 bits beside an fp32 master copy (``training.optimizer_state_dtype``: Megatron-Core's
``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``, TE's FusedAdam
with ``exp_avg_dtype``/``exp_avg_sq_dtype``; DeepSeek-V3, arXiv:2412.19437 Sec. 3.3.3): 4 + 2 + 2.

Stored weights are 16-bit (``param_bytes``) but for FP8 primary weights
(``training.fp8_param_gather``, Megatron-Core ``--fp8-param-gather``): the blocks' linear
weights are Transformer Engine Float8Tensors (``fp8_model_init``), one byte an element, gathered
by the distributed optimizer in that dtype; the embedding, the output layer and the norms stay
16-bit (``stored_weight_bytes``).
"""
from __future__ import annotations

from simcore.model import workload as wl
from simcore.plan.spec import ModelSpec, Optimizer, Plan, Precision, StateDtype, TrainingSpec, ZeroImpl, ZeroStage

#: torchao's 8-bit AdamW quantisation block (elements per fp32 scale), torchao/optim/adam.py @36027d82.
EIGHT_BIT_BLOCK = 256
#: fp32 states, in bytes per parameter, per optimizer (Adafactor's: per hidden-size element, see above).
_FP32_STATES = {Optimizer.ADAMW: 8, Optimizer.ADAM: 8, Optimizer.SGD: 4, Optimizer.ONEBIT_ADAM: 8,
                Optimizer.ONEBIT_LAMB: 12, Optimizer.ZERO_ONE_ADAM: 12}


def largest_tensor_params(m: ModelSpec, tp: int) -> float:
    """Parameters of the largest tensor one GPU holds (the vocabulary-parallel embedding or
    output, an MLP or attention matrix, split over TP): all of the gradients that live at once
    when the optimizer steps each parameter in the backward (``training.optimizer_in_backward``).
    A tied embedding's gradient lives through the whole backward; it is that tensor too."""
    return max(m.vocab * m.hidden, m.hidden * m.ffn_hidden, m.hidden * wl.q_width(m)) / tp


def weight_bytes_per_param(precision: Precision) -> int:
    return 4 if precision == Precision.FP32 else 2


def param_bytes(tr: TrainingSpec) -> int:
    """Bytes of a stored parameter: fp32 under ``training.autocast`` (the casts are transient),
    else the precision's (16-bit beside an fp32 master copy in the optimizer)."""
    return 4 if tr.autocast else weight_bytes_per_param(tr.precision)


def stored_weight_bytes(plan: Plan, params: float, ends: float) -> float:
    """Bytes of ``params`` stored parameters of which ``ends`` are the embedding and output (and
    of what the distributed optimizer all-gathers of them): ``param_bytes`` each, the others
    FP8's one byte under ``training.fp8_param_gather`` (see above)."""
    wb = param_bytes(plan.training)
    if not plan.training.fp8_param_gather:
        return wb * params
    return wb * ends + wl.quantized_bytes(Precision.FP8.value) * (params - ends)


def flat_partitions(plan: Plan) -> bool:
    """Whether the optimizer steps flat 1-D partitions of the parameters (DeepSpeed's ZeRO)."""
    return plan.parallel.zero_impl == ZeroImpl.DEEPSPEED and plan.parallel.zero >= ZeroStage.OPTIMIZER_STATES


def optimizer_bytes_per_param(tr: TrainingSpec, hidden: int, flat: bool = False) -> float:
    """K: the master copy (mixed precision with ``master_weights``) plus the optimizer's states;
    ``flat``: the optimizer steps flat partitions (``flat_partitions``)."""
    pure16 = not tr.master_weights and tr.precision != Precision.FP32
    # under autocast the fp32 parameters are what the optimizer steps: no master copy
    master = 4.0 if tr.master_weights and tr.precision != Precision.FP32 and not tr.autocast else 0.0
    if tr.optimizer == Optimizer.ADAMW8BIT:
        return master + 2 * (1 + 4 / EIGHT_BIT_BLOCK)
    if tr.optimizer == Optimizer.ADAFACTOR:
        states = 4.0 if flat else 8.0 / hidden
    else:
        states = float(_FP32_STATES[tr.optimizer])
    half = pure16 or tr.optimizer_state_dtype != StateDtype.FP32   # 16-bit moments
    return master + (states / 2 if half else states)
