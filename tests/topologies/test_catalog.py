"""The hardware catalog: every entry has a source, units convert once, names resolve."""
from __future__ import annotations

import pytest

from topologies.components import GIB, CatalogError, EfficiencyCurve
from topologies.hardware import load_catalog

REQUIRED = {
    "gpus": {"v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "b200", "mi250x", "mi300x", "l40s"},
    "nodes": {"dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200", "dgx-b200", "mi300x-8", "localhost"},
    "fabrics": {"ib-edr", "ib-hdr", "ib-ndr", "ib-xdr", "roce-200", "roce-400", "eth-100"},
    "models": {"gpt3-175b", "gpt-22b", "gpt-530b", "gpt-1t", "llama2-7b", "llama2-13b", "llama2-70b",
               "llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b"},
}


@pytest.fixture(scope="module")
def cat():
    return load_catalog()


@pytest.mark.parametrize("kind", sorted(REQUIRED))
def test_required_entries_exist(cat, kind):
    assert REQUIRED[kind] <= set(getattr(cat, kind))


def test_every_entry_cites_a_source(cat):
    entries = [*cat.gpus.values(), *cat.fabrics.values(), *cat.storage.values()]
    assert all(e.source.strip() for e in entries)
    assert all(str(e.get("source", "")).strip() for e in (*cat.nodes.values(), *cat.models.values()))
    assert all(p.source.strip() for p in cat.prices.gpus.values())
    assert cat.prices.energy_source and cat.prices.failures_source


def test_units_convert_once(cat):
    a100 = cat.gpus["a100-80gb"]
    assert a100.peak("bf16") == pytest.approx(312e12)
    assert a100.peak("fp8") is None
    assert a100.hbm_bytes == 80 * GIB
    assert a100.intra_link_bytes_per_s == pytest.approx(300e9)  # 600 GB/s both directions
    assert cat.fabrics["ib-hdr"].nic_bytes_per_s == pytest.approx(25e9)  # 200 Gb/s
    assert cat.gpus["h100-sxm"].peak("bf16") == pytest.approx(989e12, rel=0.01)


def test_nodes_resolve_to_their_gpu_and_fabric(cat):
    node = cat.node("dgx-h100")
    assert node.gpu.name == "h100-sxm" and node.gpus_per_node == 8
    assert node.fabric in cat.fabrics and node.storage in cat.storage
    for name, raw in cat.nodes.items():
        if not raw.get("calibrated"):
            assert cat.node(name).gpus_per_node >= 1


def test_localhost_without_profile_is_marked_uncalibrated(cat, tmp_path):
    node = cat.node("localhost", tmp_path / "no-profile.yaml")
    assert not node.calibrated and node.gpu.name == "uncalibrated-host"


def test_unknown_node_lists_known_ones(cat):
    with pytest.raises(CatalogError, match=r"unknown node 'dgx-z1' \(known: .*dgx-h100"):
        cat.node("dgx-z1")


def test_efficiency_curve_interpolates_in_log_space():
    curve = EfficiencyCurve(points=((1e6, 0.2), (1e10, 0.6)), source="test")
    assert curve.at(1e3) == 0.2 and curve.at(1e12) == 0.6
    assert curve.at(1e8) == pytest.approx(0.4)


def _compiled_and_fitted(e: dict) -> bool:
    """An accelerator whose stack compiles the whole step (XLA on TPU): no per-kernel or host
    overheads, said in ``overheads_source``, and a matmul plateau FITTED to its own published runs
    with those zeros, so the zeros are paid for in the fitted figure, not given for nothing."""
    return bool(str(e.get("overheads_source", "")).strip()) and "FITTED" in e.get("matmul", {}).get("source", "")


def test_no_gpu_type_gets_the_frameworks_overheads_for_free(cat):
    # the fitted per-kernel GPU gaps and host time belong to the eager frameworks that run on
    # every catalog GPU: a GPU type given less would win a procurement ranking for nothing
    eff = cat.efficiency
    fitted = (eff["a100-80gb"]["kernel_overhead_us"], eff["a100-80gb"]["host_overhead_us"])
    for name in cat.gpus:
        if name in eff and not _compiled_and_fitted(eff[name]):
            assert (eff[name].get("kernel_overhead_us"), eff[name].get("host_overhead_us")) == fitted, name


def test_every_gpu_type_pays_for_overlapping_communication(cat):
    # an overlapped collective takes SMs/CUs and memory bandwidth on every GPU; a type with no
    # figure would overlap for free (absent reads as 1.0 in simcore/model/compute.py)
    for name in cat.gpus:
        e = cat.efficiency.get(name, {})
        if e and not _compiled_and_fitted(e):
            assert e.get("comm_compute_interference", 1.0) > 1.0, name
            assert str(e.get("comm_compute_interference_source", "")).strip(), name


def test_a_power_limited_h100_is_never_faster_than_the_full_power_part(cat):
    # the 500 W Grand Teton H100 (torchtitan's fleet) has the H100 SXM's peaks and less
    # power and HBM bandwidth: no layout may run faster on it than on a DGX H100
    from simcore.engine.predict import simulate
    from simcore.plan.load import plan_from_dict
    assert cat.node("grand-teton-h100").gpu.hbm_bytes_per_s < cat.node("dgx-h100").gpu.hbm_bytes_per_s
    assert "h100-sxm-96gb-500w" not in cat.prices.gpus  # not for sale: procure never proposes it
    model = {"name": "m", "layers": 8, "hidden": 4096, "heads": 32, "ffn_hidden": 14336, "vocab": 128256,
             "seq_len": 8192, "kv_heads": 8, "gated_mlp": True}
    layouts = ({"dp": 8, "zero": 3}, {"tp": 8}, {"tp": 2, "pp": 2, "dp": 2}, {"dp": 4, "cp": 2, "zero": 3})
    for par in layouts:
        for precision in ("bf16", "fp8"):
            t = {}
            for node in ("grand-teton-h100", "dgx-h100"):
                doc = {"name": "x", "model": model, "cluster": {"node": node, "nodes": 1}, "parallel": par,
                       "training": {"global_batch": 16, "micro_batch": 1, "precision": precision,
                                    "flash_attention": True}}
                t[node] = simulate(plan_from_dict(doc)).step_time_s
            assert t["grand-teton-h100"] > 1.1 * t["dgx-h100"], (par, precision, t)
