"""DDP's gradient buckets and the communication hooks ``training.grad_compression`` names, as
torch 2.13 runs them (torch/distributed/algorithms/ddp_comm_hooks), per bucket and step:

- buckets (reducer.cpp ``compute_bucket_assignment_by_size``): gradients in ready order fill a
  bucket until it reaches its limit, 1 MiB for the first and 25 MiB after;
- ``fp16`` / ``bf16`` (default_hooks.py ``_compress_hook``): the bucket cast to 16 bits and
  divided by the world (two kernels), all-reduced, copied back into the fp32 bucket (one);
- ``powersgd`` (powerSGD_hook.py ``powerSGD_hook``, rank r, error feedback and warm start as
  torch defaults them): the error added to the bucket and the bucket cloned; each gradient seen
  as a matrix n x m is compressed where (n + m) r x ``min_compression_rate`` (2) < n m, the
  rest concatenated; each compressed matrix M gets P = M Q and, after the Ps' all-reduce,
  Q = M^T P and M = P Q^T, each P and Q orthogonalised first (Gram-Schmidt for r <= 2: a norm
  and a division per column); three all-reduces a bucket, each after the last one's result
  (the uncompressed tensors, all Ps, all Qs), then the Qs divided by the world, the
  uncompressed tensors copied back and the new error (the clone minus the result) kept;
- ``int8`` (the executor's own hook, ``executors/int8_hook.py``: ZeRO++'s qgZ in one level, arXiv
  2306.10209 Sec. 4): the bucket padded to W chunks of k groups of g elements (``int8_layout``),
  quantized (an fp32 scale a group, absmax / 127), one all-to-all of the int8 chunks and their
  scales, the W copies of this rank's chunk dequantized, summed and quantized again, one
  all-gather of the sums, dequantized with the scales divided by W: two calls a bucket, each of
  W (k g + 4 k) bytes, and ``INT8_KERNELS`` kernels; ``int8_ef`` adds error feedback (Seide et al.
  2014, "1-Bit Stochastic Gradient Descent", the residual carried to the next step; Karimireddy et
  al. 2019, arXiv 1901.09847, EF-SGD), at both of the hook's quantizations as DeepSpeed's compressed
  all-reduce keeps a worker and a server error (deepspeedai/DeepSpeed@edaa7221
  deepspeed/runtime/comm/nccl.py ``compressed_allreduce``): the worker's error added to the padded
  bucket before its quantization and the new one kept (the bucket minus its dequantized int8),
  the server's alike on the summed chunk; ``EF_KERNELS`` more kernels and fp32 errors of the padded
  bucket and of the chunk kept from step to step (``ef_error_bytes``);
- ``int4``: int8's steps with 4-bit values in [-7, 7] (absmax / 7 a scale), two packed a byte, as
  qgZ sends them (DeepSpeed's ``swizzle_quant(..., 4, Symmetric, ...)`` @17b3b557): groups of an
  even size, W (k g / 2 + 4 k) bytes a call, ``PACK_KERNELS`` more a quantization and
  ``UNPACK_KERNELS`` a dequantization.

``hook_costs`` prices them on a device (its streams and per-kernel costs: a hook's kernels are
plain eager ops issued one by one from Python callbacks, no autograd around them);
``bucket_calls`` lists the all-reduces each bucket makes, ``bucket_collectives`` every call by kind.
"""
from __future__ import annotations

import math

