"""The answers of a procurement search: the Pareto front of days against dollars, the cheapest
option that meets the deadline, the fastest within the budget (or a clear sentence that none
does), the table as a reader sees it, and the assumptions with their sources.

An option is one hardware cell and one way of paying (``simcore.planner.procure``). Options
that cannot be had (spot with no spare pool that keeps the job whole, a run that cannot make
progress) are listed but never chosen.
"""
from __future__ import annotations

import math

import pandas as pd

from simcore.planner import formatting as f
from simcore.planner.headroom import headroom_text, is_thin, memory_margin

MODE_LABELS = {"on_demand": "rent on-demand", "reserved": "rent reserved", "spot": "rent spot", "buy": "buy"}


def feasible(options: pd.DataFrame) -> pd.DataFrame:
    """Options with finite days and dollars and no reason they cannot be had."""
    if options.empty:
        return options
    ok = options["days"].map(math.isfinite) & options["usd"].map(math.isfinite)
    ok &= ~options["infeasible"].map(lambda s: isinstance(s, str) and bool(s))
    return options[ok]


def frontier(options: pd.DataFrame) -> pd.DataFrame:
    """The options no other beats on both days and dollars, fastest first."""
    from simcore.planner.search import pareto_front

    ok = feasible(options)
    return pareto_front(ok, "days", "usd") if len(ok) else ok


def mode_fronts(options: pd.DataFrame) -> pd.DataFrame:
    """The front of each way of paying (rent on-demand, reserved, spot; buy), with ``overall``
    True on the options of the front of all of them."""
    overall = set(frontier(options).index)
    parts = [frontier(part) for _, part in feasible(options).groupby("mode", sort=False)]
    out = pd.concat(parts) if parts else feasible(options)
    return out.assign(overall=[i in overall for i in out.index])


def deadline_choice(options: pd.DataFrame, deadline_days: float | None):
    """The cheapest feasible option whose predicted days meet the deadline (ties: faster), or None."""
    ok = feasible(options)
    if deadline_days is None or ok.empty:
        return None
    meets = ok[ok["days"] <= deadline_days]
    return None if meets.empty else meets.sort_values(["usd", "days"], kind="stable").iloc[0]


def cash(options: pd.DataFrame) -> pd.Series:
    """What the buyer pays out for each option (``procure.OPTION_KEYS``: a rental's bill, a
    purchase's capex before the run): what a budget is held against."""
    return options["cash_usd"] if "cash_usd" in options else options["usd"]


def budget_choice(options: pd.DataFrame, budget_usd: float | None):
    """The fastest feasible option whose cash fits the budget (ties: less cash), or None. A
    budget is money out of the buyer's pocket: a purchase needs its capex, not the run's share."""
    ok = feasible(options)
    if budget_usd is None or ok.empty:
        return None
    fits = ok[cash(ok) <= budget_usd]
    if fits.empty:
        return None
    return fits.assign(_cash=cash(fits)).sort_values(["days", "_cash"], kind="stable").drop(columns="_cash").iloc[0]


def _key(row) -> tuple:
    return (row["gpu"], int(row["nodes"]), row["fabric_asked"])


def to_resimulate(options: pd.DataFrame, c) -> list[tuple]:
    """Cells of the front and of the two answers (and the fastest and cheapest, which a
    'none does' sentence names), each once, in that order."""
    keys = [_key(r) for _, r in mode_fronts(options).iterrows()]
    ok = feasible(options)
    picks = [deadline_choice(options, c.deadline_days), budget_choice(options, c.budget_usd)]
    if len(ok):
        picks += [ok.loc[ok["days"].idxmin()], ok.loc[ok["usd"].idxmin()], ok.loc[cash(ok).idxmin()]]
    keys += [_key(p) for p in picks if p is not None]
    return list(dict.fromkeys(keys))


def option_label(row) -> str:
    """'rent reserved: 64 x dgx-b200 (512 GPUs, ib-ndr)'."""
    mixed = f", later pipeline stages on {row['stage_gpu']}" if isinstance(row.get("stage_gpu"), str) else ""
    return (f"{MODE_LABELS.get(row['mode'], row['mode'])}: {int(row['nodes'])} x {row['node']} "
            f"({int(row['gpus'])} GPUs, {row['fabric']}{mixed})")


