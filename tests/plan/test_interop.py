"""Import from and export to the training stacks (simcore/plan/interop.py, readers.py, exporters.py).

Golden files live in tests/golden/<plan>.<target>; regenerate them after a deliberate
change with TRAINPLAN_UPDATE_GOLDEN=1 (and read the diff).
"""
import json
import os
import re
import shlex
import tomllib
from pathlib import Path

import pytest

from simcore.plan import megatron_reader, torchtitan_reader
from simcore.plan.writers import export_plan, hf_config_from_model
from simcore.plan.interop import import_plan
from simcore.plan.megatron_reader import read_megatron
from simcore.plan.readers import load_tool_options
from simcore.plan.load import load_plan, plan_from_dict, plan_to_dict
from simcore.engine.predict import simulate
from simcore.plan.spec import PlanError

from tests.plan.layouts import ALL, PLANS, ROOT, VARIANTS

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
EXAMPLES = ROOT / "examples"
TARGETS = ("megatron", "deepspeed", "torchtitan", "torchtitan-0.2", "slurm", "slurm-trainplan", "maxtext")
SUFFIX = {"megatron": "sh", "slurm": "sbatch", "deepspeed": "json", "torchtitan": "torchtitan.sh",
          "torchtitan-0.2": "toml", "slurm-trainplan": "trainplan.sbatch", "maxtext": "maxtext.sh"}


def _export_or_refusal(plan, target):
    try:
        return export_plan(plan, target), None
    except ValueError as exc:
        return None, str(exc)


# --------------------------------------------------------------------------- option names

def _megatron_script_options(text: str) -> tuple[list, list, list]:
    """(sbatch options, launcher options, pretrain_gpt.py options) of an exported script."""
    sbatch = [ln.split()[1].split("=")[0] for ln in text.splitlines() if ln.startswith("#SBATCH")]
    line = next(ln for ln in megatron_reader._logical_lines(text) if "pretrain_gpt.py" in ln or "executors.launch" in ln)
    tokens = shlex.split(line)
    cut = tokens.index("pretrain_gpt.py") if "pretrain_gpt.py" in tokens else tokens.index("-m")
    launch = [t for t in tokens[:cut] if t.startswith("--")]
    return sbatch, launch, [t for t in tokens[cut + 1:] if t.startswith("--")]


def undefined_options(text: str, target: str) -> list[str]:
    """Every option name in an export that the tool does not define (tool_options.yaml)."""
    known = load_tool_options()
    if target == "maxtext":   # key=value overrides after MaxText's base.yml
        keys = [a.split("=", 1)[0] for a in shlex.split(text, comments=True) if "=" in a]
        return [k for k in keys if k not in known["maxtext"]["options"]]
    if target == "slurm-trainplan":
        sbatch, launch, _ = _megatron_script_options(text)
        return [o for o in launch if o not in known["torchrun"]["options"]] + [
            o for o in sbatch if o not in known["sbatch"]["options"]]
    if target in ("megatron", "slurm"):
        sbatch, launch, opts = _megatron_script_options(text)
        bad = [o for o in opts if o not in known["megatron"]["options"]]
        bad += [o for o in launch if o not in known["torchrun"]["options"]]
        return bad + [o for o in sbatch if o not in known["sbatch"]["options"]]
    if target == "deepspeed":
        cfg = json.loads(text)  # plain JSON, as json.load and the HF Trainer need
        ds = known["deepspeed"]
        bad = [k for k in cfg if k not in ds["top"]]
        bad += [f"zero_optimization.{k}" for k in cfg.get("zero_optimization", {}) if k not in ds["zero_optimization"]]
        for sub in ("offload_optimizer", "offload_param"):
            bad += [f"{sub}.{k}" for k in cfg.get("zero_optimization", {}).get(sub, {}) if k not in ds[sub]]
        bad += [f"optimizer.{k}" for k in cfg.get("optimizer", {}) if k not in ds["optimizer"]]
        bad += [f"optimizer.params.{k}" for k in cfg.get("optimizer", {}).get("params", {})
                if k not in ds["optimizer_params"]]
        kind = cfg.get("optimizer", {}).get("type")
        return bad + ([f"optimizer.type={kind}"] if kind and kind.lower() not in ds["optimizer_types"] else [])
    cfg = torchtitan_reader._torchtitan_command(text) if target == "torchtitan" else tomllib.loads(text)
    cfg.pop("model", None) if target == "torchtitan" else None  # --module/--config: checked by torchtitan itself
    tt = known["torchtitan"]
    extra = known["torchtitan_0_3"]["sections"] if target == "torchtitan" else {}
    bad = [f"{s}.{k}" for s, opts in cfg.items() for k in opts
           if k not in tt["sections"].get(s, []) + extra.get(s, [])]
    for key, choices in tt["choices"].items():
        section, name = key.split(".")
        if name in cfg.get(section, {}) and cfg[section][name] not in choices:
            bad.append(f"{key}={cfg[section][name]}")
    schedule = cfg.get("parallelism", {}).get("pipeline_parallel_schedule")
    return bad + ([f"schedule={schedule}"] if schedule and schedule not in tt["pipeline_schedules"] else [])


