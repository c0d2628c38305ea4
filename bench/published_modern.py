"""Rules that map the rows of ``dev_modern.csv`` onto Plans, one rule per source.

``bench/validate_published.py`` uses them; see ../shared/validation/SOURCES.md for every
source's stack and counting. Nothing here is per row: each source's documented setup
becomes the same Plan fields for all its rows, and fields a source leaves blank are
filled by the fastest predicted choice that fits (as the authors tuned their runs).

Rows whose hardware, precision or model the Plan cannot express yet are left out with
the reason printed (``skip_reason``): a power-capped B200, sliding-window attention
(GPT-OSS). GB200 rows run on the catalog's
``gb200-nvl72`` (4-GPU trays in one 72-GPU NVLink domain; a job past one rack in the Slurm
segments Megatron-Bridge's launcher asks for, 64 GPUs at 256: ``bridge_segment_gpus``); MXFP8 / NVFP4 rows on
``training.precision`` mxfp8 / nvfp4 (Transformer Engine's block-scaled recipes).
"""
from __future__ import annotations

import math
import re

import pandas as pd

from simcore.model.peak import EXPANDABLE_SEGMENTS_MARGIN
from simcore.plan.readers import sdpa_attention_kernel
from topologies.hardware import load_catalog

#: GPUs of dev_modern rows, by the catalog node that carries them.
MODERN_NODES = {"h100-80gb": "dgx-h100", "h100-80gb-sxm": "dgx-h100", "b200 (DGX-B200)": "dgx-b200",
                "gb200 (DGX-GB200, NVL72)": "gb200-nvl72"}
TORCHAO_H100 = "h100 (80GB SXM or Meta's 96GB HBM2e variant: not stated)"
LLMFOUNDRY = ("llmfoundry_2024_h100_large_scale", "llmfoundry_2023_h100_bf16", "llmfoundry_2023_h100_fp8")
NEMO_LONG = ("nemo_longctx_2024_h100", "nemo_longctx_2025_b200")
TORCHAO = ("torchao_float8_readme_2025_h100", "torchao_mx_readme_2025_b200")
AUTOMODEL = "automodel_perf_summary_2026"
#: Trays (4-GPU nodes) of one GB200 NVL72 rack: Megatron-Bridge's launcher sizes a job's Slurm
#: segment, the trays sbatch keeps in one NVLink domain, by them (``bridge_segment_gpus``).
NVL72_TRAYS = 18


def bridge_segment_gpus(gpus: int, per_node: int = 4) -> int:
    """GPUs in one NVLink domain of a Megatron-Bridge job on GB200: its launcher passes sbatch
    ``--segment``, the job's node count up to 18, else the largest divisor of it up to 18
    (scripts/performance/utils/executors.py @21d102f5e: "add --segment flag to sbatch if job uses
    GB200", ``for segment_candidate in range(18, 0, -1): if nodes % segment_candidate == 0``).
    256 GPUs (64 trays) run in domains of 16 trays, 64 GPUs."""
    nodes = math.ceil(gpus / per_node)
    segment = nodes if nodes <= NVL72_TRAYS else next(s for s in range(NVL72_TRAYS, 0, -1) if nodes % s == 0)
    return per_node * segment
BRIDGE = "megatron_bridge_26.04.01_perf_summary"


#: torchtitan's fleet. The torchao README names only "8xH100". Its runs are torchtitan's, by the
#: same team at Meta, and torchtitan's own benchmark page (benchmarks/llama3_h100_202412_torchtitan.md
#: @820504e20) gives that fleet: Grand Teton, H100 96GB HBM2e at 2.4 TB/s, 500 W limit. Its
#: tables also peak at 82-84.5 GiB, more than an 80 GB part holds (ASSUMPTION: the same fleet;
#: the catalog's GPU is fitted to those tables, not to these rows).
TORCHTITAN_FLEET_NODE = "grand-teton-h100"


def _node(row: pd.Series) -> str | None:
    if row.gpu == TORCHAO_H100:
        return TORCHTITAN_FLEET_NODE
    return MODERN_NODES.get(row.gpu)