def option_sentence(row) -> str:
    """An option's answer in one sentence: days and $ with intervals, layout, headroom, engine."""
    engine = "event engine" if row.get("engine") == "event" else "analytic engine"
    usd = f.with_interval(row['usd'], row['usd_lo'], row['usd_hi'], f.money)
    money = (f"{f.money(row.get('cash_usd', row.get('capex_usd')))} paid out ({f.money(row['capex_usd'])} up front "
             f"for GPUs, servers and fabric, the facility and energy while it runs), of which the run bears {usd} "
             f"(its amortised share, ${row['usd_per_gpu_hour']:.2f} per GPU-hour)"
             if row["mode"] == "buy" and isinstance(row.get("capex_usd"), float)
             else f"{usd} (${row['usd_per_gpu_hour']:.2f} per GPU-hour)")
    return (f"{option_label(row)}, {f.with_interval(row['days'], row['days_lo'], row['days_hi'], f.days)} days, "
            f"{money}, layout {row['layout']}, "
            f"{row['headroom_gib']:.1f} GiB memory headroom{_thin(row)}, MFU {f.percent(row['mfu'])} "
            f"({engine}){_price_basis(row)}{_unchecked(row)}{_efficiency_basis(row)}{_network_basis(row)}")


def _network_basis(row) -> str:
    """'; its ... join over FABRIC, whose ... are judgements' where the option's GPUs span more than
    one NVLink / ICI domain over a fabric whose figures are judgements (fabrics.yaml ``judgements``)."""
    from topologies.hardware import load_catalog

    cat = load_catalog()
    fab = cat.fabrics.get(row.get("fabric"))
    if fab is None or row.get("node") not in cat.nodes:
        return ""
    node = cat.node(row["node"])
    domain, gpus = node.nvlink_domain_gpus or node.gpus_per_node, int(row["gpus"])
    if not fab.judged_between(gpus, domain):
        return ""
    return (f"; its {-(-gpus // domain)} domains of {domain} join over {fab.name}, whose "
            f"{' and '.join(k.replace('_us', '') for k in fab.judgements)} are judgements (topologies/catalog/SOURCES.md)")


def _efficiency_basis(row) -> str:
    """'; its ... efficiency is ... extended' where the option's chip has no published run and its
    efficiency entry is its family's, extended to it (efficiency.yaml says EXTENDED)."""
    from topologies.hardware import load_catalog

    source = str(((load_catalog().efficiency.get(row.get("gpu")) or {}).get("matmul") or {}).get("source", ""))
    if "EXTENDED" not in source:
        return ""
    return (f"; its {row['gpu']} efficiency figures are its family's, fitted to the family's other chips and "
            "extended to it (topologies/catalog/SOURCES.md): an assumption no run of its own checks")


def _unchecked(row) -> str:
    """'; no published run ...' where no residuals give the option's GPU an interval, or '; its
    interval is widened: ...' where the question goes beyond the published runs
    (``uncertainty.extrapolation``): its time rests on the catalog's figures for that GPU alone."""
    if f.is_missing(row.get("days_lo", math.nan)):
        return f"; no published run on {row.get('gpu', 'this GPU')} checks its predicted time (no interval)"
    line = row.get("extrapolated")
    return f"; its interval is widened ({line})" if isinstance(line, str) and line else ""


#: How prices.yaml marks a figure no list price or published quote gives, and how an answer says it.
UNSOURCED_PRICE = {"ASSUMPTION": "an assumption", "DERIVED": "derived", "PLACEHOLDER": "a placeholder",
                   "UNVERIFIED": "unverified"}


def _price_basis(row) -> str:
    """'; its price is ... ' where the option's GPU price (rent, or buy) is not a published one:
    an answer that rests on an assumed price says so, with the catalog's own words."""
    from topologies.hardware import load_catalog

    prices, gpu = load_catalog().prices, row.get("gpu")
    entry = ((prices.purchase.get("gpus") or {}).get(gpu) or {}).get("source", "") if row["mode"] == "buy" \
        else getattr(prices.gpus.get(gpu), "source", "")
    kind = next((k for k in UNSOURCED_PRICE if str(entry).startswith(k)), None)
    if kind is None:
        return ""
    return f"; its {gpu} {'purchase' if row['mode'] == 'buy' else 'rental'} price is {UNSOURCED_PRICE[kind]} (prices.yaml: " \
           f"{entry[len(kind):].lstrip(': ').split(';')[0]}): check it against a quote"


def _thin(row) -> str:
    """' (thin: ...)' where the option's layout leaves less than the memory model's margin."""
    if not is_thin(row["headroom_gib"], row["headroom_gib"] + row["memory_per_gpu_gib"]):
        return ""
    return (f" (thin: {memory_margin().describe()}; trainplan plan --min-headroom ranks roomier layouts)")


