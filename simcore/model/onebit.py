"""1-bit Adam (Tang et al., ICML 2021, "1-bit Adam: Communication Efficient Large-Scale Training
with Adam's Convergence Speed") as DeepSpeed runs it (deepspeedai/DeepSpeed @edaa7221,
``deepspeed/runtime/fp16/onebit/adam.py`` and ``runtime/comm/nccl.py``): what its compression
stage puts on the wire, the kernels it runs, and the error-feedback buffers it keeps.

- For its first ``freeze_step`` steps it is Adam with the engine's gradient all-reduce. After,
  the engine stops reducing gradients (``enable_backward_allreduce = False``) and the optimizer's
  step all-reduces the momentum instead, compressed: ``NcclBackend.compressed_allreduce`` on each
  flat fp32 parameter group (the mixed-precision optimizer flattens them). The variance is frozen.
  A step prices that steady state; ``trainplan cost`` charges the first
  ``training.onebit_freeze_step`` steps at Adam's step (``simcore.planner.runcost.onebit_warmup``).
- The compressed all-reduce: add the worker error, scale = norm / sqrt(n), keep the new error,
  pack the signs to bits (n/8 bytes), ``all_to_all_single`` of the packed chunks, ``all_gather``
  of the W worker scales; each rank unpacks its chunk from every worker, averages, adds its
  server error, rescales and packs its 1/W of the signs; ``all_gather`` of the packed server
  chunks (n/8 bytes out) and of the W server scales; unpack into the momentum. All in the
  optimizer's step, after the backward: nothing overlaps it.
- Kept: the worker error (fp32, the flat size rounded up to a multiple of W x 8) and the server
  error (fp32, 1/W of it).
- DeepSpeed refuses it with ZeRO (engine.py: "1bit-Adam is not compatible with ZeRO").

Pure functions of the element count, the group and the device: ``dp_costs`` and ``memory`` call them.
"""
from __future__ import annotations

import math

from simcore.model import collectives as coll
from simcore.model import compute as cmp

#: Bytes of an fp32 element (the momentum, the errors, the scales).
FP32 = 4.0
#: Bytes a packed sign takes (``cupy.packbits``: 8 signs a byte).
SIGN = 1.0 / 8
#: HBM bytes per element of the compressed all-reduce's elementwise kernels, as nccl.py runs them
#: in eager PyTorch and CuPy, per element of the flat buffer (reads + writes):
#: worker side: ``add_(worker_error)`` 12, ``linalg.norm`` 4, the new error (``sign().add_(1)
#: .bool().float().add_(-0.5).mul_(2.0)``, then ``buffer - scale * that``) 6 passes of 8 = 48,
#: the signs to bool and packed 4 + 1 + 1 + 1/8; server side, over the W chunks received (n
#: elements): ``unpackbits`` 1/8 + 1, ``.float().add_(-0.5).mul_(2.0)`` 5 + 8 + 8, ``mul_`` by
#: the scales 8, ``sum(0)`` 4; the final ``unpackbits`` 1/8 + 1, the same float ops 21, the
#: scale 8 and ``copy_`` into the momentum 8. The server's own error and packing run on 1/W of
#: the elements and are left out.
KERNEL_BYTES = 12 + 4 + 48 + (4 + 1 + 1 + SIGN) + (SIGN + 1) + 21 + 8 + 4 + (SIGN + 1) + 21 + 8 + 8


def compressed_allreduce_s(elements: float, net: coll.GroupNet) -> float:
    """The wire of one compression-stage step over ``elements`` fp32 momenta on ``net``: the
    packed signs' all-to-all and all-gather (n/8 bytes each), and the scales' two all-gathers."""
    ranks = net.ranks
    if ranks <= 1 or elements <= 0:
        return 0.0
    signs = elements * SIGN
    scales = FP32 * ranks
    return coll.all_to_all_s(signs, net) + coll.all_gather_s(signs, net) + 2 * coll.all_gather_s(scales, net)


def kernel_s(elements: float, dev: cmp.DeviceModel) -> float:
    """The compression and decompression kernels of one step, memory-bound."""
    return cmp.stream_s(KERNEL_BYTES * elements, dev)


def error_bytes(elements: float, ranks: int) -> float:
    """The worker and server error-feedback buffers (fp32), allocated whatever W: the flat size
    rounded up to a multiple of W x lcm(W, 8) (adam.py ``corrected_tensor_size``, ``divider``),
    and 1/W of it."""
    unit = ranks * ranks * 8 // math.gcd(ranks, 8)
    corrected = -(-elements // unit) * unit
    return FP32 * (corrected + corrected / ranks)