def skip_reason(row: pd.Series) -> str | None:
    """Why a row cannot become a Plan today, or None."""
    if "power limit" in str(row.gpu):   # notes: "single node 8xB200 limited to 750W" (torchao mx README @d8bb51f63)
        return f"GPU {row.gpu!r}: a power-capped part (the catalog's B200 is the 1000 W DGX B200)"
    if _node(row) is None:
        return f"GPU {row.gpu!r} is not in the catalog"
    notes = str(row.notes)
    model = notes[notes.rfind("Model:"):]
    if "sliding-window" in model:   # notes: "attention sinks, alternating 128-token sliding-window / full attention"
        return ("GPT-OSS: its attention sinks (model.attention_sinks) run in kernels with no catalog figures "
                "(TE's sink support, FlexAttention); with its sliding window modelled (model.sliding_window) the "
                "Bridge rows come out -17% to -39% (bench/RESULTS.md, twenty-ninth session)")
    if re.search(r"first layer dense", model) and not re.search(r"first \d+ layers? dense \(ffn", model):
        return "the dense layers' MLP width is not in the notes (Kimi K2)"
    return None


def _ends_split(row: pd.Series) -> list[int] | None:
    """Megatron's ``account_for_embedding_in_pipeline_split`` and ``..._loss_...`` (the
    recipe sets both where the notes say so): the embedding and the loss count as one layer
    each in the split, so the first and the last virtual stage hold one transformer layer
    fewer (none, where each stage holds one)."""
    if "account_for_embedding_in_pipeline_split" not in str(row.notes):
        return None
    stages = int(_num(row.pp, 1)) * int(_num(row.vpp_interleave, 1))
    units = int(row.layers) + 2
    if stages == 1 or units % stages:
        return None
    per = units // stages
    return [per - 1] + [per] * (stages - 2) + [per - 1]


def _flag(notes: str, pattern: str) -> str | None:
    m = re.search(pattern, notes)
    return m.group(1) if m else None


def _moe(notes: str) -> dict:
    """An MoE row's model fields from its notes' "Model:" line (the validation README: the
    notes give experts, top-k, shared experts, dense layers, head width and MLA): every
    family here runs SwiGLU experts (HF ``hidden_act: silu``), untied, token-dropless
    (capacity factor 1). ``ffn_hidden`` is one expert's width (the column). Notes: Bridge
    rows "MoE benchmarks force-balance the token distribution and are token-dropless"; Qwen3 "kv_heads=4, head_dim 128,
    SwiGLU"; DeepSeek "HF config deepseek-ai/DeepSeek-V3" (the HF config's words, not copied into the notes)."""
    model = notes[notes.rfind("Model:"):]
    experts, top_k = re.search(r"(\d+) (?:routed )?experts top-(\d+)", model).groups()
    out = {"experts": int(experts), "top_k": int(top_k), "gated_mlp": True, "tied_embeddings": False,
           "capacity_factor": 1.0}
    if m := re.search(r"\+ (\d+) shared", model):
        out["shared_ffn_hidden"] = int(m.group(1)) * int(re.search(r"moe_ffn (\d+)", model).group(1))
    if m := re.search(r"first (\d+) layers? dense \(ffn (\d+)\)", model):
        out.update(dense_layers=int(m.group(1)), dense_ffn_hidden=int(m.group(2)))
    if m := re.search(r"head_dim (\d+)", model):
        out["kv_channels"] = int(m.group(1))
    if m := re.search(r"MLA \(q_lora_rank (\d+), kv_lora_rank (\d+), qk_nope (\d+), qk_rope (\d+), v_head (\d+)\)",
                      model):
        q, kv, nope, rope, v = (int(x) for x in m.groups())
        out.update(q_lora_rank=q, kv_lora_rank=kv, kv_channels=nope, qk_rope_head_dim=rope, v_head_dim=v)
    return out


