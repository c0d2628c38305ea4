"""The price sheet of a run: $ per GPU-hour, energy tariff and failure rates, with sources.

``resolve_prices`` takes the catalog's figures for the plan's GPU
(``topologies/catalog/prices.yaml``), then the Plan's own
``cluster.price_per_gpu_hour``, then explicit overrides by field name. ``buy_sheet`` does the
same for owning the GPUs instead (prices.yaml ``purchase``: price per GPU with its server share,
the fabric per GPU, life, utilisation, facility per kW-month, lead time), each override checked.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from simcore.plan.spec import Plan, PlanError
from topologies.components import GpuPrice
from topologies.hardware import load_catalog


@dataclass(frozen=True, slots=True, kw_only=True)
class PriceSheet:
    """The prices, energy and failure figures of one run, each with its source."""

    on_demand_usd: float
    reserved_usd: float
    spot_usd: float
    """$ per GPU-hour."""
    price_source: str
    usd_per_kwh: float
    pue: float
    energy_source: str
    failures_per_gpu_hour: float
    restart_s: float
    spot_preemptions_per_node_hour: float
    failures_source: str
    spot_notice_s: float = 0.0
    """Warning before a preemption; a checkpoint that fits in it saves the work."""
    spot_elastic_restart_s: float = 0.0
    """Re-rendezvous and relaunch on a spare node after a preemption (the restore comes on top)."""
    spot_reacquire_s: float = 0.0
    """Mean time for the spot market to return a node to the spare pool."""
    spot_availability: float = 0.99
    """Share of the time the job must be whole; sizes the spare pool when spot_spare_nodes is auto."""
    spot_spare_nodes: float = math.nan
    """Spare spot nodes held (and paid) beside the job's; NaN: the fewest that reach spot_availability."""
    spot_source: str = ""


def resolve_prices(plan: Plan, overrides: Mapping[str, float] | None = None) -> PriceSheet:
    """Catalog prices for the plan's GPU, the plan's own price, then ``overrides`` (by field name)."""
    cat = load_catalog().prices
    gpu = plan.cluster.node.gpu.name
    gp = cat.gpus.get(gpu, GpuPrice(on_demand_usd=math.nan, reserved_usd=math.nan, spot_usd=math.nan,
                                    source=f"no catalog price for {gpu}: give one"))
    sheet = PriceSheet(
        on_demand_usd=gp.on_demand_usd, reserved_usd=gp.reserved_usd, spot_usd=gp.spot_usd,
        price_source=gp.source, usd_per_kwh=cat.usd_per_kwh, pue=cat.pue, energy_source=cat.energy_source,
        failures_per_gpu_hour=cat.interruptions_per_gpu_hour, restart_s=cat.restart_s,
        spot_preemptions_per_node_hour=cat.spot_preemptions_per_hour, failures_source=cat.failures_source,
        spot_notice_s=cat.spot_notice_s, spot_elastic_restart_s=cat.spot_elastic_restart_s,
        spot_reacquire_s=cat.spot_reacquire_s, spot_availability=cat.spot_availability,
        spot_source=cat.spot_source)
    if plan.cluster.price_per_gpu_hour is not None:
        sheet = replace(sheet, on_demand_usd=plan.cluster.price_per_gpu_hour,
                        price_source="cluster.price_per_gpu_hour of the Plan")
    for key, value in (overrides or {}).items():
        if key not in PriceSheet.__dataclass_fields__ or key.endswith("source"):
            known = ", ".join(k for k in PriceSheet.__dataclass_fields__ if not k.endswith("source"))
            raise PlanError(f"unknown price override '{key}' (known: {known})")
        if not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value):
            raise PlanError(f"price override {key}={value!r} must be a non-negative number")
        if key == "spot_availability" and not 0 < value < 1:
            raise PlanError(f"price override spot_availability={value!r} must lie strictly between 0 and 1")
        if key == "spot_spare_nodes" and value != int(value):
            raise PlanError(f"price override spot_spare_nodes={value!r} must be a whole number of nodes")
        sheet = replace(sheet, **{key: float(value)})
    if overrides:
        sheet = replace(sheet, price_source=sheet.price_source + " (overridden: " + ", ".join(overrides) + ")")
    if math.isnan(sheet.on_demand_usd):
        raise PlanError(f"no price for GPU '{gpu}': set cluster.price_per_gpu_hour or --price on_demand_usd=")
    return sheet