#: (plan, target) pairs the target can hold; the others are refusals, checked by the golden files.
EXPORTABLE = [(n, t) for n in sorted(ALL) for t in TARGETS if _export_or_refusal(ALL[n], t)[0] is not None]


@pytest.mark.parametrize("name, target", EXPORTABLE)
def test_every_exported_option_is_one_the_tool_defines(name, target):
    text, _ = _export_or_refusal(ALL[name], target)
    assert undefined_options(text, target) == []


def test_the_option_check_catches_a_misspelt_option():
    text = export_plan(ALL["gpt3-175b-a100"], "megatron").replace("--tensor-model-parallel-size",
                                                                  "--tensor-model-paralel-size")
    assert undefined_options(text, "megatron") == ["--tensor-model-paralel-size"]
    ds = export_plan(ALL["v-ds-zero3-paramoffload"], "deepspeed").replace('"stage"', '"stages"')
    assert undefined_options(ds, "deepspeed") == ["zero_optimization.stages"]
    tt = export_plan(ALL["llama3-8b-fsdp-h100"], "torchtitan-0.2").replace("data_parallel_shard_degree",
                                                                           "data_parallel_shard_dgree")
    assert undefined_options(tt, "torchtitan-0.2") == ["parallelism.data_parallel_shard_dgree"]
    tt = export_plan(ALL["llama3-8b-fsdp-h100"], "torchtitan").replace("data-parallel-shard-degree",
                                                                       "data-parallel-shard-dgree")
    assert undefined_options(tt, "torchtitan") == ["parallelism.data_parallel_shard_dgree"]


def test_tool_options_name_their_sources():
    known = load_tool_options()
    assert re.fullmatch(r"[0-9a-f]{40}", known["megatron"]["source"]["commit"])
    assert re.fullmatch(r"[0-9a-f]{40}", known["torchtitan"]["source"]["commit"])
    assert re.fullmatch(r"[0-9a-f]{40}", known["maxtext"]["source"]["commit"])
    assert all(re.fullmatch(r"[0-9a-f]{40}", f["commit"]) for f in known["deepspeed"]["source"]["files"])


# --------------------------------------------------------------------------- golden files

@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("target", TARGETS)
def test_export_matches_golden_file(name, target):
    text, refusal = _export_or_refusal(ALL[name], target)
    out = text if text is not None else f"REFUSED: {refusal}\n"
    path = GOLDEN / f"{name}.{SUFFIX[target]}"
    if os.environ.get("TRAINPLAN_UPDATE_GOLDEN"):
        path.write_text(out)
    if not path.exists():
        pytest.fail(f"no golden file {path.name}; write it with TRAINPLAN_UPDATE_GOLDEN=1 and review the diff")
    assert out == path.read_text()


def test_exports_cite_the_tool_version():
    plan = ALL["llama3-8b-fsdp-h100"]
    assert "commit d98e8a64" in export_plan(plan, "megatron")
    assert "commit 6404b932" in export_plan(plan, "torchtitan-0.2") and "0.3.0" in export_plan(plan, "torchtitan")
    ds = ALL["v-ds-zero3-paramoffload"]
    assert json.loads(export_plan(ds, "deepspeed"))  # plain JSON: the source goes to stderr
    from simcore.plan.writers import export_with_notes
    assert "088be892" in export_with_notes(ds, "deepspeed")[1][0]


