"""Rules that map the rows of ``dev_accelerators.csv`` onto Plans, one rule per source.

``bench/validate_published.py`` and ``bench/fit.py`` use them; ../shared/validation/SOURCES.md
(section "dev_accelerators.csv") has every source's stack, counting and units. Nothing here is
per row: each source's documented setup becomes the same Plan fields for all its rows, in the
source's own words, with the degrees converted once into chips (the unit the catalog counts:
``topologies/catalog/gpus.yaml`` ``unit:``).

- ``maxtext_v4_readme``, ``maxtext_v5e_readme``, ``maxtext_v5p_readme`` (MaxText on TPU, 2023):
  one JAX device per chip. ``ici_tensor_parallelism`` -> ``tp`` (sequence-sharded activations
  between the TP matmuls: ``sequence_parallel``; XLA's latency-hiding scheduler runs the TP
  all-gathers and reduce-scatters asynchronously beside the matmuls: ``tp_comm_overlap``); ``ici_fsdp_parallelism`` shards parameters,
  gradients and optimizer state over those chips: ZeRO-3 over the data-parallel ranks, and
  ``dcn_data_parallelism`` (slices over DCN) replicates them: ``dp = fsdp x slices``, zero 3,
  ``dp_replicate = slices`` (hybrid sharding: FSDP inside a slice, the slices all-reduce the
  shards), each slice one ICI torus (``cluster.nvlink_domain_gpus``). Global batch = chips x
  ``per_device_batch_size``; MaxText shards it over the data and FSDP axes, not the tensor axis, and
  runs it at once (base.yml ``gradient_accumulation_steps: 1``): one micro-batch of per-device x tp
  sequences a data-parallel rank. Remat policy ``full`` -> full recompute; ``minimal`` -> ``dots``
  (MaxText/layers/models.py @e64f6813: ``jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims``:
  the projections' outputs saved, attention and elementwise ops recomputed; ``simcore.model.recompute``).
  The base.yml model: ReLU MLP (not gated), tied embeddings (``logits_via_embedding``), RoPE,
  no dropout, ``head_dim`` from the notes (``kv_channels``), the Pallas flash attention kernel.
  Node: the catalog's TPU host of the chip; a slice is its ICI torus.
- ``neuron_trn1_perf`` (AWS Neuron on trn1.32xlarge, NeMo-Megatron and NeuronX Distributed): TP/PP/DP count
  NeuronCores, two per Trainium chip, and a TP group's two ranks on one chip are neighbours: ``tp`` chips = TP
  cores/2, PP and DP as published (TP x PP x DP cores = 2 x chips). ZeRO-1 (both stacks' tutorials shard the
  optimizer: NxD ``use_zero1_optimizer``, neuronx-nemo-megatron ``wrap_with_zero``) where the row leaves it blank
  (NxD @fbac349b: run_llama2_70B_tp_pp.sh "--use_zero1_optimizer 1", tp_zero1_llama3_8B_hf_pretrain.sh
  "USE_ZERO_1=1"); sequence parallel with TP (both tutorials: NxD run_llama_nxd.py @fbac349b
  '"--use_sequence_parallel", default=1', tp_zero1_llama3_8B_hf_pretrain.sh "--sequence_parallel_enabled";
  neuronx-nemo-megatron nemo/examples/nlp/language_modeling/test.sh @05dde85a "model.sequence_parallel=True");
  recompute as the row states it, the fastest fitting of none / selective / full where it is blank; micro-batch and
  global batch as published. GPT-3: GeLU MLP of 4h, learned positions, GPT-2 vocabulary (50257 padded to 50304)
  where the row leaves it blank (notes: "FFN=4*HS in test.sh"; test.sh @05dde85a: "gpt2/gpt2-vocab.json"); Llama:
  SwiGLU, untied, RoPE, ``kv_heads`` from the notes (e.g. "kv_heads=8; arch=maxtext
  configs/models/llama3.1-70b.yml"). Where the TP cores outnumber the KV heads (TP 32 over Llama's 8: every such row
  is NxD's), NxD copies each KV head onto TP / kv_heads cores, one head a core: ``parallel.kv_replicator`` = TP
  cores / kv_heads, the ``--kv_replicator 4`` of NxD's own Llama 2 70B, Llama 3 70B and Llama 3 8B scripts at TP 32
  (aws-neuron/neuronx-distributed @fbac349b examples/training/llama/tp_pp_llama_hf_pretrain/run_llama2_70B_tp_pp.sh,
  run_llama3_70B_tp_pp.sh, tp_zero1_llama_hf_pretrain/tp_zero1_llama3_8B_hf_pretrain.sh;
  ``simcore.model.kv_replication``). Node: trn1.32xlarge, 16 chips in a 2D torus; instances over EFA (``efa-trn1``,
  non-blocking as trn1-arch.rst says).
- ``mindspeed_llm_readme_2024`` (MindSpeed-LLM on Atlas 800T A2, Megatron-LM arguments): TP,
  PP, DP in NPUs (= chips on 910B); ``--use-distributed-optimizer`` -> ZeRO-1 (zero_stage 1),
  ``--sequence-parallel`` and ``--use-flash-attn`` from the script's flags; recompute as the
  row states (``full/block/N``: Megatron's ``--recompute-method block --recompute-num-layers N``),
  none where blank (the script passes no recompute flag); SwiGLU where the script fuses it or the
  MLP is not 4h wide; RoPE, ``kv_groups`` from the notes. The table is "measured with mc2 enabled"
  (README.md @a27b45f00: "以下为开启 mc2 加速特性后的实测性能"), which the code leaves off until a
  line of modellink/arguments.py is commented out and the script passes ``--use-mc2`` (README.md, same
  commit: "如果需要开启 mc2 ... #args.use_mc2 = False"): MC2 fuses sequence parallelism's all-gather into
  the next matmul and the matmul into its reduce-scatter
  (modellink/core/tensor_parallel/ascend_turbo/mc2_linears_seq_parallel.py: ``npu_all_gather_base_mm``,
  ``npu_mm_reduce_scatter_base``), so TP's communication overlaps its GEMMs: ``tp_comm_overlap`` where
  the row's script passes ``--use-mc2`` (the notes' flags) with TP and sequence parallelism, on a dense
  model: "In MCore scenarios ... the MLP part of MoE models does not enable MC2" (MindSpeed-LLM
  docs/en/pytorch/features/mcore/mc2.md @c77308a1), and the Plan's TP overlap covers the MLP, so a MoE
  row (Grok-1 40B) is read without it, its attention's overlap left out. Vocabulary and tied
  embeddings from the row's script (``validation/mindspeed_scripts.yaml``, written by
  ``bench/read_mindspeed_scripts.py``): ``--padded-vocab-size`` / ``--vocab-size`` where it prints
  one, else 32000 (Llama's: the tokenizer file is not stored); tied unless it passes
  ``--untie-embeddings-and-output-weights``.

Rows the Plan cannot state, or whose hardware the catalog cannot predict, are counted per
reason (``skip_reason``), never dropped silently.
"""
from __future__ import annotations

