"""Collectives on a torus: TPU ICI slices (3D tori on v4, v5p and TPU7x, 2D on v5e and v6e) and
the 2D torus of a Trainium instance (catalog nodes with ``intra: torus``).

A torus gives every chip two links per dimension, one to each neighbour; a collective over
a group that spans several axes runs one ring per axis, and on an axis with its wraparound
link the ring is bidirectional: half the shards go each way. The model is the one of
jax-ml/scaling-book (Google DeepMind; ``sharding.md`` and ``tpus.md`` @0819a7d8):

- an AllGather or ReduceScatter of V bytes over one axis with a wraparound takes
  V / W_ici, W_ici the BIDIRECTIONAL bandwidth of one link (two one-way links), i.e.
  (n-1)/n * V / (2 * link) with the ring's (n-1)/n kept here;
- without a wraparound (an axis shorter than 16 on v5e/v6e, any slice that is not whole
  4x4x4 cubes on v4/v5p, scaling-book tpus.md) the ring cannot run both ways: "it typically
  doubles the time", (n-1)/n * V / link;
- over several axes "the available bandwidth is multiplied by the number of axes",
  V / (W_ici * n_axes). Here (this module's schedule) the buffer is split in one part per
  axis, each part gathered over the axes in a rotated order, all parts at once, and the
  collective ends when its busiest axis does: equal axes give scaling-book's figure,
  unequal ones the time of the axis that carries most for its bandwidth;
- an all-reduce is a reduce-scatter then an all-gather: twice the bandwidth term.

Nothing beats the link bound: a chip receives (n-1)/n of the gathered buffer over at most
2 * dims links. ``group_bytes_per_s`` turns the time into the per-rank bus bandwidth
``simcore.model.collectives.GroupNet`` carries, so the ring formulas there apply unchanged;
across slices the data-centre network joins them as NICs join NVLink domains (hierarchical).
Not modelled: twisted tori (they shorten paths, not per-axis rings), the per-hop latency of a
torus (ceil(n/2) hops per axis; the ring's n-1 steps are charged), and the Trn2 UltraServer's
slower fourth-neighbour links across instances.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Axis:
    """The part of one torus axis a communication group spans."""

    extent: int
    """Members of the group along the axis."""
    ring: bool
    """The group closes a ring over the axis's wraparound link: both directions carry data."""
    shared: int = 1
    """Groups interleaved on the same links (members ``shared`` chips apart on the axis)."""


@functools.lru_cache(maxsize=256)
def slice_shape(chips: int, dims: int) -> tuple[int, ...]:
    """The most balanced ``dims``-axis shape of ``chips`` chips, axes ascending (a v5p slice of
    512 chips: 8x8x8; 6,144: 16x16x24; a 4-chip host: 1x2x2; Trn2's 16: 4x4)."""
    if chips < 1 or dims < 1:
        raise ValueError(f"a torus of {chips} chips in {dims} dimensions")
    best: tuple[int, ...] | None = None
    for shape in _factorizations(chips, dims, 1):
        if best is None or (max(shape), shape[::-1]) < (max(best), best[::-1]):
            best = shape
    return best