# --------------------------------------------------------------------------- round trips

def _hf_dir(tmp_path: Path, plan) -> str:
    d = tmp_path / plan.model.name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(hf_config_from_model(plan.model)))
    return str(d / "config.json")


def _held(doc: dict, target: str) -> dict:
    """The part of a Plan document that a format (with the inputs a user adds) holds."""
    cluster = {k: doc["cluster"][k] for k in ("node", "nodes", "gpus_per_node")}
    if target in ("deepspeed", "torchtitan", "torchtitan-0.2"):  # the user gives the cluster
        del cluster["gpus_per_node"]
    if target in ("megatron", "slurm"):
        model = {k: v for k, v in doc["model"].items() if k != "name"}
        return {"model": model, "cluster": cluster, "parallel": doc["parallel"], "training": doc["training"]}
    if target == "deepspeed":
        keys = ("global_batch", "micro_batch", "precision", "offload", "optimizer", "grad_compression")
        return {"model": doc["model"], "cluster": cluster,
                "parallel": {"dp": doc["parallel"]["dp"], "zero": doc["parallel"]["zero"]},
                "training": {k: doc["training"][k] for k in keys}}
    # torchtitan's config names no attention kernel: SDPA picks it, and the import says which it runs
    training = {k: v for k, v in doc["training"].items()
                if k not in ("flash_attention", "grad_compression", "attention_kernel")}
    name = doc.get("name") if target == "torchtitan-0.2" else None  # 0.3's config has no job description
    return {"name": name, "model": doc["model"], "cluster": cluster, "parallel": doc["parallel"],
            "training": training}


@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("target", [t for t in TARGETS if t not in ("slurm-trainplan", "maxtext")])   # maxtext's:
# tests/plan/test_maxtext_export.py (the import needs the cluster's slices)
def test_import_of_export_gives_back_the_plan(name, target, tmp_path):
    plan = ALL[name]
    text, refusal = _export_or_refusal(plan, target)
    if text is None:  # the format cannot hold this plan: the refusal names the field
        assert re.match(r"(model|parallel|training)\.\w+=|the plan uses", refusal), refusal
        return
    inputs = {"megatron": {"megatron": text}, "slurm": {"megatron": text},
              "deepspeed": {"deepspeed": text, "hf": _hf_dir(tmp_path, plan)},
              "torchtitan": {"torchtitan": text, "hf": _hf_dir(tmp_path, plan)},
              "torchtitan-0.2": {"torchtitan": text, "hf": _hf_dir(tmp_path, plan)}}[target]
    doc, _ = import_plan(**inputs, cluster=plan.cluster.node.name, nodes=plan.cluster.nodes)
    again = plan_from_dict(doc)
    assert _held(plan_to_dict(again), target) == _held(plan_to_dict(plan), target)


def test_every_shipped_plan_round_trips_through_megatron():
    # Megatron holds every field of the shipped layouts but the model's name.
    for path in PLANS:
        plan = load_plan(path)
        doc, _ = import_plan(megatron=export_plan(plan, "megatron"), cluster=plan.cluster.node.name)
        got, want = plan_to_dict(plan_from_dict(doc)), plan_to_dict(plan)
        for section in ("parallel", "training"):
            assert got[section] == want[section], path.name