#: Megatron-Bridge's DeepSeek-V3 recipe, which both the B200 and the GB200 presets start from
#: (scripts/performance/configs/deepseek/deepseek_llm_pretrain.py imports it as ``pretrain_config``):
#: ``cfg.model.mtp_num_layers = 1`` and ``mtp_loss_scaling_factor = 0.1``
#: (src/megatron/bridge/recipes/deepseek/deepseek_v3.py @21d102f5e ``deepseek_v3_pretrain_config``);
#: the presets' layouts put the MTP module with the loss on the last stage (``pp_layout``
#: 'Et*4|(t*4|)*14tmL', 'm'; ``set_deepseek_v3_pipeline_model_parallel_layout``'s ``last_layer``).
BRIDGE_DEEPSEEK_V3_MTP_LAYERS = 1
#: The same recipe's split of the 61 layers over 16 virtual stages (its ``layout_map`` for (pp, vp) =
#: (16, 1), (8, 2) and (4, 4), the GB200 preset's; the B200 preset's pp_layout 'Et*4|(t*4|)*14tmL'):
#: four layers a stage, and the last stage one layer with the MTP module and the loss.
BRIDGE_DEEPSEEK_V3_SPLIT = {16: [4] * 15 + [1]}


def _bridge_deepseek_v3(row: pd.Series) -> bool:
    return row.source == BRIDGE and str(row.model).upper().startswith("DEEPSEEKV3")


def _mtp(row: pd.Series) -> dict:
    """``model.mtp_layers`` of a row whose source states its MTP depth: Megatron-Bridge's DeepSeek-V3
    rows (AutoModel's DeepSeek-V3 configs and the other MoE rows state none: none is modelled)."""
    return {"mtp_layers": BRIDGE_DEEPSEEK_V3_MTP_LAYERS} if _bridge_deepseek_v3(row) else {}


def _model(row: pd.Series) -> dict:
    """The model: llm-foundry's MPT (learned positions, biases, tied: the MPTConfig
    defaults its yamls keep, SOURCES.md); Llama-family rows read kv_heads, SwiGLU and
    untied embeddings from the notes, as the validation README says."""
    notes = str(row.notes)
    heads = int(row.heads)
    m = {"name": row.model, "layers": int(row.layers), "hidden": int(row.hidden), "heads": heads,
         "ffn_hidden": int(row.ffn_hidden), "vocab": int(row.vocab), "seq_len": int(row.seq_len)}
    if row.source in LLMFOUNDRY:   # MPTConfig: resid_pdrop, emb_pdrop and attn_pdrop default to 0.0
        return {**m, "gated_mlp": False, "tied_embeddings": True, "position_embedding": "learned", "dropout": 0.0}
    # the Llama-family stacks train without dropout (Megatron-Bridge Llama3ModelProvider and the
    # Hugging Face configs: hidden_dropout / attention_dropout 0.0; torchtitan's Llama has none)
    m["dropout"] = 0.0
    kv = _flag(notes, r"kv_heads=(\d+)")
    if re.search(r"\d+ (routed )?experts", notes):
        return {**m, "kv_heads": int(kv) if kv else heads, "position_embedding": "rope", **_moe(notes), **_mtp(row)}
    # notes (nemo_longctx_2024_h100): "Llama 2 7B: MHA (kv_heads=32), SwiGLU, untied embeddings"
    llama2 = "LLAMA2" in str(row.model).upper()  # Llama 2 7B: MHA, SwiGLU, untied (HF config)
    return {**m, "kv_heads": int(kv) if kv else heads, "gated_mlp": llama2 or "SwiGLU" in notes,
            "tied_embeddings": not (llama2 or "untied" in notes), "position_embedding": "rope"}


def _triton_attention(row: pd.Series) -> bool:
    """llm-foundry runs whose MPT config chose the Triton FlashAttention (``attn_impl:
    triton``): every 2023 H100 table (the pretrain yamls of that time, e.g. llm-foundry
    scripts/train/yamls/pretrain/mpt-3b.yaml @34c28fc9, ``attn_config: attn_impl: triton``),
    and 13B / 30B in the 2024 large-scale sweep (sweep.py, SOURCES.md)."""
    if row.source in LLMFOUNDRY[1:]:
        return True
    return row.source == LLMFOUNDRY[0] and any(k in str(row.model).lower() for k in ("13b", "30b"))


