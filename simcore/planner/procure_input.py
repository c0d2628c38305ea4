"""What a procurement search is asked: the model, the tokens, a deadline or a budget, and the
candidate hardware (GPU types x cluster sizes x fabrics x ways to pay), from a YAML file, the
command line or the defaults, each field checked with one sentence naming it and its rule.

The default candidates are the accelerators priced to rent in ``topologies/catalog/prices.yaml``
that the catalog has a node for, GPUs, TPUs and Trainium alike: one priced before its catalog
entry exists joins the default set the day its node does. A candidate with no purchase price in
prices.yaml (TPU v6e, Trn1) is offered on the rents alone; the kinds with a node that the
defaults leave out are named a group a sentence (``default_kinds``), with what would weigh them.
Mixed pipelines (``mixed:``, ``simcore.planner.procure_mixed``) are checked here too, and the
helpers the procure modules share (the what-if base of a GPU type, the purchase sheet of a cell)
live here, below them all. Example file: ``sweeps/procure-llama3-70b.yaml``.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from simcore.plan.bounds import check_tokens
from simcore.plan.hf_config import model_section
from simcore.plan.load import read_yaml_file
from simcore.plan.spec import PlanError
from simcore.planner.procure_serving import check_serving_section
from simcore.planner.stacks import checked_stack
from topologies.hardware import load_catalog

#: The ways of paying for the GPUs: rent (simcore/planner/runcost.py, spot.py) or buy (prices.BuySheet).
MODES = ("on_demand", "reserved", "spot", "buy")
#: Default cluster sizes (nodes): 20 sizes from a few nodes to a large training cluster.
DEFAULT_NODES = (2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024)
#: Default search axes per cell: the layouts production runs of this size use (TP inside a
#: node, the distributed optimizer, micro-batch 1), so a cell costs tens of milliseconds.
DEFAULT_SPACE = {"cp": [1, 2], "zero": [1], "micro_batch": [1], "vpp": [2, 4], "offload": ["none"]}
#: The ZeRO stage a stack runs where the distributed optimizer is not its own: torchtitan's data
#: parallelism is FSDP2, resharding after forward by default (ZeRO-3); it has no ZeRO-1.
STACK_ZERO = {"torchtitan": [3], "torchtitan-0.2": [3], "maxtext": [1, 3]}
#: (MaxText: its data axis with shard_optimizer_over_data, ZeRO-1, and its fsdp axis, ZeRO-3.)
#: Training defaults of a procurement (the Plan's own defaults otherwise).
DEFAULT_TRAINING = {"precision": "bf16", "flash_attention": True}
DEFAULT_GLOBAL_BATCH = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidates:
    """One procurement question and the hardware it may buy or rent."""

    name: str = "procure"
    model: dict
    tokens: float
    global_batch: int = DEFAULT_GLOBAL_BATCH
    training: dict = field(default_factory=lambda: dict(DEFAULT_TRAINING))
    deadline_days: float | None = None
    budget_usd: float | None = None
    gpus: tuple[str, ...] = ()
    nodes: tuple[int, ...] = DEFAULT_NODES
    fabrics: tuple[str, ...] = ("default",)
    """Fabric names, or ``default``: the node's own."""
    modes: tuple[str, ...] = MODES
    buy: dict = field(default_factory=dict)
    """Overrides of prices.yaml ``purchase`` (life_years, utilisation, facility_usd_per_kw_month, lead_time_days)."""
    prices: dict = field(default_factory=dict)
    """Per GPU: rent (runcost.PriceSheet fields) and buy (usd_per_gpu, fabric_usd_per_gpu) overrides."""
    price: dict = field(default_factory=dict)
    """Overrides for every GPU (failure rates, energy tariff: runcost.PriceSheet fields)."""
    space: dict = field(default_factory=lambda: dict(DEFAULT_SPACE))
    storage: str | None = None
    jobs: int = 1
    failures: bool = True
    resimulate: bool = True
    """Re-simulate the frontier and the answers on the event engine."""
    mixed: tuple = ()
    """Mixed pipelines: {gpus: [BASE, OTHER], nodes: [...], share: 0.5} (``simcore.planner.procure_mixed``)."""
    stack: str | None = None
    """Rank only layouts this stack runs (``simcore.planner.stacks.STACKS``); None: any."""
    serving: dict | None = None
    """Serve the model too: rate, lengths and SLO (``simcore.planner.procure_serving``); None: training only."""
    unweighed: tuple[str, ...] = ()
    """The default kinds' left-out groups, a sentence each (``default_kinds``); none for named GPUs."""


def _with_node() -> set[str]:
    cat = load_catalog()
    return {raw.get("gpu") for raw in cat.nodes.values() if raw.get("gpu") in cat.gpus}


