"""What no run could be, and what the step-by-step tools will not play out.

``check_bounds`` (run first by ``rules.check_plan``) refuses a Plan beyond any run that has been
or could soon be made, each bound with its reason: without it such a Plan passed ``check``
and then crashed a command (a node of 2^63 GPUs divided a checkpoint interval down to zero)
or kept it busy for minutes.

``check_event_budget`` is not a rule of the Plan but of the tools that play a step micro-batch
by micro-batch (the event engine, the schedule grid, the collectives list): they refuse, in one
sentence, a step they could not play within seconds, and the analytic path answers instead.
"""
from __future__ import annotations

from simcore.plan.spec import Plan, PlanError

#: (what is bounded, its value in a Plan, the bound, why no run goes past it)
BOUNDS = (
    ("cluster.gpus_per_node", lambda p: p.cluster.gpus_per_node, 1024,
     "no server or NVLink domain holds more GPUs (the largest announced, NVIDIA's NVL576, holds 576)"),
    ("the cluster's GPUs (cluster.nodes x gpus_per_node)", lambda p: p.cluster.gpus, 2**20,
     "no cluster built or announced holds more than a few hundred thousand GPUs"),
    ("model.layers", lambda p: p.model.layers, 10_000,
     "ten times the deepest transformer trained (DeepNet's 1,000 layers: Wang et al. 2022, arXiv:2203.00555)"),
    ("model.seq_len", lambda p: p.model.seq_len, 2**24,
     "longer than the longest context any model offers (10M tokens: Meta's Llama 4 Scout, 2025)"),
    ("the tokens per step (training.global_batch x model.seq_len)",
     lambda p: p.training.global_batch * p.model.seq_len, 2**30,
     "17 times the largest published batch (DeepSeek-V3's 15,360 sequences of 4,096 tokens: DeepSeek-AI 2024, "
     "arXiv:2412.19437, Sec. 4.2)"),
    ("model.experts", lambda p: p.model.experts, 2**20,
     "a million experts is the most any mixture of experts has routed among (PEER: He 2024, arXiv:2407.04153)"),
)


def check_bounds(plan: Plan) -> None:
    """PlanError naming the first bound the Plan passes, with the bound and its reason."""
    for what, value_of, bound, why in BOUNDS:
        value = value_of(plan)
        if value > bound:
            said = f"{what} is {value:,}," if " " in what else f"{what}={value:,} is"
            raise PlanError(f"{said} over {bound:,}: {why}")


#: The most tokens a run trains on: about 28 times the most any published model was trained on
#: (Qwen3's 36T tokens: Qwen Team 2025, arXiv:2505.09388).
MAX_TOKENS = 1e15


def check_tokens(tokens, where: str = "tokens") -> float:
    """``tokens`` as a float; PlanError naming ``where`` unless it is positive, finite and at most
    ``MAX_TOKENS``."""
    import math

    ok = isinstance(tokens, (int, float)) and not isinstance(tokens, bool) and math.isfinite(tokens) and tokens > 0
    if not ok:
        raise PlanError(f"{where}={tokens} must be a positive, finite number")
    if tokens > MAX_TOKENS:
        raise PlanError(f"{where}={tokens:g} is over {MAX_TOKENS:g}: about 28 times the most tokens any published "
                        "model was trained on (Qwen3's 36T: Qwen Team 2025, arXiv:2505.09388)")
    return float(tokens)


#: Micro-batch passes of one step (pipeline stages x virtual stages x micro-batches, times the
#: layers of a chunk at layer granularity) the step-by-step tools play at most. The event
#: engine takes about 55-140 us a pass on one core (bench/engine.py: GPT-3 175B's 12 x 1,024
#: passes in 1.7 s), so this bound is a few seconds of it.
EVENT_PASSES = 2**14


def event_passes(plan: Plan, granularity: str = "microbatch", mode: str = "representative") -> int:
    """The passes of one step the event engine plays (see ``EVENT_PASSES``): every rank's in
    its full mode, one rank's per stage otherwise; a layer's each at layer granularity, and
    under FSDP (ZeRO-2/3), whose every micro-batch gathers or reduce-scatters block by block."""
    par = plan.parallel
    passes = par.pp * par.vpp * plan.num_microbatches
    if granularity == "layer" or par.zero >= 2:
        passes *= -(-plan.model.layers // (par.pp * par.vpp))
    return passes * (par.tp * par.dp * par.cp if mode == "full" else 1)


#: Passes the collectives list lowers: it lowers the whole schedule once for each pipeline stage
#: (pp x the passes), about 15 us a pass on one core, so this bound is a few seconds of it.
LISTED_PASSES = 2**17


def check_event_budget(plan: Plan, what: str, granularity: str = "microbatch", mode: str = "representative",
                       per_stage: bool = False) -> None:
    """PlanError (one sentence) when ``what`` would play more than ``EVENT_PASSES`` passes (or,
    ``per_stage``, lower the schedule once per stage over ``LISTED_PASSES`` passes in all)."""
    passes = event_passes(plan, granularity, mode) * (plan.parallel.pp if per_stage else 1)
    bound = LISTED_PASSES if per_stage else EVENT_PASSES
    if passes > bound:
        layers = " x the layers of a chunk" if granularity == "layer" or plan.parallel.zero >= 2 else ""
        ranks = " x the ranks of a stage" if mode == "full" else ""
        stages = " x pp again, once per stage" if per_stage else ""
        raise PlanError(f"{what} plays a step pass by pass, and this one has {passes:,} (parallel.pp x vpp x the "
                        f"micro-batches per step{layers}{ranks}{stages}), over the {bound:,} it plays within seconds: "
                        "the analytic engine (trainplan simulate) answers for it, or give fewer micro-batches per "
                        "step (a larger training.micro_batch or parallel.dp)")


#: GPUs of the cluster graph ``trainplan topology`` builds and cuts (a vertex per GPU, NIC and
#: switch; bisection by max flow): 65,536 GPUs took it 6 s on this 2-core host, so this bound
#: is a quarter of a minute. The prediction and the cost model need no graph (``simulate`` and
#: ``cost`` answer for a million GPUs in a second).
GRAPH_GPUS = 2**17


def check_graph_budget(plan: Plan) -> None:
    """PlanError (one sentence) when the cluster is past what ``trainplan topology`` builds within seconds."""
    gpus = plan.cluster.gpus
    if gpus > GRAPH_GPUS:
        raise PlanError(f"trainplan topology builds the cluster's graph GPU by GPU, and {gpus:,} GPUs are over the "
                        f"{GRAPH_GPUS:,} it builds within seconds: trainplan simulate and cost answer for this "
                        "cluster without it")

