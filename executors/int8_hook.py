"""``training.grad_compression: int8``: a DDP communication hook that averages a gradient bucket
with int8 on the wire, in two collective steps (torch's own int8 hook,
``quantization_hooks.quantization_pertensor_hook``, fails on gloo).

The scheme is ZeRO++'s qgZ, the all-to-all based quantized gradient averaging that replaces the
reduce-scatter (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for
Giant Model Training", arXiv 2306.10209, Sec. 4, qgZ), as DeepSpeed runs it in
``all_to_all_quant_reduce`` (deepspeedai/DeepSpeed@17b3b557120923866d02a45dc0598d8688303e0a
deepspeed/runtime/comm/coalesced_collectives.py: quantize with a symmetric scale per group,
``all_to_all_single`` of the values, then of the scales; ``quantized_reduction``: dequantize,
sum the received copies, quantize the sum again; a second exchange; dequantize and divide by
the world). Per bucket of n fp32 gradients over W ranks, laid out by
``simcore.model.ddp_hooks.int8_layout`` (the model prices these very steps, ``ddp_hooks.hook_costs``):

1. the bucket, zero-padded to W chunks of k groups of g elements, quantized: one fp32 scale a
   group, absmax / 127, the values round(x / scale) as int8;
2. one ``all_to_all_single`` of a (W, k g + 4 k) int8 buffer, row j chunk j's values then its
   scales' bytes, so that rank r receives every rank's copy of chunk r;
3. the W copies dequantized and summed in fp32, the sum quantized again (step 1's rule);
4. one ``all_gather_into_tensor`` of the summed chunks, values and scales;
5. dequantized with the scales divided by W (DDP averages) into the tensor DDP copies into the
   gradients.

Where it differs from DeepSpeed's: int8 (qgZ sends int4); one level, the data-parallel group as
a whole (DeepSpeed's second all-to-all crosses the nodes and leaves each rank a 1/W shard; DDP
needs the whole averaged bucket, so the second step all-gathers the reduced chunks); the scales
ride in the values' buffer, one call a step where DeepSpeed makes two. gloo runs both calls on
int8 (torch 2.13's ProcessGroupGloo: ``alltoall_base``, ``_allgather_base``). ``int8`` keeps no
error; ``int8_ef`` registers the hook with an ``Int8State`` and carries each quantization's residual
to the next step (error feedback, as DeepSpeed's compressed all-reduce keeps a worker and a server
error: deepspeedai/DeepSpeed@edaa7221 deepspeed/runtime/comm/nccl.py ``compressed_allreduce``): the
worker's error, over the padded bucket, is added before step 1 and replaced by what step 1 lost;
the server's, over this rank's chunk, is added to the sum before step 3's quantization and replaced
alike (4 bytes a parameter and 4 / W more, kept per bucket index from step to step).

On gloo the hook runs its steps in order on the thread DDP calls it from and returns a completed
future: torch's powerSGD_hook issues its later collectives from completion callbacks, whose order
gloo does not keep across ranks over several buckets (``executors.support``), and a CPU rank's
gloo calls block it anyway. On a GPU the all-to-all is asynchronous and the rest is chained on
its future, as torch's hooks chain theirs, so that the backward's kernels are not held behind it.

Under FSDP2 (``parallel.zero`` 2-3) ``int8`` is ``Int8ReduceScatter``, the block's reduce-scatter
as FSDP2 lets it be replaced (``FSDPModule.set_custom_reduce_scatter``, torch 2.13): qgZ's own
shape, steps 1-3 without the second quantization and the all-gather. FSDP2 hands it the block's
flat unsharded gradient in its reduce dtype, W chunks of n (each parameter padded along dim 0,
``_fsdp_collectives.foreach_reduce``), and this rank's n to fill: each chunk padded to k groups of
g (``int8_layout`` of W n), quantized, one ``all_to_all_single`` of (W, k g + 4 k) int8, the W copies
of this rank's chunk dequantized and summed in fp32 (divided by W for FSDP2's average) into the
output. No error feedback: its residual would be the whole unsharded gradient in fp32 on every
rank, which ZeRO-2/3 shard away (``simcore.plan.rules``); DeepSpeed's qgZ keeps none either.
"""
from dataclasses import dataclass, field

import torch   # no ``from __future__ import annotations``: DDP checks the hook's annotations as objects
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter   # the protocol set_custom_reduce_scatter takes

from simcore.model import ddp_hooks as hooks

#: The symmetric range by bits: int8's values in [-127, 127] (absmax / 127 a scale), int4's in [-7, 7].
QMAX = {8: 127, 4: 7}


def values_bytes(k: int, g: int, bits: int) -> int:
    """Bytes of a row's k groups of g values at ``bits`` each (int4: two a byte, ``g`` even)."""
    return k * g * bits // 8


