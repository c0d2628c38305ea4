"""MaxText's multi-slice rows under an ASSUMED non-blocking data-centre network (issue 54).

``bench/validate_published.py`` refuses the rows of ``dev_accelerators.csv`` whose slices talk over
Google's DCN: the catalog's ``gcp-dcn-*`` fabrics state each chip's DCN rate but not the fabric's
oversubscription (a gap: no Google figure was found; the Jupiter papers give bisection in aggregate
only), and the collectives refuse to price a group across leaf switches without it. This bench
asks what the model would say if the DCN were non-blocking (oversubscription 1.0, an assumption
stated here and nowhere in the catalog), row by row by the same rule (``published_accelerators``),
and how the step grows with the number of slices, measured against predicted: the part of the
multi-slice cost the model does not see. Nothing is fitted to these rows and none enters a target.

    .venv/bin/python bench/multislice.py [--validation DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import published_accelerators as acc  # noqa: E402
from simcore.engine.predict import simulate  # noqa: E402
from simcore.plan.load import plan_from_dict  # noqa: E402
from topologies.hardware import load_catalog  # noqa: E402

DEFAULT_VALIDATION = ROOT.parent / "shared" / "validation"
#: The assumption this bench makes, and only this bench.
ASSUMED_OVERSUBSCRIPTION = 1.0


def assumed_catalog():
    """The catalog with every Google DCN fabric's oversubscription set to the assumption."""
    catalog = load_catalog()
    for name, fab in list(catalog.fabrics.items()):
        if name.startswith("gcp-dcn") and "oversubscription" in fab.gaps:
            catalog.fabrics[name] = dataclasses.replace(fab, oversubscription=ASSUMED_OVERSUBSCRIPTION)
    return catalog


def rows(validation: Path) -> pd.DataFrame:
    """Each multi-slice MaxText row predicted under the assumption (rows still refused: the reason)."""
    df = pd.read_csv(validation / "dev_accelerators.csv")
    catalog, out = assumed_catalog(), []
    for i, row in df.iterrows():
        if row.source not in acc.MAXTEXT or acc.slices(row) == 1:
            continue
        rec = {"row": i, "chip": row.accelerator, "model": str(row.model).replace("MaxText synthetic ", ""),
               "slices": acc.slices(row), "chips": int(row.num_chips), "measured_s": acc.measured_step_s(row)}
        if why := acc.refusal(row, catalog):
            out.append({**rec, "refused": why})
            continue
        res = simulate(plan_from_dict(acc.base_doc(row), catalog=catalog), "analytic")
        out.append({**rec, "predicted_s": res.step_time_s, "dp_comm_s": res.time_s.get("dp_comm", 0.0),
                    "fits": res.fits, "refused": ""})
    t = pd.DataFrame(out)
    return t.assign(error=t.predicted_s / t.measured_s - 1) if "predicted_s" in t else t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    args = ap.parse_args(argv)
    if not (args.validation / "dev_accelerators.csv").exists():
        print(f"multislice: {args.validation / 'dev_accelerators.csv'} not found; pass --validation DIR",
              file=sys.stderr)
        return 2
    t = rows(args.validation)
    pd.set_option("display.width", 200)
    print(f"MaxText rows over several slices, the DCN's oversubscription ASSUMED {ASSUMED_OVERSUBSCRIPTION:g} "
          "(a catalog gap; validate_published refuses these rows):")
    done = t[t.refused == ""]
    print(done.drop(columns=["refused"]).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for why, n in t[t.refused != ""].refused.value_counts().items():
        print(f"  still refused ({n}): {why}")
    print("\nMAPE under the assumption, per chip:")
    for chip, g in done.groupby("chip"):
        print(f"  {chip}: {len(g)} rows, MAPE {100 * g.error.abs().mean():.1f}%, max {100 * g.error.abs().max():.0f}%, "
              f"bias {100 * g.error.mean():+.1f}%")
    print("\nthe step from the fewest slices to the most, per model (measured vs predicted growth):")
    for (chip, model), g in done.groupby(["chip", "model"]):
        g = g.sort_values("slices")
        if g.slices.nunique() < 2:
            continue
        lo, hi = g.iloc[0], g.iloc[-1]
        grew = 100 * (hi.measured_s / lo.measured_s - 1)
        print(f"  {chip} {model}: {lo.slices} -> {hi.slices} slices: measured {grew:+.1f}%, "
              f"predicted {100 * (hi.predicted_s / lo.predicted_s - 1):+.1f}% (exposed data-parallel communication "
              f"{hi.dp_comm_s:.3f} s at {hi.slices})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
