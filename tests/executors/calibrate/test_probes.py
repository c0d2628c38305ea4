"""The single-process probes (``executors.calibrate.probes``) and the collective fits
(``executors.calibrate.collective_probes``) on synthetic data (closed forms), the matmul
efficiency curve built from the GEMM probes, and the executor's activation formula
against its saved-tensor hooks."""
import pytest
import torch
import yaml

from executors.calibrate import build
from executors.calibrate import collective_probes as cprobes
from executors.calibrate import probes
from simcore.model import compute as cmp
from simcore.model import executor_acts as xa
from tests.executors.calibrate.synthetic import ALPHA, BETA, alpha_beta_rows


def test_alpha_beta_fit_recovers_a_noiseless_line():
    fits = cprobes.fit_alpha_beta(alpha_beta_rows("all_reduce", 4) + alpha_beta_rows("all_gather", 2, 1e-3, 5e8))
    assert fits["all_reduce"][4]["alpha_s"] == pytest.approx(ALPHA, rel=1e-6)
    assert fits["all_reduce"][4]["bus_bytes_per_s"] == pytest.approx(BETA, rel=1e-6)
    assert fits["all_gather"][2]["alpha_s"] == pytest.approx(1e-3, rel=1e-6)
    assert fits["all_gather"][2]["bus_bytes_per_s"] == pytest.approx(5e8, rel=1e-6)


def test_ring_latency_split_keeps_the_model_consistent():
    fits = cprobes.fit_alpha_beta(alpha_beta_rows("send_recv", 2, 1e-4) + alpha_beta_rows("all_reduce", 2, 5e-4) + alpha_beta_rows("all_reduce", 4, 1e-4))
    hop, ar = cprobes.split_ring_latency(fits)
    assert hop == pytest.approx(1e-4)
    # ring all-reduce latency = base + 2(n-1) hops (simcore.model.collectives._ring_latency)
    assert ar[2]["base_latency_s"] == pytest.approx(5e-4 - 2 * 1e-4)
    assert ar[4]["base_latency_s"] == 0.0          # 1e-4 - 6e-4 clamps at zero


def test_matmul_curve_is_the_median_per_size_capped_at_one():
    rows = [{"precision": "fp32", "flops": 8.0, "flops_per_s": v} for v in (1.0, 3.0, 2.0)]
    rows += [{"precision": "fp32", "flops": 64.0, "flops_per_s": 5.0}, {"precision": "bf16", "flops": 8.0, "flops_per_s": 9.0}]
    assert build.matmul_curve(rows, "fp32", 4.0) == [[8.0, 0.5], [64.0, 1.0]]


def test_probe_kernels_match_the_compute_model():
    spec = probes.probe_spec()
    from simcore.model import workload as wl

    ops = wl.layer_forward_ops(spec, b=1, s=spec.seq_len)
    assert probes.probe_kernels(spec) == (12, 16)     # 4 GEMMs get 2 backward kernels each
    assert sum(o.kernels for o in ops) == 12


def test_cpu_half_precision_grid_stops_early():
    shapes = probes.matmul_shapes("bf16", torch.device("cpu"))
    assert max(m for m, _, _ in shapes) == probes.CPU_HALF_MAX_SIZE
    assert max(m for m, _, _ in probes.matmul_shapes("fp32", torch.device("cpu"))) == 1024


def test_cold_layer_gemms_alone_make_the_curve_and_hot_squares_set_the_peak():
    rows = probes.bench_layer_gemms(tokens=(8,), hidden=(16, 32), min_time_s=0.001)
    assert [r["form"] for r in rows] == ["layer-fwd", "layer-dx", "layer-dw"] * 2
    assert all(r["cold"] and r["flops"] == 2.0 * 8 * r["k"] * 4 * r["k"] and r["flops_per_s"] > 0 for r in rows)
    hot = [{"precision": "fp32", "m": 4, "k": 4, "n": 4, "flops": 128.0, "flops_per_s": 2.0}]
    cold = [{"precision": "fp32", "flops": f, "flops_per_s": v, "cold": True} for f, v in ((128.0, 0.5), (128.0, 1.5), (1024.0, 1.0))]
    assert build.matmul_curve(hot + cold, "fp32", 2.0) == [[128.0, 0.5], [1024.0, 0.5]]
    assert build.matmul_curve(hot, "fp32", 2.0) == [[128.0, 1.0]]


