"""Issue 55, item 4: the Megatron-LM options a real launch gives reach the Plan and come back
from the Megatron export: import -> export -> import is the same Plan for every example script
in examples/megatron (NVIDIA's Megatron-FSDP recipes among them: a `uv run` prefix, empty
arrays, an sbatch here-document), for multi-latent attention, expert TP and CPU offloading."""
from pathlib import Path

import pytest

from simcore.plan.interop import import_plan
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.spec import PlanError
from simcore.plan.writers import export_plan
from tests.plan.layouts import ROOT
from tests.plan.test_megatron_args import broken_rules

SCRIPTS = ROOT / "examples" / "megatron"
HF = ROOT / "examples" / "hf"
#: what an example needs beside itself: the DeepSeek tokenizer's vocabulary (--hf), the published nodes
EXTRA = {"train_gpt3_175b_distributed.sh": {"nodes": 16},
         "sbatch_mfsdp_deepseek_v3.sh": {"nodes": 16, "hf": str(HF / "deepseek-v3" / "config.json")}}


def _without_name(plan) -> dict:
    doc = plan_to_dict(plan)
    doc["model"].pop("name", None)
    return {k: v for k, v in doc.items() if k != "name"}


def _round_trip(plan) -> object:
    text = export_plan(plan, "megatron")
    assert broken_rules(text) == []
    doc, _ = import_plan(megatron=text, cluster=plan.cluster.node.name, nodes=plan.cluster.nodes)
    return plan_from_dict(doc)


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_every_example_script_round_trips(script):
    doc, _ = import_plan(megatron=str(SCRIPTS / script), cluster="dgx-h100", **EXTRA.get(script, {}))
    plan = plan_from_dict(doc)
    assert _without_name(_round_trip(plan)) == _without_name(plan)


def test_nvidia_megatron_fsdp_recipes_import():
    doc, warnings = import_plan(megatron=str(SCRIPTS / "train_llama3_8b_fsdp_h100_fp8.sh"), cluster="dgx-h100")
    assert doc["parallel"]["zero"] == 3 and "overlap_param_gather" not in doc["parallel"]
    assert doc["training"]["precision"] == "fp8" and doc["model"]["seq_len"] == 8192
    assert "--overlap-param-gather" not in warnings[0] and "--mock-data" in warnings[0]
    text = (SCRIPTS / "train_llama3_8b_fsdp_h100_fp8.sh").read_text().replace('"--fp8-format hybrid"',
                                                                               '"--fp8-format hybrid" --fp8-param-gather')
    with pytest.raises(PlanError, match="training.fp8_param_gather needs"):
        plan_from_dict(import_plan(megatron=text, cluster="dgx-h100")[0])
    doc, _ = import_plan(megatron=str(SCRIPTS / "sbatch_mfsdp_deepseek_v3.sh"), cluster="dgx-h100",
                         **EXTRA["sbatch_mfsdp_deepseek_v3.sh"])
    m = doc["model"]
    assert (m["q_lora_rank"], m["kv_lora_rank"], m["kv_channels"], m["qk_rope_head_dim"], m["v_head_dim"]) == (
        1536, 512, 128, 64, 128)
    assert doc["parallel"]["ep"] == 8 and doc["training"]["micro_batch"] == 4


def test_mla_expert_tp_and_offload_round_trip():
    mla = plan_from_dict({
        "model": {"hf_config": str(HF / "deepseek-v3" / "config.json"), "seq_len": 4096},
        "cluster": {"node": "dgx-h100", "nodes": 32},
        "parallel": {"tp": 2, "pp": 1, "dp": 128, "ep": 8, "expert_tp": 1, "zero": 1, "sequence_parallel": True},
        "training": {"global_batch": 1024, "recompute": "selective", "flash_attention": True}})
    back = _round_trip(mla)
    assert back.model.mla and back.parallel.expert_tp == 1
    assert _without_name(back) == _without_name(mla)
    offload = plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 8192}, "cluster": {"node": "dgx-h100", "nodes": 1},
                              "parallel": {"tp": 1, "dp": 8, "zero": 1}, "training": {"global_batch": 64,
                                                                                      "activation_offload": 8}})
    back = _round_trip(offload)
    assert back.training.activation_offload == 8 and _without_name(back) == _without_name(offload)


CMD = ("torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 --num-attention-heads 8 "
       "--seq-length 1024 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 8 --bf16 ")


def test_the_options_the_plan_can_state():
    f = read_megatron(CMD + "--padded-vocab-size 32768 --quick-geglu --softmax-type vanilla").fields
    assert f["model.vocab"] == 32768 and f["model.gated_mlp"] is True
    r = read_megatron(CMD + "--multi-latent-attention --softmax-type learnable --cpu-offloading-num-layers 2")
    assert (r.fields["model.kv_lora_rank"], r.fields["model.kv_channels"], r.fields["model.qk_rope_head_dim"],
            r.fields["model.v_head_dim"], r.fields["model.q_lora_rank"]) == (32, 128, 64, 128, None)  # Megatron's
    assert r.fields["training.activation_offload"] == 2 and r.ignored == () and r.fields["model.attention_sinks"]
    assert "--q-lora-rank" in read_megatron(CMD + "--q-lora-rank 64").ignored   # no MLA: ordinary attention
    with pytest.raises(PlanError, match="--group-query-attention"):
        read_megatron(CMD + "--multi-latent-attention --group-query-attention --num-query-groups 2")
    with pytest.raises(PlanError, match="--overlap-param-gather needs --use-distributed-optimizer"):
        read_megatron(CMD + "--overlap-param-gather")


