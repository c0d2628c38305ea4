"""The accelerators beside the GPUs (issue 54): TPU, Trainium, Gaudi, Ascend, GH200 entries
with their sources; a figure no source gives stays a gap (NaN), and a plan that needs one is
refused in one sentence."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from simcore.plan.spec import PlanError
from topologies.hardware import load_catalog

NEW = {"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu7x", "trn1", "trn2", "trn3", "gaudi2", "gaudi3",
       "ascend-910b", "ascend-910c", "gh200"}
HOSTS = {"tpu-v4-host", "tpu-v5e-host", "tpu-v5p-host", "tpu-v6e-host", "tpu7x-host", "trn1-32xl",
         "trn2-48xl", "hls-gaudi2", "hls-gaudi3", "atlas-800t-a2", "cloudmatrix-384"}


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


def test_every_new_accelerator_has_its_unit_source_and_datasheet_peaks(cat):
    raw = __import__("yaml").safe_load(open(__import__("topologies.hardware").hardware.CATALOG_DIR / "gpus.yaml"))
    assert NEW <= set(cat.gpus)
    for name in NEW:
        g = cat.gpus[name]
        assert g.source.strip() and str(raw[name].get("unit", "")).strip(), name
        assert g.peak("bf16") and g.peak("bf16") > 1e14, name
    # checked against the stored sources (SOURCES.md, 'Accelerators beside the GPUs')
    assert cat.gpus["tpu7x"].peak("fp8") == pytest.approx(4614e12)
    assert cat.gpus["tpu-v5p"].peak("fp8") == cat.gpus["tpu-v5p"].peak("bf16")   # no FP8 speed-up on v5p
    assert cat.gpus["trn2"].peak("bf16") == pytest.approx(667e12) and cat.gpus["trn2"].peak("fp8") == pytest.approx(1299e12)
    assert cat.gpus["gaudi3"].intra_link_bytes_per_s == pytest.approx(525e9)
    assert cat.gpus["trn1"].hbm_bytes_per_s == pytest.approx(820 * 2**30, rel=1e-3)   # 820 GiB/s


def test_a_gap_is_nan_never_an_invented_figure(cat):
    for name in NEW:
        g = cat.gpus[name]
        for key, value in (("tdp_w", g.tdp_w), ("hbm_tbyte_per_s", g.hbm_bytes_per_s),
                           ("pcie_gbyte_per_s_bidir", g.pcie_bytes_per_s),
                           ("intra_link_gbyte_per_s_bidir", g.intra_link_bytes_per_s)):
            assert math.isnan(value) == (key in g.gaps), (name, key)
    assert "tdp_w" in cat.gpus["tpu-v5p"].gaps and cat.gpus["gaudi3"].tdp_w == 900


def test_hosts_resolve_with_their_torus_and_fabric(cat):
    for name in HOSTS:
        node = cat.node(name)
        assert node.gpu.name in NEW and node.source.strip()
        assert node.fabric is None or node.fabric in cat.fabrics
    v5p = cat.node("tpu-v5p-host")
    assert (v5p.torus_dims, v5p.torus_wrap, v5p.torus_wrap_all, v5p.nvlink_domain_gpus) == (3, 4, True, 6144)
    assert cat.node("tpu-v6e-host").torus_dims == 2 and cat.node("trn2-48xl").torus_dims == 2
    assert cat.node("dgx-h100").torus_dims == 0
    assert all(cat.fabrics[f].source for f in ("gcp-dcn-50", "gcp-dcn-100", "gcp-dcn-200", "efa-v3", "gaudi3-roce-200"))


def test_the_accelerators_priced_to_rent_join_the_procurement_defaults(cat):
    # issue 54 item 4: procure weighs TPU and Trainium beside the GPUs; the rest are named, not dropped
    from simcore.planner.procure_input import default_gpus, default_kinds

    assert NEW & set(default_gpus()) == {"tpu-v6e", "trn1"}
    assert cat.prices.gpus["tpu-v6e"].on_demand_usd == 2.70 and "tpu-v5p" not in cat.prices.gpus
    kinds, unweighed = default_kinds("bf16")
    assert "v100-32gb" not in kinds and any("no bf16 peak" in s and "v100-32gb" in s for s in unweighed)
    unpriced = " ".join(s for s in unweighed if "no rental price" in s)
    assert all(g in unpriced for g in NEW - {"tpu-v6e", "trn1"} if g in {n.gpu.name for n in map(cat.node, HOSTS)})


#: The accelerators whose efficiency entry bench/fit.py fits to their family's rows of
#: ../shared/validation/dev_accelerators.csv (the TPU family under MaxText, Trn1 under Neuron's
#: NxD and neuronx-nemo-megatron, the Ascend 910B under MindSpeed-LLM), and the family's later chips
#: it writes the same plateau to (EXTENDED: no row of their own); every other new one has none.
FAMILIES = {"tpu": {"tpu-v4", "tpu-v5e", "tpu-v5p"}, "trainium": {"trn1"}, "ascend": {"ascend-910b"}}
EXTENDED = {"tpu": {"tpu-v6e", "tpu7x"}, "trainium": {"trn2"}, "ascend": {"ascend-910c"}}
#: Eager stacks (MindSpeed-LLM on torch_npu) whose fitted interference beside fused communication is theirs.
EAGER = {"ascend-910b", "ascend-910c"}
FITTED = set().union(*FAMILIES.values())
WITH_ENTRY = FITTED | set().union(*EXTENDED.values())


def test_simulate_refuses_what_the_catalog_lacks_in_one_sentence(cat):
    # an efficiency curve only from the fit to development rows (issue 54 item 3), on the chips that
    # have rows or a family that does; the rest refuse
    from simcore.model.compute import device_model

    assert NEW & set(cat.efficiency) == WITH_ENTRY
    for name in NEW - WITH_ENTRY:
        assert "efficiency" in cat.gpus[name].gaps, name
        with pytest.raises(PlanError) as err:
            device_model(cat.gpus[name], "bf16")
        assert str(err.value).startswith(f"GPU '{name}' has no entry in topologies/catalog/efficiency.yaml")
        assert "\n" not in str(err.value)


def test_an_accelerator_gets_an_efficiency_entry_only_from_the_fit_with_its_rows_named(cat):
    for name in FITTED:
        e = cat.efficiency[name]
        assert "efficiency" not in cat.gpus[name].gaps
        assert "FITTED by bench/fit.py" in e["matmul"]["source"] and "dev_accelerators.csv" in e["matmul"]["source"]
        # the GPU stacks' eager per-kernel figures are not written to another stack, compiled (XLA,
        # Neuron) or eager on its own device (torch_npu): an Ascend interference is the Ascend fit's
        assert not {"kernel_overhead_us", "host_overhead_us"} & set(e)
        assert ("comm_compute_interference" in e) == (name in EAGER), name
        if name in EAGER:
            assert "FITTED by bench/fit.py" in e["comm_compute_interference_source"]
    for family, names in FAMILIES.items():
        plateaus = {cat.efficiency[n]["matmul"]["points"][-1][1] for n in names | EXTENDED[family]}
        assert len(plateaus) == 1, family   # one matrix-unit plateau for the family, its later chips included
        for name in EXTENDED[family]:   # said to be extended, not fitted to rows of its own
            e = cat.efficiency[name]
            assert "EXTENDED" in e["matmul"]["source"] and "no row" in e["matmul"]["source"], name
            assert "efficiency" not in cat.gpus[name].gaps, name
            assert not {"kernel_overhead_us", "host_overhead_us"} & set(e)
            assert ("comm_compute_interference" in e) == (name in EAGER), name
    # Neuron's own words for the compiled step (lazy torch-xla graphs, neuronx-cc), not an analogy only
    assert "lazy mode" in cat.efficiency["trn1"]["overheads_source"]
    assert "one source" in cat.efficiency["trn1"]["matmul"]["source"]
    assert "one source" in cat.efficiency["ascend-910b"]["matmul"]["source"]


def test_the_910b_figures_are_huaweis_own_model_and_its_mesh_is_one_link_a_peer(cat):
    # Ascend/msmodeling tensor_cast/device.py @84fec853 (ATLAS_800.A2_376T_64G, A2_INTERCONNECT)
    g, node = cat.gpus["ascend-910b"], cat.node("atlas-800t-a2")
    assert g.hbm_bytes_per_s == pytest.approx(1.6 * 1024**4, rel=1e-3) and g.hbm_bytes == 64 * 2**30
    assert g.intra_link_bytes_per_s == pytest.approx(196e9) and node.intra == "hccs-mesh"
    assert "msmodeling" in g.source and "msmodeling" in node.source
    fab = cat.fabrics[node.fabric]
    assert node.nics_per_node == 8 and fab.nic_bytes_per_s == pytest.approx(25e9)
    assert math.isnan(fab.oversubscription) and "oversubscription" in fab.gaps   # the model states none
    # the 910C package: two dies of the A3 profile (ATLAS_800_A3_752T_128G_DIE), the '752 TFLOPS' being fp16's
    c = cat.gpus["ascend-910c"]
    assert c.peak("bf16") == pytest.approx(2 * 353.9e12) and c.peak("fp16") == pytest.approx(752e12)
    assert c.hbm_bytes == 2 * g.hbm_bytes and c.hbm_bytes_per_s == pytest.approx(2 * g.hbm_bytes_per_s, rel=1e-3)
    assert c.intra_link_bytes_per_s == pytest.approx(2 * 196e9)
    cm = cat.node("cloudmatrix-384")
    assert cm.nvlink_domain_gpus == 384 and cm.intra == "nvswitch" and cm.fabric is None


def test_a_cloudmatrix_needs_no_network_inside_its_supernode_and_one_beyond():
    from simcore.plan.load import plan_from_dict

    def plan(nodes):
        return plan_from_dict({"model": "llama3-70b", "cluster": {"node": "cloudmatrix-384", "nodes": nodes},
                               "parallel": {"tp": 8, "dp": nodes}, "training": {"global_batch": 8 * nodes}})

    assert plan(48).cluster.gpus == 384                  # 48 nodes on one Unified Bus: no NIC to route
    with pytest.raises(PlanError, match=r"^cluster.nodes=49 needs a network: cluster.node=cloudmatrix-384 has no "
                                        r"fabric, set cluster.fabric$"):
        plan(49)


#: Gaps the step-time model never reads: the host link (offload only) and the power.
UNREAD = {"pcie_gbyte_per_s_bidir", "tdp_w"}


def test_an_efficiency_entry_needs_the_figures_the_model_reads(cat):
    # whoever adds an efficiency entry for a gapped accelerator must first fill (or refuse) its gaps
    for name, g in cat.gpus.items():
        if name in cat.efficiency:
            assert set(g.gaps) <= UNREAD, name


def test_a_tpu_is_charged_xla_runtime_reserve_not_the_cuda_context_and_allocator(cat):
    # XLA:TPU's HBM report: 'reserved 530.00M', buffers assigned at compile time (0.0-0.4% fragmentation)
    from simcore.model.peak import ALLOCATOR_MARGIN, CUDA_CONTEXT_BYTES, framework_terms
    from simcore.plan.load import plan_from_dict

    doc = {"model": "llama3-8b", "parallel": {"tp": 1, "dp": 16, "zero": 3}, "training": {"global_batch": 64}}
    tpu = plan_from_dict({**doc, "cluster": {"node": "tpu-v5p-host", "nodes": 4}})
    gpu = plan_from_dict({**doc, "cluster": {"node": "dgx-h100", "nodes": 2}})
    context, margin, _ = framework_terms(tpu)
    assert context == 530 * 2**20 and margin == 0.004
    assert "reserved 530.00M" in cat.efficiency["tpu-v5p"]["memory"]["source"]
    assert framework_terms(gpu)[:2] == (CUDA_CONTEXT_BYTES, ALLOCATOR_MARGIN)
    for name in ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu7x"):
        assert cat.efficiency[name]["memory"]["framework_bytes"] == 530 * 2**20, name


def test_offload_over_a_host_link_the_catalog_lacks_is_refused_not_infinite():
    # the TPUs' and Trainium's PCIe rates are gaps: offloading over them has no time to price
    from simcore.plan.load import plan_from_dict
    from simcore.plan.rules import check_plan

    plan = plan_from_dict({"model": "llama3-8b", "cluster": {"node": "tpu-v5p-host", "nodes": 4},
                           "parallel": {"tp": 1, "dp": 16, "zero": 3}, "training": {"global_batch": 64}})
    check_plan(plan)
    with pytest.raises(PlanError) as err:
        check_plan(plan_from_dict({"model": "llama3-8b", "cluster": {"node": "tpu-v5p-host", "nodes": 4},
                                   "parallel": {"tp": 1, "dp": 16, "zero": 3},
                                   "training": {"global_batch": 64, "offload": "optimizer"}}))
    assert str(err.value) == ("training.offload=optimizer moves states over the host link, whose bandwidth "
                              "(pcie_gbyte_per_s_bidir) is a gap in the catalog entry of the GPU: tpu-v5p")


def test_efa_on_trn1_is_non_blocking_as_its_source_says_and_efa_v3_stays_a_gap(cat):
    trn1, v3 = cat.fabrics["efa-trn1"], cat.fabrics["efa-v3"]
    assert trn1.oversubscription == 1.0 and "oversubscription" not in trn1.gaps
    assert "non-blocking petabit-scale EFA networking infrastructure" in trn1.source and "trn1-arch.rst" in trn1.source
    assert math.isnan(trn1.latency_s) and "latency_us" in trn1.gaps        # no source prints it
    assert math.isnan(v3.oversubscription) and "oversubscription" in v3.gaps   # trn2-arch.rst says nothing of it


def _trn1_step(cat, **gpu_figures) -> float:
    """A trn1 plan across four instances (its DP groups cross EFA), with the trn1 entry's
    figures replaced by ``gpu_figures`` for the call."""
    import dataclasses

    from simcore.engine.predict import simulate
    from simcore.model import collectives, compute
    from simcore.plan.load import plan_from_dict

    saved = cat.gpus["trn1"]
    cat.gpus["trn1"] = dataclasses.replace(saved, **gpu_figures)
    compute.device_model.cache_clear()
    collectives.group_net.cache_clear()
    try:
        return simulate(plan_from_dict({
            "model": "llama2-7b", "cluster": {"node": "trn1-32xl", "nodes": 4},
            "parallel": {"tp": 4, "dp": 16, "zero": 1, "sequence_parallel": True},
            "training": {"global_batch": 64, "micro_batch": 1, "recompute": "selective"}}, catalog=cat)).step_time_s
    finally:
        cat.gpus["trn1"] = saved
        compute.device_model.cache_clear()
        collectives.group_net.cache_clear()


def test_trn1s_remaining_gaps_are_not_read_by_the_step_model(cat):
    # the rule above, checked: trn1's gaps (host PCIe, TDP) are NaN, and filling them with any
    # number leaves the step time where it was
    assert set(cat.gpus["trn1"].gaps) == {"pcie_gbyte_per_s_bidir", "tdp_w"}
    step = _trn1_step(cat)
    assert math.isfinite(step) and step > 0
    assert _trn1_step(cat, pcie_bytes_per_s=1e9, tdp_w=1.0) == step
    assert _trn1_step(cat, pcie_bytes_per_s=1e12, tdp_w=1e4) == step


def test_topology_of_hosts_over_a_network_with_a_gap_draws_one_logical_switch_and_says_so(cat):
    # Trn2's EFAv3 has no oversubscription figure (trn2-arch.rst says nothing of it): no leaf/spine
    # is invented, the summary says so
    from simcore.plan.load import plan_from_dict
    from topologies.build import build_cluster
    from topologies.routes import cluster_summary

    plan = plan_from_dict({"model": "llama3-8b", "cluster": {"node": "trn2-48xl", "nodes": 16},
                           "parallel": {"tp": 4, "dp": 64, "zero": 1}, "training": {"global_batch": 64}})
    graph = build_cluster(plan.cluster)
    summary = cluster_summary(graph, plan.cluster)
    assert summary["leaf_switches"] == 1 and summary["spine_switches"] == 0
    assert summary["fabric_gap"].startswith("efa-v3's oversubscription is a catalog gap")
    assert "oversubscription a gap" in summary["cluster"] and "nan" not in summary["cluster"]


def test_collectives_on_a_tpu_say_the_torch_calls_are_not_xlas():
    from simcore.model.collective_plan import plan_wire
    from simcore.plan.load import plan_from_dict
    from trainplan.commands_model import wire_note

    doc = {"model": "llama3-8b", "parallel": {"tp": 1, "dp": 16, "zero": 3}, "training": {"global_batch": 64}}
    tpu = plan_from_dict({**doc, "cluster": {"node": "tpu-v5p-host", "nodes": 4}})
    gpu = plan_from_dict({**doc, "cluster": {"node": "dgx-h100", "nodes": 2}})
    assert "XLA partitions MaxText's mesh into" in wire_note(tpu, plan_wire(tpu), False)
    assert "XLA" not in wire_note(gpu, plan_wire(gpu), False)


def test_googles_dcn_is_taken_as_non_blocking_at_its_printed_per_chip_rate(cat):
    # judgements with their reasons in SOURCES.md: Jupiter's 13 Pb/s bisection over 100,000 Trillium chips
    # at 100 Gbps each, v5e's 6.4 Tbps a pod = its hosts' NICs; the latency is eth-100's kernel TCP
    for name in ("gcp-dcn-50", "gcp-dcn-100", "gcp-dcn-200"):
        fab = cat.fabrics[name]
        assert fab.oversubscription == 1.0 and fab.latency_s == pytest.approx(15e-6) and not fab.gaps
    text = (Path(__file__).resolve().parents[2] / "topologies" / "catalog" / "SOURCES.md").read_text()
    assert "**Google's DCN**" in text and "13 Petabits/sec" in text and "6.4 Tbps per pod" in text
