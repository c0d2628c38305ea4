"""The price sheet of a run: $ per GPU-hour, energy tariff and failure rates, with sources.

``resolve_prices`` takes the catalog's figures for the plan's GPU
(``topologies/catalog/prices.yaml``), then the Plan's own
``cluster.price_per_gpu_hour``, then explicit overrides by field name.
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
