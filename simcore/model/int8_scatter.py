"""FSDP2's reduce-scatter with int8 (or int4) on the wire: ``training.grad_compression: int8`` (``int4``) under
``parallel.zero`` 2-3 (``simcore.plan.rules.int8_scatters``), as ``executors.int8_hook``
``Int8ReduceScatter`` runs it in place of each FSDP group's reduce-scatter: ZeRO++'s qgZ in one
level (Wang et al. 2023, arXiv 2306.10209, Sec. 4; DeepSpeed's ``all_to_all_quant_reduce``).

Per call, over a group of N unsharded gradient elements (FSDP2's padded reduce-scatter input, W
chunks of N / W) and W ranks, the chunks laid out as the DDP hook's (``ddp_hooks.int8_layout``:
k groups of g a chunk, padded):

- the wire: one all-to-all of W (k g + 4 k) bytes (``ddp_hooks.int8_call_bytes``), the values and
  an fp32 scale a group, where FSDP2 reduce-scatters 4 N (its fp32 reduce dtype);
- the kernels (``SCATTER_KERNELS``): the chunks padded (one, where k g > N / W), one quantization
  (7: absmax, its division and floor, x / scale, round, the int8 copy, the scales' copy), one
  dequantization of the W received copies (3), their sum and its copy into FSDP2's output;
  streaming ``SCATTER_PASS_BYTES`` an element of the padded input and ``SCATTER_CHUNK_BYTES`` an
  element of this rank's chunk;
- the memory (``SCATTER_BUFFER_BYTES`` an element, beside FSDP2's own input and output): the int8
  buffers sent and received, the padded fp32 chunks and the W copies dequantized to fp32;
- int4 (``ddp_hooks.QUANT_BITS``): W (k g / 2 + 4 k) bytes, groups of an even size, the packing
  after the quantization and the unpacking before the dequantization (``ddp_hooks.PACK_KERNELS``,
  ``UNPACK_KERNELS`` and their bytes); its packed buffers are half int8's, its unpacked codes the
  other half: the same working bytes.
"""
from __future__ import annotations

from simcore.model import collectives as coll
from simcore.model import ddp_hooks as hooks

#: The call's kernels (module docstring): quantization 7, dequantization 3, the sum and its copy.
SCATTER_KERNELS = 7 + 3 + 1 + 1
#: fp32 bytes an element of the padded input costs them: the quantization reads it three times and
#: writes it twice in fp32, once in int8 (25), the dequantization of the W copies reads int8, writes
#: fp32, reads and writes it again (13), the sum reads them (4).
SCATTER_PASS_BYTES = 25 + 13 + 4
#: The same per element of this rank's chunk: the sum's write (4), the copy's read and write (8).
SCATTER_CHUNK_BYTES = 4 + 8
#: The padding's pass, per element of the padded input where there is one: read and write fp32.
PAD_BYTES = 8
#: Working bytes an element of the input (module docstring): int8 sent and received (1 + 1), the
#: padded fp32 chunks (4) and the dequantized fp32 copies (4).
SCATTER_BUFFER_BYTES = 1 + 1 + 4 + 4


def call_bytes(numel: float, world: int, bits: int = 8) -> int:
    """The all-to-all's buffer of one call over ``numel`` unsharded gradient elements."""
    return hooks.int8_call_bytes(max(1, round(numel)), world, bits)


def kernels_s(numel: float, world: int, dev, bits: int = 8) -> float:
    """The call's kernels on ``dev`` (eager ops issued one by one, ``ddp_hooks.op_s``)."""
    k, g = hooks.int8_layout(max(1, round(numel)), world, bits)
    padded = world * k * g
    pad, packed = padded > numel, bits == 4
    passes = SCATTER_PASS_BYTES * padded + SCATTER_CHUNK_BYTES * k * g + (PAD_BYTES * padded if pad else 0) \
        + packed * (hooks.PACK_BYTES + hooks.UNPACK_BYTES) * padded
    count = SCATTER_KERNELS + pad + packed * (hooks.PACK_KERNELS + hooks.UNPACK_KERNELS)
    return count * hooks.op_s(dev) + passes / (dev.hbm_bytes_per_s * dev.memory_efficiency)


def call_s(numel: float, net: coll.GroupNet, dev, measured: bool = False, bits: int = 8) -> float:
    """One call over ``numel`` elements on ``net``: its all-to-all (``measured``: a calibrated host
    whose measured FSDP cost holds the call's latency, the bytes' term only) and, on a GPU, its
    kernels on the reduce-scatter's stream; a calibrated CPU host runs them on the thread that runs
    the backward (``host_s``), so they are not part of the call there."""
    nbytes = call_bytes(numel, net.ranks, bits)
    wire = coll.ring_bytes_s(nbytes, net) if measured else coll.all_to_all_s(nbytes, net)
    return wire + (0.0 if dev.parallel_kernels else kernels_s(numel, net.ranks, dev, bits))


def host_s(numel: float, world: int, dev, calls: float, bits: int = 8) -> float:
    """A calibrated CPU host's blocking time for ``calls`` calls over ``numel`` elements each: there
    FSDP2 runs the reduce-scatter, kernels and all, inside the backward (no streams); 0 elsewhere."""
    return calls * kernels_s(numel, world, dev, bits) if dev.parallel_kernels and numel > 0 else 0.0