import functools
import math
import re
from pathlib import Path

import pandas as pd

FILE = "dev_accelerators.csv"
MAXTEXT = ("maxtext_v4_readme", "maxtext_v5e_readme", "maxtext_v5p_readme")
NEURON = "neuron_trn1_perf"
MINDSPEED = "mindspeed_llm_readme_2024"
#: The catalog's chip and host of each accelerator the CSV names (topology column: "trn1.32xlarge/trn1n.32xlarge
#: (16 Trainium chips = 32 NeuronCore-v2 per node", "Atlas 800T A2 nodes, 8 NPUs per node"; SOURCES.md: "v5e
#: chips_per_host = 4").
GPU = {"tpu-v4": "tpu-v4", "tpu-v5e": "tpu-v5e", "tpu-v5p": "tpu-v5p", "trainium1": "trn1",
       "ascend-910b": "ascend-910b"}
NODE = {"tpu-v4": "tpu-v4-host", "tpu-v5e": "tpu-v5e-host", "tpu-v5p": "tpu-v5p-host",
        "trainium1": "trn1-32xl", "ascend-910b": "atlas-800t-a2"}
#: Accelerator families: the chips whose efficiency figures are fitted together (one stack,
#: one matrix-unit design: the TPU MXU of v4 / v5e / v5p under MaxText/XLA; Trn1's TensorEngine
#: under Neuron's PyTorch/XLA stacks, ``bench/fitting.py`` ``trainium_plateau``).
FAMILY = {"tpu-v4": "tpu", "tpu-v5e": "tpu", "tpu-v5p": "tpu", "trainium1": "trainium", "ascend-910b": "ascend"}
#: Device units per chip, per source (SOURCES.md "Parallel-degree units": "Trainium1: TP/PP/DP are in
#: **NeuronCores** (2 per chip)"; notes: "units=TP/PP/DP are in NeuronCores (2 per Trainium1 chip)").
UNITS_PER_CHIP = {NEURON: 2}
#: Catalog gaps that the step-time model reads: a chip with one of them cannot be predicted.
READ_GAPS = ("hbm_tbyte_per_s", "intra_link_gbyte_per_s_bidir", "efficiency")