def ranking_price(plan: Plan, objective: str = "cost") -> tuple[float, str]:
    """The on-demand $ per GPU-hour, and a note where the catalog has none: a ranking by time
    goes on without costs (NaN), one by cost or the Pareto front cannot."""
    try:
        return resolve_prices(plan).on_demand_usd, ""
    except PlanError:
        gpu = plan.cluster.node.gpu.name
        if objective != "time":
            raise PlanError(f"objective={objective} needs a price for GPU '{gpu}', which the catalog lacks "
                            "(topologies/catalog/prices.yaml): rank by time, or price it there") from None
        return math.nan, (f"no catalog price for GPU '{gpu}' (topologies/catalog/prices.yaml): the ranking by time "
                          "shows no costs; `trainplan cost PLAN --price on_demand_usd=X` prices the best plan")


# --------------------------------------------------------------------------- buying

#: Hours in a year of 365 days and in an average month (the facility's rate is per month).
HOURS_PER_YEAR = 365 * 24
HOURS_PER_MONTH = HOURS_PER_YEAR / 12
#: The editable inputs of buying (prices.yaml ``purchase``), each with its rule.
BUY_FIELDS = {"life_years": "a positive number of years", "utilisation": "a share in (0, 1]",
              "facility_usd_per_kw_month": "a non-negative number", "lead_time_days": "a non-negative number",
              "usd_per_gpu": "a positive number", "fabric_usd_per_gpu": "a non-negative number"}


@dataclass(frozen=True, slots=True, kw_only=True)
class BuySheet:
    """What owning a GPU costs, each figure with its source (prices.yaml ``purchase``)."""

    gpu: str
    usd_per_gpu: float
    """Purchase price per GPU, the server's share included."""
    gpu_source: str
    fabric: str
    fabric_usd_per_gpu: float
    fabric_source: str
    life_years: float
    utilisation: float
    """Share of the life the cluster does paid work: the run bears capex / utilisation."""
    facility_usd_per_kw_month: float
    lead_time_days: float
    source: str

    @property
    def capex_per_gpu(self) -> float:
        return self.usd_per_gpu + self.fabric_usd_per_gpu

    def capex_usd_per_gpu_hour(self) -> float:
        """The capex a used GPU-hour carries: straight-line over the life, over the hours used."""
        return self.capex_per_gpu / (self.life_years * HOURS_PER_YEAR * self.utilisation)

    def facility_usd_per_gpu_hour(self, watts_per_gpu: float) -> float:
        """The facility's share of a used GPU-hour (its kW are rented for the whole life)."""
        return self.facility_usd_per_kw_month * watts_per_gpu / 1000 / HOURS_PER_MONTH / self.utilisation


def _check_buy(key: str, value, where: str) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and key == "utilisation":
        ok = 0 < value <= 1
    elif ok and key in ("life_years", "usd_per_gpu"):
        ok = value > 0
    elif ok:
        ok = value >= 0
    if not ok:
        raise PlanError(f"{where}.{key}={value!r} must be {BUY_FIELDS[key]}")
    return float(value)


def buy_sheet(gpu: str, fabric: str | None, overrides: Mapping[str, float] | None = None,
              where: str = "buy") -> BuySheet:
    """The purchase figures of ``gpu`` on ``fabric`` from prices.yaml, then ``overrides`` (by
    field name, each checked: one sentence naming ``where.field`` and its rule)."""
    raw = load_catalog().prices.purchase
    gpus, fabrics = raw.get("gpus") or {}, raw.get("fabrics") or {}
    for key in overrides or {}:
        if key not in BUY_FIELDS:
            raise PlanError(f"unknown field '{where}.{key}' (known: {', '.join(BUY_FIELDS)})")
    over = {k: _check_buy(k, v, where) for k, v in (overrides or {}).items()}
    if gpu not in gpus and "usd_per_gpu" not in over:
        raise PlanError(f"no purchase price for GPU '{gpu}' in prices.yaml purchase.gpus: give {where}.usd_per_gpu")
    g = gpus.get(gpu, {})
    f = fabrics.get(fabric or "", {})
    doc = {"life_years": raw.get("life_years"), "utilisation": raw.get("utilisation"),
           "facility_usd_per_kw_month": raw.get("facility_usd_per_kw_month"),
           "lead_time_days": raw.get("lead_time_days", 0), "usd_per_gpu": g.get("usd_per_gpu"),
           "fabric_usd_per_gpu": f.get("usd_per_gpu", 0.0)}
    doc = {k: _check_buy(k, v, "prices.purchase") for k, v in doc.items()} | over
    return BuySheet(gpu=gpu, fabric=fabric or "none", gpu_source=str(g.get("source", "given")),
                    fabric_source=str(f.get("source", "no fabric price: 0")), source=str(raw.get("source", "")),
                    **doc)