def test_checkpointing_host_cost_is_what_the_recompute_model_does_not_charge(synthetic):
    from simcore.plan.spec import Recompute

    prof = yaml.safe_load(synthetic.read_text())
    eff, peak = prof["efficiency"], prof["device"]["dense_tflops"]["fp32"] * 1e12
    bw = prof["device"]["hbm_tbyte_per_s"] * 1e12
    host = {"forward_s": 4e-4, "backward_s": 6e-4, "forward_kernels": 12, "backward_kernels": 16,
            "per_kernel_s": 1e-3 / 28,
            "checkpointed": {"full": {"forward_s": 6e-4, "backward_s": 1.5e-3},
                             "selective": {"forward_s": 4e-4, "backward_s": 5e-4}}}
    out = probes.recompute_kernels(host, peak, bw, eff)
    device = sum(probes.serial_layer_s(probes.probe_spec(), peak, bw, eff["matmul"]["points"], eff["attention"]["forward"]))
    dispatch = 1e-3 / 28 - device / 28
    rec = probes.serial_layer_s(probes.probe_spec(), peak, bw, eff["matmul"]["points"], eff["attention"]["forward"],
                             dispatch, Recompute.FULL)[0]
    assert out["recompute_full"]["forward_kernels"] == pytest.approx(2e-4 * 28 / 1e-3)
    assert out["recompute_full"]["backward_kernels"] == pytest.approx((9e-4 - rec) * 28 / 1e-3)
    assert out["recompute_selective"] == {"forward_kernels": 0.0, "backward_kernels": 0.0}   # never negative


def _saved_and_counted(b: int, autocast: bool):
    """(saved-tensor peak, executor_acts' count) of one forward and backward of the executor's
    GPT-style model, at two widths and one and two layers (under CPU autocast, bf16, with
    ``autocast``)."""
    import contextlib

    from executors.measure import SavedActivations
    from executors.model import build_model, loss_fn
    from simcore.plan.spec import ModelSpec

    torch.manual_seed(0)
    for layers, h, a in ((1, 64, 4), (2, 128, 8)):
        spec = ModelSpec(name="t", layers=layers, hidden=h, heads=a, kv_heads=a, ffn_hidden=4 * h, vocab=256,
                         seq_len=32, tied_embeddings=False)
        model = build_model(spec)
        saved = SavedActivations(model.parameters())
        x, y = torch.randint(0, 256, (b, 32)), torch.randint(0, 256, (b, 32))
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
        with saved.hooks():
            with cast:
                out = model(x)
            loss_fn(out, y).backward()
        yield saved.peak, (layers * xa.layer_bytes(spec, b=b, s=32, autocast=autocast)
                           + xa.embedding_bytes(spec, b=b, s=32) + xa.logits_bytes(spec, b=b, s=32, autocast=autocast))


def test_executor_activation_formula_matches_the_saved_tensor_hooks():
    """Differential: simcore.model.executor_acts' count of what executors.model saves, against the
    executor's own saved-tensor measurement, for two widths and one and two layers."""
    for peak, want in _saved_and_counted(b=1, autocast=False):
        assert peak == pytest.approx(want, abs=8)   # the 4-byte scalar loss is not modelled


def test_autocast_activation_formula_matches_the_saved_tensor_hooks():
    """Differential under torch autocast (bf16, as the executor runs on a GPU): the fp32 residual
    stream, a 16-bit input copy per linear and each weight's 16-bit copy. On a CPU, RMSNorm runs
    as composite ops that also save the normalized fp32 tensor (CUDA's fused kernel does not:
    the H100 runs of validation/gpu_runs.csv are within 0.6% of this count), so the check uses
    GPT-style LayerNorm models."""
    for peak, want in _saved_and_counted(b=2, autocast=True):
        assert peak == pytest.approx(want, rel=0.01)


def test_latency_bound_collective_fit_is_capped_at_the_copy_bandwidth():
    # three latency-bound sizes whose times fall with size (noise): the unconstrained
    # slope is negative and 1/slope would run away; the cap holds beta at the host's copy
    # bandwidth, marks the fit, and alpha is refitted under the capped slope
    rows = [{"op": "all_reduce", "ranks": 2, "bytes": b, "seconds": t}
            for b, t in ((4096, 2.1e-4), (65536, 2.0e-4), (1 << 20, 1.9e-4))]
    fit = cprobes.fit_alpha_beta(rows, max_bytes_per_s=1e10)["all_reduce"][2]
    assert fit["bus_bytes_per_s"] == 1e10 and fit["capped_at_copy_bandwidth"]
    assert 0.0 < fit["alpha_s"] < 2.1e-4
    # a fit below the cap is left alone and unmarked
    fit = cprobes.fit_alpha_beta(alpha_beta_rows("all_reduce", 4), max_bytes_per_s=1e10)["all_reduce"][4]
    assert fit["bus_bytes_per_s"] == pytest.approx(BETA, rel=1e-6) and "capped_at_copy_bandwidth" not in fit


def test_a_probe_step_is_progress_for_the_watchdog(monkeypatch):
    """On a busy host the parallel probe ran past the spawning watchdog's 240 s without a beat
    ("no heartbeat for 240 s ... after 0 steps") and calibrate failed; each timed step beats now,
    outside its timed region."""
    from executors import watchdog
    from executors.calibrate import probes

    beats = []
    monkeypatch.setattr(watchdog, "heartbeat", lambda steps=None: beats.append(steps))
    assert probes._median_step(lambda: (1.0, 2.0), reps=4, warmup=2) == (1.0, 2.0)
    assert len(beats) == 6
