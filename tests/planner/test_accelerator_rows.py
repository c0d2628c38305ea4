"""dev_accelerators.csv rows as Plans (issue 54): each source's degrees by its own rule, in chips;
the rows the Plan cannot state refused with their reason; a TPU plan predicted with its interval;
Trn1 rows across instances predicted over the non-blocking EFA, their one-source plateau honest
when left out; the accelerators with no fitted entry refused in one sentence."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simcore.plan.load import plan_from_dict

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT.parent / "shared" / "validation" / "dev_accelerators.csv"
pytestmark = pytest.mark.skipif(not CSV.exists(), reason="../shared/validation is not beside the repository")


@pytest.fixture(scope="module")
def acc():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import published_accelerators

        yield published_accelerators
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.fixture(scope="module")
def rows():
    return pd.read_csv(CSV)


def _find(rows, source, model, chips, **cols):
    sel = rows[(rows.source == source) & (rows.model.str.contains(model, regex=False)) & (rows.num_chips == chips)]
    for k, v in cols.items():
        sel = sel[sel[k] == v]
    return sel.iloc[0]


def _plan(acc, row):
    return plan_from_dict(acc.choices(row, acc.base_doc(row))[0])


def test_maxtext_fsdp_is_zero3_over_the_chips_and_slices_multiply_it(acc, rows):
    r = _find(rows, "maxtext_v5p_readme", "32B", 64)                 # ici_tensor 4 x ici_fsdp 16
    p = _plan(acc, r)
    assert (p.parallel.tp, p.parallel.pp, p.parallel.dp, int(p.parallel.zero)) == (4, 1, 16, 3)
    assert p.cluster.gpus == 64 and p.cluster.node.name == "tpu-v5p-host"
    # remat 'minimal' is JAX's dots policy; one micro-batch a step: per-device batch 8 x tp 4
    assert p.training.recompute.value == "dots" and p.training.micro_batch == 32 and p.num_microbatches == 1
    assert p.parallel.tp_comm_overlap and p.parallel.sequence_parallel
    r2 = _find(rows, "maxtext_v5e_readme", "16B", 512)                # fsdp 256 x 2 slices over DCN
    p2 = _plan(acc, r2)
    assert (p2.parallel.tp, p2.parallel.dp) == (1, 512) and p2.training.recompute.value == "full"
    # FSDP inside each slice's ICI torus, the two slices replicas over the DCN (dcn_data_parallelism)
    assert p2.parallel.dp_replicate == 2 and p2.parallel.shard_ranks == 256 and p2.cluster.nvlink_domain == 256
    assert p2.model.kv_channels == 256 and not p2.model.gated_mlp and p2.model.tied_embeddings
    assert p2.training.global_batch == 512 * p2.training.micro_batch   # per-device batch, no accumulation


def test_maxtext_step_time_is_its_own_flop_count_over_its_tflops(acc, rows):
    r = _find(rows, "maxtext_v4_readme", "22B", 64)
    assert acc.maxtext_params(r) == pytest.approx(22e9, rel=0.02)      # the nominal size
    flops = r.global_batch_seqs * (6 * acc.maxtext_params(r) * 2048 + 12 * 24 * 48 * 256 * 2048 ** 2)
    assert acc.measured_step_s(r) == pytest.approx(flops / (64 * 156e12))


def test_neuron_degrees_count_neuroncores_two_per_chip(acc, rows):
    r = _find(rows, "neuron_trn1_perf", "GPT3-23B", 512)               # TP 8, PP 4, DP 32 NeuronCores
    p = _plan(acc, r)
    assert (p.parallel.tp, p.parallel.pp, p.parallel.dp) == (4, 4, 32)
    assert p.parallel.gpus == 512 == r.num_chips and p.cluster.node.name == "trn1-32xl"
    assert acc.measured_step_s(r) == pytest.approx(1024 * 2048 / (r.measured_tokens_per_s_per_chip * 512))
    llama = _find(rows, "neuron_trn1_perf", "Llama2-7B", 256, dp=64, seq_len=4096)    # recompute blank: searched
    # run by NeuronX Distributed (its notes), whose examples checkpoint the selected modules or every layer
    assert acc.nxd_row(llama)
    assert {d["training"]["recompute"] for d in acc.choices(llama, acc.base_doc(llama))} == {"selective", "full"}
    nemo = rows[(rows.source == "neuron_trn1_perf") & rows.recompute.isna()
                & ~rows.notes.str.contains("framework=NeuronX Distributed")].iloc[0]
    assert {d["training"]["recompute"] for d in acc.choices(nemo, acc.base_doc(nemo))} == {"none", "selective", "full"}


def test_mindspeed_reads_megatron_arguments(acc, rows):
    d = acc.base_doc(_find(rows, "mindspeed_llm_readme_2024", "Qwen-72B", 128))
    assert (d["parallel"]["tp"], d["parallel"]["pp"], d["parallel"]["dp"]) == (8, 8, 2)
    assert d["parallel"]["sequence_parallel"] and d["cluster"]["nodes"] == 16 and d["model"]["gated_mlp"]
    p = _plan(acc, _find(rows, "mindspeed_llm_readme_2024", "Qwen1.5-4B", 8))   # one Atlas 800T A2
    assert (p.parallel.tp, p.parallel.pp, p.parallel.dp, int(p.parallel.zero)) == (1, 2, 4, 1)
    assert p.cluster.gpus == 8 and p.training.flash_attention
    b = _plan(acc, _find(rows, "mindspeed_llm_readme_2024", "Bloom-176B", 96))      # full/block/70
    assert (b.training.recompute.value, b.training.recompute_method.value, b.training.recompute_layers) == \
        ("full", "block", 70)
    # MC2 (the table is "measured with mc2 enabled") where the script passes --use-mc2: TP's collectives
    # fused into its GEMMs under sequence parallelism; Bloom-176B's script does not, Qwen1.5-4B runs no TP
    mc2 = _plan(acc, _find(rows, "mindspeed_llm_readme_2024", "LLaMA2-70B", 32))
    assert mc2.parallel.tp_comm_overlap and mc2.parallel.sequence_parallel and mc2.parallel.tp == 8
    assert not b.parallel.tp_comm_overlap and b.parallel.sequence_parallel and not p.parallel.tp_comm_overlap
    # vocabulary and tied embeddings as the row's script prints them (validation/mindspeed_scripts.yaml)
    small = _plan(acc, _find(rows, "mindspeed_llm_readme_2024", "Qwen1.5-0.5B", 8))   # --padded-vocab-size 151936
    assert small.model.vocab == 151936 and small.model.tied_embeddings            # no --untie-... flag
    assert p.model.vocab == 151936 and not p.model.tied_embeddings
    llama = _plan(acc, _find(rows, "mindspeed_llm_readme_2024", "LLaMA2-70B", 32))   # the tokenizer's: not printed
    assert llama.model.vocab == 32000 and not llama.model.tied_embeddings


def test_mindspeed_scripts_file_is_what_its_reader_writes(acc):
    # the facts the rule reads, as bench/read_mindspeed_scripts.py takes them from a script's text
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import read_mindspeed_scripts as rd
    finally:
        sys.path.remove(str(ROOT / "bench"))
    assert rd.script_facts("--num-layers 24 \\\n    --padded-vocab-size 151936 \\\n") == {"vocab": 151936, "untied": False}
    assert rd.script_facts("--vocab-size 256000 --untie-embeddings-and-output-weights") == \
        {"vocab": 256000, "untied": True}
    assert rd.script_facts("--make-vocab-size-divisible-by 64") == {"vocab": None, "untied": False}
    stored = acc._mindspeed_scripts()
    assert len(stored) == 40 and stored["examples/gemma/pretrain_gemma_7b_ptd.sh @a27b45f00"]["vocab"] == 256000


def test_rows_that_cannot_be_predicted_are_refused_with_their_reason(acc, rows):
    inconsistent = _find(rows, "neuron_trn1_perf", "Llama2-13B", 512, dp=4)   # TP*PP*DP = 128 != 1024 cores
    assert "!= 1024 devices" in acc.refusal(inconsistent)
    assert "no throughput" in acc.refusal(rows[(rows.source == "neuron_trn1_perf")
                                               & rows.measured_tokens_per_s_per_chip.isna()].iloc[0])
    assert "data-parallel degree not published" in acc.refusal(_find(rows, "mindspeed_llm_readme_2024", "Mixtral", 16))
    assert acc.refusal(_find(rows, "mindspeed_llm_readme_2024", "Qwen-72B", 128)) is None   # 16 Atlas 800T A2
    assert "no data-centre network" in acc.refusal(_find(rows, "maxtext_v4_readme", "22B", 128))
    assert acc.refusal(_find(rows, "maxtext_v5p_readme", "32B", 64)) is None
    # two slices: the replicas' all-reduce crosses the DCN, priced at the per-chip rate Google prints
    # (no oversubscription: a judgement, topologies/catalog/SOURCES.md "Google's DCN")
    assert acc.refusal(_find(rows, "maxtext_v5p_readme", "32B", 128)) is None
    assert acc.refusal(_find(rows, "maxtext_v4_readme", "22B", 64)) is None    # one slice: ICI only
    # TP 32 NeuronCores = 16 chips over 8 KV heads: NxD copies each head onto 4 cores (--kv_replicator 4)
    llama = _find(rows, "neuron_trn1_perf", "Llama-3.1-8B", 512)
    assert acc.refusal(llama) is None
    assert acc.base_doc(llama)["parallel"]["kv_replicator"] == 4
    assert "kv_replicator" not in acc.base_doc(_find(rows, "neuron_trn1_perf", "GPT3-23B", 512))["parallel"]


def test_trn1_rows_across_instances_are_predicted_over_the_non_blocking_efa(acc, rows):
    # 32 trn1.32xlarge: the DP groups cross EFA leaf switches, priced at oversubscription 1.0
    # (trn1-arch.rst: 'non-blocking'), where they were refused while it was a catalog gap
    from simcore.engine.predict import simulate
    from topologies.hardware import load_catalog

    r = _find(rows, "neuron_trn1_perf", "GPT3-23B", 512)
    assert acc.refusal(r) is None
    p = _plan(acc, r)
    assert p.cluster.nodes == 32 and p.cluster.fabric.name == "efa-trn1"
    assert p.cluster.fabric.oversubscription == 1.0
    res = simulate(p)
    assert res.fits and 0 < res.step_time_s < 10 * acc.measured_step_s(r)
    assert "trn1" in load_catalog().efficiency and acc.refusal(_find(rows, "neuron_trn1_perf", "Llama2-7B", 256,
                                                                       dp=64, seq_len=4096)) is None


def test_a_trn2_group_across_instances_still_refuses_its_fabric_gap():
    # efa-v3's oversubscription stays a gap (trn2-arch.rst prints no such words): with trn2's
    # efficiency entry (the Trainium family's, extended), a DP group over 32 instances is refused
    from simcore.engine.predict import simulate

    plan = plan_from_dict({"model": "llama2-7b", "cluster": {"node": "trn2-48xl", "nodes": 32},
                           "parallel": {"tp": 4, "dp": 128, "zero": 1},
                           "training": {"global_batch": 512, "micro_batch": 1}})
    with pytest.raises(ValueError, match="efa-v3 has no oversubscription figure in the catalog"):
        simulate(plan)


@pytest.fixture(scope="module")
def bench_fit():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import fit_rows
        import fitting

        yield fitting, fit_rows
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.fixture(scope="module")
def acc_rows(bench_fit):
    from topologies.hardware import load_catalog

    return bench_fit[1].accelerator_rows(CSV.parent, load_catalog())


@pytest.mark.parametrize("block, source, count, kind", [("trainium", "neuron_trn1_perf", 40, "trn1"),
                                                        ("ascend", "mindspeed_llm_readme_2024", 39, "ascend-910b")])
def test_a_one_source_family_is_where_its_fit_stops_and_its_loso_is_the_prior(bench_fit, acc_rows, block, source,
                                                                             count, kind):
    # fitted to the family's predictable rows only (one source): from the stored figures no step on
    # their grid lowers the loss; left out, nothing else fits them, so out of sample they are the priors
    import yaml

    F, R = bench_fit
    idx = R.block_rows(acc_rows, block)
    assert len(idx) == count and {acc_rows[k].source for k in idx} == {source}
    stored = F.stored_values()
    assert R.fit_block(acc_rows, block, stored, None, {}) == stored
    figs = [f for f in F.FIGURES if f.block == block]
    fits = yaml.safe_load((ROOT / "validation" / "fits.yaml").read_text())["figures"]
    left_out = R.fit_block(acc_rows, block, stored, source, {})
    for fig in figs:
        assert fig.lo <= stored[fig.name] <= fig.hi and left_out[fig.name] == fig.prior
        assert fits[fig.name]["value"] == stored[fig.name] and fits[fig.name]["prior_when_left_out"] == [source]
        assert fits[fig.name]["leave_one_source_out"][source] == fig.prior
    assert R.prior_blocks(acc_rows, source) == [block] and R.prior_blocks(acc_rows, "maxtext_v5p_readme") == []
    # so no residual of the kind is out of sample: no table, its intervals those of an unpublished GPU's
    kinds = yaml.safe_load((ROOT / "validation" / "residuals.yaml").read_text())["kinds"]
    assert kinds[kind]["measured"].get("in_sample_only") and "residuals" not in kinds[kind]


def _simulate(plan) -> subprocess.CompletedProcess:
    """``trainplan simulate PLAN`` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "trainplan", "simulate", str(plan)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_simulate_predicts_a_tpu_plan_with_its_interval(tmp_path):
    plan = tmp_path / "tpu.yaml"
    plan.write_text(
        "name: tpu-check\n"
        "model: {name: maxtext-22b, layers: 48, hidden: 6144, heads: 24, ffn_hidden: 24576, vocab: 32768,\n"
        "        seq_len: 2048, gated_mlp: false, tied_embeddings: true, kv_channels: 256}\n"
        "cluster: {node: tpu-v5p-host, nodes: 16}\n"
        "parallel: {tp: 4, dp: 16, zero: 3, sequence_parallel: true, tp_comm_overlap: true}\n"
        "training: {global_batch: 512, micro_batch: 32, recompute: dots, flash_attention: true}\n")
    out = _simulate(plan)
    assert out.returncode == 0, out.stderr
    assert "step time" in out.stdout and "interval of the step time" in out.stdout
    assert "extrapolated: tpu-v5p" in out.stdout or "residuals" in out.stdout


