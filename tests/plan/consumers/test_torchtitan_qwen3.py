"""The qwen3 exports (tests/plan/test_torchtitan_qwen3.py) against the installed torchtitan 0.3.0: its own
``ConfigManager`` parses each command to the config and layout the Plan says, its own model checks
(``Decoder.Config.update_from_config``: TP divides the heads, no tying under PP, the RoPE's length) accept
it, and the model it builds from the registry on the meta device has trainplan's parameter count.
``simcore.plan.torchtitan_qwen3.CONFIGS`` is held to torchtitan's ``qwen3_configs`` field by field, and
what the export refuses citing torchtitan, torchtitan refuses too."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist

from simcore.model.params import param_counts
from simcore.plan.torchtitan_qwen3 import CONFIGS, MAX_SEQ_LEN, ROPE_THETA
from simcore.plan.writers import export_plan
from tests.plan.consumers.test_consumers import _torchtitan_parse, _torchtitan_stages
from tests.plan.test_torchtitan_qwen3 import CONFIG_OF, EXPORTS, PLANS, TORCHTITAN_PARAMS, _plan


@contextlib.contextmanager
def _fake_world(size: int):
    """A process group of ``size`` ranks on torch's fake backend, on which torchtitan builds its device mesh
    here (a mesh that cannot be unflattened from the world raises as on the GPUs)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _registry(name: str, *options: str):
    from torchtitan.config.manager import ConfigManager

    return ConfigManager().parse_args(["--module", "qwen3", "--config", name, *options])


def _params(model_config) -> int:
    """torchtitan's model built from its config on the meta device, its parameters counted once each
    (a tied embedding is the output's weight)."""
    with torch.device("meta"):
        model = model_config.build()
    return sum(p.numel() for p in model.parameters())


def _shape(model_config) -> dict:
    """The Plan fields of a torchtitan qwen3 model config, read from its layers."""
    layer = model_config.layers[0]
    att, moe = layer.attention, layer.moe
    width = moe.routed_experts.inner_experts.hidden_dim if moe is not None else layer.feed_forward.w1.out_features
    return {"layers": len(model_config.layers), "hidden": model_config.dim, "heads": att.n_heads,
            "kv_heads": att.n_kv_heads, "head_dim": att.head_dim, "ffn_hidden": width,
            "vocab": model_config.vocab_size, "tied_embeddings": model_config.enable_weight_tying,
            "experts": moe.num_experts if moe is not None else 0, "top_k": moe.router.top_k if moe is not None else 0}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_table_is_torchtitan_s_registry(name):
    cfg = _registry(name)
    spec, model = cfg.model_spec, cfg.model_spec.model
    assert (spec.name, spec.flavor) == ("qwen3", CONFIGS[name]["flavor"])
    assert _shape(model) == {k: v for k, v in CONFIGS[name].items() if k != "flavor"}
    for layer in model.layers:   # the block every config builds (torchtitan_qwen3's docstring)
        att = layer.attention
        assert type(layer.attention_norm).__qualname__ == type(layer.ffn_norm).__qualname__ == "RMSNorm.Config"
        assert type(att.qk_norm).__qualname__ == "RMSNorm.Config" and att.qk_norm.normalized_shape == att.head_dim
        assert not att.qkv_linear.wqkv.bias and not att.wo.bias
        assert (att.rope.theta, att.rope.max_seq_len) == (ROPE_THETA, MAX_SEQ_LEN)
        if layer.moe is None:
            assert type(layer.feed_forward).__qualname__ == "FeedForward.Config"   # w2(silu(w1 x) * w3 x)
            assert not any(w.bias for w in (layer.feed_forward.w1, layer.feed_forward.w2, layer.feed_forward.w3))
        else:
            assert layer.moe.shared_experts is None and not layer.moe.router.gate.bias
            assert type(layer.moe.routed_experts.token_dispatcher).__qualname__ == "AllToAllTokenDispatcher.Config"
    assert _params(model) == TORCHTITAN_PARAMS[name]


