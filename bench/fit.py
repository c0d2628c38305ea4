"""Fit every FITTED figure of the catalog to the published runs, and write them.

    .venv/bin/python bench/fit.py [--validation DIR] [--check] [--no-loso]

The figures, their bounds, priors and rows are ``bench/fitting.py``; the procedure (least
squares on the log error, every source weighing the same; pairs for the FP8 ratios; a
pattern search on the catalog's stored digits, block by block) is ``bench/fit_rows.py``.
Writes the figures into ``topologies/catalog/efficiency.yaml`` (only the lines whose value
moved, and the figures derived from them) and ``validation/fits.yaml``: each figure with its
rows, bounds and prior, the losses, and the figures refitted with each source left out,
which ``bench/validate_published.py`` reads for its leave-one-source-out errors.
``--check`` writes nothing and exits 1 when the catalog or fits.yaml is not what the fit gives.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import fit_rows as R  # noqa: E402
import fitting as F  # noqa: E402
from simcore.results import atomic_write_text  # noqa: E402

EFFICIENCY = ROOT / "topologies" / "catalog" / "efficiency.yaml"
FITS = ROOT / "validation" / "fits.yaml"
DEFAULT_VALIDATION = ROOT.parent / "shared" / "validation"


def _frac(y: float) -> str:
    """A curve's fraction as the catalog writes it: at least two decimals (0.10, 0.0084)."""
    return f"{y:.2f}" if round(y, 2) == y else repr(float(y))


def _fmt(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):   # a curve: [[FLOPs, fraction], ...]
        return "[" + ", ".join(f"[{f'{x:.1e}'.replace('e+0', 'e+')}, {_frac(y)}]" for x, y in v) + "]"
    return repr(float(v))


def _changes(new: dict, old: dict, path=()):
    """(entry and key path, value) of every leaf of ``new`` that differs from ``old``."""
    for k, v in new.items():
        if isinstance(v, dict) and isinstance(old.get(k), dict) and k != "fp8_recipes":
            yield from _changes(v, old[k], path + (k,))
        elif v != old.get(k):
            yield path + (k,), v


def yaml_set(text: str, path: tuple, value) -> str:
    """``text`` (efficiency.yaml) with the value at ``path`` (entry, key, ...) replaced in
    place: comments, order and every other line kept."""
    lines = text.split("\n")
    lo, hi, indent = 0, len(lines), -1
    for key in path:
        pat = re.compile(rf"^(\s*){re.escape(key)}:(\s*)(.*?)(\s+#.*)?$")
        for i in range(lo, hi):
            m = pat.match(lines[i])
            if m and len(m.group(1)) > indent:
                indent, start = len(m.group(1)), i
                break
        else:
            raise KeyError(f"efficiency.yaml: no {'.'.join(path)}")
        end = next((j for j in range(start + 1, hi) if lines[j].strip() and not lines[j].lstrip().startswith("#")
                    and len(lines[j]) - len(lines[j].lstrip()) <= indent), hi)
        lo, hi = start, end
    m = re.match(rf"^(\s*{re.escape(path[-1])}:\s*)(.*?)(\s+#.*)?$", lines[lo])
    lines[lo] = m.group(1) + _fmt(value) + (m.group(3) or "")
    return "\n".join(lines)


def catalog_text(values: dict) -> str:
    """efficiency.yaml as it stands with ``values`` written in (derived figures too)."""
    text = EFFICIENCY.read_text()
    for path, v in _changes(F.efficiency_with(values), F.BASE):
        text = yaml_set(text, path, v)
    return text


def _prior_when_left_out(rows, sources) -> dict[str, list[str]]:
    """figure -> the sources whose leaving out leaves it no row: its refitted value is its prior."""
    out: dict[str, list[str]] = {}
    for s in sources:
        for block in R.prior_blocks(rows, s):
            for f in F.FIGURES:
                if f.block == block:
                    out.setdefault(f.name, []).append(s)
    return out


def fits_doc(rows, values: dict, loso: dict, cache: dict) -> dict:
    losses = {b: round(R.loss(rows, R.block_rows(rows, b), b, values, cache), 6) for b in F.BLOCKS}
    sources = sorted({r.source for r in rows})
    prior = _prior_when_left_out(rows, sources)
    return {
        "procedure": " ".join((R.__doc__ or "").split("\n\n")[1:3]).replace("\n", " "),
        "rows": {f: sum(r.file == f for r in rows) for f in R.FILES},
        "figures": {f.name: {"value": values[f.name], "home": f.home, "prior": f.prior, "bounds": [f.lo, f.hi],
                             "step": f.step, "basis": f.basis, "fitted_to": f.rows,
                             "leave_one_source_out": {s: loso[s][f.name] for s in sources if s in loso},
                             **({"prior_when_left_out": prior[f.name]} if f.name in prior else {})}
                    for f in F.FIGURES},
        "loss": losses,
        "leave_one_source_out": loso,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--validation", type=Path, default=DEFAULT_VALIDATION)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if the catalog differs")
    ap.add_argument("--no-loso", action="store_true", help="the in-sample fit only (fits.yaml not written)")
    args = ap.parse_args(argv)
    t0, cache = time.perf_counter(), {}
    rows = R.load_rows(args.validation)
    values = R.fit(rows, cache=cache)
    print(f"fitted on {len(rows)} rows in {time.perf_counter() - t0:.0f} s:")
    stored = F.stored_values()
    for f in F.FIGURES:
        print(f"  {f.name:28s} {values[f.name]:8g}  (catalog {stored[f.name]:g}, prior {f.prior:g}, "
              f"bounds {f.lo:g}-{f.hi:g})")
    text = catalog_text(values)
    if args.check:
        same = text == EFFICIENCY.read_text()
        print("catalog: " + ("reproduced" if same else "DIFFERS from the fit"))
        return 0 if same else 1
    if text != EFFICIENCY.read_text():
        atomic_write_text(EFFICIENCY, text)
        print(f"written: {EFFICIENCY.relative_to(ROOT)}")
    if args.no_loso:
        return 0
    loso = {}
    for src in sorted({r.source for r in rows}):
        loso[src] = R.fit(rows, exclude=src, cache=cache)
        moved = {k: v for k, v in loso[src].items() if v != values[k]}
        print(f"  without {src}: {moved or 'no figure moves'}")
        for block in R.prior_blocks(rows, src):   # nothing left to fit: out of sample is the prior
            names = ", ".join(f"{f.name} = its prior {f.prior:g}" for f in F.FIGURES if f.block == block)
            print(f"    {src} is the only source of block {block}'s rows: without it, {names} (not a fit)")
    doc = fits_doc(rows, values, loso, cache)
    header = ("# The catalog's FITTED figures, written by bench/fit.py: each figure's value, rows, bounds and\n"
              "# prior, and every figure refitted with each source left out (bench/validate_published.py reads\n"
              "# those for its leave-one-source-out errors). Do not edit: rerun bench/fit.py.\n")
    atomic_write_text(FITS, header + yaml.safe_dump(doc, sort_keys=False, width=100))
    print(f"written: {FITS.relative_to(ROOT)} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
