"""One kernel of one micro-batch on one GPU (``Op``) and the two ways one is built: a GEMM and a
memory-bound elementwise pass. ``simcore.model.workload`` lists a layer's ops (and re-exports
these); ``simcore.model.compute`` prices them."""
from __future__ import annotations

from dataclasses import dataclass

#: Bytes per element of 16-bit activations (the mixed-precision case all sources model).
ACT_BYTES = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One kernel (or ``count`` identical kernels) of one micro-batch on one GPU."""

    name: str
    flops: float
    """FLOPs of one instance (counted, no causal halving)."""
    bytes: float
    """HBM bytes one instance reads and writes."""
    matmul: bool
    count: int = 1
    exec_fraction: float = 1.0
    """Fraction of ``flops`` the kernel really executes (causal flash attention: 0.5)."""
    batched: bool = False
    """The ``count`` instances run as ONE batched kernel (attention bmm over b x heads)."""
    length: int = 0
    """Query tokens of one attention kernel (0: not an attention kernel); its efficiency
    depends on it (``compute.attention_length_factor``)."""
    uncounted: bool = False
    """Kernels outside the modelled set whose launches the per-kernel costs already carry
    (``eager_ops``): their device time counts, their launches do not."""
    detached: bool = False
    """A GEMM whose input is detached from the graph: its backward computes the weight gradient only."""
    backward_scale: float = 1.0
    """The backward's work as a share of what a kernel of this kind takes by default (a GEMM's two
    forward-sized GEMMs, an elementwise kernel's traffic); 0: no backward (``simcore.model.dsa``'s
    indexer kernels, whose gradients cover the selected keys only)."""

    @property
    def kernels(self) -> int:
        if self.uncounted:
            return 0
        return 1 if self.batched else self.count

    @property
    def backward_kernels(self) -> int:
        """Its backward's kernels: a GEMM's two (one where its input is detached), one for a batched
        GEMM, flash attention or an elementwise kernel, none without a backward."""
        gemm = self.matmul and not self.batched and self.name != "flash_attention"
        return self.kernels * (2 - self.detached if gemm else 1) * (self.backward_scale > 0)


def _gemm(name: str, m_: float, n: float, k: float, count: int = 1, batched: bool = False) -> Op:
    """A (m x k) @ (k x n) matmul: 2mnk FLOPs, reads both inputs and writes the output."""
    return Op(name=name, flops=2.0 * m_ * n * k, bytes=ACT_BYTES * (m_ * k + k * n + m_ * n),
              matmul=True, count=count, batched=batched)


def _eltwise(name: str, elements: float, passes: float) -> Op:
    """A memory-bound kernel moving ``passes`` 16-bit tensors of ``elements`` each."""
    return Op(name=name, flops=0.0, bytes=ACT_BYTES * elements * passes, matmul=False)
