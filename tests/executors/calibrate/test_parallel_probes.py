"""The parallel probe (``executors.calibrate.parallel_probes`` and its pieces,
``wrapper_probes`` and ``handover_probes``): the fits of the ranks' timings to
kernel-unit figures on synthetic rounds, and a real grouped probe on four ranks."""
import math

import pytest

from executors.calibrate import handover_probes as hprobes
from executors.calibrate import parallel_probes as pprobes
from executors.calibrate import wrapper_probes as wprobes


def test_parallel_probe_kernels_are_the_median_of_per_round_ratios():
    # 10 kernels per layer (4 + 6); round i: plain (4i, 6i) ms, so i ms per kernel; tp adds
    # (8i, 3i) ms = (8, 3) kernels in that round's units, except round 2 where tp's extra
    # doubles (a load spike on the wrapped variant only): the median ignores it
    def rnd(i, spike=1.0):
        return {"plain": (4e-3 * i, 6e-3 * i), "tp": (4e-3 * i + spike * 8e-3 * i, 6e-3 * i + spike * 3e-3 * i)}

    rows = [{"rounds": [rnd(1), rnd(2, spike=2.0), rnd(3)]}] * 2
    f, b = wprobes._round_kernels(rows, "tp", 4, 6)
    assert f == pytest.approx(8.0) and b == pytest.approx(3.0)
    # a wrapper faster than plain (noise) clamps to zero extra kernels
    rows = [{"rounds": [{"plain": (1e-3, 1e-3), "tp": (0.5e-3, 0.9e-3)}]}]
    assert wprobes._round_kernels(rows, "tp", 1, 1) == (0.0, 0.0)
    # a wrapped model end counts over its own plain counterpart, in the plain layer's unit
    rows = [{"rounds": [{**rnd(i), "head": (1e-3 * i, 2e-3 * i), "tp_head": (3e-3 * i, 2.5e-3 * i)}
                        for i in (1, 2, 3)]}]
    f, b = wprobes._round_kernels(rows, "tp_head", 4, 6, base="head")
    assert f == pytest.approx(2.0) and b == pytest.approx(0.5)


def test_wrapper_costs_are_a_line_through_two_model_depths():
    # per round, the plain layer runs (4i, 6i) ms: i ms per kernel. The plain model at depth
    # L runs L x the layer plus (1, 1) ms of ends; wrapped, each layer costs (5, 8) kernels
    # more and the ends (3, 4) more, FSDP2's root group or TP's embedding and head together.
    # TP's embedding alone costs (1, 3) kernels over plain and its head (3, 1): the fitted
    # ends split in that ratio
    lo, hi = wprobes.WRAPPER_FIT_LAYERS

    def rnd(i):
        ms = lambda f, b: (1e-3 * i * f, 1e-3 * i * b)
        row = {"plain": ms(4, 6), "embed": ms(1, 1), "head": ms(1, 1)}
        for n in (lo, hi):   # the ring's base, a rank's share of the sequence, takes as long here
            row[f"model{n}"] = row[f"half{n}"] = ms(4 * n + 1, 6 * n + 1)
            for mode in wprobes.WRAPPER_MODES:
                row[f"{mode}{n}"] = ms(9 * n + 4, 14 * n + 5)
        for mode in ("tp", "tp_sp"):
            row[f"{mode}_embed"], row[f"{mode}_head"] = ms(2, 4), ms(4, 2)
        return row

    rows = [{"rounds": [rnd(i) for i in (1, 2, 3)]}] * 2
    plain = [m for m in wprobes.WRAPPER_MODES if m not in wprobes.MODELLED_KERNELS and m not in ("moe", "ep")]
    out = wprobes.parallel_host_kernels(rows, 4, 6, modes=tuple(plain))
    for mode in plain:
        assert out[mode] == pytest.approx({"forward_kernels": 5.0, "backward_kernels": 8.0})
    for zero in (2, 3):
        assert out[f"fsdp_zero{zero}_root"] == pytest.approx({"forward_kernels": 3.0, "backward_kernels": 4.0})
    assert out["tp_embed"] == pytest.approx({"forward_kernels": 0.75, "backward_kernels": 3.0})
    assert out["tp_head"] == pytest.approx({"forward_kernels": 2.25, "backward_kernels": 1.0})
    assert set(out) == {*plain, *wprobes.WRAPPER_ENDS}


