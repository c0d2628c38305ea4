"""Mixed GPU types across pipeline stages as procurement options: a cluster of one GPU type
whose last pipeline stages run on another (the GPUs a team already owns beside the ones it
buys or rents), priced at the blend of the two.

The engine runs such a pipeline on the event engine only (``simcore.model.mixed``: each
stage's compute on its own GPU type, communication on the base node's fabric and NVLink
domain), so a mixed cell is: the base GPU's layout search restricted to pipelines that split
``share`` of their stages off (``simcore.planner.whatif.search_cell``), the memory of the
moved stages checked against the other GPU's HBM, the step played by the event engine, and
the run priced (``simcore.planner.runcost``) at the GPU-weighted blend of the two GPU types'
prices, rent and buy alike. Energy is counted at the base GPU's power (an approximation the
assumptions state).
"""
from __future__ import annotations

from dataclasses import replace



def mixed_cells(c) -> list[dict]:
    """Every mixed entry of the candidates x its node counts x the fabrics."""
    return [{"gpu": e["gpus"][0], "stage_gpu": e["gpus"][1], "share": float(e.get("share", 0.5)), "nodes": n,
             **({} if f == "default" else {"fabric": f})}
            for e in c.mixed for n in e["nodes"] for f in c.fabrics]


def _split_pps(c, cell: dict) -> list[int]:
    """Pipeline sizes whose ``share`` of stages is a whole number of stages, neither none nor all."""
    from simcore.planner.space import base_plan, derive_space
    from simcore.planner.whatif import node_for_gpu

    base = base_plan(c.model, {"node": node_for_gpu(cell["gpu"]), "nodes": cell["nodes"]}, c.global_batch,
                     c.training)
    pins = c.space.get("pp")
    pps = [int(p) for p in (pins if pins else derive_space(base).pp)]
    return [p for p in pps if p >= 2 and 0 < round(p * cell["share"]) < p
            and abs(p * cell["share"] - round(p * cell["share"])) < 1e-9]


RENT_KEYS = ("on_demand_usd", "reserved_usd", "spot_usd")


def _blended_prices(c, plan, other: str, share: float, overrides: dict) -> dict:
    """The base GPU's price overrides with each rent price blended with the other GPU's."""
    from simcore.model.mixed import plan_on_gpu
    from simcore.planner.prices import resolve_prices
    from simcore.planner.procure_input import blend

    a = resolve_prices(plan, overrides)
    b = resolve_prices(plan_on_gpu(plan, other), {k: v for k, v in (c.prices.get(other) or {}).items()
                                                  if k in RENT_KEYS})
    return {**overrides, **{k: blend(getattr(a, k), getattr(b, k), share) for k in RENT_KEYS}}


def _moved_stages_fit(plan, stage_gpus: dict[int, str]) -> tuple[float, str]:
    """(smallest headroom in GiB over every rank on its own GPU, a sentence when a rank overflows)."""
    from simcore.model.memory import memory_per_rank
    from topologies.hardware import load_catalog

    gpus = load_catalog().gpus
    per_rank = memory_per_rank(plan)
    rooms = []
    for r, m in enumerate(per_rank):
        gpu = gpus[stage_gpus[r]] if r in stage_gpus else plan.cluster.node.gpu
        rooms.append((gpu.hbm_bytes - m["total"]) / 2**30)
        if rooms[-1] < 0:
            return rooms[-1], (f"pipeline stage {r} needs {m['total'] / 2**30:.1f} GiB per GPU, more than "
                               f"{gpu.name}'s {gpu.hbm_bytes / 2**30:.0f} GiB")
    return min(rooms), ""


def evaluate_mixed(c, cell: dict) -> tuple[dict, object | None]:
    """One mixed cell: (row, RunCost or None); the row's ``gpu`` reads ``base+other``."""
    from simcore.engine.des import simulate_des
    from simcore.model.mixed import mixed_costs
    from simcore.planner.procure_input import sweep_of
    from simcore.planner.runcost import run_cost
    from simcore.planner.whatif import _cost_fields, search_cell

    label = {"gpu": f"{cell['gpu']}+{cell['stage_gpu']}", "base_gpu": cell["gpu"], "stage_gpu": cell["stage_gpu"],
             "nodes": cell["nodes"], "fabric_asked": cell.get("fabric", "default")}
    pps = _split_pps(c, cell)
    if not pps:
        return {**label, "layout": None, "fits": False,
                "note": f"no pipeline size splits {cell['share']:.0%} of its stages off"}, None
    sweep = replace(sweep_of(c, cell["gpu"]), space={**c.space, "pp": pps})
    row, res, tokens, prices = search_cell(sweep, {k: cell[k] for k in ("gpu", "nodes", "fabric") if k in cell})
    row.update(label)
    if res is None:
        return row, None
    plan, top = res.best, res.table.iloc[0]
    pp = plan.parallel.pp
    moved = round(pp * cell["share"])
    stage_gpus = {r: cell["stage_gpu"] for r in range(pp - moved, pp)}
    room, why = _moved_stages_fit(plan, stage_gpus)
    if why:
        return {**row, "layout": None, "fits": False, "note": why}, None
    result = simulate_des(mixed_costs(plan, stage_gpus))
    share = moved / pp
    rc = run_cost(plan, result, tokens, prices=_blended_prices(c, plan, cell["stage_gpu"], share, prices),
                  failures=c.failures, monte_carlo=0)
    figures = {k: getattr(result, k) for k in ("mfu", "memory_per_gpu_gib", "compute_s", "exposed_comm_s",
                                                "bubble_s", "offload_s")}
    stages = f"stage {pp - 1}" if moved == 1 else f"stages {pp - moved}-{pp - 1}"
    row.update(layout=f"{top['layout']} ({stages} on {cell['stage_gpu']})", fits=True,
               **{**_cost_fields(rc, figures, plan.cluster), "engine": "event"}, stage_share=share)
    row["headroom_gib"] = room
    return row, rc