def _num(x, default=None):
    return default if x is None or (isinstance(x, float) and math.isnan(x)) or x == "" else x


def _flag(notes: str, pattern: str) -> str | None:
    m = re.search(pattern, notes)
    return m.group(1) if m else None


def slices(row: pd.Series) -> int:
    """MaxText: slices over DCN ("N slice(s) over DCN" in the topology)."""
    return int(_flag(str(row.topology), r"(\d+) slice\(s\) over DCN") or 1)


def devices(row: pd.Series) -> int:
    """The degrees' product in the source's units (NeuronCores on Trainium, chips else). MaxText (SOURCES.md):
    "`fsdp` for MaxText rows = `ici_fsdp × ici_fsdp_transpose` (× `dcn_fsdp` where used). `dp` = slices over DCN ×
    `ici_data`."."""
    tp, pp, dp, cp = (int(_num(row[k], 1)) for k in ("tp", "pp", "dp", "cp"))
    if row.source in MAXTEXT:
        return tp * int(_num(row.fsdp, 1)) * slices(row)
    return tp * pp * dp * cp


def skip_reason(row: pd.Series, catalog=None) -> str | None:
    """Why a row cannot become a predicted Plan, in words (rows are counted per reason), or None."""
    from topologies.hardware import load_catalog

    if all(math.isnan(float(_num(row[k], float("nan")))) for k in
           ("measured_tflops_per_chip", "measured_step_time_s", "measured_tokens_per_s_per_chip")):
        return "no throughput published (an MFU of unstated definition only)"
    if math.isnan(float(_num(row.seq_len, float("nan")))):
        return "sequence length not published"
    units = UNITS_PER_CHIP.get(row.source, 1)
    if _num(row.dp) is None and row.source not in MAXTEXT:
        return "data-parallel degree not published (TP x PP differs from the devices)"
    if devices(row) != int(row.num_chips) * units:
        return (f"degrees' product {devices(row)} != {int(row.num_chips) * units} devices "
                "(source inconsistency, the notes' layout_consistency / script_vs_table)")
    catalog = catalog or load_catalog()
    gaps = [g for g in catalog.gpus[GPU[row.accelerator]].gaps if g in READ_GAPS and g != "efficiency"]
    if gaps:
        return f"{GPU[row.accelerator]}: catalog gaps the step model reads ({', '.join(gaps)})"
    node = catalog.node(NODE[row.accelerator])
    if node.fabric is None and (slices(row) > 1 if row.source in MAXTEXT else int(row.num_chips) > node.gpus_per_node):
        return f"{node.name}: no data-centre network in the catalog (a group across its hosts or slices is refused)"
    return None


#: A single-slice MaxText run on a host with no network in the catalog (TPU v4): the Plan asks a
#: fabric of every cluster of several hosts even when every group stays inside the ICI torus, so
#: this one is named and ``refusal`` checks that no prediction reads it (its rate doubled
#: changes nothing).
PLACEHOLDER_FABRIC = "gcp-dcn-50"
#: The entry that stands in for a chip with none, only to find which links a row's groups use.
STAND_IN = "tpu-v5p"