def test_comm_share_is_the_recorded_exposed_comm_over_the_wrappers_extra_time():
    # recorded steps of the deeper probe model: plain (4, 6) ms; each wrapper adds (10, 20) ms,
    # of which the recorder saw (4, 15) ms on rank 0 and (6, 5) ms on rank 1 in collectives:
    # shares (0.5, 0.5), ranks averaged. More comm than extra time (a recorder artefact) caps
    # at 1; no extra time at all leaves the wrapper's cost all communication (1)
    deep = wprobes.WRAPPER_FIT_LAYERS[-1]

    def row(cf, cb, extra=(10e-3, 20e-3)):
        rec = {f"model{deep}": [4e-3, 6e-3, 0.0, 0.0], f"half{deep}": [4e-3, 6e-3, 0.0, 0.0]}
        rec.update({f"{m}{deep}": [4e-3 + extra[0], 6e-3 + extra[1], cf, cb] for m in wprobes.WRAPPER_MODES})
        return {"recorded": rec}

    out = wprobes.comm_shares([row(4e-3, 15e-3), row(6e-3, 5e-3)])
    assert set(out) == set(wprobes.WRAPPER_MODES)
    assert out["tp"] == pytest.approx([0.5, 0.5])
    assert wprobes.comm_shares([row(30e-3, 0.0)])["fsdp_zero3"] == pytest.approx([1.0, 0.0])
    assert wprobes.comm_shares([row(1e-3, 1e-3, extra=(0.0, -1e-3))])["tp_sp"] == [1.0, 1.0]


def test_busy_rank_figures_in_kernel_units():
    # 60 relay round trips: each rank computes 1 ms per message, a message's transit costs
    # 0.1 ms of which the send call 0.02 ms; posting a receive takes rank 0 0.04 ms and
    # rank 1 0.06 ms; the stream's receiver waits 0.3 ms beyond the compute per message; the
    # lone collectives take the slower rank's call. Unit: 10 us.
    r = hprobes.P2P_PROBE_REPS
    rows = [{"p2p": (r * 2e-3 + 2 * r * 1e-4, r * 1e-3, r * 2e-5, r * 4e-5), "stream": (r * 1e-3, r * 1e-3),
             "lone": {"all_reduce": 1.0e-3, "broadcast": 4e-4}},
            {"p2p": (0.0, r * 1e-3, r * 2e-5, r * 6e-5), "stream": (r * 1.3e-3, r * 1e-3),
             "lone": {"all_reduce": 1.5e-3, "broadcast": 3e-4}}]
    raw, k = hprobes._busy_rank_kernels(rows, 1e-5)
    assert raw["p2p_per_message_s"] == pytest.approx(1e-4) and raw["p2p_send_s"] == pytest.approx(2e-5)
    assert raw["p2p_post_s"] == pytest.approx(5e-5)
    assert k == pytest.approx({"p2p_send_kernels": 2.0, "p2p_latency_kernels": 30.0, "p2p_wake_kernels": 8.0,
                               "p2p_post_kernels": 5.0, "lone_all_reduce_kernels": 150.0,
                               "lone_broadcast_kernels": 40.0})
    # a probe that ran no lone collectives (world > 2) gives the pipeline figures alone
    k = hprobes._busy_rank_kernels([{kk: v for kk, v in row.items() if kk != "lone"} for row in rows], 1e-5)[1]
    assert set(k) == {"p2p_send_kernels", "p2p_latency_kernels", "p2p_wake_kernels", "p2p_post_kernels"}
    # the receive wait holds the post: a post read longer than the wait is capped by it
    rows[1]["stream"] = (r * 1.02e-3, r * 1e-3)
    assert hprobes._busy_rank_kernels(rows, 1e-5)[1]["p2p_post_kernels"] == pytest.approx(2.0)
    # four ranks relay in two pairs at once: each pair's figures, averaged over the pairs
    slow = [dict(rows[0], p2p=(r * 2e-3 + 2 * r * 3e-4, r * 1e-3, r * 2e-5, r * 4e-5)), rows[1]]
    raw = hprobes._busy_rank_kernels(rows + slow, 1e-5)[0]
    assert raw["p2p_per_message_s"] == pytest.approx(2e-4) and raw["p2p_send_s"] == pytest.approx(2e-5)


