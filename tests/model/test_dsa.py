"""DeepSeek Sparse Attention (``model.sparse_attention``, ``simcore.model.dsa``): the indexer counted as
transformers builds it, priced as Megatron-Core's DSA runs it in the analytic path, the event engine,
the byte ledger and the collectives list alike, never a gain for nothing, and refused in one sentence
wherever trainplan does not model it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simcore.engine.predict import simulate
from simcore.model import collectives as coll
from simcore.model import compute as cmp
from simcore.model import dsa
from simcore.model import workload as wl
from simcore.model.collective_plan import expected_calls
from simcore.model.comm_ledger import step_bytes
from simcore.model.layer_comm import layer_comm
from simcore.model.memory import layer_params_per_gpu
from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan, hf_config_from_model
from simcore.serving.load import serving_from_dict
from simcore.planner.uncertainty import extrapolation

HF_V3 = Path(__file__).resolve().parents[2] / "examples" / "hf" / "deepseek-v3" / "config.json"
INDEXER = {"topk": 2048, "heads": 64, "head_dim": 128}
#: transformers 5.24.0's DeepseekV32ForCausalLM with DeepSeek-V3's shape (its config defaults) on the
#: meta device: DeepSeek-V3's 671,026,404,352 plus 61 indexers of 13,959,424.
V32_PARAMS = 671_877_929_216


def _plan(seq: int, dsa_on: bool = True, tp: int = 2, pp: int = 2, cp: int = 1, recompute: str = "selective",
          flash: bool = True, **model):
    m = {"name": "dsv3", "hf_config": str(HF_V3), "seq_len": seq, "mtp_layers": 0, "layers": 8, "dense_layers": 1,
         **model}
    if dsa_on:
        m["sparse_attention"] = dict(INDEXER)
    return plan_from_dict({"name": "dsa", "model": m, "cluster": {"node": "dgx-h100", "nodes": 4},
                           "parallel": {"tp": tp, "pp": pp, "dp": 32 // (tp * pp * cp), "cp": cp, "ep": 8 // cp,
                                        "zero": 1, "sequence_parallel": tp > 1, "schedule": "1f1b"},
                           "training": {"global_batch": 32, "micro_batch": 1, "precision": "bf16",
                                        "recompute": recompute, "flash_attention": flash}})


def test_the_indexer_is_counted_as_transformers_builds_it(tmp_path):
    cfg = json.loads(HF_V3.read_text()) | {"model_type": "deepseek_v32", "index_topk": 2048, "index_n_heads": 64,
                                           "index_head_dim": 128}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc, _ = import_plan(hf=str(tmp_path / "config.json"), cluster="dgx-h100", nodes=1)
    model = plan_from_dict(doc).model
    assert model.sparse_attention is not None and model.sparse_attention.topk == 2048
    assert wl.param_counts(model).total == V32_PARAMS
    assert dsa.indexer_params(model) == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64 == 13_959_424


def test_an_exported_hf_config_reads_back_with_its_indexer(tmp_path):
    plan = _plan(4096)
    cfg = hf_config_from_model(plan.model)
    assert (cfg["model_type"], cfg["index_topk"], cfg["index_n_heads"]) == ("deepseek_v32", 2048, 64)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    doc, _ = import_plan(hf=str(tmp_path / "config.json"), cluster="dgx-h100", nodes=1)
    assert plan_from_dict(doc).model.sparse_attention == plan.model.sparse_attention
    assert plan_to_dict(plan)["model"]["sparse_attention"] == INDEXER
    assert "sparse_attention" not in plan_to_dict(_plan(4096, dsa_on=False))["model"]


def test_indexed_layers_mixed_with_dense_ones_are_refused_naming_them(tmp_path):
    cfg = json.loads(HF_V3.read_text()) | {"model_type": "deepseek_v32", "index_topk": 2048,
                                           "layer_types": ["full_attention"] + ["indexed_attention"] * 60}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PlanError, match="layer_types has indexed_attention layers"):
        import_plan(hf=str(tmp_path / "config.json"), cluster="dgx-h100", nodes=1)


@pytest.mark.parametrize("change, field", [
    ({"model": {"sparse_attention": {"topk": 0, "heads": 64, "head_dim": 128}}}, "model.sparse_attention.topk"),
    ({"model": {"sparse_attention": {"topk": 8, "heads": 64, "head_dim": 128, "extra": 1}}},
     "model.sparse_attention.extra"),
    ({"model": {"sparse_attention": {"topk": 8, "heads": 64, "head_dim": 32}}}, "model.sparse_attention.head_dim"),
    ({"parallel": {"cp": 2, "dp": 4, "ep": 4}}, "parallel.cp"),
    ({"training": {"flash_attention": False}}, "training.flash_attention"),
])
def test_bad_input_gets_one_sentence_naming_the_field(change, field):
    doc = plan_to_dict(_plan(4096))
    for section, values in change.items():
        doc[section].update(values)
    with pytest.raises(PlanError) as err:
        plan_from_dict(doc)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_a_model_without_multi_latent_attention_cannot_have_an_indexer():
    with pytest.raises(PlanError, match="needs multi-latent attention"):
        plan_from_dict({"model": {"name": "llama3-8b", "sparse_attention": INDEXER},
                        "cluster": {"node": "dgx-h100", "nodes": 1}, "parallel": {"dp": 8},
                        "training": {"global_batch": 8, "flash_attention": True}})


@pytest.mark.parametrize("seq", [1024, 2048])
@pytest.mark.parametrize("tp, recompute", [(1, "none"), (2, "selective"), (2, "full")])
def test_no_gain_for_nothing_up_to_topk_keys(seq, tp, recompute):
    """While a sequence holds no more than topk keys the sparse kernel reads all of them (twice a causal
    flash kernel's half) and the indexer only adds: DSA is never faster, on either engine."""
    for engine in ("analytic", "des"):
        dense = simulate(_plan(seq, False, tp=tp, recompute=recompute), engine=engine).step_time_s
        sparse = simulate(_plan(seq, True, tp=tp, recompute=recompute), engine=engine).step_time_s
        assert sparse > dense, (engine, sparse, dense)


def test_long_sequences_gain_what_the_skipped_keys_cost_and_the_engines_agree():
    """At 64k tokens a query reads 2,048 keys, not 32k on average: the step is far shorter, yet no shorter
    than the dense step less its whole attention core; the event engine charges what the analytic path does."""
    dense, sparse = _plan(65536, False), _plan(65536, True)
    a_dense, a_sparse = simulate(dense), simulate(sparse)
    assert a_sparse.step_time_s < 0.8 * a_dense.step_time_s
    d_sparse = simulate(sparse, engine="des")
    assert d_sparse.step_time_s == pytest.approx(a_sparse.step_time_s, rel=0.02)
    dev = cmp.device_model(dense.cluster.node.gpu, "bf16")
    ops = wl.layer_forward_ops(dense.model, b=1, s=65536, tp=2, flash=True)
    flash = [op for op in ops if op.name == "flash_attention"]
    core = sum(cmp.op_forward_s(op, dev) + sum(cmp.op_backward_s(op, dev)) for op in flash)
    layers = dense.model.layers // dense.parallel.pp
    assert a_sparse.step_time_s > a_dense.step_time_s - dense.num_microbatches * layers * core * 1.5


def test_each_indexer_kernel_costs_time_and_its_backward_what_its_source_computes():
    plan = _plan(8192)
    dev = cmp.device_model(plan.cluster.node.gpu, "bf16")
    ops = {op.name: op for op in dsa.indexer_ops(plan.model, 1, 8192, 2)}
    assert set(ops) == {"dsa_wq_b", "dsa_wk", "dsa_weights", "dsa_index_scores", "dsa_topk", "dsa_loss_scores"}
    for op in ops.values():
        assert cmp.op_forward_s(op, dev) > 0
    for name in ("dsa_wq_b", "dsa_wk", "dsa_weights"):   # detached input: weight gradients only
        grad_in, grad_w = cmp.op_backward_s(ops[name], dev)
        assert grad_in == 0 and grad_w == pytest.approx(cmp.op_forward_s(ops[name], dev))
    assert cmp.op_backward_s(ops["dsa_topk"], dev) == (0.0, 0.0)
    scores = ops["dsa_index_scores"]   # three products a selected pair against one a causal pair
    ratio = sum(cmp.op_backward_s(scores, dev)) / cmp.op_forward_s(scores, dev)
    assert ratio == pytest.approx(3 * dsa.selected_pairs(plan.model, 8192) / dsa.causal_pairs(8192), rel=0.05)


def test_the_loss_all_reduce_is_charged_listed_and_ledgered_alike():
    sparse, dense = _plan(4096), _plan(4096, False)
    dev = cmp.device_model(sparse.cluster.node.gpu, "bf16")
    nbytes = dsa.loss_all_reduce_bytes(sparse.model, 1, 4096)
    assert nbytes == 4 * 4096 * 2048
    net = coll.group_net(sparse.cluster, dev, 2, 1)
    extra = layer_comm(sparse, dev)["tp_f"] - layer_comm(dense, dev)["tp_f"]
    assert extra == pytest.approx(coll.all_reduce_s(nbytes, net))
    calls = [(c, n) for c, n in expected_calls(sparse, 0).items() if c.issuer == "dsa"]
    layers = sparse.layers_per_stage[0]
    assert calls == [(calls[0][0], sparse.num_microbatches * 2 * layers)] and calls[0][0].bytes == nbytes
    ledger = step_bytes(sparse)["tp", "all_reduce"] - step_bytes(dense)["tp", "all_reduce"]
    assert ledger == pytest.approx(nbytes * 2 * layers * sparse.num_microbatches)


def test_the_indexer_is_whole_on_every_tp_rank():
    sparse, dense = _plan(4096), _plan(4096, False)
    assert layer_params_per_gpu(sparse)[0] - layer_params_per_gpu(dense)[0] == pytest.approx(
        dsa.indexer_params(sparse.model))


@pytest.mark.parametrize("to", ["megatron", "torchtitan", "deepspeed"])
def test_exports_refuse_it_in_one_sentence(to):
    with pytest.raises(ValueError) as err:
        export_plan(_plan(4096), to)
    assert "model.sparse_attention" in str(err.value) and "\n" not in str(err.value)


def test_serving_refuses_it_and_the_interval_says_it_is_extrapolated():
    doc = {"name": "s", "model": {"hf_config": str(HF_V3), "sparse_attention": INDEXER}, "hardware": {"node": "hgx-h200"},
           "parallel": {"tp": 8}, "traffic": {"arrival": "offline", "num_requests": 8, "prompt_len": 128,
                                              "output_len": 16}}
    with pytest.raises(PlanError, match="model.sparse_attention is refused for serving"):
        serving_from_dict(doc)
    factor, line = extrapolation(_plan(4096))
    assert factor > 1 and "DeepSeek Sparse Attention: no published run has it" in line


def test_the_executor_refuses_it():
    from executors.support import check_executable

    with pytest.raises(ValueError, match="model.sparse_attention is priced, not run"):
        check_executable(_plan(4096), "cuda")


@pytest.mark.parametrize("layers", [{"indexer_types": ["full", "shared"] * 30 + ["full"]}, {"index_topk_freq": 2},
                                    {"index_topk_pattern": "FFS" * 20 + "F"}])
def test_layers_that_reuse_an_earlier_top_k_are_refused_naming_the_field(tmp_path, layers):
    cfg = json.loads(HF_V3.read_text()) | {"model_type": "glm_moe_dsa", "index_topk": 2048, **layers}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PlanError, match="indexer_types / index_topk_freq") as err:
        import_plan(hf=str(tmp_path / "config.json"), cluster="dgx-h100", nodes=1)
    assert "\n" not in str(err.value)
