"""Memory per GPU: ZeRO stages against Rajbhandari et al., pipeline in-flight micro-batches, offload, fits."""
import dataclasses

import pytest

from simcore.model import memory as mem

from simcore.model import peak as pk
from simcore.model import workload as wl
from simcore.plan.load import plan_from_dict
from simcore.plan.spec import Schedule


def plan(**over):
    doc = {"model": {"name": "t", "layers": 24, "hidden": 2048, "heads": 16, "vocab": 51200, "seq_len": 2048},
           "cluster": {"node": "dgx-a100-80gb", "nodes": 8},
           "parallel": {"tp": 1, "pp": 1, "dp": 64},
           "training": {"global_batch": 512, "micro_batch": 2, "recompute": "full"}}
    for sec, fields in over.items():
        doc[sec] = {**doc[sec], **fields}
    return plan_from_dict(doc)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_model_states_match_rajbhandari(zero):
    p = plan(parallel={"zero": zero})
    psi = wl.param_counts(p.model).total
    nd = 64
    # ZeRO-2 is FSDP2 with reshard_after_forward=False: the gathered 16-bit parameters, and
    # 16 B per parameter over N_d (fp32 sharded parameters, fp32 sharded gradients, Adam m, v);
    # DeepSpeed's ZeRO-2 would keep 2 + 14 / N_d. ZeRO-1 is Megatron's distributed optimizer,
    # whose whole gradients are fp32 under bf16: 6 + 12 / N_d (its docs' dist_optimizer.md)
    expected = {0: (2 + 2 + 12) * psi, 1: (2 + 4) * psi + 12 * psi / nd,
                2: 2 * psi + (4 + 4 + 8) * psi / nd, 3: (4 + 4 + 8) * psi / nd}[zero]
    sp = mem.stage_params(p)[0]
    states = mem.model_state_bytes(p, sp)
    assert states["weights"] + states["gradients"] + states["optimizer_states"] == pytest.approx(expected)


def test_zero2_in_fp32_keeps_a_sharded_fp32_copy_beside_the_gathered_parameters():
    # FSDP2 with reshard_after_forward=False (the executor's ZeRO-2) holds its sharded fp32
    # parameters, which AdamW steps, and the unsharded ones from forward to backward
    psi, nd = wl.param_counts(plan().model).total, 64
    for zero, extra in ((2, psi / nd), (1, 0.0), (3, 0.0)):
        p = plan(parallel={"zero": zero}, training={"precision": "fp32"})
        s = mem.model_state_bytes(p, mem.stage_params(p)[0])
        full = psi if zero < 3 else psi / nd
        assert s["weights"] == pytest.approx(4 * (full + extra))
        assert s["optimizer_states"] == pytest.approx(8 * (psi / nd if zero >= 1 else psi))


def test_optimizer_offload_moves_states_to_host():
    p = plan(parallel={"zero": 1}, training={"offload": "optimizer"})
    r = mem.memory_per_rank(p)[0]
    psi = wl.param_counts(p.model).total
    assert r["optimizer_states"] == 0
    assert r["host"] == pytest.approx(12 * psi / 64)
    assert pk.host_bytes_per_node(p, [r]) == pytest.approx(8 * 12 * psi / 64)


def test_offload_checked_against_host_memory():
    big = plan(model={"layers": 96, "hidden": 12288, "heads": 96}, cluster={"nodes": 1},
               parallel={"dp": 8, "zero": 3}, training={"offload": "optimizer+params", "global_batch": 8,
                                                         "micro_batch": 1})
    per_rank = mem.memory_per_rank(big)
    # 175B x 16 B = 2.8 TB of states on a node with 2 TiB of host memory
    assert pk.host_bytes_per_node(big, per_rank) > big.cluster.node.host_memory_bytes
    assert not pk.fits(big, per_rank)


def test_1f1b_first_stage_keeps_p_microbatches():
    p = plan(parallel={"pp": 4, "dp": 16})
    assert [mem.in_flight_chunks(p, r) for r in range(4)] == [4, 3, 2, 1]
    g = dataclasses.replace(p, parallel=dataclasses.replace(p.parallel, schedule=Schedule.GPIPE))
    assert mem.in_flight_chunks(g, 0) == p.num_microbatches


def test_interleaved_first_stage_matches_korthikanti():
    p = plan(parallel={"pp": 4, "dp": 16, "vpp": 2, "schedule": "interleaved-1f1b"})
    chunks = mem.in_flight_chunks(p, 0)
    layers_per_chunk = 24 / 8
    # L (1 + (p-1)/(p v)) layers on rank 0
    assert chunks * layers_per_chunk == pytest.approx(24 * (1 + 3 / 8))


def test_embedding_on_first_stage_and_output_copy_on_last():
    p = plan(parallel={"pp": 4, "dp": 16})
    sps = mem.stage_params(p)
    emb = 51200 * 2048 + 2048 * 2048
    assert sps[0].dense - sps[1].dense == pytest.approx(emb)
    assert sps[3].dense - sps[1].dense == pytest.approx(51200 * 2048 + 2 * 2048)  # tied copy + final norm


def test_fits_compares_with_hbm():
    small = plan()
    assert pk.fits(small, mem.memory_per_rank(small))
    huge = plan(training={"micro_batch": 8, "recompute": "none"})
    per_rank = mem.memory_per_rank(huge)
    assert max(r["total"] for r in per_rank) > huge.cluster.node.gpu.hbm_bytes
    assert not pk.fits(huge, per_rank)


def test_full_recompute_stores_less_than_none():
    a = mem.activation_bytes(plan(), 0)
    b = mem.activation_bytes(plan(training={"recompute": "none"}), 0)
    assert a < b / 5


@pytest.mark.parametrize("impl, compression, zero, grads", [
    ("fsdp2", "none", 1, 4), ("fsdp2", "bf16", 1, 2), ("deepspeed", "none", 1, 2), ("fsdp2", "none", 0, 2)])
def test_the_distributed_optimizers_whole_gradients_are_in_the_reduce_dtype(impl, compression, zero, grads):
    # Megatron (--bf16) accumulates fp32 main_grads unless --grad-reduce-in-bf16; DeepSpeed
    # reduces in the model's dtype; DDP's autocast keeps fp32 parameters and gradients, which
    # the 2 + 2 + 12 split counts as 16 bytes too
    p = plan(parallel={"zero": zero, "zero_impl": impl}, training={"precision": "bf16", "grad_compression": compression})
    sp = mem.stage_params(p)[0]
    assert mem.model_state_bytes(p, sp)["gradients"] == pytest.approx(grads * sp.total)
