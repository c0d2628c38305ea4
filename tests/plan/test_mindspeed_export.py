"""``trainplan export --to mindspeed``: a plan on Ascend NPUs as MindSpeed-LLM's launch. Every export
parses with the options MindSpeed-LLM's pretrain_gpt.py accepts (Megatron-LM core_v0.12.1's,
MindSpeed's and MindSpeed-LLM's: simcore/plan/mindspeed_args.yaml, each read at its commit; none is
installable here, so the parser is rebuilt from the data) and says back the plan's layout; what
MindSpeed-LLM cannot run is one sentence."""
import argparse

import pytest
import yaml

from simcore.plan.load import plan_from_dict
from simcore.plan.megatron_reader import split_command
from simcore.plan.mindspeed_writer import ARGS_FILE, CP_ALGO
from simcore.plan.writers import export_plan
from tests.plan.test_megatron_args import options_parser

DATA = yaml.safe_load(ARGS_FILE.read_text())
#: Megatron-LM core_v0.12.1's options, then MindSpeed's and MindSpeed-LLM's.
PARSER = options_parser(DATA["megatron"]["options"], DATA["mindspeed"]["options"])


def _plan(parallel: dict, training: dict | None = None, model: str = "llama3-8b"):
    return plan_from_dict({"name": "asc", "model": {"name": model}, "cluster": {"node": "atlas-800t-a2", "nodes": 1},
                           "parallel": parallel, "training": {"global_batch": 32, **(training or {})}})


PLANS = {
    "tp2-dp4": _plan({"tp": 2, "dp": 4}),
    "tp8-sp": _plan({"tp": 8, "sequence_parallel": True}),
    "pp2-tp2-dp2-interleaved": _plan({"tp": 2, "pp": 2, "dp": 2, "vpp": 2, "schedule": "interleaved-1f1b"}),
    "zero1-flash-full-recompute": _plan({"dp": 8, "zero": 1}, {"flash_attention": True, "recompute": "full"}),
    "cp2-ring": _plan({"tp": 2, "cp": 2, "dp": 2, "cp_comm": "p2p"}, {"flash_attention": True}),
    "cp2-all-gather": _plan({"tp": 2, "cp": 2, "dp": 2, "cp_comm": "all_gather"}, {"flash_attention": True}),
    "cp4-ulysses": _plan({"cp": 4, "dp": 2, "cp_comm": "a2a"}, {"flash_attention": True}),
    "mixtral-ep": _plan({"tp": 1, "dp": 8, "ep": 8, "zero": 1}, model="mixtral-8x7b"),
    "tp8-sp-mc2": _plan({"tp": 8, "sequence_parallel": True, "tp_comm_overlap": True}),
}


def _parse(text: str) -> tuple[argparse.Namespace, dict, dict]:
    pre, env, opts = split_command(text)
    tokens = [t for name, values in opts.items() for t in [name, *values]]
    try:
        return PARSER.parse_args(tokens), env, pre
    except (argparse.ArgumentError, SystemExit) as exc:
        raise AssertionError(f"MindSpeed-LLM's parser refuses the export: {exc}") from None


@pytest.mark.parametrize("name", list(PLANS))
def test_every_export_parses_with_mindspeed_llm_s_options_and_says_the_layout(name):
    plan = PLANS[name]
    args, env, pre = _parse(export_plan(plan, "mindspeed"))
    par, tr = plan.parallel, plan.training
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size) == (par.tp, par.pp)
    assert (args.context_parallel_size if par.cp > 1 else 1) == par.cp
    assert (args.micro_batch_size, args.global_batch_size) == (tr.micro_batch, tr.global_batch)
    assert int(pre["--nnodes"]) * int(pre["--nproc-per-node"]) == par.gpus
    assert args.use_mcore_models and args.no_gradient_accumulation_fusion and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert args.attention_backend is None   # newer Megatron-LM's: MindSpeed's fused attention is --use-flash-attn
    assert args.use_flash_attn == tr.flash_attention
    m = plan.model
    assert (args.use_fused_rmsnorm, args.use_fused_swiglu, args.use_fused_rotary_pos_emb) == (
        m.norm.value == "rmsnorm", m.activation.value == "swiglu", m.position_embedding.value == "rope")
    assert args.context_parallel_algo == (CP_ALGO[par.cp_comm] if par.cp > 1 else None)
    assert args.use_distributed_optimizer == (par.zero == 1)
    assert (args.expert_model_parallel_size or 1) == par.ep
    # TP's overlap as MindSpeed runs it: MC2, never Megatron's userbuffers (MindSpeed turns those off)
    assert args.use_ascend_mc2 == par.tp_comm_overlap and not args.tp_comm_overlap


def test_mc2_is_said_to_need_mindspeed_llm_s_switch_and_refused_on_a_moe_model():
    text = export_plan(PLANS["tp8-sp-mc2"], "mindspeed")
    assert "--use-ascend-mc2" in text and "--tp-comm-overlap" not in text
    assert "# --use-ascend-mc2 (the plan's TP overlap): MindSpeed-LLM runs MC2 only once" in text
    assert "MindSpeed-LLM runs MC2" not in export_plan(PLANS["tp8-sp"], "mindspeed")
    moe = _plan({"tp": 2, "dp": 4, "ep": 4, "sequence_parallel": True, "tp_comm_overlap": True}, model="mixtral-8x7b")
    with pytest.raises(ValueError, match=r"^parallel.tp_comm_overlap on a MoE model: MindSpeed's MC2 "
                                         r"\(--use-ascend-mc2\) leaves a MoE model's MLP out"):
        export_plan(moe, "mindspeed")