def test_megatron_round_trips_tp_overlap_cp_comm_and_the_fp8_recipe():
    """Megatron's --tp-comm-overlap, --cp-comm-type and --fp8-recipe (its tensorwise is TE's
    current scaling) come back as the Plan fields they were written from."""
    plan = load_plan(ROOT / "plans" / "llama3-70b-h100.yaml")
    for parallel, training in (({"tp_comm_overlap": True}, {"precision": "fp8", "fp8_recipe": "current"}),
                               ({"cp": 2, "cp_comm": "all_gather"}, {"precision": "fp8", "fp8_recipe": "delayed"})):
        doc = plan_to_dict(plan)
        doc["parallel"] = {**doc["parallel"], "sequence_parallel": True, "tp": 8, **parallel}
        doc["parallel"]["dp"] = plan.cluster.gpus // (8 * doc["parallel"]["pp"] * doc["parallel"]["cp"])
        doc["training"] = {**doc["training"], **training}
        want = plan_from_dict(doc)
        back, _ = import_plan(megatron=export_plan(want, "megatron"), cluster=want.cluster.node.name,
                              nodes=want.cluster.nodes)
        got = plan_to_dict(plan_from_dict(back))
        for key, value in parallel.items():
            assert got["parallel"][key] == value
        assert got["training"]["fp8_recipe"] == training["fp8_recipe"]
    rowwise = plan_to_dict(plan)
    rowwise["training"] = {**rowwise["training"], "precision": "fp8", "fp8_recipe": "rowwise"}
    with pytest.raises(ValueError, match="training.fp8_recipe=rowwise has no Megatron-LM option"):
        export_plan(plan_from_dict(rowwise), "megatron")


def test_megatron_round_trips_the_block_scaled_precisions():
    """mxfp8 -> --fp8-format e4m3 --fp8-recipe mxfp8; nvfp4 -> --fp4-format e2m1 --fp4-recipe
    nvfp4 (options of megatron_args.yaml); each comes back as the precision it was written from."""
    for precision, flags in (("mxfp8", ["--fp8-recipe mxfp8"]), ("nvfp4", ["--fp4-format e2m1", "--fp4-recipe nvfp4"])):
        doc = {"model": {"name": "llama3-70b"}, "cluster": {"node": "gb200-nvl72", "nodes": 16},
               "parallel": {"tp": 2, "pp": 4, "sequence_parallel": True},
               "training": {"global_batch": 256, "precision": precision}}
        plan = plan_from_dict(doc)
        text = export_plan(plan, "megatron")
        assert all(f in text for f in flags)
        back, _ = import_plan(megatron=text, cluster="gb200-nvl72", nodes=16)
        assert plan_to_dict(plan_from_dict(back))["training"]["precision"] == precision
    with pytest.raises(ValueError, match="training.precision=nvfp4 has no DeepSpeed config option"):
        export_plan(plan_from_dict({**doc, "parallel": {}}), "deepspeed")   # data parallel: a ds_config states no pp


# --------------------------------------------------------------------------- importers

HF_EXPECTED = {  # from the public model cards (examples/hf/*/config.json)
    "llama2-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=32, ffn_hidden=11008, vocab=32000, gated_mlp=True),
    "llama3-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, gated_mlp=True),
    "llama3-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672, vocab=128256, gated_mlp=True),
    "mistral-7b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000, gated_mlp=True),
    "mixtral-8x7b": dict(layers=32, hidden=4096, kv_heads=8, ffn_hidden=14336, experts=8, top_k=2, gated_mlp=True),
    "qwen2-7b": dict(layers=28, hidden=3584, heads=28, kv_heads=4, ffn_hidden=18944, vocab=152064, gated_mlp=True),
    "gpt2": dict(layers=12, hidden=768, heads=12, kv_heads=12, ffn_hidden=3072, vocab=50257, seq_len=1024,
                 gated_mlp=False, tied_embeddings=True, position_embedding="learned"),
    "gpt-neox-20b": dict(layers=44, hidden=6144, heads=64, ffn_hidden=24576, vocab=50432, gated_mlp=False,
                         tied_embeddings=False, position_embedding="rope"),
}


@pytest.mark.parametrize("model", sorted(HF_EXPECTED))
def test_hf_import_reads_each_family(model):
    doc, warnings = import_plan(hf=f"examples/hf/{model}/config.json", cluster="dgx-h100", nodes=1, base_dir=ROOT)
    spec = plan_to_dict(plan_from_dict(doc))["model"]
    assert {k: spec[k] for k in HF_EXPECTED[model]} == HF_EXPECTED[model]
    assert spec["name"] == model
    assert doc["parallel"]["dp"] == 8 and doc["training"]["global_batch"] == 8