def _with_fabrics(catalog, nic_scale: float):
    """The catalog's fabrics with every NIC rate scaled, for ``refusal``'s placeholder check;
    restored by the caller (``catalog.fabrics.update``). Gaps stay NaN: the collectives refuse them."""
    import dataclasses

    saved = dict(catalog.fabrics)
    for k, f in saved.items():
        catalog.fabrics[k] = dataclasses.replace(f, nic_bytes_per_s=f.nic_bytes_per_s * nic_scale)
    return saved


def refusal(row: pd.Series, catalog=None) -> str | None:
    """``skip_reason``, or why the row's prediction cannot be trusted: it reads a catalog gap
    (a fabric's oversubscription, NaN: ``collectives._group_net`` refuses it when a group
    crosses leaf switches of that fabric), or the Plan refuses the layout. None: the row is
    predicted."""
    from simcore.model import collectives
    from simcore.engine.predict import simulate
    from simcore.plan.load import plan_from_dict
    from simcore.plan.spec import PlanError
    from topologies.hardware import load_catalog

    catalog = catalog or load_catalog()
    if why := skip_reason(row, catalog):
        return why
    doc = choices(row, base_doc(row))[0]
    try:
        plan = plan_from_dict(doc, catalog=catalog)
    except PlanError as e:
        return f"the Plan refuses it: {str(e).split(';')[0]}"
    from simcore.model import compute

    gpu, steps = GPU[row.accelerator], []
    stand_in = gpu not in catalog.efficiency   # the network check only: any entry decides which links a group uses
    if stand_in:
        catalog.efficiency[gpu] = catalog.efficiency[STAND_IN]
    compute.device_model.cache_clear()
    gap = False
    try:
        for scale in (1.0, 2.0):
            saved = _with_fabrics(catalog, scale)
            collectives.group_net.cache_clear()
            try:
                steps.append(simulate(plan_from_dict(doc, catalog=catalog)).step_time_s)
            except ValueError as e:
                if "(a gap)" not in str(e):
                    raise
                gap = True
                break
            finally:
                catalog.fabrics.update(saved)
                collectives.group_net.cache_clear()
    finally:
        if stand_in:
            del catalog.efficiency[gpu]
        compute.device_model.cache_clear()
    if gap:
        fab = plan.cluster.fabric.name if plan.cluster.fabric else "?"
        return (f"its groups cross leaf switches of {fab}, whose oversubscription is a catalog gap "
                "(the collectives refuse to price it)")
    if doc["cluster"].get("fabric") == PLACEHOLDER_FABRIC and abs(steps[0] - steps[1]) > 1e-9 * steps[0]:
        return f"a group leaves the ICI slice, and {NODE[row.accelerator]} has no network in the catalog"
    if stand_in:
        return f"{gpu}: no efficiency entry (none of its rows is predicted without a catalog gap, so none fits one)"
    return None


def measured_step_s(row: pd.Series) -> float:
    """Seconds per step as SOURCES.md derives it per source: MaxText's model TFLOP/s per chip
    over its own FLOP count (``calculate_training_tflops``: 6 x params x tokens + 12 x heads x
    layers x head_dim x seq^2 per sequence, the attention not halved, SOURCES.md); Neuron and
    MindSpeed: batch tokens over tokens/s/chip (SOURCES.md: Neuron "tokens/s/chip = seq/s × seq_len / (nodes × 16)
    is `derived`"; MindSpeed "The unit is **tokens/s/p** (per NPU)")."""
    b, s = float(row.global_batch_seqs), float(row.seq_len)
    if not math.isnan(float(_num(row.measured_step_time_s, float("nan")))):
        return float(row.measured_step_time_s)
    if row.source in MAXTEXT:
        return maxtext_flops(row) / (int(row.num_chips) * float(row.measured_tflops_per_chip) * 1e12)
    return b * s / (float(row.measured_tokens_per_s_per_chip) * int(row.num_chips))


