"""1-bit Adam (Tang et al., ICML 2021, "1-bit Adam: Communication Efficient Large-Scale Training
with Adam's Convergence Speed") as DeepSpeed runs it (deepspeedai/DeepSpeed @edaa7221,
``deepspeed/runtime/fp16/onebit/adam.py`` and ``runtime/comm/nccl.py``): what its compression
stage puts on the wire, the kernels it runs, and the error-feedback buffers it keeps.

- For its first ``freeze_step`` steps it is Adam with the engine's gradient all-reduce. After,
  the engine stops reducing gradients (``enable_backward_allreduce = False``) and the optimizer's
  step all-reduces the momentum instead, compressed: ``NcclBackend.compressed_allreduce`` on each
  flat fp32 parameter group (the mixed-precision optimizer flattens them). The variance is frozen.
  A step prices that steady state; ``trainplan cost`` charges the first
  ``training.onebit_freeze_step`` steps at Adam's step (``simcore.planner.onebit_phases``).
- The compressed all-reduce: add the worker error, scale = norm / sqrt(n), keep the new error,
  pack the signs to bits (n/8 bytes), ``all_to_all_single`` of the packed chunks, ``all_gather``
  of the W worker scales; each rank unpacks its chunk from every worker, averages, adds its
  server error, rescales and packs its 1/W of the signs; ``all_gather`` of the packed server
  chunks (n/8 bytes out) and of the W server scales; unpack into the momentum. All in the
  optimizer's step, after the backward: nothing overlaps it.
- Kept: the worker error (fp32, the flat size rounded up to a multiple of W x 8) and the server
  error (fp32, 1/W of it).
- DeepSpeed refuses it with ZeRO (engine.py: "1bit-Adam is not compatible with ZeRO").

Its two siblings (Li et al., arXiv 2104.06069; Lu et al., arXiv 2202.06009), same commit:

- 1-bit LAMB (``runtime/fp16/onebit/lamb.py`` ``OnebitLamb``): after ``freeze_step`` the same
  compressed all-reduce of the flat momentum (``exp_avg_flat``, padded to the corrected size) each
  step, and LAMB's own passes in the step (``LAMB_KERNEL_BYTES``); it keeps ``exp_avg_sq_fresh``
  (``optim_states``), the errors and, through the step, ``exp_avg_last_step``, a clone of the
  momentum. Its warm-up is LAMB over the engine's all-reduce, ``trainplan cost`` charges it.
- 0/1 Adam (``zoadam.py`` ``ZeroOneAdam``): up to ``var_freeze_step`` the gradient is 1-bit
  all-reduced each step but on the variance updates (the engine's all-reduce, every
  ``var_interval`` steps, doubling after each ``VAR_UPDATE_SCALER`` updates); then local steps
  (the momentum accumulator, ``ZERO_ONE_LOCAL_BYTES``) and, every ``local_step_interval`` steps,
  the accumulator's compressed all-reduce and the passes around it (``ZERO_ONE_SYNC_BYTES``), the
  interval doubling every ``LOCAL_STEP_SCALER`` steps up to ``LOCAL_STEP_CLIPPER``. A step prices
  the steady state, one in 16; ``simcore.planner.onebit_phases`` charges the steps before it.
  It keeps ``momentum_accumulator`` (``optim_states``) and the errors.
- DeepSpeed refuses both with ZeRO (engine.py: "1bit-Lamb ..." and "0/1 Adam is not compatible with ZeRO").

Pure functions of the element count, the group and the device: ``dp_costs``, ``memory`` and
``simcore.planner.onebit_phases`` call them.
"""
from __future__ import annotations

import math

from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.plan.choices import ONEBIT_OPTIMIZERS, Optimizer

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


# --------------------------------------------------------------------------- 1-bit LAMB, 0/1 Adam

