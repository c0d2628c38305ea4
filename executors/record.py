"""Record a training step's spans and collectives, per rank, on the simulator's streams.

Per rank and step the recorder keeps spans on the streams the simulator uses:
"compute" (forward / backward per micro-batch, optimizer step) and one communication
stream per mesh axis ("dp", "tp", "pp", ...). Collectives are timed from torch's own
entry points (``torch.distributed`` and ``torch.distributed._functional_collectives``,
the functions DDP's comm hooks, FSDP2, ZeroRedundancyOptimizer, DTensor and the
pipelining schedules call), from the call to the completion of their ``Work`` future;
a collective that blocks the host (a synchronous call) is cut out of the compute spans,
so that ``simcore.results.split_step`` sees compute, exposed communication and bubble as
the simulator defines them. Functional (DTensor) collectives are waited on at once; one that
a selective checkpoint's recomputation serves from what it saved (``replayed``) moves no
bytes and is not recorded.
Pipeline receives are counted but not drawn: their wait is the upstream stage's compute,
i.e. bubble, not transfer. An asynchronous collective issued and completed inside one
compute span was awaited there (DDP's bucket all-reduces, which ``backward`` waits for
before it returns; ZeroRedundancyOptimizer's broadcasts, which its ``step`` waits for):
the host waits from the last such call to the last completion, and that interval is cut
out of the compute span as well. Limits: the host cannot see other waits inside an
autograd hook (FSDP2's unshard wait) and counts them as compute.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.utils.checkpoint as ckpt
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from simcore.results import Span, subtract_intervals

#: torch.distributed functions (name -> span kind) that the recorder times.
_C10D = {"all_reduce": "all_reduce", "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
         "all_gather_single": "all_gather", "_all_gather_base": "all_gather",
         "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
         "reduce_scatter_single": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
         "broadcast": "broadcast", "all_to_all_single": "all_to_all", "all_to_all": "all_to_all"}
# isend/irecv stay unpatched (P2POp checks their identity); batch_isend_irecv is timed instead.
#: functional collectives (DTensor's redistribution calls these).
_FUNCOL = {"all_reduce": "all_reduce", "all_gather_single": "all_gather", "all_gather_tensor": "all_gather",
           "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
           "all_to_all_single": "all_to_all", "broadcast": "broadcast"}


#: functional collective -> the ``_c10d_functional`` op it dispatches (what a selective
#: checkpoint's policy saves: torchtitan's ``comm_ops``).
_FUNCOL_OPS = {"all_reduce": "all_reduce", "all_gather_tensor": "all_gather_into_tensor",
               "all_gather_single": "all_gather_into_tensor", "reduce_scatter_tensor": "reduce_scatter_tensor",
               "reduce_scatter_single": "reduce_scatter_tensor", "all_to_all_single": "all_to_all_single"}


def replayed(name: str) -> bool:
    """Whether selective checkpointing's recomputation hands back the output it saved in the
    forward for the next call of functional collective ``name``, so that nothing is
    communicated: torch.utils.checkpoint's ``_CachedTorchDispatchMode`` serves a saved op
    from its storage by (op, call index) and runs only the ones stored as ``_RECOMPUTE``."""
    op = getattr(torch.ops._c10d_functional, _FUNCOL_OPS.get(name, ""), None)
    if op is None:
        return False
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, ckpt._CachedTorchDispatchMode):
            entry = mode.storage.get(op.default, {}).get(mode.func_counter[op.default])
            return entry is not None and entry is not ckpt._RECOMPUTE and entry is not ckpt._CONSUMED
    return False


def tensor_bytes(t) -> int:
    """Bytes of a tensor's local data (a DTensor's local shard)."""
    if t is None or not isinstance(t, torch.Tensor):
        return 0
    if isinstance(t, DTensor):
        t = t._local_tensor
    return t.numel() * t.element_size()


@dataclass(kw_only=True)
class Recorder:
    """Spans and collective counts of one rank; times relative to ``step_start``."""

    rank: int
    axis_of: dict = field(default_factory=dict)
    """frozenset of global ranks -> mesh axis name."""
    spans: list = field(default_factory=list)
    blocking: list = field(default_factory=list)
    """(start, end) of collectives that blocked the host from call to completion."""
    issued: list = field(default_factory=list)
    """(start, end) of asynchronous collectives: call to completion of their future."""
    counts: Counter = field(default_factory=Counter)
    step_start: float = 0.0
    enabled: bool = True
    sync: object = None
    """A GPU's synchronize, called at each compute span's edges so that the span holds its
    kernels' time, not their launches' (None on a CPU, whose kernels run as they are issued)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _local: threading.local = field(default_factory=threading.local)

    def start_step(self) -> None:
        self.spans, self.blocking, self.issued = [], [], []
        self.step_start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.step_start

    @contextlib.contextmanager
    def span(self, kind: str, name: str):
        """Time one piece of work on the compute stream."""
        if self.sync:
            self.sync()
        start = self.now()
        try:
            yield
        finally:
            if self.sync:
                self.sync()
            self.spans.append(("compute", kind, name, start, self.now(), 0.0))

    def comm(self, kind: str, axis: str, nbytes: float, start: float, end: float, blocking: bool) -> None:
        with self._lock:
            self.spans.append((axis, kind, f"{kind} {axis}", start, end, nbytes))
            if blocking:
                self.blocking.append((start, end))
            elif kind != "send":   # the pipeline schedule never waits on its sends inside a chunk
                self.issued.append((start, end))

    def awaited(self) -> list[tuple[float, float]]:
        """Per compute span, the host's wait for the asynchronous collectives it issued and
        saw complete: from the last call to the last completion (none where it issued none)."""
        waits = []
        for stream, _kind, _name, start, end, _nbytes in self.spans:
            inside = [(s, e) for s, e in self.issued if start <= s and e <= end] if stream == "compute" else []
            if inside:
                waits.append((max(s for s, _ in inside), max(e for _, e in inside)))
        return [(s, e) for s, e in waits if e > s]

    def step_spans(self) -> list[Span]:
        """This step's spans, compute spans with the host's waits cut out: blocking
        collectives and the awaited tail of asynchronous ones."""
        out = []
        blocks = sorted(self.blocking + self.awaited())
        for stream, kind, name, start, end, nbytes in self.spans:
            pieces = subtract_intervals([(start, end)], blocks) if stream == "compute" else [(start, end)]
            out.extend(Span(self.rank, stream, kind, name, s, e - s, nbytes) for s, e in pieces if e > s)
        return out


