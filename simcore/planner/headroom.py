"""Memory headroom in a ranking: the memory model's margin, what "fits", "thin" and "may not fit"
mean, which layout the search recommends near the limit, and the ``min_headroom_gib`` filter.

A layout's predicted peak already holds the caching allocator's margin and the CUDA context
(``simcore.model.peak``). The memory model is checked against the peaks published runs measured
(``bench/validate_memory.py --write-residuals``): the true peak of a prediction P lies in
[P e^lo, P e^hi] at 90% (``uncertainty.memory_log_bounds``). So a layout

- fits when even P e^hi fits the GPU (a careful team's headroom);
- is thin when P fits but P e^hi does not: a prediction short by the model's error would not;
- may not fit when P does not fit but P e^lo does: over the GPU by less than the model's error,
  it is ranked, marked, never recommended while a layout fits, and never dropped silently;
- does not fit otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from simcore.plan.choices import NoLayoutFits

FITS, THIN, MAY_NOT_FIT = "fits", "thin", "may not fit"
#: The order of preference of the classes (the recommendation takes the first that has a layout).
CLASS_ORDER = (FITS, THIN, MAY_NOT_FIT)


@dataclass(frozen=True, slots=True)
class MemoryMargin:
    """The 90% bounds of a true peak over its prediction: [lo, hi] as factors."""

    lo: float
    hi: float
    n: int
    source: str

    def describe(self) -> str:
        return (f"the memory model's peaks lie within {100 * (1 / self.hi - 1):+.1f}% .. {100 * (1 / self.lo - 1):+.1f}% "
                f"of {self.n} measured peaks (90%)")


@lru_cache(maxsize=1)
def memory_margin() -> MemoryMargin:
    """The margin of the residuals file as it stands (``uncertainty.memory_log_bounds``)."""
    from simcore.planner.uncertainty import memory_log_bounds

    lo, hi, n, source = memory_log_bounds()
    return MemoryMargin(lo=math.exp(min(lo, 0.0)), hi=math.exp(max(hi, 0.0)), n=n, source=source)


def fit_class(peak_bytes: float, hbm_bytes: float, margin: MemoryMargin | None = None) -> str | None:
    """``FITS``, ``THIN``, ``MAY_NOT_FIT`` or None (does not fit) for a predicted peak on a GPU."""
    margin = margin or memory_margin()
    if peak_bytes * margin.hi <= hbm_bytes:
        return FITS
    if peak_bytes <= hbm_bytes:
        return THIN
    return MAY_NOT_FIT if peak_bytes * margin.lo <= hbm_bytes else None


def thin_gib(hbm_gib: float) -> float:
    """Headroom (GiB) below which a layout on a GPU of ``hbm_gib`` is thin: P e^hi > HBM."""
    return hbm_gib * (1 - 1 / memory_margin().hi)


def is_thin(headroom_gib: float, hbm_gib: float) -> bool:
    return headroom_gib < thin_gib(hbm_gib)


def keep_roomy(df: pd.DataFrame, hbm_gib: float, min_headroom_gib: float, what: str) -> pd.DataFrame:
    """The rows of the ranked table whose headroom (GPU memory less ``memory_per_gpu_gib``) is at
    least ``min_headroom_gib``; one sentence naming ``what`` when none is."""
    if min_headroom_gib <= 0:
        return df
    room = hbm_gib - df["memory_per_gpu_gib"]
    if not (room >= min_headroom_gib).any():
        raise NoLayoutFits(f"no layout of {what} leaves min_headroom_gib={min_headroom_gib:g} GiB of its "
                           f"{hbm_gib:.0f} GiB GPUs (the most any fitting layout leaves is {room.max():.1f} GiB)")
    return df[room >= min_headroom_gib].reset_index(drop=True)


def recommended_first(df: pd.DataFrame) -> pd.DataFrame:
    """The ranked table with the recommendation on top: the first layout that fits with the
    memory model's margin, else the first thin one, else the first that may not fit; the
    others keep their order. One rule for every entry point (plan, report, what-if, procure)."""
    if "fit" not in df or df.empty:
        return df
    for cls in CLASS_ORDER:
        hits = df.index[df["fit"] == cls]
        if len(hits):
            first = hits[0]
            return pd.concat([df.loc[[first]], df.drop(index=first)]).reset_index(drop=True)
    return df


def headroom_note(df: pd.DataFrame, hbm_gib: float) -> list[str]:
    """A sentence when faster layouts than the recommendation (the table's first row) were passed
    over for memory (thin, or may not fit), with the margin that ruled them out; and one when
    the recommendation itself is thin or may not fit."""
    best, margin = df.iloc[0], memory_margin()
    out = []
    fit = best.get("fit", FITS if best["headroom_gib"] >= thin_gib(hbm_gib) else THIN)
    col = "des_step_time_s" if "des_step_time_s" in df and pd.notna(best.get("des_step_time_s")) else "step_time_s"
    if fit != FITS:
        error = best["headroom_gib"] / best["memory_per_gpu_gib"]
        out.append(f"The recommended layout {'leaves only' if fit == THIN else 'is over the GPU by'} "
                   f"{abs(best['headroom_gib']):.1f} GiB of {hbm_gib:.0f} GiB per GPU ({fit}: a memory prediction "
                   f"{abs(error):.1%} {'short' if fit == THIN else 'high'} would {'not ' if fit == THIN else ''}fit; "
                   f"{margin.describe()}); no layout fits with that margin.")
    if fit == FITS and "fit" in df:
        # each row against the recommendation on the engine both were timed with
        same = (df[col].notna() if col != "step_time_s" else pd.Series(True, index=df.index))
        t = df[col].where(same, df["step_time_s"])
        t0 = pd.Series(best[col], index=df.index).where(same, best["step_time_s"])
        gain = 1 - t / t0
        faster = df.iloc[1:][(df["fit"].iloc[1:] != FITS) & (gain.iloc[1:] > 0)]
        if len(faster):
            alt = faster.loc[gain[faster.index].idxmax()]
            out.append(f"Kept {thin_gib(hbm_gib):.1f} GiB of {hbm_gib:.0f} GiB free per GPU as the memory model's "
                       f"margin ({margin.describe()}); without it #{int(alt['rank'])} {alt['layout']} would be "
                       f"{100 * gain[alt.name]:.1f}% faster at {alt['memory_per_gpu_gib']:.1f} GiB per GPU "
                       f"({alt['fit']}).")
    return out


def headroom_text(headroom_gib: float, hbm_gib: float) -> str:
    """A headroom figure as the tables print it (GiB, one decimal), marked when thin or over."""
    if headroom_gib < 0:
        return f"{headroom_gib:.1f} (may not fit)"
    return f"{headroom_gib:.1f}" + (" (thin)" if is_thin(headroom_gib, hbm_gib) else "")


def mark_thin(headroom: pd.Series, hbm_gib: float) -> pd.Series:
    """The headroom column as the tables print it (``headroom_text``)."""
    return headroom.map(lambda v: headroom_text(v, hbm_gib))
