"""ZeRO++ (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant
Model Training", arXiv 2306.10209) as DeepSpeed runs it (deepspeedai/DeepSpeed @edaa7221):
what each of its three switches puts on the wire, the kernels it adds, and the bytes it keeps.

- qwZ (``parallel.zero_quantized_weights``): ZeRO-3's parameter all-gathers move int8 values and
  one fp32 scale per group; ``CUDAQuantizer`` (runtime/zero/partition_parameters.py) sizes the
  groups to at most ``target_group_size`` = 8,000 elements. Each rank casts its shard to fp16 and
  quantizes it (the CUDA kernel reads fp16), and the gathered buffer is dequantized to 16 bits.
- hpZ (``parallel.zero_hpz_partition_size`` = H): after the forward's all-gather each rank keeps
  a 1/H slice of the gathered parameters, a secondary partition (quantized where qwZ is on: the
  secondary tensor's ``ds_quant_scale``), and the backward's all-gathers read it over the H
  contiguous ranks of its group (utils/groups.py ``_create_zero_param_parallel_group``): inside a
  node where H is at most its GPUs. The forward gathers over all data-parallel ranks, as before.
- qgZ (``parallel.zero_quantized_gradients``): runtime/comm/coalesced_collectives.py
  ``all_to_all_quant_reduce`` in place of the reduce-scatter, per gradient tensor: swizzle and
  quantize to int4 (one fp32 scale per group, max(rows, cols, world) groups), all-to-all inside
  the node (values, then scales), ``quantized_reduction`` (dequantize, sum the node's L parts,
  requantize 1/L of it to int4), all-to-all across the nodes, dequantize and sum the nodes'
  chunks: 1/world of the gradient per rank.

Pure functions of byte counts, groups and the device: ``dp_costs`` and ``memory`` call them.
"""
from __future__ import annotations

from simcore.model import collectives as coll
from simcore.model import compute as cmp

#: ``CUDAQuantizer.target_group_size``: qwZ's largest quantization group (elements).
QWZ_GROUP = 8000
#: An fp32 scale per quantization group.
SCALE_BYTES = 4
#: int8 (qwZ) and int4 (qgZ) bytes per element.
INT8, INT4 = 1.0, 0.5
#: fp16: what ``CUDAQuantizer.quantize`` casts a shard to before its kernel reads it.
FP16 = 2.0


def qwz_wire_bytes() -> float:
    """Bytes per parameter a qwZ all-gather moves: int8 and its share of a group's scale."""
    return INT8 + SCALE_BYTES / QWZ_GROUP


def qwz_kernels_s(gathered: float, shard: float, param_bytes: float, dev: cmp.DeviceModel) -> float:
    """qwZ's kernels around one all-gather of ``gathered`` parameters (``shard`` of them this
    rank's): the shard cast to fp16 and quantized (none where it is stored quantized: hpZ's
    secondary partition, ``shard`` 0), the gathered int8 dequantized to 16 bits."""
    prepare = cmp.stream_s((param_bytes + FP16) * shard, dev) + cmp.stream_s((FP16 + INT8) * shard, dev)
    return (prepare if shard > 0 else 0.0) + cmp.stream_s((INT8 + param_bytes) * gathered, dev)


def gather_bytes(param_bytes: float, quantized: bool) -> float:
    """Bytes per parameter on the wire of a ZeRO-3 all-gather (and in hpZ's secondary copy)."""
    return qwz_wire_bytes() if quantized else param_bytes


def qgz_layer_s(params: float, grad_bytes: float, tensors: int, nets: tuple, dev: cmp.DeviceModel,
                scale_groups: float) -> float:
    """qgZ's reduction of one layer's ``params`` gradients (``grad_bytes`` an element) held in
    ``tensors`` tensors: per tensor two all-to-alls inside the node (int4 values, fp32 scales of
    ``scale_groups`` groups) over ``nets[0]`` (its L ranks) and two across the nodes over
    ``nets[1]`` (one rank a node), and the quantize, reduce and dequantize kernels."""
    intra, inter = nets
    local, world = max(1, intra.ranks), max(1, intra.ranks * inter.ranks)
    each = params / max(1, tensors)
    scales = SCALE_BYTES * scale_groups
    comm = tensors * (coll.all_to_all_s(INT4 * each, intra) + coll.all_to_all_s(scales, intra)
                      + coll.all_to_all_s(INT4 * each / local, inter) + coll.all_to_all_s(scales / local, inter))
    quantize = (grad_bytes + INT4) * params                          # swizzle_quant
    reduce = INT4 * params + INT4 * params / local                  # quantized_reduction
    finish = INT4 * params / local + 2 * FP16 * params / local + FP16 * params / world   # dequantize, sum nodes
    return comm + cmp.stream_s(quantize + reduce + finish, dev) + (3 * tensors - 1) * dev.kernel_overhead_s


def secondary_bytes(stage_params: float, param_bytes: float, hpz: int, quantized: bool) -> float:
    """hpZ's secondary partition per GPU: a 1/``hpz`` slice of the stage's parameters, int8 with
    their scales where qwZ is on (0 without hpZ)."""
    return gather_bytes(param_bytes, quantized) * stage_params / hpz if hpz > 1 else 0.0


def buffer_bytes(layer_params: float, quantized_weights: bool, quantized_gradients: bool) -> float:
    """The quantized buffers of one layer in flight: qwZ's gathered int8 before it is
    dequantized; qgZ's int4 input and the int4 it receives from the node's ranks."""
    return (INT8 * layer_params if quantized_weights else 0.0) + \
        (2 * INT4 * layer_params if quantized_gradients else 0.0)
