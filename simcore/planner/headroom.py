"""Memory headroom in a ranking: which layouts leave too little of the GPU to trust "fits",
what the search says when its best is one of them, and the ``min_headroom_gib`` filter.

A layout's predicted peak already holds the caching allocator's margin and the CUDA context
(``simcore.model.peak``). Thin is below ``sanity.THIN_HEADROOM`` of the GPU's memory (5%:
4 GiB of an 80 GiB GPU), the same line ``trainplan simulate`` warns at: the memory model is
checked to within about 10% of measured peaks (bench/validate_memory.py), so a prediction
error of that order would not fit.
"""
from __future__ import annotations

import pandas as pd

from simcore.plan.choices import NoLayoutFits
from simcore.planner.sanity import THIN_HEADROOM


def thin_gib(hbm_gib: float) -> float:
    """Headroom (GiB) below which a layout's fit is fragile on a GPU of ``hbm_gib``."""
    return THIN_HEADROOM * hbm_gib


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


def headroom_note(df: pd.DataFrame, hbm_gib: float) -> list[str]:
    """A sentence when the ranked table's best layout (first row, with ``headroom_gib``) leaves
    thin headroom: how large a memory error it survives, and the best layout that leaves more."""
    thin = thin_gib(hbm_gib)
    best = df.iloc[0]
    if not is_thin(best["headroom_gib"], hbm_gib):
        return []
    error = best["headroom_gib"] / best["memory_per_gpu_gib"]
    out = (f"The best layout leaves only {best['headroom_gib']:.1f} GiB of {hbm_gib:.0f} GiB per GPU (under "
           f"{THIN_HEADROOM:.0%}, {thin:.1f} GiB, with the allocator's margin counted): a memory prediction "
           f"{error:.1%} short would not fit")
    roomy = df[df["headroom_gib"] >= thin]
    if len(roomy):
        alt = roomy.iloc[0]
        col = "des_step_time_s" if pd.notna(alt.get("des_step_time_s")) and pd.notna(best.get("des_step_time_s")) \
            else "step_time_s"
        out += (f"; the best layout with {thin:.1f} GiB or more is #{int(alt['rank'])} {alt['layout']}, time "
                f"{100 * (alt[col] / best[col] - 1):+.1f}%, {alt['headroom_gib']:.1f} GiB headroom "
                f"(trainplan plan --min-headroom {thin:.0f} ranks only such layouts)")
    else:
        out += "; no layout that fits leaves more"
    return [out + "."]


def is_thin(headroom_gib: float, hbm_gib: float) -> bool:
    return headroom_gib < thin_gib(hbm_gib)


def headroom_text(headroom_gib: float, hbm_gib: float) -> str:
    """A headroom figure as the tables print it (GiB, one decimal), marked when thin."""
    return f"{headroom_gib:.1f}" + (" (thin)" if is_thin(headroom_gib, hbm_gib) else "")


def mark_thin(headroom: pd.Series, hbm_gib: float) -> pd.Series:
    """The headroom column as the tables print it (``headroom_text``)."""
    return headroom.map(lambda v: headroom_text(v, hbm_gib))