def default_gpus() -> tuple[str, ...]:
    """Accelerators priced to rent that the catalog has a node for, in prices.yaml order."""
    with_node = _with_node()
    return tuple(g for g in load_catalog().prices.gpus if g in with_node)


def default_kinds(precision: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the default candidates for a run in ``precision``, a sentence for each group of the kinds
    with a catalog node that they leave out): those with no rental price, and those with no peak
    in that precision (V100: no bf16)."""
    cat, with_node = load_catalog(), _with_node()
    priced = default_gpus()
    runs = tuple(g for g in priced if cat.gpus[g].peak(precision))
    out = []
    unpriced = sorted(g for g in with_node if g not in cat.prices.gpus)
    if priceable := [g for g in unpriced if not _model_gaps(g)]:
        out.append(f"not weighed, no rental price in topologies/catalog/prices.yaml (a gap): {', '.join(priceable)}; "
                   "candidates.gpus with candidates.prices.KIND.on_demand_usd weighs one at your price")
    if blind := [g for g in unpriced if _model_gaps(g)]:
        out.append("not weighed, no rental price and catalog gaps the step model reads: "
                   + "; ".join(f"{g} ({', '.join(_model_gaps(g))})" for g in blind))
    if slow := [g for g in priced if g not in runs]:
        out.append(f"not weighed, no {precision} peak in the catalog: {', '.join(slow)}")
    return runs, tuple(out)


#: Catalog gaps the step-time model does not read (host PCIe: offload only, refused where it is a gap;
#: TDP: energy only; an FP8 peak: FP8 runs only).
UNREAD_GAPS = ("pcie_gbyte_per_s_bidir", "tdp_w", "dense_tflops.fp8")


def _model_gaps(gpu: str) -> list[str]:
    """The gaps of ``gpu``'s catalog entry that the step model reads (its efficiency entry among them)."""
    cat = load_catalog()
    gaps = [g for g in cat.gpus[gpu].gaps if g not in UNREAD_GAPS]
    return gaps + (["efficiency"] if gpu not in cat.efficiency and "efficiency" not in gaps else [])


def purchase_priced(c: "Candidates", gpu: str) -> bool:
    """Whether the candidates can buy ``gpu``: prices.yaml's purchase price or theirs."""
    return gpu in (load_catalog().prices.purchase.get("gpus") or {}) or "usd_per_gpu" in (c.prices.get(gpu) or {})


def load_candidates(path: str | os.PathLike, **over) -> Candidates:
    """Read a candidates file; keyword arguments (the command line's) replace its fields."""
    path = Path(path)
    doc = read_yaml_file(path, "candidates file")
    if not isinstance(doc, dict):
        raise PlanError(f"candidates file {path} must hold a mapping")
    doc.setdefault("name", path.stem)
    return candidates_from_dict({**doc, **{k: v for k, v in over.items() if v is not None}})


def _number(doc: dict, key: str, *, whole: bool = False, optional: bool = False):
    value = doc.get(key)
    if value is None and optional:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            pass
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    if ok and whole:
        ok = value == int(value)
    if not ok:
        kind = "a positive whole number" if whole else "a positive number"
        raise PlanError(f"candidates.{key}={value!r} must be {kind}")
    return int(value) if whole else float(value)


def _names(doc: dict, key: str, known, what: str) -> tuple[str, ...]:
    values = doc[key]
    values = [values] if isinstance(values, str) else values
    if not isinstance(values, list) or not values:
        raise PlanError(f"candidates.{key} must be a non-empty list of {what}")
    for v in values:
        if v not in known:
            raise PlanError(f"candidates.{key}: '{v}' is not one of the {what} ({', '.join(sorted(map(str, known)))})")
    return tuple(values)


