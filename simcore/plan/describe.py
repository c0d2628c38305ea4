"""Human-facing summaries of a Plan (what `trainplan check` prints)."""
from __future__ import annotations

from simcore.plan.load import plan_to_dict
from simcore.plan.spec import Plan


def plan_summary(plan: Plan) -> dict:
    """The resolved Plan document plus the figures derived from it."""
    par, cl = plan.parallel, plan.cluster
    derived = {
        "gpus_used": par.gpus,
        "gpus_in_cluster": cl.gpus,
        "gpu": cl.node.gpu.name,
        "node": f"{cl.node.name} x {cl.nodes} ({cl.gpus_per_node} GPUs per node)",
        "fabric": cl.fabric.name if cl.fabric else "none",
        "storage": cl.storage.name,
        "micro_batches_per_step": plan.num_microbatches,
        "layers_per_virtual_stage": list(plan.layers_per_stage),
        "tokens_per_step": plan.training.global_batch * plan.model.seq_len,
    }
    if par.kv_replicator > 1:   # NeuronX Distributed's copies (simcore.model.kv_replication)
        m = plan.model
        derived["kv_heads_per_rank"] = f"{m.kv_heads * par.kv_replicator // par.tp} ({m.kv_heads} heads x " \
                                       f"{par.kv_replicator} copies over tp {par.tp})"
    if not cl.node.calibrated and cl.node.gpu.name == "uncalibrated-host":
        derived["note"] = "localhost has no calibrated profile yet: run `trainplan calibrate` to simulate it"
    return {"plan": plan_to_dict(plan), "derived": derived}
