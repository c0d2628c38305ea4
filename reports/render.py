"""Self-contained HTML and Markdown reports, written atomically.

A ``Report`` is data: a title, a short summary (the answer first), sections of text,
tables (pandas) and figures (matplotlib), and the assumptions with their sources.
``render(report, out_dir)`` writes ``index.html`` (figures embedded as base64 PNG, no
external reference of any kind, so it opens offline and can be mailed) and
``report.md`` (figures beside it as PNG files). Every file is written to a temporary
name and renamed, so a reader never sees half a report.
"""
from __future__ import annotations

import base64
import html
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from simcore.results import atomic_write_text

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
     padding:0 1em;color:#1d2330;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em} h2{border-bottom:1px solid #d8dce5;padding-bottom:.2em;margin-top:1.8em}
.subtitle{color:#5b6475;margin-top:0}
.summary{display:flex;flex-wrap:wrap;gap:.8em;margin:1.2em 0}
.card{background:#f4f6fa;border:1px solid #dde2ec;border-radius:8px;padding:.7em 1em;min-width:150px}
.card .k{font-size:.8em;color:#5b6475;text-transform:uppercase;letter-spacing:.04em}
.card .v{font-size:1.35em;font-weight:600}
table{border-collapse:collapse;margin:.8em 0;font-size:.88em}
th,td{border:1px solid #dde2ec;padding:.3em .6em;text-align:right}
th{background:#f4f6fa} td:first-child,th:first-child{text-align:left}
figure{margin:1em 0} figure img{max-width:100%;border:1px solid #eceff5}
figcaption{color:#5b6475;font-size:.85em}
.tablewrap{overflow-x:auto;max-width:100%} .assumptions li{margin:.25em 0} .note{color:#8a4b00}
p,li,figcaption,.card .v{overflow-wrap:anywhere}
"""


@dataclass(frozen=True, slots=True)
class Section:
    heading: str
    text: str = ""
    table: pd.DataFrame | None = None
    figure: Figure | None = None
    caption: str = ""
    name: str = ""
    """File stem for the figure's PNG beside report.md."""


@dataclass(frozen=True, slots=True)
class Report:
    title: str
    subtitle: str = ""
    summary: tuple[tuple[str, str], ...] = ()
    """(label, value) cards shown first: the answer before the detail."""
    sections: tuple[Section, ...] = ()
    assumptions: tuple[tuple[str, str], ...] = ()
    """(assumption, source) pairs."""
    notes: tuple[str, ...] = field(default=())


def figure_png(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def _fmt_table(df: pd.DataFrame) -> pd.DataFrame:
    """Errors as signed percents, MFU and HFU as percents (as on the cards), $ columns as
    money, float noise next to the column's largest figure as 0 (``simcore.planner.formatting``)."""
    from simcore.planner import formatting as f

    out = df.copy()
    for col in out.columns:
        name = str(col)
        if not pd.api.types.is_float_dtype(out[col]):
            continue
        scale = float(out[col].abs().max()) if out[col].notna().any() else 0.0
        values = out[col].map(lambda x: f.clean(x, scale))
        if name.endswith(("err", "error")):
            out[col] = values.map(lambda x: "" if pd.isna(x) else f"{x:+.1%}")
        elif name in ("mfu", "hfu", "goodput") or name.startswith(("des_mfu", "mfu_")):
            out[col] = values.map(lambda x: "" if pd.isna(x) else f.percent(x))
        elif name == "usd" or name.startswith("usd_"):
            out[col] = values.map(lambda x: "" if pd.isna(x) else f.money(x))
        else:
            out[col] = values.map(lambda x: "" if pd.isna(x) else (f"{x:,.4g}" if abs(x) < 1e6 else f"{x:,.0f}"))
    return out


def to_html(report: Report, pngs: dict[str, bytes]) -> str:
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(report.title)}</title>",
             f"<style>{CSS}</style></head><body>", f"<h1>{html.escape(report.title)}</h1>"]
    if report.subtitle:
        parts.append(f"<p class='subtitle'>{html.escape(report.subtitle)}</p>")
    if report.summary:
        parts.append("<div class='summary'>" + "".join(
            f"<div class='card'><div class='k'>{html.escape(k)}</div><div class='v'>{html.escape(v)}</div></div>"
            for k, v in report.summary) + "</div>")
    for note in report.notes:
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    for sec in report.sections:
        parts.append(f"<h2>{html.escape(sec.heading)}</h2>")
        if sec.text:
            parts.extend(f"<p>{html.escape(p)}</p>" for p in sec.text.split("\n\n"))
        if sec.figure is not None:
            data = base64.b64encode(pngs[sec.name]).decode()
            parts.append(f"<figure><img alt='{html.escape(sec.caption or sec.heading)}' "
                         f"src='data:image/png;base64,{data}'>"
                         f"<figcaption>{html.escape(sec.caption)}</figcaption></figure>")
        if sec.table is not None:
            parts.append("<div class='tablewrap'>" + _fmt_table(sec.table).to_html(index=False, border=0, escape=True)
                         + "</div>")
    if report.assumptions:
        parts.append("<h2>Assumptions and sources</h2><ul class='assumptions'>")
        parts.extend(f"<li>{html.escape(a)}" + (f" <em>({html.escape(s)})</em>" if s else "") + "</li>"
                     for a, s in report.assumptions)
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)


def to_markdown(report: Report) -> str:
    lines = [f"# {report.title}", ""]
    if report.subtitle:
        lines += [f"_{report.subtitle}_", ""]
    lines += [f"- **{k}**: {v}" for k, v in report.summary] + [""]
    lines += [f"> {n}" for n in report.notes] + ([""] if report.notes else [])
    for sec in report.sections:
        lines += [f"## {sec.heading}", ""]
        if sec.text:
            lines += [sec.text, ""]
        if sec.figure is not None:
            lines += [f"![{sec.caption or sec.heading}]({sec.name}.png)", ""]
        if sec.table is not None:
            lines += [_fmt_table(sec.table).to_markdown(index=False) if _has_tabulate()
                      else "```\n" + sec.table.to_string(index=False) + "\n```", ""]
    if report.assumptions:
        lines += ["## Assumptions and sources", ""] + [f"- {a} ({s})" if s else f"- {a}" for a, s in report.assumptions] + [""]
    return "\n".join(lines)


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401  (pandas.to_markdown needs it)
    except ImportError:
        return False
    return True


def _atomic_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def render(report: Report, out_dir: str | os.PathLike) -> Path:
    """Write ``index.html`` and ``report.md`` (+ figure PNGs) into ``out_dir``; return the HTML path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    named = [s if s.name else Section(**{**{f: getattr(s, f) for f in Section.__slots__}, "name": f"figure-{i}"})
             for i, s in enumerate(report.sections)]
    report = Report(report.title, report.subtitle, report.summary, tuple(named), report.assumptions, report.notes)
    pngs = {s.name: figure_png(s.figure) for s in report.sections if s.figure is not None}
    for name, data in pngs.items():
        _atomic_bytes(out / f"{name}.png", data)
    atomic_write_text(out / "report.md", to_markdown(report))
    atomic_write_text(out / "index.html", to_html(report, pngs))
    return out / "index.html"