#: DDP's bucket limits (torch/nn/parallel/distributed.py: ``dist._DEFAULT_FIRST_BUCKET_BYTES``,
#: ``_DEFAULT_BUCKET_CAP_MB`` = 25).
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_CAP_BYTES = 25 * 1024 * 1024
#: PowerSGD's rank: torch's ``PowerSGDState(matrix_approximation_rank=1)`` default, which the
#: executor registers (Vogels et al. 2019 train with ranks 1-4).
POWERSGD_RANK = 1
#: PowerSGDState's ``min_compression_rate`` default: compress a matrix only where it saves this much.
MIN_COMPRESSION_RATE = 2
#: Kernels of one rank-r Gram-Schmidt column (``_orthogonalize_gram_schmidt``: the norm, the division).
GRAM_SCHMIDT_KERNELS = 2
#: fp32 gradients (DDP reduces the parameters' dtype; the executor's are fp32).
FP32 = 4
#: The int8 hook's largest quantization group (elements): DeepSpeed's ``CUDAQuantizer.target_group_size``,
#: which ZeRO++'s qwZ quantizes with (deepspeedai/DeepSpeed@edaa7221 runtime/zero/partition_parameters.py,
#: as ``simcore.model.zeropp`` cites it).
INT8_GROUP = 8000
#: An fp32 scale per int8 group, sent as 4 int8 bytes beside the values.
SCALE_BYTES = 4
#: The int8 hook's kernels a bucket (``executors/int8_hook.py``): two quantizations of 7 (absmax,
#: its division and floor, x / scale, round, the int8 copy, the scales' copy), two dequantizations of
#: 3 (the scales made contiguous, int8 to fp32, times the scales), the sum over the ranks, and the
#: scales divided by the world.
INT8_KERNELS = 2 * 7 + 2 * 3 + 1 + 1
#: fp32 bytes a padded element costs those kernels: the first quantization over the W chunks reads
#: it three times and writes it twice in fp32, once in int8 (25); each dequantization over them
#: reads int8, writes fp32, reads and writes it again (13, twice); the sum reads it (4).
INT8_PASS_BYTES = 25 + 13 + 13 + 4
#: The same per element of this rank's chunk: the sum's write (4) and its quantization (25).
INT8_CHUNK_BYTES = 4 + 25
#: Error feedback's kernels a bucket (``executors/int8_hook.py`` ``Int8State``), at each of the two
#: quantizations: the error added (1), the int8 dequantized (3, as above) and the new error, the
#: input minus it (1).
EF_KERNELS = 2 * (1 + 3 + 1)
#: fp32 bytes error feedback streams per element it covers (the padded bucket, this rank's chunk):
#: the add reads two and writes one (12), the dequantization 13, the new error reads two, writes one (12).
EF_PASS_BYTES = 12 + 13 + 12
#: int4's packing after a quantization (``executors/int8_hook.py`` ``quantize``): the low values masked,
#: the high ones shifted, the two or'ed into a byte; and its unpacking before a dequantization: the
#: low nibble shifted up and back (sign-extended), the high one shifted down, the two interleaved
#: (``dequantize``).
PACK_KERNELS = 3
UNPACK_KERNELS = 4
#: Bytes an element those passes stream (int8 codes read and written once each pass, half of them).
PACK_BYTES = UNPACK_BYTES = 3


#: The quantized hooks' bits a value, by ``training.grad_compression``.
QUANT_BITS = {"int8": 8, "int8_ef": 8, "int4": 4}


def bucket_members(ready_bytes: list[int], first_cap: int = DDP_FIRST_BUCKET_BYTES,
                   cap: int = DDP_BUCKET_CAP_BYTES) -> list[list[int]]:
    """Indices (into ``ready_bytes``, gradients in ready order) of each DDP bucket's gradients:
    a bucket closes once it reaches its limit (``first_cap``, then ``cap``)."""
    buckets, current, size, limit = [], [], 0, first_cap
    for i, b in enumerate(ready_bytes):
        current.append(i)
        size += b
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, cap
    return buckets + ([current] if current else [])


def compressed(shape: tuple[int, ...], rank: int) -> tuple[int, int] | None:
    """(Ps, Qs) elements of a gradient PowerSGD compresses (None: sent uncompressed)."""
    if len(shape) < 2:
        return None
    n, m = shape[0], math.prod(shape[1:])
    r = min(n, m, rank)
    return (n * r, m * r) if (n + m) * r * MIN_COMPRESSION_RATE < n * m else None