# --------------------------------------------------------------------------- collectives

def axis_map(mesh) -> dict:
    """frozenset(ranks) -> axis name for every axis of ``mesh`` larger than one, the layout's
    other groups (``executors.groups``: dp x cp is ``dp`` even where it is the world), and the world."""
    out = {frozenset(range(dist.get_world_size())): "world"}
    for axis in mesh.mesh_dim_names:
        if mesh[axis].size() > 1:
            out[frozenset(dist.get_process_group_ranks(mesh.get_group(axis)))] = axis
    from executors.groups import extra_axes   # the layout's groups beyond the mesh axes (dp x cp, ep, ...)
    for ranks, name in extra_axes().items():
        if out.get(ranks, "world") == "world":
            out[ranks] = name
    return out


def _axis(rec: Recorder, group) -> str:
    if group is None:
        return rec.axis_of.get(frozenset(range(dist.get_world_size())), "world")
    if not isinstance(group, dist.ProcessGroup):  # functional-collective group forms
        group = dist.distributed_c10d._resolve_process_group(funcol._resolve_group_name(group))
    return rec.axis_of.get(frozenset(dist.get_process_group_ranks(group)), "other")


def _wrap(rec: Recorder, fn, kind: str, functional: bool):
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if getattr(rec._local, "depth", 0) or not rec.enabled or (functional and replayed(fn.__name__)):
            return fn(*args, **kwargs)
        bound = sig.bind_partial(*args, **kwargs).arguments
        axis = _axis(rec, bound.get("group"))
        first = next(iter(bound.values()), None)
        nbytes = sum(map(tensor_bytes, first)) if isinstance(first, (list, tuple)) else tensor_bytes(first)
        rec.counts[(kind, axis)] += 1
        start = rec.now()
        rec._local.depth = 1
        try:
            out = fn(*args, **kwargs)
            if functional:
                funcol.wait_tensor(out)  # the host waits here; DTensor keeps the same object
        finally:
            rec._local.depth = 0
        if bound.get("async_op") and out is not None:
            _on_done(out, lambda: rec.comm(kind, axis, nbytes, start, rec.now(), False))
        else:
            rec.comm(kind, axis, nbytes, start, rec.now(), True)
        return out
    return timed


