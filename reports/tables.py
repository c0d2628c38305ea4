"""Tables (pandas) of the hardware catalog, each row with its source."""
from __future__ import annotations

import pandas as pd

from topologies.hardware import Catalog

GIB = 1024**3


def catalog_tables(cat: Catalog) -> dict[str, pd.DataFrame]:
    """One DataFrame per catalog kind, in datasheet units, each row with its source."""
    gpus = pd.DataFrame([{
        "gpu": g.name, "description": g.description,
        **{f"{p}_tflops": (v / 1e12 if v else None) for p, v in g.peak_flops},
        "hbm_gib": g.hbm_bytes / GIB, "hbm_tbyte_per_s": g.hbm_bytes_per_s / 1e12,
        "link": g.intra_link, "link_gbyte_per_s_per_dir": g.intra_link_bytes_per_s / 1e9,
        "pcie_gen": g.pcie_gen, "tdp_w": g.tdp_w, "source": g.source,
    } for g in cat.gpus.values()])
    nodes = pd.DataFrame([{
        "node": name, "description": e.get("description", ""), "gpu": e.get("gpu"),
        "gpus_per_node": e.get("gpus_per_node"), "nvlink_domain_gpus": e.get("nvlink_domain_gpus") or e.get("gpus_per_node"),
        "intra": e.get("intra"), "fabric": e.get("fabric"),
        "nics_per_node": e.get("nics_per_node"), "host_memory_gib": e.get("host_memory_gib"),
        "system_power_w": e.get("system_power_w"), "source": e.get("source", ""),
    } for name, e in cat.nodes.items()])
    fabrics = pd.DataFrame([{
        "fabric": f.name, "description": f.description, "nic_gbit_per_s": f.nic_bytes_per_s * 8 / 1e9,
        "latency_us": f.latency_s * 1e6, "topology": f.topology, "oversubscription": f.oversubscription,
        "source": f.source,
    } for f in cat.fabrics.values()])
    storage = pd.DataFrame([{
        "storage": s.name, "kind": s.kind, "read_gbyte_per_s": s.read_bytes_per_s / 1e9,
        "write_gbyte_per_s": s.write_bytes_per_s / 1e9,
        "per_client_gbyte_per_s": s.per_client_bytes_per_s / 1e9, "source": s.source,
    } for s in cat.storage.values()])
    p = cat.prices
    prices = pd.DataFrame([{
        "item": f"{gpu} $/GPU-hour", "on_demand": gp.on_demand_usd, "reserved": gp.reserved_usd,
        "spot": gp.spot_usd, "source": gp.source,
    } for gpu, gp in p.gpus.items()] + [
        {"item": "energy $/kWh", "on_demand": p.usd_per_kwh, "source": p.energy_source},
        {"item": "PUE", "on_demand": p.pue, "source": p.energy_source},
        {"item": "interruptions per GPU-hour", "on_demand": p.interruptions_per_gpu_hour,
         "source": p.failures_source},
    ] + _purchase_rows(p.purchase))
    models = pd.DataFrame([{
        "model": name, **{k: e.get(k) for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden",
                                                 "vocab", "seq_len", "gated_mlp", "experts", "top_k")},
        "source": e.get("source", ""),
    } for name, e in cat.models.items()])
    return {"gpus": gpus, "nodes": nodes, "fabrics": fabrics, "storage": storage,
            "prices": prices, "models": models}


def _purchase_rows(purchase: dict) -> list[dict]:
    """Buying (prices.yaml ``purchase``): $ per GPU with its server share, the fabric per GPU, and
    the life, utilisation, facility and lead time, each with its source (the ``buy`` column)."""
    rows = [{"item": f"buy {gpu} $/GPU", "buy": e["usd_per_gpu"], "source": e.get("source", "")}
            for gpu, e in (purchase.get("gpus") or {}).items()]
    rows += [{"item": f"buy fabric {fab} $/GPU", "buy": e["usd_per_gpu"], "source": e.get("source", "")}
             for fab, e in (purchase.get("fabrics") or {}).items()]
    rows += [{"item": f"buy {key}", "buy": purchase[key], "source": purchase.get("source", "")}
             for key in ("life_years", "utilisation", "facility_usd_per_kw_month", "lead_time_days") if key in purchase]
    return rows