def answer_lines(result) -> list[str]:
    """The deadline and budget answers, each one sentence or a clear 'none does'."""
    c, options = result.candidates, result.options
    ok = feasible(options)
    what = f"{c.model.get('name', 'the model')} on {f.si(c.tokens, '')} tokens"
    if ok.empty:
        return [f"No evaluated option can train {what}: no candidate cell fits the model or can be priced "
                "(see the notes)."]
    out = []
    if c.deadline_days is not None:
        pick = deadline_choice(options, c.deadline_days)
        if pick is None:
            fast = ok.loc[ok["days"].idxmin()]
            out.append(f"No evaluated option trains {what} within {c.deadline_days:g} days; the fastest is "
                       f"{option_sentence(fast)}.")
        else:
            late = (f" Its interval reaches {f.days(pick['days_hi'])} days, past the deadline."
                    if pick["days_hi"] > c.deadline_days else "")
            out.append(f"Cheapest option that trains {what} within {c.deadline_days:g} days: "
                       f"{option_sentence(pick)}.{late}")
    if c.budget_usd is not None:
        pick = budget_choice(options, c.budget_usd)
        if pick is None:
            cheap = ok.loc[cash(ok).idxmin()]
            out.append(f"No evaluated option trains {what} within {f.money(c.budget_usd)} paid out; the one that "
                       f"needs the least cash is {option_sentence(cheap)}.")
        else:
            hi = pick.get("cash_usd_hi", pick["usd_hi"])
            over = f" Its interval reaches {f.money(hi)}, over the budget." if hi > c.budget_usd else ""
            out.append(f"Fastest option that trains {what} within {f.money(c.budget_usd)} paid out: "
                       f"{option_sentence(pick)}.{over}")
    return out


def _engine_figures(r: dict) -> tuple[dict, dict]:
    """An option's figures by engine: (the event engine's or {}, the analytic pass's or {})."""
    own = {k: r.get(k, math.nan) for k in ("days", "days_lo", "days_hi", "usd", "usd_lo", "usd_hi", "cash_usd", "mfu",
                                            "energy_kwh")}
    own["cash_usd"] = r.get("cash_usd", r["usd"])
    if r.get("engine") != "event":
        return {}, own
    first = {k: r.get("analytic_" + k, math.nan) for k in own}
    return own, ({} if f.is_missing(first["days"]) else first)


def _order(df: pd.DataFrame) -> pd.DataFrame:
    """Fastest first by one engine, the analytic pass every option has (a mixed pipeline, which
    has none, by its event-engine days)."""
    days = df["analytic_days"].fillna(df["days"]) if "analytic_days" in df else df["days"]
    return df.assign(_days=days).sort_values(["_days", "usd"], kind="stable").drop(columns="_days")


def _columns(recs: list[dict], name: str, pick: int) -> dict[str, list[str]]:
    figs = [_engine_figures(r)[pick] for r in recs]
    return {f"days [{name}]": [f.with_interval(g["days"], g["days_lo"], g["days_hi"], f.days) if g else "" for g in figs],
            f"$ of the run [{name}]": [f.with_interval(g["usd"], g["usd_lo"], g["usd_hi"], f.money) if g else ""
                                       for g in figs],
            f"$ paid out [{name}]": [f.money(g["cash_usd"]) if g else "" for g in figs],
            f"MFU [{name}]": [f.percent(g["mfu"]) if g else "" for g in figs],
            f"MWh [{name}]": [("no TDP" if f.is_missing(g["energy_kwh"]) else f"{g['energy_kwh'] / 1000:,.0f}") if g
                              else "" for g in figs]}


def display_table(options: pd.DataFrame, rows: int | None = None) -> pd.DataFrame:
    """The options as a reader sees them, fastest first: hardware (GPUs beside nodes), way of
    paying, layout; days, $ and MFU with their intervals under the engine they come from (the
    event engine's where it re-simulated the option, the analytic pass's for every option);
    $ per GPU-hour, energy, headroom."""
    df = _order(feasible(options))
    df = df.head(rows) if rows else df
    recs = df.to_dict(orient="records")
    out = {"GPU": [r["gpu"] for r in recs], "GPUs": [int(r["gpus"]) for r in recs],
           "nodes": [int(r["nodes"]) for r in recs], "fabric": [r["fabric"] for r in recs],
           "pay": [MODE_LABELS[r["mode"]] for r in recs], "layout": [r["layout"] for r in recs]}
    if any(r.get("engine") == "event" for r in recs):
        out.update(_columns(recs, "event", 0))
    out.update(_columns(recs, "analytic", 1))
    out["$/GPU-h"] = [f"{r['usd_per_gpu_hour']:.2f}" for r in recs]
    out["headroom GiB"] = [headroom_text(r["headroom_gib"], r["headroom_gib"] + r["memory_per_gpu_gib"]) for r in recs]
    return pd.DataFrame(out)