def test_grouped_parallel_probe_runs_two_pairs_side_by_side():
    """Four real ranks: two TP pairs, each wrapping its own model and relaying between its
    own two ranks; the wrapper costs more than the plain model, and a world that does not
    split into pairs is refused."""
    out = pprobes.bench_parallel_host(world=4, reps=4, rounds=1, modes=("tp",))
    assert out["ranks"] == 4 and set(out["comm_share"]) == {"tp"}
    # the wrapped model costs more than the plain one at both depths (by 10-20x here); the fitted
    # per-layer count is a difference of those depths, which a busy host can read as 0 (a suite
    # run beside a busy loop did): the figure's size is the calibration bench's, its sign is here
    raw = out["raw"]
    assert all(sum(raw[f"tp{n}"]) > sum(raw[f"model{n}"]) for n in wprobes.WRAPPER_FIT_LAYERS)
    assert all(0 <= out["tp"][k] < math.inf for k in ("forward_kernels", "backward_kernels"))
    assert {"tp_embed", "tp_head"} <= set(out) and "tp_sp" not in out and "fsdp_zero3" not in out
    assert "optimizer_per_tensor_kernels" not in out and "pipeline_chunk" not in out
    assert out["p2p_send_kernels"] > 0 and out["raw"]["p2p_per_message_s"] > 0
    with pytest.raises(ValueError, match="groups of 2"):
        pprobes.bench_parallel_host(world=3)


def test_ring_attention_is_costed_over_the_plain_model_on_a_ranks_share_of_tokens():
    # the cp wrapper runs half the tokens: its plain base (half{L}) takes (2, 3) ms a layer
    # where the whole-sequence model takes (4, 6); the ring adds (5, 8) kernels a layer over
    # the half, which against the whole model would read (3, 5)
    lo, hi = wprobes.WRAPPER_FIT_LAYERS

    def rnd(i):
        ms = lambda f, b: (1e-3 * i * f, 1e-3 * i * b)
        row = {"plain": ms(4, 6)}
        for n in (lo, hi):
            row[f"model{n}"], row[f"half{n}"] = ms(4 * n + 1, 6 * n + 1), ms(2 * n + 1, 3 * n + 1)
            row[f"cp{n}"] = ms(7 * n + 1, 11 * n + 1)
        return row

    out = wprobes.parallel_host_kernels([{"rounds": [rnd(i) for i in (1, 2, 3)]}] * 2, 4, 6, modes=("cp",))
    assert out == {"cp": pytest.approx({"forward_kernels": 5.0, "backward_kernels": 8.0})}


def test_moe_and_expert_parallel_are_costed_beyond_the_kernels_the_model_counts_itself():
    # the MoE model takes (30, 40) kernels a layer over the dense one, of which the model
    # counts the router, the top-k, the permutations and one GEMM per expert itself; expert
    # parallel takes (6, 9) over the MoE model, where the model counts fewer local experts
    lo, hi = wprobes.WRAPPER_FIT_LAYERS
    (mf, mb), (ef, eb) = wprobes._modelled_moe_kernels(), wprobes._modelled_ep_kernels()
    assert mf > 0 and mb > 0 and ef < 0 and eb < 0

    def rnd(i):
        ms = lambda f, b: (1e-3 * i * f, 1e-3 * i * b)
        row = {"plain": ms(4, 6)}
        for n in (lo, hi):
            row[f"model{n}"] = ms(4 * n + 1, 6 * n + 1)
            row[f"moe{n}"] = ms(34 * n + 1, 46 * n + 1)
            row[f"ep{n}"] = ms(40 * n + 1, 55 * n + 1)
        return row

    out = wprobes.parallel_host_kernels([{"rounds": [rnd(i) for i in (1, 2, 3)]}] * 2, 4, 6, modes=("moe", "ep"))
    assert out == {"moe": pytest.approx({"forward_kernels": 30.0 - mf, "backward_kernels": 40.0 - mb}),
                   "ep": pytest.approx({"forward_kernels": 6.0 - ef, "backward_kernels": 9.0 - eb})}