def _num(x, default=None):
    return default if x is None or (isinstance(x, float) and math.isnan(x)) else x


def _precision(row: pd.Series) -> dict:
    """The precision and FP8 scaling of a row: torchao's rows name theirs ("Scaling
    'float8 tensorwise ...'" / "'rowwise ...'"), Megatron-Bridge's FP8 is FP8-CS (current
    scaling); llm-foundry's amp_fp8 (TE 0.10) and NeMo 24.03 use TE's default, delayed. llm-foundry's notes:
    "Composer amp_fp8 = TE fp8_autocast (delayed scaling default)"; NeMo's precision: "FP8 recipe not stated"."""
    prec, notes = str(row.precision), str(row.notes)
    if row.source in TORCHAO:
        scaling = notes.split("Scaling '")[1].split("'")[0]
        if "float8" in scaling or scaling.startswith(("tensorwise", "rowwise")):
            return {"precision": "fp8", "fp8_recipe": "rowwise" if "rowwise" in scaling else "tensorwise"}
        return {"precision": "bf16"}
    if prec.startswith(("fp8", "amp_fp8")):
        return {"precision": "fp8", "fp8_recipe": "current" if "FP8-CS" in prec else "delayed"}
    if prec.startswith(("mxfp8", "nvfp4")):   # Transformer Engine MXFP8BlockScaling / NVFP4BlockScaling
        return {"precision": prec.split()[0]}
    return {"precision": "bf16"}


def _deepep(row: pd.Series, ep: int) -> bool:
    """MoE rows whose notes name DeepEP (AutoModel's ``dispatcher: deepep``, its "TE + DeepEP"
    kernels) or Megatron-Core's flex dispatcher over DeepEP or HybridEP (Megatron-Bridge presets)
    run ``parallel.moe_dispatcher: deepep``: both backends send a token once to each rank holding
    one of its experts (Megatron-Core ``moe/token_dispatcher.py`` ``MoEFlexTokenDispatcher``:
    the routing map is reduced to ranks before the dispatch), not once per expert. Notes: AutoModel "kernels 'TE +
    DeepEP'", "dispatcher deepep"; Bridge "flex dispatcher hybridep", "deepep dispatcher", "hybridep"."""
    return ep > 1 and re.search(r"(?i)deepep|hybridep", str(row.notes)) is not None


def _moe_overlap(row: pd.Series, ep: int) -> dict:
    """Megatron-Bridge's MoE presets that set ``moe_a2a_overlap`` (the notes quote the preset of
    scripts/performance/configs at the table's commit): Megatron-Core's combined 1F1B schedule,
    ``--overlap-moe-expert-parallel-comm`` (``parallel.moe_a2a_overlap``)."""
    if row.source == BRIDGE and ep > 1 and re.search(r"Recipe preset[^.]*moe_a2a_overlap", str(row.notes)):
        return {"moe_a2a_overlap": True}
    return {}


def _bridge_tp_overlap(row: pd.Series, tp: int) -> bool:
    """Megatron-Bridge's Llama recipes overlap TP communication with the GEMMs (Transformer
    Engine userbuffers): ``llama3_70b_pretrain_config`` and ``llama31_405b_pretrain_config``
    set ``CommOverlapConfig(tp_comm_overlap=True)`` (src/megatron/bridge/recipes/llama/llama3.py
    @0d5f5558), and the performance scripts keep it on every GPU except for NVFP4
    (scripts/performance/configs/llama/llama3_llm_pretrain.py @2a0d46e2 and
    llama31_llm_pretrain.py @0013c9a8: ``tp_comm_overlap = False if precision == "nvfp4"``).
    The MoE recipes are left as the Plan's default (no overlap); the one MoE row with tp > 1 (Qwen3 235B on H100)
    agrees: ``qwen3_235b_a22b_pretrain_config_h100`` sets ``CommOverlapConfig(tp_comm_overlap=False)``
    (scripts/performance/configs/qwen/qwen3_llm_pretrain.py @21d102f5e)."""
    return (row.source == BRIDGE and tp > 1 and "LLAMA" in str(row.model).upper()
            and not str(row.precision).startswith("nvfp4"))