def test_an_accelerator_without_rows_or_a_family_still_refuses_in_one_sentence(tmp_path):
    plan = tmp_path / "gaudi3.yaml"
    plan.write_text("model: llama3-8b\ncluster: {node: hls-gaudi3, nodes: 1}\nparallel: {tp: 4, dp: 2}\n"
                    "training: {global_batch: 16, micro_batch: 1}\n")
    out = _simulate(plan)
    assert out.returncode != 0
    msg = out.stderr.strip()
    assert "GPU 'gaudi3' has no entry in topologies/catalog/efficiency.yaml" in msg and len(msg.splitlines()) == 1


def test_a_later_chip_of_a_family_is_predicted_and_says_it_extrapolates(tmp_path):
    # trn2 has no row: its entry is the Trainium family's, extended, and its interval says so
    plan = tmp_path / "trn2.yaml"
    plan.write_text("model: llama3-8b\ncluster: {node: trn2-48xl, nodes: 1}\nparallel: {tp: 4, dp: 4}\n"
                    "training: {global_batch: 16, micro_batch: 1}\n")
    out = _simulate(plan)
    assert out.returncode == 0, out.stderr
    assert "step time" in out.stdout and "extrapolated: trn2: no published run on this GPU" in out.stdout


@pytest.mark.parametrize("model", ["LLaMA2-70B", "Mistral-7B", "Grok1-40B"])
def test_the_planner_finds_mindspeed_s_published_layout_and_does_no_worse(model):
    # bench/frontier.py's question for a MindSpeed row: the published layout (MC2 where its script passes
    # --use-mc2; ZeRO-1 over one data-parallel rank; a MoE model without MC2) is in the search for
    # MindSpeed-LLM, fits, and the search's best is predicted no slower
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import frontier
    finally:
        sys.path.remove(str(ROOT / "bench"))
    rows = frontier.published_rows(CSV.parent, 8, ("mindspeed_llm_readme_2024",))
    runs = [r for r in rows.to_dict("records") if r["model"] == model]
    assert len(runs) == 1
    runs[0]["stack"] = None   # the chip's own stack, as `trainplan plan` ranks for it
    (got,) = frontier.answer((frontier.question_key(runs[0]["doc"]), runs))
    assert got["in_space"], got["why"]
    assert got["fits"] and got["best_over_predicted"] <= 1.0 + 1e-9
