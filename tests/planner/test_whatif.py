"""What-if sweeps: the grid, exact price and GPU axes, figures, the report, the shipped example."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from reports.planning_plots import breakdown_bars, pareto_figure, whatif_figures, whatif_heatmap  # noqa: E402
from simcore.planner.search import search  # noqa: E402
from simcore.plan.spec import PlanError  # noqa: E402
from simcore.planner.headroom import thin_gib  # noqa: E402
from simcore.planner.whatif import cells, load_sweep, node_for_gpu, run_whatif, sweep_from_dict  # noqa: E402
from topologies.hardware import load_catalog  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def sweep(**over):
    doc = {"name": "t", "model": "gpt-1.7b", "cluster": {"node": "dgx-h100", "nodes": 1},
           "global_batch": 64, "tokens": 1e10, "grid": {"gpu": ["a100-80gb", "h100-sxm"], "nodes": [1, 2]},
           "space": {"tp": [1, 2], "pp": [1], "cp": [1], "zero": [1], "micro_batch": [2]},
           "failures": False}
    doc.update(over)
    return sweep_from_dict(doc)


@pytest.fixture(scope="module")
def grid():
    return run_whatif(sweep(), progress=False)


def test_cells_are_the_product_of_the_axes():
    assert cells(sweep()) == [{"gpu": "a100-80gb", "nodes": 1}, {"gpu": "a100-80gb", "nodes": 2},
                              {"gpu": "h100-sxm", "nodes": 1}, {"gpu": "h100-sxm", "nodes": 2}]
    assert node_for_gpu("h200") == "hgx-h200"


def test_grid_over_gpu_and_nodes(grid):
    t = grid.table.set_index(["gpu", "nodes"])
    assert list(t["node"]) == ["dgx-a100-80gb", "dgx-a100-80gb", "dgx-h100", "dgx-h100"]
    prices = load_catalog().prices.gpus
    for (gpu, nodes), row in t.iterrows():
        assert row.gpus == 8 * nodes
        # no failures: the cost is exactly GPU-hours x the catalog's on-demand price
        assert row.usd == pytest.approx(row.gpu_hours * prices[gpu].on_demand_usd, rel=1e-12)
    for nodes in (1, 2):   # H100 has 3.2x the A100's dense bf16 peak: it must be faster
        assert t.loc[("h100-sxm", nodes), "days"] < t.loc[("a100-80gb", nodes), "days"]
    assert any("Oracle Cloud" in a for a in grid.assumptions)
    assert any(a.startswith("GPU h100-sxm:") for a in grid.assumptions)


def test_price_axis_scales_dollars_only():
    res = run_whatif(sweep(grid={"price.on_demand_usd": [1.0, 3.0]}), progress=False)
    a, b = res.table.iloc[0], res.table.iloc[1]
    assert a.days == b.days and a.layout == b.layout
    assert b.usd == pytest.approx(3 * a.usd, rel=1e-12)


def test_slower_network_is_never_faster():
    res = run_whatif(sweep(grid={"fabric.nic_gbit_per_s": [400, 25]},
                           cluster={"node": "dgx-h100", "nodes": 4}), progress=False)
    fast, slow = res.table.iloc[0], res.table.iloc[1]
    assert slow.step_time_s > fast.step_time_s and slow.exposed_comm_s > fast.exposed_comm_s


def test_bad_sweeps_are_one_sentence():
    with pytest.raises(PlanError, match="unknown sweep axis 'grid.colour'"):
        sweep(grid={"colour": ["red"]})
    with pytest.raises(PlanError, match="needs 'tokens'"):
        sweep_from_dict({"model": "gpt-1.7b", "cluster": {"node": "dgx-h100"}, "global_batch": 8})
    with pytest.raises(PlanError, match="no catalog node has GPU 'l40s'"):
        node_for_gpu("l40s")
    assert node_for_gpu("v100-32gb") == "dgx2-v100-32gb"


def test_a_cell_says_whether_nothing_fits_or_its_plan_is_invalid_on_that_gpu():
    """A kernel the catalog prices on H100 but not on B200 makes the B200 cell invalid, not full."""
    from simcore.planner.whatif import display_table
    res = run_whatif(sweep(grid={"gpu": ["h100-sxm", "b200"]}, training={"flash_attention": True,
                                                                        "attention_kernel": "flash2"}),
                     progress=False)
    shown = display_table(res.table, ["gpu"]).set_index("gpu")["layout"]
    assert shown["b200"] == "invalid plan" and shown["h100-sxm"].startswith("tp")
    assert any("training.attention_kernel=flash2 has no efficiency for b200" in n for n in res.notes())
    full = run_whatif(sweep(model="llama3-70b", grid={"nodes": [1]}), progress=False)
    assert display_table(full.table, ["nodes"])["layout"].iloc[0] == "does not fit"


def test_figures_are_agg_safe(grid, tmp_path):
    heat = whatif_heatmap(grid.table, "days")
    assert isinstance(heat, Figure)
    image = heat.axes[0].get_images()[0].get_array()
    assert image.shape == (2, 2)                           # GPU type x node count
    assert image[1, 0] == grid.table.set_index(["gpu", "nodes"]).loc[("h100-sxm", 1), "days"]
    assert isinstance(pareto_figure(grid.table), Figure)
    res = search("gpt-1.7b", {"node": "dgx-h100", "nodes": 1}, 32, top_k=0, progress=False)
    bars = breakdown_bars(res.table, top=5)
    widths = [p.get_width() for p in bars.axes[0].patches[:5]]
    assert widths == pytest.approx(list(res.table["compute_s"].head(5)))
    assert sorted(whatif_figures(grid)) == ["heatmap_days", "heatmap_usd", "pareto"]


def _panel_cells(fig) -> dict[str, list[str]]:
    """Panel title -> the texts drawn in its cells."""
    return {ax.get_title(): [t.get_text() for t in ax.texts] for ax in fig.axes if ax.get_images()}


def test_fabric_by_nodes_figures_show_every_cell():
    """Issue 31.5: a grid over fabric x node count (plus GPU type) shows every cell: a panel
    per value past the first two axes, and the Pareto labels name every axis."""
    res = run_whatif(sweep(grid={"fabric": ["ib-hdr", "ib-ndr"], "nodes": [2, 4], "gpu": ["a100-80gb", "h100-sxm"]},
                           cluster={"node": "dgx-h100", "nodes": 2}), progress=False)
    figs = whatif_figures(res)
    panels = _panel_cells(figs["heatmap_days"])
    assert sorted(panels) == ["gpu=a100-80gb", "gpu=h100-sxm"]
    assert all(len(texts) == 4 for texts in panels.values())          # fabric x nodes in each panel
    ax = next(a for a in figs["heatmap_days"].axes if a.get_title() == "gpu=h100-sxm")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["ib-hdr", "ib-ndr"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2", "4"]
    shown = {round(float(t.get_text().splitlines()[0].replace(",", "")), 1) for t in ax.texts}
    expect = res.table[res.table.gpu == "h100-sxm"]["days"]
    assert shown == {round(float(f"{d:.3g}" if d < 100 else f"{d:.0f}"), 1) for d in expect}
    labels = [t.get_text() for t in figs["pareto"].axes[0].texts]
    assert labels and all(lab.startswith("fabric=") and "nodes=" in lab and "gpu=" in lab for lab in labels)


def test_every_comparison_of_gpu_kinds_counts_the_gpus():
    """Issue 57.3: a GB200 node is a 4-GPU tray, a B200 node 8 GPUs; "2 nodes" beside "2 nodes"
    compares 8 GPUs with 16. The table, the heat maps and the Pareto labels say how many."""
    from reports.build import whatif_report

    res = run_whatif(sweep(grid={"gpu": ["gb200", "b200"], "nodes": [2]}), progress=False)
    gpus = dict(zip(res.table["gpu"], res.table["gpus"]))
    assert gpus == {"gb200": 8, "b200": 16}
    table = res.display_table()
    assert list(table.columns[:3]) == ["gpu", "nodes", "GPUs"] and list(table["GPUs"]) == ["8", "16"]
    figs = whatif_figures(res)
    for name in ("heatmap_days", "heatmap_usd"):
        texts = [t.get_text() for t in figs[name].axes[0].texts]
        assert sorted(t.splitlines()[1] for t in texts) == ["16 GPUs", "8 GPUs"], texts
    labels = [t.get_text() for t in figs["pareto"].axes[0].texts]
    assert labels and all(lab.endswith(("(8 GPUs)", "(16 GPUs)")) for lab in labels)
    cards = dict(whatif_report(res).summary)
    assert cards["fastest"].split(":")[0].endswith("GPUs)") and cards["cheapest"].split(":")[0].endswith("GPUs)")


def test_shipped_example_sweep():
    sw = load_sweep(ROOT / "sweeps" / "example.yaml")
    assert sw.grid == {"gpu": ["a100-80gb", "h100-sxm", "h200"], "nodes": [16, 32, 64]}
    res = run_whatif(sw, progress=False)
    t = res.table
    assert len(t) == 9 and t["fits"].all()
    for gpu in sw.grid["gpu"]:   # more nodes, fewer days
        days = t[t.gpu == gpu].sort_values("nodes")["days"].tolist()
        assert days == sorted(days, reverse=True)
    # a cell whose best layout leaves less than the memory model's margin is marked and said, no other
    thin = t["headroom_gib"] < thin_gib(t["headroom_gib"] + t["memory_per_gpu_gib"])
    said = {n.split(":")[0] for n in res.notes() if "leaves only" in n}
    assert said == {f"gpu={g}, nodes={n}" for g, n in zip(t.gpu[thin], t.nodes[thin])}
    assert list(res.display_table()["headroom GiB"].str.endswith("(thin)")) == list(thin)


def test_shipped_compile_sweep_prices_eager_modules():
    sw = load_sweep(ROOT / "sweeps" / "compile.yaml")
    t = run_whatif(sw, progress=False).table
    assert len(t) == 6 and t["fits"].all()
    fused, eager = (t[t["training.kernels"] == k].set_index("nodes") for k in ("fused", "eager"))
    assert list(fused["layout"]) == list(eager["layout"])        # the same layouts, compiled or not
    gain = eager["step_time_s"] / fused["step_time_s"]
    assert ((gain > 1.05) & (gain < 1.3)).all()                  # torchtitan's table: 1.16x


def test_shipped_amp_sweep_prices_autocast():
    """torch AMP (training.autocast) against a master copy, the same DDP layout: slower by its
    casts and fp32 passes, and with less headroom by its cached 16-bit copies (2 bytes a
    parameter of the layers, about 2.6 GiB for this 1.5B model, before the allocator's margin)."""
    sw = load_sweep(ROOT / "sweeps" / "amp.yaml")
    t = run_whatif(sw, progress=False).table
    assert len(t) == 4 and t["fits"].all()
    master, amp = (t[t["training.autocast"] == a].set_index("nodes") for a in (False, True))
    assert list(master["layout"]) == list(amp["layout"])
    assert (amp["step_time_s"] > 1.03 * master["step_time_s"]).all()
    assert (master["headroom_gib"] - amp["headroom_gib"] > 2.6).all()