def test_unmapped_fields_are_listed_in_one_warning_line():
    _, warnings = import_plan(hf="examples/hf/llama3-8b/config.json", cluster="dgx-h100", base_dir=ROOT)
    assert warnings[0] == ("not mapped to the plan: hf config.json: architectures, bos_token_id, eos_token_id, "
                           "rms_norm_eps, torch_dtype")
    _, warnings = import_plan(megatron="examples/megatron/pretrain_llama3_8b.sh", cluster="dgx-h100", base_dir=ROOT)
    assert len([w for w in warnings if w.startswith("not mapped")]) == 1
    assert "--lr, --min-lr" in warnings[0] and "--tensor-model-parallel-size" not in warnings[0]


def test_megatron_example_gives_its_layout():
    doc, _ = import_plan(megatron="examples/megatron/pretrain_llama3_8b.sh", cluster="dgx-h100", base_dir=ROOT)
    # 2 nodes x 8 GPUs / (tp 2 * pp 2) = dp 4; --use-distributed-optimizer is ZeRO-1.
    assert doc["cluster"] == {"node": "dgx-h100", "nodes": 2}
    assert doc["parallel"] == {"tp": 2, "pp": 2, "dp": 4, "zero": 1, "sequence_parallel": True, "schedule": "1f1b",
                               "overlap_param_gather": True}
    assert doc["training"]["global_batch"] == 256 and doc["training"]["optimizer"] == "adamw"


def test_deepspeed_batch_sizes_give_data_parallel():
    doc, _ = import_plan(deepspeed="examples/deepspeed/ds_config.json", hf="examples/hf/llama3-8b/config.json",
                         cluster="dgx-h100", nodes=2, base_dir=ROOT)
    # train_batch_size 64 = micro 2 * accumulation 2 * dp 16
    assert doc["parallel"] == {"dp": 16, "zero": 3, "zero_impl": "deepspeed"}   # priced as DeepSpeed runs it
    # a Hugging Face model's attention is torch SDPA: FlashAttention-2 on an H100 (readers.sdpa_attention_kernel)
    assert doc["training"] == {"global_batch": 64, "micro_batch": 2, "precision": "bf16", "offload": "optimizer",
                               "optimizer": "adamw", "recompute": "selective", "flash_attention": True,
                               "attention_kernel": "flash2"}


def test_torchtitan_shard_minus_one_takes_the_leftover_ranks():
    doc, _ = import_plan(torchtitan="examples/torchtitan/llama3_70b.toml", cluster="dgx-h100", nodes=8,
                         base_dir=ROOT)
    # 64 GPUs / tp 8 = 8-way FSDP; global batch = local 8 * dp 8.
    assert doc["parallel"]["dp"] == 8 and doc["parallel"]["zero"] == 3
    assert doc["parallel"]["fsdp_root"] == "output_kept"   # torchtitan's [norm, output] group, not resharded
    assert doc["training"]["global_batch"] == 64 and doc["training"]["recompute"] == "full"
    assert doc["model"]["layers"] == 80 and doc["model"]["ffn_hidden"] == 28672
    plan_from_dict(doc)


def test_torchtitan_imports_the_attention_kernel_sdpa_runs_on_its_gpu():
    """torch 2.5.1-2.10 run SDPA's flash backend (FlashAttention-2) before cuDNN's on Hopper
    (pytorch/pytorch#138522): the import says so where the catalog has FA2's figures."""
    doc, warnings = import_plan(torchtitan="examples/torchtitan/llama3_70b.toml", cluster="dgx-h100", nodes=8,
                                base_dir=ROOT)
    assert doc["training"]["attention_kernel"] == "flash2"
    assert any("training.attention_kernel=flash2" in w for w in warnings)
    fa2 = simulate(plan_from_dict(doc))
    cudnn = simulate(plan_from_dict({**doc, "training": {**doc["training"], "attention_kernel": "auto"}}))
    assert fa2.step_time_s > cudnn.step_time_s
    doc, _ = import_plan(torchtitan="examples/torchtitan/llama3_70b.toml", cluster="dgx-b200", nodes=8,
                         base_dir=ROOT)
    assert "attention_kernel" not in doc["training"]   # no FA2 figures for B200: the catalog's own