def parsed_export(plan, export: str, module: str, flavor: str):
    """torchtitan's config of ``export`` (a command trainplan wrote for ``plan``), held to the Plan: the
    module and flavor, the parallel degrees and the meshes they build (the experts' among them), batch,
    sequence, compile, routing, checkpointing and stages, and torchtitan's own checks of the model."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    cfg = _torchtitan_parse(export)
    assert (cfg.model_spec.name, cfg.model_spec.flavor) == (module, flavor)
    par = plan.parallel
    dims = ParallelDims.from_config(cfg.parallelism, world_size=par.gpus)   # validates the product
    assert (dims.tp, dims.pp, dims.cp, dims.ep) == (par.tp, par.pp, par.cp, par.ep)
    assert dims.dp_replicate * dims.dp_shard == par.dp
    with _fake_world(par.gpus):   # the meshes torchtitan builds, the experts' (pp, dp_replicate, efsdp, ep) among them
        dims.build_mesh()
        if par.ep > 1:
            assert dims.get_mesh("ep").size() == par.ep
            assert dims.get_mesh("efsdp").size() == dims.dp_shard * dims.cp * dims.tp // par.ep
    assert cfg.training.seq_len == plan.model.seq_len and cfg.training.global_batch_size == plan.training.global_batch
    assert cfg.compile.enable == (plan.training.kernels.value == "fused")
    assert cfg.debug.moe_force_load_balance == (plan.training.moe_routing.value == "round_robin")
    assert plan.training.recompute.value.split("-")[0] in type(cfg.activation_checkpoint).__qualname__.lower()
    if par.pp > 1:
        assert _torchtitan_stages(cfg, plan) == list(plan.layers_per_stage)
    cfg.model_spec.model.update_from_config(config=cfg)   # torchtitan's own checks of the model and layout
    return cfg


@pytest.mark.parametrize("name", sorted(PLANS))
def test_torchtitan_parses_builds_and_counts_each_export(name):
    cfg = parsed_export(PLANS[name], EXPORTS[name], "qwen3", CONFIGS[CONFIG_OF[name]]["flavor"])
    assert _params(cfg.model_spec.model) == param_counts(PLANS[name].model).total


@pytest.mark.parametrize("options, error, plan", [
    (["--parallelism.pipeline-parallel-degree", "2", "--training.disable-cuda-graphs"],
     (NotImplementedError, "Weight tying is not supported with Pipeline Parallel"),
     lambda: _plan("qwen3-1.7b", 1, {"pp": 2, "dp": 4, "zero": 0})),
    (["--training.seq-len", "65536"], (ValueError, "exceeds attention RoPE maximum"),
     lambda: _plan("qwen3-1.7b", 1, {"dp": 8, "zero": 3}, seq_len=65536)),
])
def test_torchtitan_refuses_what_the_export_refuses(options, error, plan):
    cfg = _registry("qwen3_1_7b", *options)
    with pytest.raises(error[0], match=error[1]):
        cfg.model_spec.model.update_from_config(config=cfg)
    with pytest.raises(ValueError, match=r"has no torchtitan option: .*torchtitan/models/common/decoder\.py\)$"):
        export_plan(plan(), "torchtitan")


def test_torchtitan_cannot_lay_out_the_experts_the_export_refuses():
    """Expert parallel over ZeRO-0's data parallel: dp_shard 1 leaves EP no ranks to borrow (parallel.ep)."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    cfg = _registry("qwen3_30b_a3b", "--parallelism.data-parallel-replicate-degree", "8", "--parallelism.data-"
                    "parallel-shard-degree", "1", "--parallelism.expert-parallel-degree", "4",
                    "--training.disable-cuda-graphs")
    with _fake_world(8), pytest.raises(ValueError, match="mesh_sizes"):
        ParallelDims.from_config(cfg.parallelism, world_size=8).build_mesh()
    plan = _plan("qwen3-30b-a3b", 1, {"dp": 8, "ep": 4, "zero": 0})
    with pytest.raises(ValueError, match=r"^parallel\.ep=4 has no torchtitan option: .*shard_degree 1\)$"):
        export_plan(plan, "torchtitan")