def quantize(x: torch.Tensor, out: torch.Tensor, bits: int = 8) -> None:
    """``x`` (rows, k, g) fp32 into ``out`` (rows, k g bits / 8 + 4 k) int8: each row's values (int4:
    two a byte, the even one in the low nibble), then its k fp32 scales (absmax / QMAX of each group
    of g) as bytes."""
    rows, k, g = x.shape
    v = values_bytes(k, g, bits)
    scale = torch.linalg.vector_norm(x, float("inf"), dim=2).div_(QMAX[bits]).clamp_(min=torch.finfo(torch.float32).tiny)
    codes = x.div(scale.unsqueeze(2)).round_()
    if bits == 4:   # the low nibble masked, the high one shifted up, or'ed (two's complement nibbles)
        pairs = codes.to(torch.int8).view(rows, k, g // 2, 2)
        codes = pairs[..., 0].bitwise_and(0x0F).bitwise_or_(pairs[..., 1].bitwise_left_shift(4))
    out[:, :v].view(rows, k, g * bits // 8).copy_(codes)
    out[:, v:].copy_(scale.view(torch.int8).view(rows, hooks.SCALE_BYTES * k))


def dequantize(buf: torch.Tensor, k: int, g: int, factor: float = 1.0, bits: int = 8) -> torch.Tensor:
    """``buf`` (rows, k g bits / 8 + 4 k) int8, as ``quantize`` wrote it, as (rows, k, g) fp32 times
    ``factor``."""
    rows, v = buf.shape[0], values_bytes(k, g, bits)
    scale = buf[:, v:].clone(memory_format=torch.contiguous_format).view(torch.float32)   # 4-byte aligned
    if factor != 1.0:
        scale = scale * factor
    codes = buf[:, :v].view(rows, k, g * bits // 8)
    if bits == 4:   # each nibble sign-extended by an arithmetic shift, then interleaved back
        low = codes.bitwise_left_shift(4).bitwise_right_shift_(4)
        codes = torch.stack((low, codes.bitwise_right_shift(4)), dim=-1).view(rows, k, g)
    return codes.to(torch.float32).mul_(scale.unsqueeze(2))


@dataclass
class Int8State:
    """The hook's state: its group, its bits (``int4``: 4) and, under error feedback (``int8_ef``),
    each bucket's worker and server errors by the bucket's index (DDP keeps its buckets from step to
    step)."""

    group: object = None
    bits: int = 8
    feedback: bool = True
    worker: dict = field(default_factory=dict)
    server: dict = field(default_factory=dict)


def _with_feedback(x: torch.Tensor, out: torch.Tensor, errors: dict | None, key, bits: int = 8) -> None:
    """Quantize ``x`` (rows, k, g) into ``out``; with ``errors``, add its error for ``key`` first
    and keep what the quantization lost as the next one."""
    if errors is None:
        quantize(x, out, bits)
        return
    _, k, g = x.shape
    err = errors.get(key)
    x = x + err if err is not None and err.shape == x.shape else x.clone()
    quantize(x, out, bits)
    errors[key] = x.sub_(dequantize(out, k, g, bits=bits))


def _reduce_and_gather(recv: torch.Tensor, n: int, group, world: int, k: int, g: int,
                       state: Int8State, key=None) -> torch.Tensor:
    """Steps 3-5: sum this rank's chunk over the ranks' copies, all-gather the sums, the average."""
    bits, ef = state.bits, state.feedback
    part = torch.empty(1, recv.shape[1], dtype=torch.int8, device=recv.device)
    _with_feedback(dequantize(recv, k, g, bits=bits).sum(0, keepdim=True), part, state.server if ef else None, key, bits)
    gathered = torch.empty_like(recv)
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)   # torch 2.13 deprecates the latter
    gather(gathered, part, group=group)   # gloo: the output's rows are the inputs
    return dequantize(gathered, k, g, 1.0 / world, bits).view(-1)[:n]


def int8_hook(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook (``register_comm_hook(group, int8_hook)``, or an ``Int8State``: int4,
    error feedback): the bucket averaged over the group (None: the world) with int8 on the wire."""
    st = state if isinstance(state, Int8State) else Int8State(group=state, feedback=False)
    group = st.group if st.group is not None else dist.group.WORLD
    world = dist.get_world_size(group)
    grad = bucket.buffer()
    n = grad.numel()
    k, g = hooks.int8_layout(n, world, st.bits)
    flat = grad if world * k * g == n else torch.nn.functional.pad(grad, (0, world * k * g - n))
    send = torch.empty(world, values_bytes(k, g, st.bits) + hooks.SCALE_BYTES * k, dtype=torch.int8, device=grad.device)
    key = bucket.index() if st.feedback else None
    _with_feedback(flat.view(world, k, g), send, st.worker if st.feedback else None, key, st.bits)
    recv = torch.empty_like(send)
    if grad.is_cuda:
        work = dist.all_to_all_single(recv, send, group=group, async_op=True)
        return work.get_future().then(lambda _fut: _reduce_and_gather(recv, n, group, world, k, g, st, key))
    dist.all_to_all_single(recv, send, group=group)
    out = torch.futures.Future()
    out.set_result(_reduce_and_gather(recv, n, group, world, k, g, st, key))
    return out


class Int8ReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter with int8 (``bits`` 4: int4) on the wire (the module docstring's last
    paragraph)."""

    def __init__(self, bits: int = 8) -> None:
        self.bits = bits

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group, op, async_op: bool = False):
        if op not in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            raise ValueError(f"the int8 reduce-scatter sums or averages, not {op}")
        world, n = dist.get_world_size(group), output_tensor.numel()
        k, g = hooks.int8_layout(world * n, world, self.bits)
        chunks = input_tensor.view(world, n).float()
        if k * g != n:
            chunks = torch.nn.functional.pad(chunks, (0, k * g - n))
        send = torch.empty(world, values_bytes(k, g, self.bits) + hooks.SCALE_BYTES * k, dtype=torch.int8,
                           device=input_tensor.device)
        quantize(chunks.view(world, k, g), send, self.bits)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=group)
        factor = 1.0 / world if op == dist.ReduceOp.AVG else 1.0
        output_tensor.copy_(dequantize(recv, k, g, factor, self.bits).sum(0).view(-1)[:n])
        return None


def fsdp_int8(model: torch.nn.Module, bits: int = 8) -> torch.nn.Module:
    """``model``'s FSDP2 groups (``executors.fsdp_wrap``) reduce-scattering with ``Int8ReduceScatter``."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_reduce_scatter(Int8ReduceScatter(bits))
    return model