def _check_gpus(doc: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the candidate GPUs, the sentences on the default kinds left out)."""
    cat = load_catalog()
    if "gpus" not in doc:
        training = doc.get("training") if isinstance(doc.get("training"), dict) else {}
        return default_kinds(str({**DEFAULT_TRAINING, **training}.get("precision", "bf16")))
    with_node = sorted(_with_node())
    gpus = _names(doc, "gpus", set(cat.prices.gpus) | set(with_node), "GPUs priced in prices.yaml")
    for g in gpus:
        if g not in with_node:
            raise PlanError(f"candidates.gpus: '{g}' is priced but the catalog has no node built on it yet "
                            f"(GPUs with nodes: {', '.join(with_node)})")
        prices, price = doc.get("prices"), doc.get("price")
        own = prices.get(g) if isinstance(prices, dict) else None
        rent = {**(price if isinstance(price, dict) else {}), **(own if isinstance(own, dict) else {})}
        if g not in cat.prices.gpus and "on_demand_usd" not in rent:
            raise PlanError(f"candidates.gpus: '{g}' has no rental price in prices.yaml (a gap): give "
                            f"candidates.prices.{g}.on_demand_usd (and reserved_usd, spot_usd), or leave it out")
    return gpus, ()


def _check_nodes(doc: dict) -> tuple[int, ...]:
    nodes = doc.get("nodes", list(DEFAULT_NODES))
    nodes = [nodes] if isinstance(nodes, int) else nodes
    if not isinstance(nodes, list) or not nodes or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in nodes):
        raise PlanError(f"candidates.nodes={nodes!r} must be a non-empty list of positive whole numbers of nodes")
    return tuple(sorted(set(nodes)))


def _check_prices(doc: dict, gpus: tuple[str, ...]) -> dict:
    from simcore.planner.prices import BUY_FIELDS, PriceSheet

    prices = doc.get("prices") or {}
    if not isinstance(prices, dict):
        raise PlanError("candidates.prices must map a GPU to its price fields")
    known = set(BUY_FIELDS) | {k for k in PriceSheet.__dataclass_fields__ if not k.endswith("source")}
    for gpu, fields in prices.items():
        if gpu not in gpus:
            raise PlanError(f"candidates.prices.{gpu}: not one of the candidate GPUs ({', '.join(gpus)})")
        if not isinstance(fields, dict):
            raise PlanError(f"candidates.prices.{gpu} must map price fields to numbers")
        for key in fields:
            if key not in known:
                raise PlanError(f"unknown field 'candidates.prices.{gpu}.{key}' (known: {', '.join(sorted(known))})")
    return prices


def candidates_from_dict(doc: dict) -> Candidates:
    """Check every field (one sentence on the first problem) and fill the defaults."""
    known = set(Candidates.__dataclass_fields__)
    for key in doc:
        if key not in known:
            raise PlanError(f"unknown candidates field '{key}' (known: {', '.join(sorted(known))})")
    if "model" not in doc or "tokens" not in doc:
        raise PlanError(f"the candidates need '{'model' if 'model' not in doc else 'tokens'}'")
    model = model_section(doc["model"])
    if not isinstance(model, dict):
        raise PlanError("candidates.model must be a catalog name or a Plan model section")
    gpus, unweighed = _check_gpus(doc)
    fabrics = _names(doc, "fabrics", set(load_catalog().fabrics) | {"default"}, "fabrics (or 'default')") \
        if "fabrics" in doc else ("default",)
    modes = _names(doc, "modes", MODES, "modes") if "modes" in doc else MODES
    for key in ("buy", "price", "space", "training"):
        if not isinstance(doc.get(key) or {}, dict):
            raise PlanError(f"candidates.{key} must be a mapping")
    _check_model(model, gpus, doc)
    return Candidates(
        name=str(doc.get("name", "procure")), model=dict(model),
        tokens=check_tokens(_number(doc, "tokens"), "candidates.tokens"),
        global_batch=_number(doc, "global_batch", whole=True) if "global_batch" in doc else DEFAULT_GLOBAL_BATCH,
        training={**DEFAULT_TRAINING, **(doc.get("training") or {})},
        deadline_days=_number(doc, "deadline_days", optional=True), budget_usd=_number(doc, "budget_usd", optional=True),
        gpus=gpus, nodes=_check_nodes(doc), fabrics=fabrics, modes=modes, buy=_check_buy_fields(doc),
        prices=_check_prices(doc, gpus), price=dict(doc.get("price") or {}),
        space=_default_space(doc),
        storage=doc.get("storage"), jobs=_number(doc, "jobs", whole=True) if "jobs" in doc else 1,
        failures=bool(doc.get("failures", True)), resimulate=bool(doc.get("resimulate", True)),
        mixed=tuple(_mixed(doc)), stack=checked_stack(doc.get("stack"), "candidates.stack"),
        serving=check_serving_section(doc.get("serving")), unweighed=unweighed)


def _default_space(doc: dict) -> dict:
    """The candidates' search axes, or the defaults with the stack's own ZeRO stage."""
    if doc.get("space") is not None:
        return dict(doc["space"])
    return {**DEFAULT_SPACE, **({"zero": STACK_ZERO[doc["stack"]]} if doc.get("stack") in STACK_ZERO else {})}


def _mixed(doc: dict) -> list[dict]:
    cat = load_catalog()
    return check_mixed(doc, _with_node(), set(cat.prices.gpus) & set(cat.gpus))


def _check_model(model: dict, gpus: tuple[str, ...], doc: dict) -> None:
    """The model, batch and training fields as one Plan would take them (one sentence if not)."""
    from simcore.planner.space import base_plan
    from simcore.planner.whatif import node_for_gpu

    if gpus:
        base_plan(model, {"node": node_for_gpu(gpus[0]), "nodes": 1}, int(doc.get("global_batch", 1) or 1),
                  {**DEFAULT_TRAINING, **(doc.get("training") or {})})


def _check_buy_fields(doc: dict) -> dict:
    """``buy`` overrides: each a known purchase field with a valid value (prices._check_buy)."""
    from simcore.planner.prices import BUY_FIELDS, _check_buy

    buy = doc.get("buy") or {}
    for key, value in buy.items():
        if key not in BUY_FIELDS:
            raise PlanError(f"unknown field 'candidates.buy.{key}' (known: {', '.join(BUY_FIELDS)})")
        _check_buy(key, value, "candidates.buy")
    return dict(buy)


# --------------------------------------------------------------------------- shared by the procure modules

def sweep_of(c: Candidates, gpu: str):
    """The what-if base of one GPU type: its rent overrides with the ones for every GPU."""
    from simcore.planner.prices import BUY_FIELDS
    from simcore.planner.whatif import Sweep, node_for_gpu

    from simcore.planner.stacks import HARDWARE_STACKS

    rent = {**c.price, **{k: v for k, v in (c.prices.get(gpu) or {}).items() if k not in BUY_FIELDS}}
    cluster = {"node": node_for_gpu(gpu), "nodes": 1, **({"storage": c.storage} if c.storage else {})}
    space, own = c.space, HARDWARE_STACKS.get(load_catalog().gpus[gpu].vendor)
    if c.stack is None and own in STACK_ZERO and space == DEFAULT_SPACE:   # the chip's own stack's ZeRO stages
        space = {**space, "zero": STACK_ZERO[own]}
    return Sweep(name=c.name, model=c.model, cluster=cluster, global_batch=c.global_batch, tokens=c.tokens,
                 training=c.training, space=space, top_k=0, objective="time", jobs=1, monte_carlo=0,
                 failures=c.failures, prices=rent, stack=c.stack)


def buy_sheet_of(c: Candidates, row: dict):
    """The purchase figures of a cell's GPUs: the catalog's, the candidates' overrides, and for a
    mixed pipeline the purchase price blended over its two GPU types."""
    from simcore.planner.prices import buy_sheet

    gpu = row.get("base_gpu") if isinstance(row.get("base_gpu"), str) else row["gpu"]
    over = {**c.buy, **{k: v for k, v in (c.prices.get(gpu) or {}).items() if k in ("usd_per_gpu", "fabric_usd_per_gpu")}}
    if isinstance(row.get("stage_gpu"), str):
        over.update(blended_buy(c, row))
    return buy_sheet(gpu, row.get("fabric"), over, where="candidates.buy")


def blend(a: float, b: float, share: float) -> float:
    """The price of a GPU-hour when ``share`` of the GPUs are of the second type."""
    return (1 - share) * a + share * b


def blended_buy(c, row: dict) -> dict:
    """Buy overrides of a mixed row: the per-GPU purchase price blended like the rent."""
    from simcore.planner.prices import buy_sheet

    price = {g: buy_sheet(g, None, {k: v for k, v in (c.prices.get(g) or {}).items() if k == "usd_per_gpu"},
                          where=f"candidates.prices.{g}").usd_per_gpu for g in (row["base_gpu"], row["stage_gpu"])}
    return {"usd_per_gpu": blend(price[row["base_gpu"]], price[row["stage_gpu"]], row["stage_share"])}


def check_mixed(doc: dict, gpus_with_node: set, priced: set) -> list[dict]:
    """The candidates' ``mixed`` entries, each checked (one sentence naming the field and rule)."""
    entries = doc.get("mixed") or []
    if not isinstance(entries, list):
        raise PlanError("candidates.mixed must be a list of {gpus: [BASE, OTHER], nodes: [...], share: 0.5}")
    for i, e in enumerate(entries):
        where = f"candidates.mixed[{i}]"
        if not isinstance(e, dict) or set(e) - {"gpus", "nodes", "share"}:
            raise PlanError(f"{where} must map gpus, nodes and share (known: gpus, nodes, share)")
        g = e.get("gpus")
        if not (isinstance(g, list) and len(g) == 2 and g[0] != g[1]):
            raise PlanError(f"{where}.gpus={g!r} must name two different GPU types: [BASE, OTHER]")
        if g[0] not in gpus_with_node or g[1] not in priced:
            raise PlanError(f"{where}.gpus={g!r}: the base needs a catalog node and both a price "
                            f"(GPUs with nodes: {', '.join(sorted(gpus_with_node))})")
        n = e.get("nodes")
        if not (isinstance(n, list) and n and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in n)):
            raise PlanError(f"{where}.nodes={n!r} must be a non-empty list of positive whole numbers of nodes")
        s = e.get("share", 0.5)
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < 1:
            raise PlanError(f"{where}.share={s!r} must be the share of pipeline stages on the other GPU, in (0, 1)")
    return [dict(e) for e in entries]
