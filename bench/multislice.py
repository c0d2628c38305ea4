"""MaxText's multi-slice rows: how the step grows with the number of slices, measured against
predicted (issue 54).

The rows of ``dev_accelerators.csv`` whose slices talk over Google's DCN are predicted by
``bench/validate_published.py`` with the catalog's ``gcp-dcn-*`` fabrics, whose oversubscription
(1: no oversubscription at the per-chip rate Google prints) and latency are judgements
(topologies/catalog/SOURCES.md, "Google's DCN"); until the forty-second session they were gaps and
this bench assumed the same figure outside the catalog. It prints the rows row by row by the same rule
(``published_accelerators``) and the growth of the step from the fewest slices to the most: the
part of the multi-slice cost the model does not see (it holds the step flat).

    .venv/bin/python bench/multislice.py [--validation DIR]
"""
from __future__ import annotations

import argparse
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
def rows(validation: Path) -> pd.DataFrame:
    """Each multi-slice MaxText row predicted on the catalog (rows refused: the reason)."""
    df = pd.read_csv(validation / "dev_accelerators.csv")
    catalog, out = load_catalog(), []
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
    print("MaxText rows over several slices, on the catalog's DCN (1:1 at the per-chip rate: a judgement, "
          "topologies/catalog/SOURCES.md):")
    done = t[t.refused == ""]
    print(done.drop(columns=["refused"]).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for why, n in t[t.refused != ""].refused.value_counts().items():
        print(f"  still refused ({n}): {why}")
    print("\nMAPE per chip:")
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