def maxtext_params(row: pd.Series) -> float:
    """The param pytree's size of MaxText's base.yml decoder: q, k, v, o of heads x head_dim,
    a ReLU MLP (wi, wo), two RMSNorm scales per layer, the final norm, tied embeddings."""
    l, e, a, f, v = (int(row[k]) for k in ("layers", "hidden", "heads", "ffn_hidden", "vocab"))
    hd = head_dim(row)
    return l * (4 * e * a * hd + 2 * e * f + 2 * e) + e + v * e


def maxtext_flops(row: pd.Series) -> float:
    b, s, l, a = (float(row[k]) for k in ("global_batch_seqs", "seq_len", "layers", "heads"))
    return b * (6 * maxtext_params(row) * s + 12 * a * l * head_dim(row) * s * s)


def head_dim(row: pd.Series) -> int:
    return int(_flag(str(row.notes), r"head_dim=(\d+)") or int(row.hidden) // int(row.heads))


def _model(row: pd.Series) -> dict:
    notes = str(row.notes)
    h, heads = int(row.hidden), int(row.heads)
    m = {"name": str(row.model), "layers": int(row.layers), "hidden": h, "heads": heads,
         "seq_len": int(row.seq_len), "dropout": 0.0}
    if row.source in MAXTEXT:
        return {**m, "ffn_hidden": int(row.ffn_hidden), "vocab": int(row.vocab), "kv_channels": head_dim(row),
                "gated_mlp": False, "tied_embeddings": True, "position_embedding": "rope"}
    kv = _flag(notes, r"kv_(?:heads|groups)=(\d+)")
    llama_like = row.source == NEURON and str(row.model).lower().startswith("llama")
    if row.source == NEURON and not llama_like:   # NeMo GPT-3: GeLU MLP of 4h, learned positions
        return {**m, "ffn_hidden": int(_num(row.ffn_hidden, 4 * h)), "vocab": int(_num(row.vocab, 50304)),
                "gated_mlp": False, "tied_embeddings": True, "position_embedding": "learned"}
    ffn = int(_num(row.ffn_hidden, 4 * h))
    gated = llama_like or "use-fused-swiglu" in notes or ffn != 4 * h
    script = mindspeed_script(row) if row.source == MINDSPEED else {}
    vocab = int(_num(row.vocab, script.get("vocab") or 32000))
    out = {**m, "ffn_hidden": ffn, "vocab": vocab, "kv_heads": int(kv) if kv else heads,
           "gated_mlp": gated, "tied_embeddings": not script.get("untied", True), "position_embedding": "rope"}
    if experts := _flag(notes, r"experts=(\d+)"):
        out.update(experts=int(experts), top_k=int(_flag(notes, r"topk=(\d+)") or 2), capacity_factor=1.0)
    return out


def base_doc(row: pd.Series) -> dict:
    """The Plan document of a row by its source's rule (module docstring)."""
    src = row.source
    tp, pp, dp = (int(_num(row[k], 1)) for k in ("tp", "pp", "dp"))
    chips = int(row.num_chips)
    from topologies.hardware import load_catalog

    gpn = load_catalog().node(NODE[row.accelerator]).gpus_per_node
    cluster = {"node": NODE[row.accelerator], "nodes": max(1, math.ceil(chips / gpn))}
    if src in MAXTEXT and cluster["nodes"] > 1 and load_catalog().node(cluster["node"]).fabric is None:
        cluster["fabric"] = PLACEHOLDER_FABRIC
    # topology column, e.g. "2x v5p-128 (64 chips/slice, ICI 3D torus; 2 slice(s) over DCN)"
    if src in MAXTEXT and slices(row) > 1:   # one ICI torus a slice, the slices joined by the DCN
        cluster["nvlink_domain_gpus"] = chips // slices(row)
    training = {"global_batch": int(row.global_batch_seqs), "micro_batch": int(_num(row.micro_batch, 1)),
                "precision": "fp16" if str(row.precision) == "fp16" else "bf16", "flash_attention": True}
    rc = str(_num(row.recompute, "none"))
    if src in MAXTEXT:
        # FSDP over the slice's ICI (ici_fsdp_parallelism), data parallel over the DCN
        # (dcn_data_parallelism): parameters sharded inside a slice, replicated across slices. SOURCES.md: "Pure
        # FSDP over ICI", "Data parallel over DCN across slices"; zero_stage "3 = FSDP-style sharding of params,
        # grads and optimizer state (MaxText `fsdp` axes)"
        fsdp = int(row.fsdp) * slices(row)
        parallel = {"tp": tp, "pp": 1, "dp": fsdp, "zero": 3, "sequence_parallel": tp > 1, "tp_comm_overlap": tp > 1,
                    "dp_replicate": slices(row)}
        training["recompute"] = {"minimal": "dots"}.get(rc, rc)
        training["micro_batch"] *= tp   # one micro-batch a step: per-device x tp sequences a data-parallel rank
    elif src == NEURON:
        parallel = {"tp": tp // UNITS_PER_CHIP[src], "pp": pp, "dp": dp, "zero": int(_num(row.zero_stage, 1)),
                    "sequence_parallel": tp // UNITS_PER_CHIP[src] > 1}
        kv = int(_flag(str(row.notes), r"kv_(?:heads|groups)=(\d+)") or row.heads)   # as ``_model`` reads it
        if tp > kv:   # NxD copies each KV head onto tp / kv_heads NeuronCores (--kv_replicator: one head a core)
            parallel["kv_replicator"] = tp // kv
        training["recompute"] = rc
    else:   # MindSpeed-LLM: Megatron-LM arguments
        # zero_stage (SOURCES.md): "1 = Megatron distributed optimizer", set where the notes' script flags have
        # "use-distributed-optimizer"; the script "gives TP, PP, EP, MBS, GBS, ... recompute and flags"
        notes = str(row.notes)
        sp = tp > 1 and "sequence-parallel" in notes
        parallel = {"tp": tp, "pp": pp, "dp": dp, "zero": int(_num(row.zero_stage, 0)),
                    "sequence_parallel": sp, "tp_comm_overlap": sp and "use-mc2" in notes and "experts=" not in notes}
        if ep := int(_num(row.ep, 1)):
            parallel["ep"] = ep
        training["flash_attention"] = "use-flash-attn" in notes
        if m := re.match(r"full/(block|uniform)/(\d+)", rc):
            training["recompute"] = {"layers": int(m.group(2)), "method": m.group(1)}
        else:
            training["recompute"] = rc
    if pp > 1:
        parallel["schedule"] = "1f1b"
    return {"name": f"{src}:{row.model}", "model": _model(row), "cluster": cluster,
            "parallel": parallel, "training": training}


@functools.cache
def _mindspeed_scripts() -> dict:
    import yaml

    path = Path(__file__).resolve().parent.parent / "validation" / "mindspeed_scripts.yaml"
    return yaml.safe_load(path.read_text())


def mindspeed_script(row: pd.Series) -> dict:
    """What the row's MindSpeed-LLM script prints (``validation/mindspeed_scripts.yaml``; {} for a row with no
    ``config=`` in its notes)."""
    m = re.search(r"config=(\S+ @\w+)", str(row.notes))
    return _mindspeed_scripts().get(m.group(1), {}) if m else {}


def choices(row: pd.Series, doc: dict) -> list[dict]:
    """Neuron rows that leave recompute blank: the fastest fitting of none / selective / full
    (as the authors tuned the run), of selective / full where the row's framework is NeuronX
    Distributed (``nxd_row``: its Llama examples checkpoint the selected modules or every layer,
    ``simcore.plan.nxd_writer``); every other row: its one Plan."""
    if row.source == NEURON and _num(row.recompute) is None:
        policies = ("selective", "full") if nxd_row(row) else ("none", "selective", "full")
        return [{**doc, "training": {**doc["training"], "recompute": rc}} for rc in policies]
    return [doc]


def nxd_row(row: pd.Series) -> bool:
    """A Neuron row run with NeuronX Distributed, as its notes say ("framework=NeuronX Distributed")."""
    return row.source == NEURON and "framework=NeuronX Distributed" in str(row.notes)


def family(row) -> str:
    return FAMILY[row.accelerator]
