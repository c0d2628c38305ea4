"""The search space of a model with Gated DeltaNet layers proposes only what its rules accept."""
from pathlib import Path

from simcore.plan.hf_config import model_section
from simcore.plan.rules import check_plan
from simcore.plan.spec import PlanError
from simcore.planner.space import base_plan, derive_space, families

QWEN3_NEXT = Path(__file__).resolve().parents[2] / "examples" / "hf" / "qwen3-next-80b-a3b" / "config.json"


def test_no_context_parallel_and_tp_dividing_the_linear_heads():
    model = {**model_section(str(QWEN3_NEXT)), "seq_len": 4096}
    base = base_plan(model, {"node": "dgx-h100", "nodes": 8}, 512, {"flash_attention": True})
    la = base.model.linear_attention
    space = derive_space(base)
    assert space.cp == (1,)
    assert all(la.num_key_heads % t == 0 and la.num_value_heads % t == 0 for t in space.tp)
    rules = ("Gated DeltaNet", "linear_attention")
    for lay in families(base, space, base.cluster.gpus)[::50]:
        try:
            check_plan(lay.apply(base))
        except PlanError as exc:
            assert not any(w in str(exc) for w in rules), (lay.label(), str(exc))