#: The gradient buffer and its reduction of every Megatron-Bridge performance run: the published
#: table's scripts override the recipes' fp32 default, ``cfg.mixed_precision.grad_reduce_in_fp32 =
#: False; cfg.ddp.grad_reduce_in_fp32 = False`` in every model family's
#: scripts/performance/configs/*/*_llm_pretrain.py @21d102f5e (the table's commit), so the gradients
#: are held and reduced in bf16 (Megatron ``--grad-reduce-in-bf16``).
BRIDGE_GRAD_DTYPE = "bf16"
#: NeMo 1.0's performance runs of 2024 on DGX-H100 keep Apex DistributedFusedAdam's gradient
#: buffer and its reduce-scatter in bf16: NVIDIA's launcher examples for every GPT and Llama 2
#: model on A100 and H100 pass ``+training.model.optim.grad_sync_dtype=bf16`` (NeMo-Framework-
#: Launcher examples/training/llama/h100/llama2_7b_fp8.sh and 38 others, added in e743722a,
#: 10 April 2024, "Added to example configs"; Apex's default is the optimizer's fp32).
NEMO_2024_GRAD_DTYPE = "bf16"


def base_doc(row: pd.Series) -> dict:
    """The Plan document of a row by its source's rule."""
    src = row.source
    tp, pp, dp, cp = (int(_num(row[k], 1)) for k in ("tp", "pp", "dp", "cp"))
    gpn = int(_num(row.gpus_per_node, 8))
    cluster = {"node": _node(row), "nodes": max(1, math.ceil(int(row.num_gpus) / gpn))}
    if cluster["node"] == "gb200-nvl72" and int(row.num_gpus) > (seg := bridge_segment_gpus(int(row.num_gpus), gpn)):
        cluster["nvlink_domain_gpus"] = seg
    vpp = int(_num(row.vpp_interleave, 1))
    ep = int(_flag(str(row.notes), r"EP (\d+)") or 1)   # "Published: ... EP n" (carved out of dp x cp)
    # expert TP 1 where EP spans TP ranks: notes "EP64 ETP1" (DeepSeek), ``BASE_QWEN3_235B_A22B_CONFIG =
    # WorkloadBaseConfig(expert_tensor_parallel_size=1)`` (qwen3_workload_base_configs.py @21d102f5e)
    folded = ep > 1 and (dp * cp) % ep != 0   # EP across TP ranks: Megatron-Core's MoE parallel folding
    # sequence_parallel: Bridge notes "Recipe facts: sequence_parallel = tp > 1" (NeMo's notes: "Not stated: ...")
    parallel = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "vpp": vpp, "ep": ep, **({"expert_tp": 1} if folded else {}),
                "schedule": "interleaved-1f1b" if vpp > 1 else "1f1b",
                "zero": int(_num(row.zero_stage, 1)), "sequence_parallel": tp > 1}
    if split := _ends_split(row):
        parallel["stage_layers"] = split
    elif _bridge_deepseek_v3(row) and pp * vpp in BRIDGE_DEEPSEEK_V3_SPLIT:
        parallel["stage_layers"] = BRIDGE_DEEPSEEK_V3_SPLIT[pp * vpp]
    training = {"global_batch": int(row.global_batch_seqs), "micro_batch": int(_num(row.micro_batch, 1)),
                "recompute": str(_num(row.recompute, "none")), "flash_attention": True, **_precision(row)}
    if src in TORCHAO or src == AUTOMODEL:
        parallel["zero"] = 3  # FSDP2 fully_shard over the dp ranks
        # notes: torchao "FSDP2 data_parallel_shard_degree -1"; AutoModel "PyTorch backend (FSDP2)"
    if _bridge_tp_overlap(row, tp):
        parallel["tp_comm_overlap"] = True
    if src == BRIDGE and parallel["zero"] == 1:
        # Megatron-Bridge's recipes: DistributedDataParallelConfig(use_distributed_optimizer=True,
        # overlap_grad_reduce=True, overlap_param_gather=True): ``cfg.ddp.overlap_param_gather = True`` in
        # recipes/llama/llama3.py, deepseek/deepseek_v3.py, qwen/qwen3_moe.py @21d102f5e; but the 405B GB200 preset
        # calls ``disable_param_gather_overlap(cfg)`` ``if precision == "nvfp4" and config_variant.lower() == "v2"``
        # (scripts/performance/configs/llama/llama31_llm_pretrain.py @21d102f5e): row 73 ran without it
        parallel["overlap_param_gather"] = True
    if src == NEMO_LONG[0]:
        training["grad_compression"] = NEMO_2024_GRAD_DTYPE
    if src == BRIDGE:
        training["grad_compression"] = BRIDGE_GRAD_DTYPE
        # the launcher runs every job under expandable_segments:True (``PERF_ENV_VARS`` in
        # scripts/performance/utils/executors.py @21d102f5e)
        training["allocator_margin"] = EXPANDABLE_SEGMENTS_MARGIN
    if offloaded := _flag(str(row.notes), r"cpu_offloading_num_layers=(\d+)"):   # Megatron-Core's activation offload
        training["activation_offload"] = int(offloaded)
    if _deepep(row, ep):
        parallel["moe_dispatcher"] = "deepep"
    parallel.update(_moe_overlap(row, ep))
    if ep > 1 and "fake_balanced_gate" in str(row.notes):
        # AutoModel's benchmark gate: token t runs experts tk .. tk+k-1 (nemo_automodel/components/
        # moe/layers.py FakeBalancedGate @e45812012, noise 0 by default), the configs' fake_balanced_gate
        training["moe_routing"] = "round_robin"
    if src in TORCHAO:
        training["recompute"] = "op"  # torchtitan per-op SAC (selective_ac_option "op")
        # torchao's benchmark scripts launch torchtitan's run_train.sh, which sets
        # PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" (bench/validate_memory.py
        # ``EXPANDABLE_SEGMENTS_SOURCES``; both tables ran on CUDA): pytorch/ao float8_training_benchmark.sh
        # @8c81863ba runs "${TORCHTITAN_ROOT}/run_train.sh"; torchtitan's run_train.sh @0da8901b1 sets it
        training["allocator_margin"] = EXPANDABLE_SEGMENTS_MARGIN
        # notes: "SDPA flash attention".
        # torchtitan's attention is SDPA, whose flash backend (Dao's FlashAttention-2 kernels) runs
        # on H100: torch made its cuDNN backend opt-in in 2.5.1 (pytorch/pytorch#138522)
        training["attention_kernel"] = sdpa_attention_kernel(load_catalog().node(cluster["node"]).gpu)
    if _triton_attention(row):
        training["attention_kernel"] = "triton"
    elif row.source in LLMFOUNDRY:
        # attn_impl flash: Dao's FlashAttention-2 kernels (submit_benchmarks.py installs
        # '.[gpu-flash2]' = flash-attn==2.4.2 @5e85bd62d), not the cuDNN kernel of the H100 entry,
        # through its varlen API: llmfoundry/models/layers/attention.py flash_attn_fn @5e85bd62d
        # unpads Q, K, V (bert_padding.unpad_input, an all-ones mask when none is given) and pads
        # the output every layer
        training.update(attention_kernel="flash2", attention_unpad=True)
    return {"name": f"{src}:{row.model}", "model": _model(row), "cluster": cluster,
            "parallel": parallel, "training": training}