def frontier_table(options: pd.DataFrame) -> pd.DataFrame:
    """Each way of paying's front as a reader sees it (``display_table``'s columns and order),
    ``*`` beside the options on the front of all of them."""
    fronts = mode_fronts(options)
    table = display_table(fronts)
    marks = _order(fronts)["overall"].map({True: "*", False: ""})
    return table.assign(front=list(marks))


def _rent_line(gpu: str) -> str:
    from topologies.hardware import load_catalog

    p = load_catalog().prices.gpus[gpu]
    return (f"price {gpu} (on-demand ${p.on_demand_usd:.2f}, reserved ${p.reserved_usd:.2f}, spot "
            f"${p.spot_usd:.2f} per GPU-hour): {p.source}")


def assumptions_of(c, rows: list[tuple[dict, object]]) -> list[str]:
    """Every figure the answer leaned on, with its source: the what-if's (hardware, rent,
    energy, failures), then buying (purchase prices, fabric, life, utilisation, facility)."""
    from simcore.planner.procure_input import buy_sheet_of, purchase_priced
    from simcore.planner.whatif import assumptions_of as whatif_assumptions, node_for_gpu

    plain = [(r, rc) for r, rc in rows if not isinstance(r.get("stage_gpu"), str)]
    rents = []
    for r, _ in rows:   # a mixed pipeline leans on both GPU types' own figures (its rc holds the blend)
        if isinstance(r.get("stage_gpu"), str):
            for g in (r["base_gpu"], r["stage_gpu"]):
                plain.append(({**r, "gpu": g, "node": node_for_gpu(g), "base_gpu": None, "stage_gpu": None}, None))
                rents.append(_rent_line(g))
    out = whatif_assumptions(plain) + rents
    if "buy" in c.modes:
        for row, _ in plain:
            if not purchase_priced(c, row["gpu"]):
                continue
            s = buy_sheet_of(c, row)
            out.append(f"buy {row['gpu']}: ${s.usd_per_gpu:,.0f} per GPU with its server share: {s.gpu_source}")
            out.append(f"buy fabric {s.fabric}: ${s.fabric_usd_per_gpu:,.0f} per GPU: {s.fabric_source}")
            out.append(f"buy: life {s.life_years:g} years, utilisation {s.utilisation:.0%}, facility "
                       f"${s.facility_usd_per_kw_month:,.2f} per kW-month of the nodes' system power, lead time "
                       f"{s.lead_time_days:g} days: {s.source}")
    out += ["an option's days and $ carry the 90% interval of the step time's validation residuals; the front and the "
            "answers are re-simulated on the event engine (the cell's best analytic layout), the rest are analytic; the "
            "tables give each engine its own columns ([event], [analytic]) and order the rows by the analytic pass",
            "a bought cluster is charged its share of capex (wall time / (life x utilisation)), the same share of the "
            "facility, and the energy it draws; a rented one its price per GPU-hour, energy included",
            "'$ of the run' is that charge; '$ paid out' is the money the buyer spends: a rental's bill, a purchase's "
            "capex of GPUs, servers and fabric before the run starts and the facility and energy while it runs; a "
            "budget is held against '$ paid out'"]
    if c.mixed:
        out.append("a mixed pipeline (simcore/planner/procure_mixed.py) runs its later stages on the other GPU type on "
                   "the event engine, is priced at the GPU-weighted blend of both types' prices, and counts energy at "
                   "the base GPU's power (an approximation)")
    return list(dict.fromkeys(out))


def left_out_lines(c, cells: pd.DataFrame) -> tuple[str, ...]:
    """What the answer could not weigh, a sentence each: the kinds with a node but no rental price
    (when the candidates take the default kinds), the kinds no way of buying prices, and the cells
    with no layout, grouped by kind and reason, with the cluster sizes."""
    from simcore.planner.procure_input import purchase_priced

    out = list(c.unweighed)
    if "buy" in c.modes and (rent_only := [g for g in c.gpus if not purchase_priced(c, g)]):
        out.append(f"rented only, no purchase price in prices.yaml purchase.gpus: {', '.join(rent_only)}; "
                   "candidates.prices.KIND.usd_per_gpu prices buying one")
    failed = cells[~cells["fits"].astype(bool)] if "fits" in cells else cells.iloc[0:0]
    failed = failed.assign(note=failed["note"] if "note" in failed else "no layout fits").fillna({"note": "no layout fits"})
    for (gpu, note), group in failed.groupby(["gpu", "note"], sort=False):
        sizes = ", ".join(str(int(n)) for n in sorted(group["nodes"]))
        out.append(f"{gpu} at {sizes} node{'s' if len(group) > 1 or sizes != '1' else ''}: {note}")
    return tuple(out)