def test_the_commands_seq_length_wins_over_the_hf_default():
    doc, _ = import_plan(hf=str(HF / "llama3-8b" / "config.json"), cluster="dgx-h100",
                         megatron="torchrun --nproc-per-node 8 pretrain_gpt.py --seq-length 2048 --bf16")
    assert doc["model"]["seq_len"] == 2048


@pytest.mark.parametrize("launch", [
    "uv run torchrun --nproc-per-node 8 pretrain_gpt.py $ARGS ${EXTRA_ARGS[@]}",
    'uv run --frozen python -m torch.distributed.run --nproc_per_node 8 pretrain_gpt.py $ARGS "${EXTRA_ARGS[@]}"',
    'bash -c "torchrun --nproc-per-node 8 pretrain_gpt.py $ARGS ${EXTRA_ARGS[@]}" 2>&1 | tee log.txt',
])
def test_launch_forms(launch):
    text = f'EXTRA_ARGS=()\nARGS="--tensor-model-parallel-size 2 --bf16"\n{launch}\n'
    doc, _ = import_plan(megatron=text, hf=str(HF / "llama3-8b" / "config.json"), cluster="dgx-h100")
    assert (doc["parallel"]["tp"], doc["parallel"]["dp"], doc["training"]["precision"]) == (2, 4, "bf16")


def test_moe_layer_freq_as_megatron_reads_it():
    """--moe-layer-freq (arguments.py ``moe_freq_type``, gpt_layer_specs.py @d98e8a64): an integer N
    makes layers 0, N, 2N ... MoE; a list expression is the pattern; a dense prefix is dense_layers."""
    from simcore.plan.megatron_reader import moe_layer_pattern

    assert moe_layer_pattern("2", 4) == [1, 0, 1, 0] and moe_layer_pattern("([1,0]*2)", 4) == [1, 0, 1, 0]
    moe = CMD + "--num-experts 8 --moe-router-topk 2 "
    assert read_megatron(moe + "--moe-layer-freq 2").fields["model.moe_layers"] == [0, 2]
    assert read_megatron(moe + "--moe-layer-freq '([0]*1+[1]*3)'").fields["model.dense_layers"] == 1
    for bad, words in (("__import__('os').getcwd()", "neither an integer nor a list expression"),
                       ("([1]*3)", "gives 3 layers, not --num-layers=4")):
        with pytest.raises(PlanError, match=words):
            read_megatron(moe + f"--moe-layer-freq \"{bad}\"")


def test_interleaved_moe_layers_round_trip():
    """Llama 4 Maverick's alternate MoE layers leave as Megatron's list pattern and come back."""
    plan = plan_from_dict({"model": {"hf_config": str(HF / "llama4-maverick" / "config.json"), "seq_len": 8192},
                           "cluster": {"node": "dgx-h100", "nodes": 16},
                           "parallel": {"tp": 4, "pp": 4, "dp": 8, "ep": 8, "zero": 1, "sequence_parallel": True},
                           "training": {"global_batch": 256, "recompute": "full", "flash_attention": True}})
    back = _round_trip(plan)
    assert back.model.moe_layers == tuple(range(1, 48, 2)) and _without_name(back) == _without_name(plan)


def test_the_vocabulary_is_padded_as_megatron_pads_it():
    """vocab_utils.py ``calculate_padded_vocab_size``: to a multiple of --make-vocab-size-divisible-by
    (128) x TP; --padded-vocab-size is taken as the rows; GPT-2's 50,257 tokens -> 50,304 at TP 1."""
    base = CMD.replace("--vocab-size 32000 ", "")
    assert read_megatron(base + "--vocab-size 50257").fields["model.vocab"] == 50304
    assert read_megatron(base + "--vocab-size 50257 --tensor-model-parallel-size 8").fields["model.vocab"] == 51200
    assert read_megatron(base + "--vocab-size 50257 --make-vocab-size-divisible-by 64").fields["model.vocab"] == 50304
    assert read_megatron(base + "--padded-vocab-size 50257 --tensor-model-parallel-size 8").fields["model.vocab"] == 50257


def test_full_recompute_keeps_its_method_and_layers():
    """--recompute-method and --recompute-num-layers were read and dropped: block recompute of 2
    layers a chunk came back as uniform groups of 1. Megatron's TransformerConfig needs both for
    full recompute and refuses a layer count with selective; so does the import."""
    full = CMD + "--recompute-granularity full --recompute-method block --recompute-num-layers 2 "
    assert read_megatron(full).fields["training.recompute"] == {"layers": 2, "method": "block"}
    plan = plan_from_dict({"model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 2},
                           "parallel": {"tp": 2, "pp": 2, "dp": 4, "zero": 1, "sequence_parallel": True},
                           "training": {"global_batch": 64, "recompute": {"layers": 3, "method": "block"},
                                        "flash_attention": True}})
    back = _round_trip(plan)
    assert (back.training.recompute_layers, back.training.recompute_method.value) == (3, "block")
    for bad, words in (("--recompute-granularity full --recompute-num-layers 2", "needs --recompute-method"),
                       ("--recompute-granularity full --recompute-method uniform", "needs --recompute-num-layers"),
                       ("--recompute-granularity selective --recompute-num-layers 2", "refuses it with selective")):
        with pytest.raises(PlanError, match=words):
            read_megatron(CMD + bad)