#: 1-bit LAMB's compression stage, HBM bytes per element its step runs beyond 1-bit Adam's (lamb.py
#: ``step``; the momentum update, ``exp_avg / (exp_avg_sq.sqrt() + eps)`` and ``p.add_`` are Adam's
#: step, which ``dp_costs.optimizer_costs`` charges from K, each state read and written once): the
#: ``exp_avg_last_step`` clone 8; ``exp_avg.mul_(scaling_coeff)`` 8 before the all-reduce and ``div_``
#: 8 after; ``grad_reconstruct = (exp_avg - exp_avg_last_step * beta1) / (1 - beta1)`` 8 + 12 + 8; the
#: fresh variance ``mul_(beta2).addcmul_(1 - beta2, g, g)`` 8 + 16 less the read and write K charges
#: (8); ``update.pow(2).sum()`` 8 + 4; ``denom_real = exp_avg_sq_fresh.sqrt() + eps`` 8 + 8;
#: ``(denom / denom_real).max()`` 12 + 4 (weight_decay 0, its default: no ``update_prelim`` norm).
LAMB_KERNEL_BYTES = 8 + 8 + 8 + (8 + 12 + 8) + (8 + 16 - 8) + (8 + 4) + (8 + 8) + (12 + 4)
#: Its warm-up ("baseline Lamb optimization") beyond Adam's step: ``p.data.pow(2).sum()`` and
#: ``update.pow(2).sum()``, 8 + 4 each.
LAMB_WARMUP_BYTES = 2 * (8 + 4)
#: 0/1 Adam past ``var_freeze_step`` (zoadam.py ``step``), beyond Adam's step, every step:
#: ``comm_buffer.add_(-lr * update)`` 8 + 12, less the accumulator's read and write K charges (8).
ZERO_ONE_LOCAL_BYTES = 8 + 12 - 8
#: ... and every ``local_step_interval`` steps beside the compressed all-reduce: ``p.data.add_(-1 *
#: comm_buffer)`` 8 + 12; ``comm_buffer.mul_(exp_avg_sq.sqrt() + eps)`` 8 + 8 + 12; ``comm_buffer.copy_``
#: of the all-reduced (padded) buffer 8; ``exp_avg.zero_().add_(comm_buffer / lrs, alpha=-1)`` 4 + 8 +
#: 12; ``p.data.add_(comm_buffer / (exp_avg_sq.sqrt() + eps))`` 8 + 8 + 12 + 12; ``comm_buffer.zero_()`` 4.
ZERO_ONE_SYNC_BYTES = (8 + 12) + (8 + 8 + 12) + 8 + (4 + 8 + 12) + (8 + 8 + 12 + 12) + 4
#: zoadam.py's defaults: ``var_update_scaler`` (variance updates per interval before it doubles),
#: ``local_step_scaler`` (steps per local-step interval before it doubles) and ``local_step_clipper``
#: (the largest interval: the steady state's).
VAR_UPDATE_SCALER = 16
LOCAL_STEP_SCALER = 32678
LOCAL_STEP_CLIPPER = 16


def sync_s(optimizer: Optimizer, elements: float, net: coll.GroupNet, dev: cmp.DeviceModel,
           interval: int = LOCAL_STEP_CLIPPER) -> float:
    """Per compression-stage step on ``net``: the compressed all-reduce and its kernels, every step
    (1-bit Adam, 1-bit LAMB) or every ``interval`` steps (0/1 Adam's accumulator); none on one rank
    (each optimizer's ``if self.size > 1``)."""
    if net.ranks <= 1:
        return 0.0
    one = compressed_allreduce_s(elements, net) + kernel_s(elements, dev)
    return one / interval if optimizer == Optimizer.ZERO_ONE_ADAM else one


def step_kernel_s(optimizer: Optimizer, elements: float, dev: cmp.DeviceModel,
                  interval: int = LOCAL_STEP_CLIPPER) -> float:
    """What the step runs beyond Adam's, whatever the ranks: 1-bit LAMB's passes, 0/1 Adam's
    accumulator and, every ``interval`` steps, its sync passes; 0 for the others."""
    if optimizer == Optimizer.ONEBIT_LAMB:
        return cmp.stream_s(LAMB_KERNEL_BYTES * elements, dev)
    if optimizer == Optimizer.ZERO_ONE_ADAM:
        return cmp.stream_s((ZERO_ONE_LOCAL_BYTES + ZERO_ONE_SYNC_BYTES / interval) * elements, dev)
    return 0.0


def memory_terms(optimizer: Optimizer, elements: float, ranks: int) -> dict[str, float]:
    """Bytes beyond the states (K) of DeepSpeed's 1-bit optimizers: their error buffers and 1-bit
    LAMB's ``exp_avg_last_step`` (fp32, a clone of the momentum held through its step); none else."""
    if optimizer not in ONEBIT_OPTIMIZERS:
        return {}
    clone = {"onebit_momentum_clone": FP32 * elements} if optimizer == Optimizer.ONEBIT_LAMB else {}
    return {"onebit_errors": error_bytes(elements, ranks), **clone}


def uncompressed_steps(steps: int, scaler: int = VAR_UPDATE_SCALER) -> int:
    """Of 0/1 Adam's first ``steps`` steps, those over the engine's uncompressed all-reduce: the first
    (``step`` initializes, updating nothing) and each variance update, every ``var_interval``-th step
    from the second on, the interval doubling after ``scaler`` updates (zoadam.py ``var_counter``)."""
    count, step, interval = min(1, steps), 1, 1
    while True:
        step = (step // interval + 1) * interval
        if step > steps:
            return count
        count += 1
        if (count - 1) % scaler == 0:
            interval *= 2


def local_step_ramp() -> tuple[int, ...]:
    """0/1 Adam's local-step intervals before the steady one, ``LOCAL_STEP_SCALER`` steps each: 1, 2, 4, 8."""
    return tuple(2 ** k for k in range(LOCAL_STEP_CLIPPER.bit_length() - 1))
