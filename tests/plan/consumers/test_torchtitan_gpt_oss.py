"""The gpt_oss exports (tests/plan/test_torchtitan_gpt_oss.py) against the installed torchtitan 0.3.0: its own
``ConfigManager`` parses each command to the config and layout the Plan says, its meshes build, its own model
checks (``Decoder.Config.update_from_config``) accept it, and the model it builds from the registry on the meta
device has trainplan's parameter count, the routers' biases (one per expert a layer) among them.
``simcore.plan.torchtitan_gpt_oss``'s tables are held to torchtitan's ``gptoss_configs`` and config functions
field by field, and what the export refuses citing torchtitan, torchtitan refuses too."""
from __future__ import annotations

import pytest
import torch

from simcore.model.params import param_counts
from simcore.plan.torchtitan_gpt_oss import CONFIGS, MAX_SEQ_LEN, REGISTRY, ROPE_THETA, WINDOW, YARN
from simcore.plan.writers import export_plan
from tests.plan.consumers.test_torchtitan_qwen3 import _fake_world, parsed_export
from tests.plan.test_torchtitan_gpt_oss import (CONFIG_OF, EXPORTS, PLANS, ROUTER_BIASES, TORCHTITAN_PARAMS,
                                                _plan)


def _registry(name: str, *options: str):
    from torchtitan.config.manager import ConfigManager

    return ConfigManager().parse_args(["--module", "gpt_oss", "--config", name, *options])


def _params(model_config) -> tuple[int, int]:
    """torchtitan's model built from its config on the meta device: its parameters, and of them the
    routers' biases (``layers.N.moe.router.gate.bias``)."""
    with torch.device("meta"):
        model = model_config.build()
    named = list(model.named_parameters())
    return sum(p.numel() for _, p in named), sum(p.numel() for n, p in named if n.endswith("router.gate.bias"))


def _shape(model_config) -> dict:
    """The Plan fields of a torchtitan gpt_oss model config, read from its layers."""
    layer = model_config.layers[0]
    att, moe = layer.attention, layer.moe
    return {"layers": len(model_config.layers), "hidden": model_config.dim, "heads": att.n_heads,
            "kv_heads": att.n_kv_heads, "head_dim": att.head_dim,
            "ffn_hidden": moe.routed_experts.inner_experts.hidden_dim, "vocab": model_config.vocab_size,
            "tied_embeddings": model_config.enable_weight_tying,
            "experts": moe.num_experts, "top_k": moe.router.top_k}


def _check_block(i: int, layer) -> None:
    """One layer as torchtitan_gpt_oss's docstring says both configs build it."""
    att, moe = layer.attention, layer.moe
    assert type(layer.attention_norm).__qualname__ == type(layer.ffn_norm).__qualname__ == "RMSNorm.Config"
    assert att.qkv_linear.wqkv.bias and att.wo.bias   # the sinks are a parameter of Attention itself (model.py)
    assert att.sliding_window_size == (WINDOW if i % 2 == 0 else None)
    assert type(att.inner_attention).__qualname__ == "VarlenAttention.Config"
    assert att.inner_attention.window_size == ((WINDOW - 1, 0) if i % 2 == 0 else (-1, 0))
    rope = att.rope
    assert (rope.theta, rope.max_seq_len, rope.scaling) == (ROPE_THETA, MAX_SEQ_LEN, "yarn")
    assert {k: getattr(rope, k) for k in YARN} == YARN
    assert moe.shared_experts is None and moe.router.gate.bias and moe.load_balance_coeff == 1e-3
    assert (moe.router.score_func, moe.router.route_norm) == ("softmax", True)
    experts = moe.routed_experts.inner_experts
    assert type(experts).__qualname__ == "GptOssGroupedExperts.Config" and experts.swiglu_limit == 7.0
    assert type(moe.routed_experts.token_dispatcher).__qualname__ == "AllToAllTokenDispatcher.Config"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_tables_are_torchtitan_s_registry(name):
    cfg = _registry(name)
    spec, model = cfg.model_spec, cfg.model_spec.model
    assert (spec.name, spec.flavor) == ("gpt_oss", CONFIGS[name]["flavor"])
    assert _shape(model) == {k: v for k, v in CONFIGS[name].items() if k != "flavor"}
    assert not model.lm_head.bias
    for i, layer in enumerate(model.layers):
        _check_block(i, layer)
    sections = REGISTRY[name]["sections"]
    assert {k: getattr(cfg.training, k) for k in sections["training"]} == sections["training"]
    assert cfg.parallelism.expert_parallel_degree == sections["parallelism"]["expert_parallel_degree"]
    assert type(cfg.activation_checkpoint).__qualname__ == "FullAC.Config"
    total, router_biases = _params(model)
    assert (total, router_biases) == (TORCHTITAN_PARAMS[name], ROUTER_BIASES[name])