#: Kinds of work (``_wrap_p2p``: "p2p" and the group's backend) whose ``get_future`` raised.
#: gloo's point-to-point works have none, and finding that out costs 160-290 us a call (a
#: C++ exception turned into Python's), about 1% of a 30 ms step with ten sends: ask once.
_NO_FUTURE: set = set()


def _on_done(work, callback, kind=None) -> None:
    """Call ``callback`` when ``work`` completes; a work without a future (gloo's
    point-to-point works) is taken as done when it has been handed to the transport.
    ``kind`` names works that all have, or all lack, a future (see ``_NO_FUTURE``)."""
    if kind is None or kind not in _NO_FUTURE:
        try:
            work.get_future().then(lambda _f: callback())
            return
        except RuntimeError:
            if kind is not None:
                _NO_FUTURE.add(kind)
    callback()


def _wrap_p2p(rec: Recorder, fn):
    @functools.wraps(fn)
    def timed(p2p_ops, *args, **kwargs):
        if getattr(rec._local, "depth", 0) or not rec.enabled:
            return fn(p2p_ops, *args, **kwargs)
        start = rec.now()
        rec._local.depth = 1
        try:
            works = fn(p2p_ops, *args, **kwargs)
        finally:
            rec._local.depth = 0
        works = works or []
        for i, op in enumerate(p2p_ops):  # a coalesced batch may return one work for all ops
            kind = "send" if op.op is dist.isend else "recv"
            axis = _axis(rec, op.group)
            rec.counts[(kind, axis)] += 1
            if kind == "send" and works:
                nbytes = tensor_bytes(op.tensor)
                _on_done(works[min(i, len(works) - 1)],
                         lambda a=axis, n=nbytes: rec.comm("send", a, n, start, rec.now(), False),
                         ("p2p", dist.get_backend(op.group)))
        return works
    return timed


@contextlib.contextmanager
def record_collectives(rec: Recorder):
    """Patch torch's collective entry points to report to ``rec`` while inside."""
    patched = []
    for module, table, functional in ((dist, _C10D, False), (dist.distributed_c10d, _C10D, False),
                                      (funcol, _FUNCOL, True)):
        for name, kind in table.items():
            fn = getattr(module, name, None)
            if fn is None:
                continue
            patched.append((module, name, fn))
            setattr(module, name, _wrap(rec, fn, kind, functional))
    from torch.distributed.pipelining import schedules  # its _batch_p2p issues every pipeline send/recv

    for module, name in ((dist, "batch_isend_irecv"), (dist.distributed_c10d, "batch_isend_irecv"),
                         (schedules, "_batch_p2p")):
        patched.append((module, name, getattr(module, name)))
        setattr(module, name, _wrap_p2p(rec, getattr(module, name)))
    try:
        yield rec
    finally:
        for module, name, fn in reversed(patched):
            setattr(module, name, fn)


# --------------------------------------------------------------------------- pipeline stages

def instrument_stage(stage, rec: Recorder) -> None:
    """Time a ``PipelineStage``'s per-micro-batch compute, named in torch's action notation
    ("2F0": stage 2, forward, micro-batch 0; B full backward, I input-, W weight-gradient)."""
    sid = stage.stage_index
    fwd, bwd, bwd_w = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def forward_one_chunk(mb, *args, **kwargs):
        with rec.span("forward", f"{sid}F{mb}") if rec.enabled else contextlib.nullcontext():
            return fwd(mb, *args, **kwargs)

    def backward_one_chunk(mb, *args, **kwargs):
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        kind, letter = ("backward", "B") if full else ("backward_input", "I")
        with rec.span(kind, f"{sid}{letter}{mb}") if rec.enabled else contextlib.nullcontext():
            return bwd(mb, *args, **kwargs)

    def backward_weight_one_chunk(mb, *args, **kwargs):
        with rec.span("backward_weight", f"{sid}W{mb}") if rec.enabled else contextlib.nullcontext():
            return bwd_w(mb, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk

