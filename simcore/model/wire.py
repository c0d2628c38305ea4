"""In which dtypes the data-parallel wrappers' collectives move their buffers (``collective_plan``).

The executor trains mixed precision by autocast over fp32 parameters, so its wrappers gather,
broadcast and reduce fp32 (``EXECUTOR_WIRE``; ``executor_wire``: FP8 block weights gathered under
``fp8_param_gather``); the stacks a Plan stands for keep 16-bit
parameters beside an fp32 master copy and reduce gradients at ``collectives.grad_wire_bytes``
(``plan_wire``), with the same calls."""
from __future__ import annotations

from dataclasses import dataclass

from simcore.model.collectives import grad_wire_bytes
from simcore.model.optim_states import param_bytes
from simcore.model.param_layout import ParamTensor
from simcore.plan.spec import Plan, ZeroStage

#: Parameters and gradients are fp32 in the executor (``executors/model.py`` builds fp32 and
#: mixed precision is autocast); the fp16/bf16 DDP hooks halve the all-reduced bucket.
PARAM_ELEMENT_BYTES = 4


@dataclass(frozen=True, slots=True)
class Wire:
    """Bytes per element that the data-parallel wrappers move."""

    param: int
    """A parameter all-gathered or broadcast."""
    grad: int
    """A gradient all-reduced or reduce-scattered (DDP sizes its buckets in fp32 gradients either way)."""
    fp8_weights: bool = False
    """The blocks' linear weights gathered in FP8 (``training.fp8_param_gather``): one byte each."""

    def of(self, p: ParamTensor) -> int:
        """Bytes of one element of parameter ``p`` as it is gathered."""
        return 1 if self.fp8_weights and p.name.startswith("layers.") and not p.norm else self.param


#: The executor's: fp32 parameters and gradients (``PARAM_ELEMENT_BYTES``).
EXECUTOR_WIRE = Wire(param=PARAM_ELEMENT_BYTES, grad=PARAM_ELEMENT_BYTES)


def executor_wire(plan: Plan) -> Wire:
    """The executor's for ``plan``: ``EXECUTOR_WIRE``, with the blocks' linear weights gathered in
    FP8 under ``training.fp8_param_gather`` (torchao's float8 all-gather under FSDP2, ZeRO-2/3:
    ``executors.float8``; the executor runs it on no other layout)."""
    return Wire(param=PARAM_ELEMENT_BYTES, grad=PARAM_ELEMENT_BYTES,
                fp8_weights=plan.training.fp8_param_gather and plan.parallel.zero >= ZeroStage.GRADIENTS)


def plan_wire(plan: Plan) -> Wire:
    """The plan's own dtypes: parameters as stored (``optim_states.param_bytes``: 16-bit beside an
    fp32 master copy, fp32 under autocast), gradients as its stacks reduce them
    (``collectives.grad_wire_bytes``: fp32 by default in Megatron-LM, torchtitan and torch AMP)."""
    tr = plan.training
    return Wire(param=param_bytes(tr), grad=int(grad_wire_bytes(plan)), fp8_weights=tr.fp8_param_gather)
