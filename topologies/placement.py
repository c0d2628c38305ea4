"""Rank placement: which global rank holds which (pp, dp, cp, tp) coordinate.

One layout serves the simulator and the executor (torchtitan's mesh order, TP innermost
so that a tensor-parallel group sits inside one node's NVLink domain):

    rank = ((pp_i * dp + dp_i) * cp + cp_i) * tp + tp_i

which is picotron's ``arange(world).view(pp, dp, cp, tp)``. Ranks are then placed on
GPUs in order: rank r sits on node ``r // gpus_per_node``, local GPU ``r % gpus_per_node``.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import product

AXES = ("pp", "dp", "cp", "tp")


@dataclass(frozen=True, slots=True)
class RankGrid:
    """The (pp, dp, cp, tp) grid of global ranks; axis sizes in mesh order."""

    pp: int
    dp: int
    cp: int
    tp: int

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.pp, self.dp, self.cp, self.tp)

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    def rank(self, pp: int = 0, dp: int = 0, cp: int = 0, tp: int = 0) -> int:
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def coords(self, rank: int) -> dict[str, int]:
        rank, tp = divmod(rank, self.tp)
        rank, cp = divmod(rank, self.cp)
        pp, dp = divmod(rank, self.dp)
        return {"pp": pp, "dp": dp, "cp": cp, "tp": tp}

    def groups(self, axis: str) -> list[list[int]]:
        """Every group of ranks that differ only along ``axis`` (e.g. each TP group)."""
        if axis not in AXES:
            raise ValueError(f"unknown mesh axis {axis!r} (known: {', '.join(AXES)})")
        sizes = dict(zip(AXES, self.shape))
        others = [a for a in AXES if a != axis]
        out = []
        for fixed in product(*(range(sizes[a]) for a in others)):
            base = dict(zip(others, fixed))
            out.append([self.rank(**{**base, axis: i}) for i in range(sizes[axis])])
        return out

    def group_of(self, rank: int, axis: str) -> list[int]:
        c = self.coords(rank)
        sizes = dict(zip(AXES, self.shape))
        return [self.rank(**{**c, axis: i}) for i in range(sizes[axis])]


def rank_grid(pp: int, dp: int, cp: int, tp: int) -> RankGrid:
    return RankGrid(pp=pp, dp=dp, cp=cp, tp=tp)


def device_of(rank: int, gpus_per_node: int) -> tuple[int, int]:
    """(node index, local GPU index) of a global rank."""
    return divmod(rank, gpus_per_node)