def _factorizations(n: int, dims: int, low: int):
    if dims == 1:
        if n >= low:
            yield (n,)
        return
    for f in range(low, math.isqrt(n) + 1):
        if n % f == 0:
            for rest in _factorizations(n // f, dims - 1, f):
                yield (f, *rest)


def axis_wraps(shape: tuple[int, ...], wrap: int, wrap_all: bool = False) -> tuple[bool, ...]:
    """Which axes have their wraparound link: an axis whose length is a multiple of ``wrap``
    (v5e/v6e: 16), and with ``wrap_all`` only when every axis is (TPU v4/v5p/TPU7x: whole
    4x4x4 cubes joined by optical switches; a 2x2x4 slice has none)."""
    each = tuple(length > 2 and length % wrap == 0 for length in shape)
    if wrap_all and not all(w or length == 1 for w, length in zip(each, shape)):
        return tuple(False for _ in shape)
    return each


def group_axes(shape: tuple[int, ...], wraps: tuple[bool, ...], ranks: int, stride: int) -> tuple[Axis, ...]:
    """The axes a group of ``ranks`` ranks ``stride`` apart spans, ranks placed in order with
    axis 0 the fastest. A group larger than the torus keeps the part inside it; a stride that
    does not fit the axes (a rank order that is no sub-grid) is read as a line over the first
    axis it reaches, shared by the interleaved groups."""
    s, n, out = stride, ranks, []
    for length, wraps_here in zip(shape, wraps):
        if n <= 1:
            break
        if length == 1:
            continue
        if s >= length and s % length == 0:
            s //= length
            continue
        room = max(1, length // s)
        extent = min(n, room)
        if length % s or n % extent:
            return (Axis(extent=min(n, length), ring=False, shared=max(1, s)),)
        out.append(Axis(extent=extent, ring=wraps_here and extent == room and extent > 2, shared=s))
        n //= extent
        s = 1
    return tuple(out)


def axis_bytes_per_s(axis: Axis, link_bytes_per_s: float) -> float:
    """Bytes per second a rank moves along ``axis``: both one-way links of a ring, one of a line."""
    return (2.0 if axis.ring else 1.0) * link_bytes_per_s / axis.shared


def all_gather_bw_s(size_bytes: float, axes: tuple[Axis, ...], link_bytes_per_s: float) -> float:
    """Bandwidth time of an all-gather (or reduce-scatter) of a ``size_bytes`` output over
    ``axes``: one part per axis, each gathered over the axes in a rotated order, all at once;
    the busiest axis, its bytes over its bandwidth, sets the time."""
    axes = tuple(a for a in axes if a.extent > 1)
    ranks = math.prod(a.extent for a in axes)
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    part = size_bytes / len(axes)
    load = [0.0] * len(axes)
    for p in range(len(axes)):
        gathered = 1
        for i in (*range(p, len(axes)), *range(p)):
            a = axes[i]
            load[i] += (a.extent - 1) * part * gathered / ranks
            gathered *= a.extent
    return max(b / axis_bytes_per_s(a, link_bytes_per_s) for a, b in zip(axes, load))


def all_reduce_bw_s(size_bytes: float, axes: tuple[Axis, ...], link_bytes_per_s: float) -> float:
    """Reduce-scatter then all-gather: twice the all-gather's bandwidth time."""
    return 2 * all_gather_bw_s(size_bytes, axes, link_bytes_per_s)


def link_bound_s(size_bytes: float, ranks: int, dims: int, link_bytes_per_s: float) -> float:
    """No all-gather is faster: a chip receives (n-1)/n of the buffer over its 2 * dims links."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    return (ranks - 1) / ranks * size_bytes / (2 * dims * link_bytes_per_s)


def link_bytes_per_s(chip_bytes_per_s: float, dims: int) -> float:
    """One one-way link: the chip's ICI rate per direction (gpus.yaml, bidirectional / 2) over
    its 2 * dims links (v5p: 1,200 GB/s / 2 / 6 = 100 GB/s; scaling-book prints 9e10)."""
    return chip_bytes_per_s / (2 * dims)


def group_bytes_per_s(chip_bytes_per_s: float, dims: int, wrap: int, wrap_all: bool,
                      domain: int, ranks: int, stride: int) -> float:
    """Per-rank bus bandwidth of a ring collective equal in time to the torus's (the
    ``GroupNet.bus_bytes_per_s`` of a group inside one torus of ``domain`` chips)."""
    shape = slice_shape(domain, dims)
    axes = group_axes(shape, axis_wraps(shape, wrap, wrap_all), ranks, stride)
    n = math.prod(a.extent for a in axes)
    link = link_bytes_per_s(chip_bytes_per_s, dims)
    if n <= 1:
        return 2 * link
    return (n - 1) / n / all_gather_bw_s(1.0, axes, link)
