"""``training.activation_offload: N``: the first N blocks of a model chunk keep their saved
activations in pinned host memory between their forward and their backward.

As Megatron-Core's ``--cpu-offloading-num-layers`` runs it (Transformer Engine's
``AsyncDoubleBufferGroupOffloadHandler``, transformer_engine/pytorch/cpu_offload.py): a block's
saved tensors are copied to the host on a copy stream beside the next block's forward (which
waits for that copy at its end), and a block's tensors come back on a second copy stream while
the block after it runs its backward ("bulk offloading with delay and bulk reloading with
prefetch"), so at most the block whose backward runs and the one reloaded ahead of it hold
device memory (``simcore.model.recompute.OFFLOAD_RESIDENT_LAYERS``). The tensors are caught with
torch's ``saved_tensors_hooks`` (as torchtune's ``OffloadActivations`` does); parameters and their
views (F.linear saves ``weight.t()``) stay where they are, as torchtune leaves them, and so do
tensor subclasses (torchao's float8 tensors). Autocast's 16-bit weight copies are the
micro-batch's own tensors and move (``simcore.model.executor_acts`` counts them in the stash).
Module names do not change: the hooks are forward hooks, not wrappers, so FSDP2 and checkpoints
key on the same names.

On a CPU the "host copy" is a plain copy (no streams): what the tests run to check which tensors
move, that gradients are unchanged and that no more than two blocks' tensors are reloaded at once.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.weak import WeakIdKeyDictionary

from simcore.plan.spec import Recompute, TrainingSpec


@dataclass
class _Saved:
    """One saved tensor of an offloaded block: its host copy, and its device copy once reloaded."""
    host: torch.Tensor
    offloaded: object = None            # the D2H copy's CUDA event
    device: torch.Tensor | None = None
    reloaded: object = None             # the H2D copy's CUDA event


@dataclass
class LayerOffload:
    """The saved-tensor hooks of one model chunk's offloaded blocks, and their bookkeeping."""
    device: torch.device
    groups: dict[int, list[_Saved]] = field(default_factory=dict)
    host_bytes: int = 0                 # the host bytes of the micro-batch in flight
    peak_host_bytes: int = 0
    peak_reloaded_blocks: int = 0
    packed: int = 0                     # tensors moved (the tests read it)

    def __post_init__(self):
        cuda = self.device.type == "cuda"
        self.d2h = torch.cuda.Stream(self.device) if cuda else None
        self.h2d = torch.cuda.Stream(self.device) if cuda else None
        self._seen = WeakIdKeyDictionary()   # tensor -> its _Saved, while the tensor lives

    def start(self) -> None:
        """A new micro-batch's forward: the last one's backward has consumed everything."""
        self.groups.clear()
        self._seen = WeakIdKeyDictionary()
        self.host_bytes = 0

    def pack(self, block: int, t: torch.Tensor):
        if isinstance(t, nn.Parameter) or isinstance(t._base, nn.Parameter) or type(t) is not torch.Tensor \
                or t.device != self.device:
            return t                    # a weight (F.linear saves weight.t()), a subclass, a CPU tensor
        if t in self._seen:             # one tensor saved by several ops moves once
            return self._seen[t]
        # a dense tensor keeps its strides (SDPA's saved q, k, v are transposed views)
        host = torch.empty_like(t, device="cpu", pin_memory=self.d2h is not None)
        if self.d2h is not None:
            self.d2h.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.d2h):
                host.copy_(t, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.d2h)
            t.record_stream(self.d2h)   # its memory is reused only after the copy
        else:
            host.copy_(t)
            event = None
        rec = _Saved(host, event)
        self._seen[t] = rec
        self.groups.setdefault(block, []).append(rec)
        self.packed += 1
        self.host_bytes += host.numel() * host.element_size()
        self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)
        return rec

    def unpack(self, rec):
        if not isinstance(rec, _Saved):
            return rec
        if rec.device is None:
            self._reload([rec])
        if self.h2d is not None:
            torch.cuda.current_stream(self.device).wait_event(rec.reloaded)
        return rec.device

    def forward_done(self, block: int) -> None:
        """Block ``block``'s forward has been issued: the host waits for the block before it to
        reach host memory (Transformer Engine's "offloading with delay": two blocks' tensors at
        most wait for their copies). The host, not only the compute stream, waits: the caching
        allocator reuses a freed tensor's memory only once its copy's event has completed when the
        host asks, so a host running ahead of slow copies made the H200 reserve 30.7-34.3 GiB for
        18.6-21.3 GiB allocated (bench/RESULTS.md)."""
        if self.d2h is not None and block - 1 in self.groups:
            for r in self.groups[block - 1]:
                r.offloaded.synchronize()

    def _reload(self, recs: list[_Saved]) -> None:
        recs = [r for r in recs if r.device is None]
        if self.h2d is None:
            for r in recs:
                r.device = r.host.clone()
            return
        # The device copies are allocated on the compute stream: torch's caching allocator keeps a
        # pool per stream, so copies allocated on the copy stream would hold a second pool.
        compute = torch.cuda.current_stream(self.device)
        for r in recs:
            r.device = torch.empty_like(r.host, device=self.device)
        self.h2d.wait_stream(compute)   # the memory may be a block the compute stream just freed
        with torch.cuda.stream(self.h2d):
            for r in recs:
                self.h2d.wait_event(r.offloaded)
                r.device.copy_(r.host, non_blocking=True)
                r.device.record_stream(self.h2d)
                r.reloaded = torch.cuda.Event()
                r.reloaded.record(self.h2d)

    def backward_reaches(self, block: int) -> None:
        """Block ``block``'s backward is next: the blocks after it are done (their device copies go),
        its own tensors must be back and the block before it starts coming back (the prefetch)."""
        for done in [b for b in self.groups if b > block]:
            for r in self.groups.pop(done):
                r.device = None
        for b in (block, block - 1):
            if b in self.groups:
                self._reload(self.groups[b])
        reloaded = sum(1 for recs in self.groups.values() if any(r.device is not None for r in recs))
        self.peak_reloaded_blocks = max(self.peak_reloaded_blocks, reloaded)


def check_activation_offload(tr: TrainingSpec) -> None:
    """ValueError (one sentence) for what the executor's offload does not run."""
    if tr.activation_offload and tr.recompute != Recompute.NONE:
        raise ValueError(f"training.activation_offload={tr.activation_offload} with training.recompute="
                         f"{tr.recompute.value} is not run by the executor: Megatron-Core's CPU offloading "
                         "refuses activation recomputation too (transformer_config.py)")


def apply_activation_offload(model, tr: TrainingSpec, device: torch.device) -> LayerOffload | None:
    """Hook the first ``tr.activation_offload`` blocks of one model chunk (``model.layers``, in
    order); every block's output tells the offload when the backward reaches it."""
    check_activation_offload(tr)
    if not tr.activation_offload:
        return None
    off = LayerOffload(device)
    blocks = list(model.layers.values())
    n = min(tr.activation_offload, len(blocks))
    for i, block in enumerate(blocks):
        block.register_forward_pre_hook(_enter(off, i, n))
        block.register_forward_hook(_leave(off, i, n))
    model.activation_offload = off
    return off


def _enter(off: LayerOffload, i: int, n: int):
    def hook(module, args):
        if i == 0:
            off.start()
        if i < n:
            ctx = torch.autograd.graph.saved_tensors_hooks(lambda t: off.pack(i, t), off.unpack)
            ctx.__enter__()
            module._offload_ctx = ctx
    return hook


def _leave(off: LayerOffload, i: int, n: int):
    def hook(module, args, output):
        ctx = module.__dict__.pop("_offload_ctx", None)
        if ctx is not None:
            ctx.__exit__(None, None, None)
        if i <= n:
            off.forward_done(i)
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(lambda grad: off.backward_reaches(i))
        return None
    return hook


def offload_host_peak(parts) -> int:
    """The host bytes the trainer's offloaded blocks held at once (0 without offload)."""
    return max((m.activation_offload.peak_host_bytes for part in parts for m in part.modules()
                if isinstance(getattr(m, "activation_offload", None), LayerOffload)), default=0)
