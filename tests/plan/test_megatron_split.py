"""Megatron-LM launches the planner proposes and the functional tests run: the embedding and
the loss counted as layers in the pipeline split (``--account-for-embedding/loss-in-pipeline-split``,
Megatron-Bridge's Llama 3.1 405B and Qwen3-235B recipes), a dense model's expert TP (Megatron
ignores it), and the training scripts whose model a Plan cannot state (found by
bench/golden_values.py over Megatron-LM's functional tests)."""
import pytest

from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import PlanError
from simcore.planner.space import layer_split

LLAMA_405B = ("pretrain_gpt.py --num-layers 126 --hidden-size 16384 --num-attention-heads 128 "
              "--group-query-attention --num-query-groups 8 --ffn-hidden-size 53248 --swiglu "
              "--seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 "
              "--position-embedding-type rope --untie-embeddings-and-output-weights "
              "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 16 --sequence-parallel "
              "--micro-batch-size 1 --global-batch-size 1536 --bf16 --use-distributed-optimizer ")


def _plan(args: str, nodes: int = 32):
    doc, warnings = import_plan(megatron=args, cluster="dgx-h100", nodes=nodes)
    return plan_from_dict(doc), warnings


@pytest.mark.parametrize("vpp", [1, 4])
def test_the_embedding_and_the_loss_count_as_layers(vpp):
    # 126 + 2 = 128 over 16 x vpp virtual stages: the first short of the embedding, the last of the loss
    extra = f"--num-virtual-stages-per-pipeline-rank {vpp} " if vpp > 1 else ""
    plan, _ = _plan(LLAMA_405B + extra + "--account-for-embedding-in-pipeline-split "
                    "--account-for-loss-in-pipeline-split")
    per = 128 // (16 * vpp)
    assert plan.layers_per_stage == (per - 1,) + (per,) * (16 * vpp - 2) + (per - 1,)
    assert plan.layers_per_stage == layer_split(126, 16 * vpp, "ends")   # the search's "ends" split
    assert plan.parallel.schedule.value == ("interleaved-1f1b" if vpp > 1 else "1f1b")


def test_one_of_them_alone_and_what_megatron_refuses():
    plan, _ = _plan(LLAMA_405B.replace("--num-layers 126", "--num-layers 127")
                    + "--account-for-embedding-in-pipeline-split")
    assert plan.layers_per_stage == (7,) + (8,) * 15
    with pytest.raises(PlanError, match="126 layers \\+ 1 do not divide over pipeline-model-parallel-size 16"):
        _plan(LLAMA_405B + "--account-for-loss-in-pipeline-split")
    with pytest.raises(PlanError, match="cannot be set with --account-for"):
        _plan(LLAMA_405B + "--account-for-loss-in-pipeline-split --decoder-first-pipeline-num-layers 6")


def test_a_dense_models_expert_tp_is_ignored_as_megatron_ignores_it():
    plan, _ = _plan(LLAMA_405B + "--expert-tensor-parallel-size 1")
    assert plan.parallel.expert_tp is None or plan.parallel.etp == plan.parallel.tp


@pytest.mark.parametrize("script", ["pretrain_bert.py", "pretrain_t5.py", "pretrain_hybrid.py", "pretrain_vlm.py",
                                    "train_rl.py", "examples/mamba/pretrain_mamba.py"])
def test_scripts_of_other_models_are_refused_in_one_sentence(script):
    with pytest.raises(PlanError, match="does not train a decoder-only transformer"):
        _plan(LLAMA_405B.replace("pretrain_gpt.py", "torchrun --nproc-per-node 8 " + script))


@pytest.mark.parametrize("vpp, flags", [(4, "--account-for-embedding-in-pipeline-split "
                                             "--account-for-loss-in-pipeline-split"),
                                        (1, "--account-for-loss-in-pipeline-split")])
def test_the_export_writes_the_split_back(vpp, flags):
    """The planner's "ends" split (Llama 3 405B interleaved on 16 stages) exports as Megatron's own
    options and imports as the same Plan; before, the export refused every interleaved uneven split."""
    from simcore.plan.writers import export_plan

    extra = f"--num-virtual-stages-per-pipeline-rank {vpp} " if vpp > 1 else ""
    args = LLAMA_405B.replace("--num-layers 126", "--num-layers 127" if vpp == 1 else "--num-layers 126")
    plan, _ = _plan(args + extra + flags)
    text = export_plan(plan, "megatron")
    assert all(f in text for f in flags.split()) and "--decoder-first-pipeline-num-layers" not in text
    again, _ = _plan(text)
    assert again.layers_per_stage == plan.layers_per_stage and again.parallel == plan.parallel


def test_a_layout_megatron_has_no_first_last_option_for_is_written_and_read_as_its_layout():
    """Megatron-LM's --pipeline-model-parallel-layout (pipeline_parallel_layer_layout.py @d98e8a64):
    Meta's interleaved Llama 3 405B (the first chunk the embedding alone, the last the loss alone)
    and Bridge's DeepSeek-V3 shape with an MTP module, written and read back stage for stage."""
    from simcore.plan.megatron_reader import read_layout
    from simcore.plan.writers import megatron_args, megatron_layout

    assert read_layout("Et*4|(t*4|)*14tmL") == ((4,) * 15 + (1,), 1)            # Bridge's own string
    assert megatron_layout((4,) * 15 + (1,), 1) == "Et*4|" + "t*4|" * 14 + "tmL"
    stages = (2,) + (4,) * 31                                                 # 126 over 16 x 2: the first lighter
    plan, _ = _plan(LLAMA_405B + f"--pipeline-model-parallel-layout {megatron_layout(stages)}")
    assert plan.layers_per_stage == stages and plan.parallel.vpp == 2
    args = dict(megatron_args(plan))
    assert args["--pipeline-model-parallel-layout"] == megatron_layout(stages)
    assert "--num-virtual-stages-per-pipeline-rank" not in args            # Megatron: one of the two at most
    with pytest.raises(PlanError, match="pipeline-model-parallel-layout gives 3 stages"):
        _plan(LLAMA_405B + "--pipeline-model-parallel-layout Et*42|t*42|t*42L")
    with pytest.raises(PlanError, match="other than E, t, m, L"):
        _plan(LLAMA_405B + "--pipeline-model-parallel-layout Et*126xL")
