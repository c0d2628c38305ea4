"""FSDP2's wrapping around the loss (``parallel.fsdp_root``) and the side streams' pools that
torch's max_memory_reserved counts beside the total (``stream_cache``)."""
import pytest

from simcore.model import fsdp_pools
from simcore.model.params import param_counts
from simcore.model.step_costs import memory_report
from simcore.plan.load import plan_from_dict, plan_to_dict
from simcore.plan.spec import PlanError


def _plan(parallel=None, training=None):
    return plan_from_dict({"model": {"name": "llama3-8b", "seq_len": 8192}, "cluster": {"node": "dgx-h100"},
                           "parallel": {"dp": 8, "zero": 3, **(parallel or {})},
                           "training": {"global_batch": 8, "recompute": "op", "loss": "eager", **(training or {})}})


def test_groups_kept_through_the_loss_add_to_its_peak():
    totals = {root: memory_report(_plan({"fsdp_root": root}))["max_gpu_bytes"]
              for root in ("resharded", "kept")}
    assert totals["resharded"] < totals["kept"]
    m = _plan().model
    # kept: the root group (embedding, norm, output) and the last block, in bf16, under the loss's transients
    assert fsdp_pools.kept_through_loss(_plan({"fsdp_root": "kept"}), 2 * m.vocab * m.hidden, 1.0) == \
        pytest.approx(2 * (2 * m.vocab * m.hidden + 1.0))
    assert fsdp_pools.kept_through_loss(_plan({"fsdp_root": "output_kept"}), 2 * m.vocab * m.hidden, 1.0) == \
        pytest.approx(2 * m.vocab * m.hidden)
    assert fsdp_pools.kept_through_loss(_plan(), 2 * m.vocab * m.hidden, 1.0) == 0.0


def test_the_side_stream_pools_hold_two_gathered_groups_and_every_sharded_gradient():
    plan = _plan()
    rep = memory_report(plan)
    rank = rep["ranks"][0]
    m, pc = plan.model, param_counts(plan.model)
    layer = (pc.total - 2 * m.vocab * m.hidden - m.hidden) / m.layers
    ends = pc.total - layer * m.layers
    copy_in = 2 * (ends + layer)                       # the root's all-gather output and a block's, bf16
    grads = 4 * pc.total / 8                            # fp32 reduce-scatter outputs: the sharded gradients
    assert rank["terms"]["gradients"] == 0.0           # freed at the activations' peak, cached in their pool
    assert rank["stream_cache"] == pytest.approx(copy_in + grads, rel=1e-3)
    assert sum(rank["terms"].values()) == pytest.approx(rank["total"])   # not part of what must fit
    assert rep["stream_cache_bytes"] == rank["stream_cache"]


@pytest.mark.parametrize("parallel", [{"zero": 1}, {"zero": 0}, {"dp": 1, "zero": 3}])
def test_no_side_stream_cache_without_fsdp2_sharding(parallel):
    training = {"global_batch": 1} if parallel.get("dp") == 1 else {}
    assert memory_report(_plan(parallel, training))["stream_cache_bytes"] == 0.0


@pytest.mark.parametrize("parallel, words", [({"zero": 2, "fsdp_root": "kept"}, "parallel.zero=3"),
                                             ({"zero_impl": "deepspeed", "fsdp_root": "output_kept"}, "zero_impl=fsdp2"),
                                             ({"fsdp_root": "sometimes"}, "parallel.fsdp_root")])
def test_bad_fsdp_root_is_one_sentence_naming_the_field(parallel, words):
    with pytest.raises(PlanError, match="parallel.fsdp_root") as err:
        _plan(parallel)
    assert words in str(err.value)


def test_fsdp_root_round_trips_through_the_plan_file():
    assert plan_to_dict(_plan({"fsdp_root": "output_kept"}))["parallel"]["fsdp_root"] == "output_kept"
    assert "fsdp_root" not in plan_to_dict(_plan())["parallel"]
    again = plan_from_dict(plan_to_dict(_plan({"fsdp_root": "kept"})))
    assert again.parallel.fsdp_root.value == "kept"


def test_torchtitan_export_says_which_groups_it_keeps_and_reads_back_the_same(tmp_path):
    from simcore.plan.interop import import_plan
    from simcore.plan.writers import export_plan
    plan = plan_from_dict({**plan_to_dict(_plan({"fsdp_root": "output_kept"})), "name": "tt"})
    path = tmp_path / "tt.toml"
    path.write_text(export_plan(plan, "torchtitan-0.2"))
    assert 'fsdp_reshard_after_forward = "default"' in path.read_text()
    doc, _ = import_plan(torchtitan=str(path), cluster="dgx-h100", nodes=1)
    assert doc["parallel"]["fsdp_root"] == "output_kept" and doc["parallel"]["zero"] == 3
    assert 'fsdp_reshard_after_forward = "always"' in export_plan(_plan(), "torchtitan-0.2")
    with pytest.raises(ValueError, match=r"^parallel\.fsdp_root=kept has no torchtitan option"):
        export_plan(_plan({"fsdp_root": "kept"}), "torchtitan-0.2")