@pytest.mark.parametrize("name", sorted(PLANS))
def test_torchtitan_parses_builds_and_counts_each_export(name):
    cfg = parsed_export(PLANS[name], EXPORTS[name], "gpt_oss", CONFIGS[CONFIG_OF[name]]["flavor"])
    assert _params(cfg.model_spec.model)[0] == param_counts(PLANS[name].model).total


def test_torchtitan_refuses_the_sequence_the_export_refuses():
    cfg = _registry("gpt_oss_20b", "--training.seq-len", str(2 * MAX_SEQ_LEN))
    with pytest.raises(ValueError, match="exceeds attention RoPE maximum"):
        cfg.model_spec.model.update_from_config(config=cfg)
    plan = _plan("gpt-oss-20b", 1, {"dp": 8, "zero": 3}, seq_len=2 * MAX_SEQ_LEN)
    with pytest.raises(ValueError, match=r"^model\.seq_len=262144 has no torchtitan option: .*decoder\.py\)$"):
        export_plan(plan, "torchtitan")


def test_torchtitan_has_no_context_parallel_for_the_attention_the_export_refuses_it_for():
    """gpt_oss_20b's attention is varlen; parallelize_gptoss hands it to apply_cp_to_forward under CP."""
    from torchtitan.distributed.context_parallel.api import apply_cp_to_forward

    cfg = _registry("gpt_oss_20b")
    inner = [layer.attention.inner_attention.build() for layer in cfg.model_spec.model.layers]
    with pytest.raises(NotImplementedError, match="Variable-length attention CP is not yet supported"):
        apply_cp_to_forward(inner, cp_mesh=None)
    plan = _plan("gpt-oss-20b", 1, {"dp": 4, "cp": 2, "cp_comm": "all_gather", "zero": 3})
    with pytest.raises(ValueError, match=r"^parallel\.cp=2 has no torchtitan option: .*api\.py apply_cp_to_forward\)$"):
        export_plan(plan, "torchtitan")


def test_torchtitan_cannot_lay_out_the_experts_the_export_refuses():
    """Expert parallel over ZeRO-0's data parallel: dp_shard 1 leaves EP no ranks to borrow (parallel.ep)."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    cfg = _registry("gpt_oss_20b", "--parallelism.data-parallel-replicate-degree", "8", "--parallelism.data-"
                    "parallel-shard-degree", "1", "--parallelism.expert-parallel-degree", "4",
                    "--training.disable-cuda-graphs")
    with _fake_world(8), pytest.raises(ValueError, match="mesh_sizes"):
        ParallelDims.from_config(cfg.parallelism, world_size=8).build_mesh()
    plan = _plan("gpt-oss-20b", 1, {"dp": 8, "ep": 4, "zero": 0})
    with pytest.raises(ValueError, match=r"^parallel\.ep=4 has no torchtitan option: .*shard_degree 1\)$"):
        export_plan(plan, "torchtitan")