def choices(row: pd.Series, doc: dict) -> list[dict]:
    """NeMo's long-context table leaves recompute and the micro-batch blank: the fastest
    fitting of none / selective / full recompute at micro-batch 1 (one sequence of up to
    1M tokens per rank; the table's batches are 4M tokens in all).

    AutoModel's recompute is read from the example config of the table's commit, and its
    notes say the measurement may predate the config: where the config's ``none`` does not fit
    the GPU, the run evidently checkpointed, and AutoModel's one switch
    (``activation_checkpointing: true``) wraps each transformer block whole
    (nemo_automodel/components/moe/parallelizer.py ``apply_ac`` @e45812012): the fastest
    fitting of none / full."""
    if row.source == AUTOMODEL and doc["training"]["recompute"] == "none":
        return [doc, {**doc, "training": {**doc["training"], "recompute": "full"}}]
    if row.source not in NEMO_LONG:
        return [doc]
    return [{**doc, "training": {**doc["training"], "recompute": rc}} for rc in ("none", "selective", "full")]


def nemo_flops(row: pd.Series) -> float:
    """NeMo's llama FLOPs per step (flops_formulas.py before 6251117f4c): no causal halving."""
    b, s, l, h = (float(row[k]) for k in ("global_batch_seqs", "seq_len", "layers", "hidden"))
    notes = str(row.notes)
    g = float(_flag(notes, r"kv_heads=(\d+)") or row.heads)
    a, f, v = float(row.heads), float(row.ffn_hidden), float(row.vocab)
    return b * s * l * h * h * (12 + 12 * g / a + 18 * f / h + 12 * s / h + 6 * v / (l * h))