def test_a_mindspeed_launch_s_tp_overlap_is_mc2_not_megatron_s():
    from simcore.plan.interop import import_plan

    text = export_plan(PLANS["tp8-sp-mc2"], "mindspeed")
    for flag in ("--use-ascend-mc2", "--use-mc2"):   # the option and the one it replaced (deprecated_args.py)
        doc, _ = import_plan(megatron=text.replace("--use-ascend-mc2", flag), cluster="atlas-800t-a2")
        assert plan_from_dict(doc).parallel.tp_comm_overlap
    doc, warnings = import_plan(megatron=text.replace("--use-ascend-mc2", "--tp-comm-overlap"), cluster="atlas-800t-a2")
    assert not plan_from_dict(doc).parallel.tp_comm_overlap
    assert any("--tp-comm-overlap read as off: MindSpeed turns Megatron's off" in w for w in warnings)


def test_a_gpu_plan_or_an_option_mindspeed_lacks_is_one_sentence():
    gpu = plan_from_dict({"model": {"name": "llama3-8b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
                          "parallel": {"dp": 8}, "training": {"global_batch": 32}})
    with pytest.raises(ValueError, match=r"^cluster.node=dgx-h100 is not an Ascend NPU: MindSpeed-LLM runs on Ascend "
                                         r"\(export --to megatron for GPUs\)$"):
        export_plan(gpu, "mindspeed")
    fsdp = _plan({"dp": 8, "zero": 3})   # Megatron-FSDP: newer Megatron-LM's --use-megatron-fsdp
    with pytest.raises(ValueError, match=r"^the plan needs Megatron-LM's --use-megatron-fsdp, which neither Megatron-LM "
                                         r"core_v0.12.1 nor MindSpeed nor MindSpeed-LLM defines"):
        export_plan(fsdp, "mindspeed")
    with pytest.raises(ValueError, match=r"^training.kernels=eager has no Megatron-LM option: its layers run fused"):
        export_plan(_plan({"tp": 2, "dp": 4}, {"kernels": "eager"}), "mindspeed")


def test_the_option_data_names_its_sources():
    assert DATA["megatron"]["ref"] == "core_v0.12.1" and len(DATA["megatron"]["commit"]) == 40
    assert all("@" in s for s in DATA["mindspeed"]["sources"])
    # the options this writer adds, each defined where the module docstring says
    for option in ("--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb", "--context-parallel-algo",
                   "--padded-vocab-size"):
        assert option in DATA["mindspeed"]["options"]
    for option in ("--use-mcore-models", "--use-flash-attn", "--no-gradient-accumulation-fusion"):
        assert option in DATA["megatron"]["options"]


@pytest.mark.parametrize("name", list(PLANS))
def test_a_mindspeed_launch_reads_back_as_the_plan(name):
    """`trainplan import --megatron` on the export: MindSpeed's attention and context-parallel options read as
    MindSpeed means them (no --use-flash-attn: the unfused softmax, where Megatron-LM alone defaults to flash),
    the fused-kernel switches its launches set not reported as unmapped."""
    from simcore.plan.interop import import_plan
    from simcore.plan.load import plan_to_dict

    plan = PLANS[name]
    doc, warnings = import_plan(megatron=export_plan(plan, "mindspeed"), cluster="atlas-800t-a2")
    got, want = plan_to_dict(plan_from_dict(doc)), plan_to_dict(plan)
    for doc_ in (got, want):
        doc_["model"].pop("name", None)
    for section in ("model", "parallel", "training"):   # every field but the model's name
        assert got[section] == want[section], section
    assert not any("not mapped" in w and "--use-fused" in w for w in warnings), warnings
    assert any("MindSpeed-LLM launch" in w for w in warnings)


def test_an_unknown_context_parallel_algorithm_is_one_sentence():
    from simcore.plan.interop import import_plan
    from simcore.plan.spec import PlanError

    text = export_plan(PLANS["cp2-ring"], "mindspeed").replace("megatron_cp_algo", "hybrid_cp_algo")
    with pytest.raises(PlanError, match=r"^megatron --context-parallel-algo='hybrid_cp_algo' \(MindSpeed\) is not one "
                                        r"of megatron_cp_algo, kvallgather_cp_algo, ulysses_cp_algo \(parallel.cp_comm\)$"):
        import_plan(megatron=text, cluster="atlas-800t-a2")


def test_a_megatron_launch_is_not_read_as_mindspeed_s():
    """Options newer Megatron-LM shares with MindSpeed-LLM (--padded-vocab-size) do not make a Megatron-LM launch
    MindSpeed's: without --attention-backend it keeps Megatron-LM's default, Transformer Engine's flash kernel."""
    from simcore.plan.interop import import_plan

    text = ("torchrun pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
            "--max-position-embeddings 128 --padded-vocab-size 256 --micro-batch-size 1 --global-batch-size 8 --bf16")
    doc, warnings = import_plan(megatron=text, cluster="dgx-h100")
    assert plan_from_dict(doc).training.flash_attention and not any("MindSpeed" in w for w in warnings)
