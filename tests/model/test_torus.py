"""Collectives on a torus (simcore/model/torus.py): rings per axis, both ways where the axis
wraps; never faster than the chip's links allow; a 1-D torus is a bidirectional ring."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simcore.model import collectives as coll
from simcore.model import torus as t

LINK = 100e9   # one one-way link, bytes/s


@settings(max_examples=200, deadline=None)
@given(dims=st.integers(1, 3), exps=st.lists(st.integers(0, 4), min_size=3, max_size=3),
       size=st.floats(1e3, 1e10), stride_exp=st.integers(0, 6), wrap=st.sampled_from([4, 16]))
def test_a_torus_never_beats_its_own_link_bound(dims, exps, size, stride_exp, wrap):
    shape = tuple(2 ** e for e in exps[:dims])
    chips = math.prod(shape)
    for ranks in {2 ** k for k in range(int(math.log2(chips)) + 1)}:
        stride = min(2 ** stride_exp, chips // ranks) or 1
        axes = t.group_axes(shape, t.axis_wraps(shape, wrap, dims == 3), ranks, stride)
        n = math.prod(a.extent for a in axes)
        assert t.all_gather_bw_s(size, axes, LINK) >= t.link_bound_s(size, n, dims, LINK) * (1 - 1e-12)


@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_a_1d_torus_is_a_bidirectional_ring(n):
    # one wrapped axis: the ring of collectives.py at twice the one-way link rate
    axes = t.group_axes((n,), (True,), n, 1)
    assert axes == (t.Axis(extent=n, ring=True),)
    net = coll.GroupNet(ranks=n, nodes=1, bus_bytes_per_s=2 * LINK, intra_bytes_per_s=2 * LINK,
                        base_latency_s=0.0, intra_hop_s=0.0, inter_hop_s=0.0)
    assert t.all_gather_bw_s(1e9, axes, LINK) == pytest.approx(coll.all_gather_s(1e9, net))
    assert t.all_reduce_bw_s(1e9, axes, LINK) == pytest.approx(coll.ring_all_reduce_s(1e9, net))
    assert t.group_bytes_per_s(2 * LINK, 1, n, False, n, n, 1) == pytest.approx(2 * LINK)


def test_an_axis_without_its_wraparound_takes_twice_as_long():
    # scaling-book tpus.md: no wraparound "typically doubles the time of most communication"
    ring = t.all_gather_bw_s(1e9, (t.Axis(extent=8, ring=True),), LINK)
    line = t.all_gather_bw_s(1e9, (t.Axis(extent=8, ring=False),), LINK)
    assert line == pytest.approx(2 * ring)


def test_equal_axes_multiply_the_bandwidth_by_their_number():
    # scaling-book sharding.md: AllGather over n_axes axes takes V / (W_ici * n_axes)
    one = t.all_gather_bw_s(1e9, (t.Axis(extent=8, ring=True),), LINK)
    three = t.all_gather_bw_s(1e9, (t.Axis(extent=8, ring=True),) * 3, LINK)
    assert three * 3 == pytest.approx(one * (511 / 512) / (7 / 8))
    assert three == pytest.approx(t.link_bound_s(1e9, 512, 3, LINK))


def test_slices_and_their_wraparounds():
    assert t.slice_shape(512, 3) == (8, 8, 8) and t.slice_shape(6144, 3) == (16, 16, 24)
    assert t.slice_shape(16, 2) == (4, 4) and t.slice_shape(4, 3) == (1, 2, 2)
    assert t.axis_wraps((4, 4, 8), 4, True) == (True, True, True)
    assert t.axis_wraps((2, 2, 4), 4, True) == (False, False, False)    # not whole cubes: no OCS wraps
    assert t.axis_wraps((8, 16), 16) == (False, True)                  # v5e 8x16 wraps its long axis


def test_group_axes_follow_the_rank_order():
    wraps = (True, True, True)
    assert t.group_axes((8, 8, 8), wraps, 64, 1) == (t.Axis(8, True), t.Axis(8, True))
    assert t.group_axes((8, 8, 8), wraps, 8, 64) == (t.Axis(8, True),)   # the slowest axis
    assert t.group_axes((8, 8, 8), wraps, 4, 1) == (t.Axis(4, False),)   # part of an axis: a line


def test_a_tpu_group_net_uses_its_torus(monkeypatch):
    # a v5p slice of 512 chips (8x8x8): DP over the last axis at both links of that axis,
    # TP over the first at both of its; a 64-rank group over two axes at four links
    from simcore.plan.spec import ClusterSpec
    from topologies.hardware import load_catalog

    cat = load_catalog()
    node = cat.node("tpu-v5p-host")
    cluster = ClusterSpec(node=node, nodes=128, fabric=cat.fabrics["gcp-dcn-50"],
                          storage=cat.storage["local-nvme"], gpus_per_node=4)
    dev = type("Dev", (), dict(nvlink_efficiency=1.0, nic_efficiency=1.0, base_latency_s=0.0,
                               nvlink_hop_latency_s=0.0, net_hop_latency_s=0.0))()
    link = node.gpu.intra_link_bytes_per_s / 6
    coll.group_net.cache_clear()
    assert coll.group_net(cluster, dev, 8, 1).bus_bytes_per_s == pytest.approx(2 * link)
    assert coll.group_net(cluster, dev, 8, 64).bus_bytes_per_s == pytest.approx(2 * link)
    assert coll.group_net(cluster, dev, 64, 1).bus_bytes_per_s == pytest.approx(4 * link)
    coll.group_net.cache_clear()


def test_a_fabric_figure_the_catalog_lacks_is_refused_not_read_as_nvlink():
    """A NaN oversubscription (a catalog gap) made min(intra, nic / NaN) the in-node rate: a
    group across leaf switches was priced at NVLink speed without a word."""
    import dataclasses

    from simcore.model import collectives as coll
    from simcore.model.compute import device_model
    from simcore.plan.load import plan_from_dict

    plan = plan_from_dict({"model": "llama3-8b", "cluster": {"node": "dgx-h100", "nodes": 512},
                           "parallel": {"dp": 4096}, "training": {"global_batch": 4096, "micro_batch": 1}})
    fab = dataclasses.replace(plan.cluster.fabric, oversubscription=float("nan"))
    cluster = dataclasses.replace(plan.cluster, fabric=fab)
    dev = device_model(cluster.node.gpu, "bf16")
    coll.group_net.cache_clear()
    with pytest.raises(ValueError, match="no oversubscription figure in the catalog"):
        coll.group_net(cluster, dev, 4096, 1)
    coll.group_net.cache_clear()
