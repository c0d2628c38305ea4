"""What torchtitan 0.3's modules of named configs share as export targets (``torchtitan_qwen3``,
``torchtitan_gpt_oss``): a Plan's model held to the registered configs' shapes, and the layouts
torchtitan can give an MoE model's experts."""
from __future__ import annotations

#: The Plan fields a named config fixes (``head_dim`` is the model's head width, ``model.kv_channels``;
#: an MoE model's ``ffn_hidden`` is an expert's width).
SHAPE = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn_hidden", "vocab", "tied_embeddings", "experts",
         "top_k")


def show(value) -> str:
    """A value as a refusal names it (booleans as the Plan file writes them)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def shape_of(m) -> dict:
    """The ``SHAPE`` fields of a Plan's model."""
    return {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
            "head_dim": m.head_dim, "ffn_hidden": m.ffn_hidden, "vocab": m.vocab,
            "tied_embeddings": m.tied_embeddings, "experts": m.experts, "top_k": m.top_k}


def config_of(m, configs: dict) -> str | None:
    """The name of the config in ``configs`` (name -> ``SHAPE`` fields) that builds this model's shape, or None."""
    shape = shape_of(m)
    return next((name for name, c in configs.items() if all(c[k] == shape[k] for k in SHAPE)), None)


def shape_refusal(m, configs: dict, module: str) -> tuple:
    """(broken, field, value, why): the first field where the model differs from the nearest of
    ``configs`` (fewest fields apart), which torchtitan's ``module`` alone builds."""
    shape = shape_of(m)
    nearest = min(configs, key=lambda n: sum(configs[n][k] != shape[k] for k in SHAPE))
    key = next(k for k in SHAPE if configs[nearest][k] != shape[k])
    field_, value = ("kv_channels", m.kv_channels) if key == "head_dim" else (key, shape[key])
    return (True, f"model.{field_}", show(value),
            f"torchtitan 0.3's {module} module builds only its registered configs ({', '.join(configs)}) and the "
            f"nearest, {nearest}, has {key} {show(configs[nearest][key])} (torchtitan/models/{module}/__init__.py)")


def expert_layout_refusals(plan, module: str, split_where: str) -> list[tuple]:
    """(broken, field, value, why) for expert layouts torchtitan cannot give ``module``'s MoE:
    expert parallel borrows ranks from FSDP and TP (torchtitan/config/configs.py
    ``expert_parallel_degree``: efsdp = dp_shard x cp x tp / ep), so an expert is whole on its rank;
    without it the experts split over TP (``split_where``); the experts are FSDP-sharded over efsdp."""
    par = plan.parallel
    shard = par.dp // par.dp_replicate if par.zero >= 2 else 1   # data_parallel_shard_degree as the export writes it
    ranks = shard * par.cp * par.tp
    efsdp = ranks // par.ep if ranks % par.ep == 0 else 0
    folded = "torchtitan's expert parallel borrows ranks from FSDP and TP, efsdp = dp_shard x cp x tp / ep " \
             "(torchtitan/config/configs.py expert_parallel_degree)"
    return [
        (par.ep > 1 and efsdp == 0, "parallel.ep", par.ep,
         f"{folded}, and dp_shard x cp x tp is {ranks} as written (data_parallel_shard_degree {shard})"),
        (par.ep > 1 and par.tp > 1 and par.etp != 1, "parallel.expert_tp", par.etp,
         f"{folded}, so each expert is whole on its rank (expert_tp 1)"),
        (par.ep == 1 and par.etp != par.tp, "parallel.expert_tp", par.etp,
         f"without expert parallel its experts split over the TP ranks ({split_where})"),
        (par.ep > 1 and par.zero < 2 and efsdp > 1, "parallel.zero", int(par.zero),
         f"it FSDP-shards the experts over efsdp = {efsdp} ranks (torchtitan/models/{module}/parallelize.py "
         "apply_fsdp_to_decoder on the efsdp mesh)"),
    ]