def test_slurm_script_imports_like_the_megatron_command():
    plan = ALL["llama3-70b-h100"]
    a, _ = import_plan(megatron=export_plan(plan, "slurm"), cluster="dgx-h100")
    b, _ = import_plan(megatron=export_plan(plan, "megatron"), cluster="dgx-h100")
    assert a == b and a["cluster"]["nodes"] == 8


def test_megatron_uneven_first_and_last_stages():
    text = export_plan(VARIANTS["v-pp-uneven"], "megatron")
    assert "--decoder-first-pipeline-num-layers 7" in text and "--decoder-last-pipeline-num-layers 7" in text
    doc, _ = import_plan(megatron=text, cluster="dgx-h100")
    assert doc["parallel"]["stage_layers"] == [7, 9, 9, 7]


# --------------------------------------------------------------------------- errors

def test_a_field_two_inputs_disagree_on_is_one_clear_error():
    cmd = "pretrain_gpt.py --num-layers 40 --hidden-size 4096 --num-attention-heads 32 --micro-batch-size 1"
    with pytest.raises(PlanError, match=r"^model\.layers conflicts: hf config\.json gives 32 but megatron gives 40$"):
        import_plan(hf="examples/hf/llama3-8b/config.json", megatron=cmd, cluster="dgx-h100", base_dir=ROOT)
    with pytest.raises(PlanError, match=r"training\.micro_batch conflicts: megatron gives 1 but deepspeed gives 2"):
        import_plan(megatron="pretrain_gpt.py --micro-batch-size 1", deepspeed="examples/deepspeed/ds_config.json",
                    hf="examples/hf/llama3-8b/config.json", cluster="dgx-h100", base_dir=ROOT)


@pytest.mark.parametrize("kwargs, message", [
    (dict(megatron="pretrain_gpt.py --fp16 --bf16"), "both --fp16 and --bf16"),
    (dict(megatron="torchrun --nnodes 2 --micro-batch-size 1"), "no training script"),
    (dict(megatron="pretrain_gpt.py --tensor-model-parallel-size eight"), "is not a int"),
    (dict(deepspeed='{"train_batch_size": 8,,}'), r"not valid JSON \(line 1\)"),
    (dict(deepspeed='{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, '
                    '"gradient_accumulation_steps": 1}'), "not a multiple"),
    (dict(torchtitan="[parallelism\n"), "not valid TOML"),
    (dict(torchtitan='[model]\nname = "deepseek_v3"\nflavor = "671B"\n'), "deepseek_v3/671B"),
    (dict(deepspeed="missing.json"), "cannot be read"),
])
def test_bad_input_is_one_sentence_naming_the_field(kwargs, message):
    with pytest.raises(PlanError, match=message):
        import_plan(**kwargs, cluster="dgx-h100")


def test_import_needs_a_cluster_and_export_a_known_target():
    with pytest.raises(PlanError, match="cluster="):
        import_plan(hf="examples/hf/gpt2/config.json", base_dir=ROOT)
    with pytest.raises(PlanError, match="unknown node 'dgx-h1000'"):
        import_plan(hf="examples/hf/gpt2/config.json", cluster="dgx-h1000", base_dir=ROOT)
    with pytest.raises(ValueError, match="unknown export target 'nemo'"):
        export_plan(ALL["gpt3-175b-a100"], "nemo")


def test_refusals_name_the_field_the_tool_cannot_hold():
    with pytest.raises(ValueError, match=r"^parallel\.zero=1 has no torchtitan option"):
        export_plan(ALL["llama3-70b-h100"], "torchtitan")
    with pytest.raises(ValueError, match=r"^parallel\.schedule=zero-bubble has no Megatron-LM option"):
        export_plan(VARIANTS["v-zero-bubble-cp"], "megatron")
    with pytest.raises(ValueError, match=r"^training\.offload=optimizer\+params has no Megatron-LM option"):
        export_plan(VARIANTS["v-zero3-paramoffload"], "megatron")


def test_read_megatron_accepts_equals_and_continuations():
    r = read_megatron("python pretrain_gpt.py \\\n  --tensor-model-parallel-size=4 --bf16  # comment\n")
    assert r.fields["parallel.tp"] == 4 and r.fields["training.precision"] == "bf16"