def int8_layout(numel: int, world: int, bits: int = 8) -> tuple[int, int]:
    """(groups a chunk, elements a group) of the quantized hook's bucket of ``numel`` over ``world``
    ranks: W chunks of ceil(numel / W) elements, each the fewest groups of at most ``INT8_GROUP``,
    equal ones (the last chunk zero-padded); at 4 bits a group's size even (two values a byte)."""
    chunk = max(1, -(-numel // world))
    k = -(-chunk // INT8_GROUP)
    g = -(-chunk // k)
    return k, g + g % 2 if bits == 4 else g


def int8_call_bytes(numel: int, world: int, bits: int = 8) -> int:
    """Bytes of each of the quantized hook's two calls on a bucket of ``numel`` gradients (the
    all-to-all's buffer, the all-gather's output): every chunk's values (``bits`` each) and scales."""
    k, g = int8_layout(numel, world, bits)
    return world * (k * g * bits // 8 + SCALE_BYTES * k)


def ef_error_bytes(numel: int, world: int) -> int:
    """fp32 bytes of the errors error feedback keeps for a bucket of ``numel`` gradients over
    ``world`` ranks: the padded bucket's and this rank's chunk's."""
    k, g = int8_layout(numel, world)
    return FP32 * (world * k * g + k * g)


def bucket_collectives(compression: str, shapes: list[tuple[int, ...]], rank: int, element_bytes: int,
                       world: int) -> list[tuple[str, int]]:
    """(kind, bytes) of each call one bucket of gradients of ``shapes`` makes over ``world`` ranks:
    the int8 hook's all-to-all and all-gather, the others' all-reduces (``bucket_calls``)."""
    if compression in QUANT_BITS:
        b = int8_call_bytes(sum(math.prod(s) for s in shapes), world, QUANT_BITS[compression])
        return [("all_to_all", b), ("all_gather", b)]
    return [("all_reduce", b) for b in bucket_calls(compression, shapes, rank, element_bytes)]


def bucket_calls(compression: str, shapes: list[tuple[int, ...]], rank: int, element_bytes: int) -> list[int]:
    """Bytes of each all-reduce one bucket of gradients of ``shapes`` makes under ``compression``
    (``none``, ``fp16``, ``bf16``, ``powersgd``)."""
    numel = sum(math.prod(s) for s in shapes)
    if compression in ("fp16", "bf16"):
        return [2 * numel]
    if compression != "powersgd":
        return [element_bytes * numel]
    pq = [compressed(s, rank) for s in shapes]
    plain = sum(math.prod(s) for s, c in zip(shapes, pq) if c is None)
    return [element_bytes * plain, element_bytes * sum(c[0] for c in pq if c),
            element_bytes * sum(c[1] for c in pq if c)]


def hook_costs(compression: str, shapes: list[tuple[int, ...]], rank: int, dev, all_reduce,
               world: int = 1, call=None) -> tuple[float, float]:
    """(communication seconds, hook kernel seconds) of one step's buckets of gradients of ``shapes``
    (in ready order) over ``world`` ranks; ``all_reduce(nbytes)`` the seconds of one all-reduce,
    ``call(kind, nbytes)`` of one call of another kind (the int8 hook's)."""
    if compression in QUANT_BITS:
        return _int8_costs(shapes, dev, world, call, compression == "int8_ef", QUANT_BITS[compression])
    comm = kernels = 0.0
    # one kernel: on a CPU host its issue and run (the thread that issues it runs it), else the
    # longer of the host's issue and the device's kernel (a hook issues them one by one)
    op = dev.kernel_overhead_s + dev.dispatch_s if dev.dispatch_s is not None else \
        max(dev.kernel_overhead_s, dev.host_overhead_s)
    stream = dev.hbm_bytes_per_s * dev.memory_efficiency
    for members in bucket_members([FP32 * math.prod(s) for s in shapes]):
        part = [shapes[i] for i in members]
        calls = bucket_calls(compression, part, rank, FP32)
        comm += sum(all_reduce(b) for b in calls)
        n = sum(math.prod(s) for s in part)
        if compression in ("fp16", "bf16"):   # cast, divide, copy back
            kernels += 3 * op + FP32 * n * 4 / stream
        elif compression == "powersgd":
            squeezed = [math.prod(s) for s in part if compressed(s, rank)]
            plain = len(part) - len(squeezed)
            gs = GRAM_SCHMIDT_KERNELS * min(rank, 2)
            # error add, clone, cat, Qs' division, new error; per matrix: two orthogonalisations
            # and three bmm; per plain tensor its copy back
            count = 5 + len(squeezed) * (2 * gs + 3) + plain
            # fp32 passes: error add 3, clone 2 and new error 3 over the bucket; the three bmm
            # over the matrices (read M twice, write it once); cat and copy back over the rest
            passes = 8 * n + 3 * sum(squeezed) + 4 * (n - sum(squeezed))
            kernels += count * op + FP32 * passes / stream
    return comm, kernels


def op_s(dev) -> float:
    """One eager kernel of a hook: on a CPU host its issue and run (the thread that issues it runs
    it), else the longer of the host's issue and the device's kernel (a hook issues them one by one)."""
    return dev.kernel_overhead_s + dev.dispatch_s if dev.dispatch_s is not None else \
        max(dev.kernel_overhead_s, dev.host_overhead_s)


def _int8_costs(shapes: list[tuple[int, ...]], dev, world: int, call, feedback: bool = False,
                bits: int = 8) -> tuple[float, float]:
    """``hook_costs`` of the quantized hook: per bucket its all-to-all and all-gather, its kernels over
    the padded bucket (N elements: zero-padding costs a fill and a copy) and over this rank's chunk,
    with ``feedback`` error feedback's over both, at 4 bits the packing and unpacking (two of each:
    the bucket's and the chunk's, the received copies' and the gathered sums')."""
    comm = kernels = 0.0
    stream = dev.hbm_bytes_per_s * dev.memory_efficiency
    for members in bucket_members([FP32 * math.prod(s) for s in shapes]):
        n = sum(math.prod(shapes[i]) for i in members)
        k, g = int8_layout(n, world, bits)
        padded, pad = world * k * g, world * k * g > n
        b = int8_call_bytes(n, world, bits)
        comm += call("all_to_all", b) + call("all_gather", b)
        passes = INT8_PASS_BYTES * padded + INT8_CHUNK_BYTES * k * g + ((FP32 * padded + 2 * FP32 * n) if pad else 0)
        passes += feedback * EF_PASS_BYTES * (padded + k * g) + (bits == 4) * (
            PACK_BYTES * (padded + k * g) + UNPACK_BYTES * 2 * padded)
        count = INT8_KERNELS + 2 * pad + feedback * EF_KERNELS + (bits == 4) * 2 * (PACK_KERNELS + UNPACK_KERNELS)
        kernels += count * op_s(dev) + passes / stream
    return comm, kernels