def measured_step_s(row: pd.Series) -> float:
    """Seconds per step as SOURCES.md derives it: the published step time where there is
    one (AutoModel), else batch tokens over tokens/s, else FLOPs over TFLOP/s (NeMo)."""
    if not math.isnan(row.measured_step_time_s):
        return float(row.measured_step_time_s)
    if not math.isnan(row.measured_tokens_per_s_per_gpu):
        return row.global_batch_seqs * row.seq_len / (row.measured_tokens_per_s_per_gpu * row.num_gpus)
    if row.source in NEMO_LONG:
        return nemo_flops(row) / (row.num_gpus * row.measured_tflops_per_gpu * 1e12)
    raise ValueError(f"no step-time rule for source {row.source}")


def precision_pairs(table: pd.DataFrame, fast: str, slow: str) -> pd.DataFrame:
    """Rows of precision ``fast`` beside the same-layout row of precision ``slow`` from the same
    publication (Megatron-Bridge's 70B and 405B GB200 MXFP8 / NVFP4 pairs): the published and
    predicted speed-up of ``fast`` over ``slow``."""
    keys = ["source", "model", "seq_len", "gpus", "tp", "pp", "dp", "global_batch"]
    a, b = table[table.precision == fast], table[table.precision == slow]
    pairs = a.merge(b, on=keys, suffixes=("", "_slow"))
    pairs = pairs.assign(published=pairs.measured_s_slow / pairs.measured_s,
                         predicted=pairs.predicted_s_slow / pairs.predicted_s)
    pairs["error"] = pairs.predicted / pairs.published - 1
    return pairs[["model", "gpus", "precision", "precision_slow", "published", "predicted", "error"]]


def fp8_pairs(table: pd.DataFrame) -> pd.DataFrame:
    """FP8 rows of ``table`` (validate_published's per-row output for dev_modern.csv) beside
    their BF16 twin (same model, sequence, GPUs, micro-batch and batch, of the same
    publication): the published and predicted FP8/BF16 speed-up of each pair."""
    keys = ["model", "seq_len", "gpus", "mb", "global_batch", "family"]
    t = table.assign(family=table.source.str.replace(r"_(bf16|fp8)$", "", regex=True))
    fp8, bf16 = t[t.precision != "bf16"], t[t.precision == "bf16"]
    pairs = fp8.merge(bf16, on=keys, suffixes=("", "_bf16"))
    pairs = pairs.assign(published=pairs.measured_s_bf16 / pairs.measured_s,
                         predicted=pairs.predicted_s_bf16 / pairs.predicted_s)
    pairs["error"] = pairs.predicted / pairs.published - 1
    return pairs[["source", "model", "seq_len", "precision", "published", "predicted", "error"]]
