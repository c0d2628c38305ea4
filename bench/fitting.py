"""The catalog's FITTED figures as code: each figure, its bounds, its prior, the rows it is
fitted to and how it is written into ``topologies/catalog/efficiency.yaml``.

``bench/fit.py`` runs the procedure (``fit_rows.fit``) and writes the catalog and
``validation/fits.yaml``; ``bench/validate_published.py`` reads the leave-one-source-out
figures back (``override``) to predict each source with figures that never saw it.

A figure is written to every entry that takes it (the framework figures to every GPU, the
H100's FP8 ratios to the H100 96GB and the H200, ...) and the figures derived from it are
derived again (the 500 W H100's curves from the H100's, the B200 family's large GEMMs from the
H100 curve times XLA's measured B200/H100 ratios), so the catalog never holds a stale copy.
"""
from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass

from topologies.hardware import load_catalog

#: The efficiency entries as the catalog stores them (the base every fit writes over).
BASE = copy.deepcopy(load_catalog().efficiency)
A100 = ("a100-80gb", "a100-40gb")
H100 = ("h100-sxm", "h200")           # the same GH100 compute and clocks (H200 datasheet)
H100_500W = "h100-sxm-96gb-500w"
HOPPER_FP8 = ("h100-sxm", H100_500W, "h200")
#: Entries whose large GEMMs are the H100 curve times XLA's measured sm_100 / sm_90 share
#: ratio (ROCm/xla matmul_interpolator_data.h @63ce2981; efficiency.yaml's b200 source).
B200_FAMILY = ("b200", "b300", "gb200", "gb300")
B200_RATIO = ((1e10, 0.58), (1e11, 0.76), (3e11, 0.85), (1e12, 0.93))
#: The H100 curve's large points relative to its 1e12-FLOP plateau: cuBLAS bf16 on H100 SXM
#: (650-700 TFLOP/s of 989 for large GEMMs, less below 1e11 FLOPs), the shape kept in the fit.
H100_SHAPE = ((1e10, 0.51 / 0.63), (1e11, 0.60 / 0.63), (1e12, 1.0))
#: A100: the points from 1e10 FLOPs on are the plateau (cuBLAS's curve is flat there).
A100_PLATEAU_FROM = 1e10
#: The TPU family (issue 54): one MXU plateau for v4, v5e and v5p, fitted to MaxText's tables of
#: dev_accelerators.csv only; the points from 1e10 FLOPs on (the A100 curve's shape below). The
#: fit writes it to the family's later chips too (EXTENDED: v6e and TPU7x have no row, so only the
#: chips with rows are fitted to; SOURCES.md 'TPU efficiency').
TPU = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu7x")
#: The Trainium family (issue 54): one TensorEngine plateau, fitted to Neuron's trn1 tables of
#: dev_accelerators.csv only; the points from 1e10 FLOPs on, as the TPU family's; extended to Trn2.
TRAINIUM = ("trn1", "trn2")
#: The Ascend family (issue 54): one Cube-unit plateau and one interference beside MC2, fitted to
#: MindSpeed-LLM's 910B table of dev_accelerators.csv only; the points from 1e10 FLOPs on, as the TPU
#: family's; extended to the 910C (two 910B-class dies, no row of its own).
ASCEND = ("ascend-910b", "ascend-910c")
ACCELERATOR_ROWS = "dev_accelerators.csv"


ALL_ROWS = "every row of dev_runs.csv, vtrain_runs.csv and dev_modern.csv that validate_published predicts"


@dataclass(frozen=True, slots=True)
class Figure:
    """One fitted figure: its home in the catalog, its grid and bounds, its prior and rows."""

    name: str
    home: str
    """Where the catalog stores it (entry: key path)."""
    block: str
    """Figures of one block are fitted jointly (they share rows)."""
    prior: float
    """The figure as read before any fitting; the start of the search and its value when
    every row it is fitted to is left out."""
    lo: float
    hi: float
    step: float
    """The digits the catalog stores: the grid the search moves on."""
    basis: str
    """Where the bounds and the prior come from (the published range, a measurement)."""
    rows: str
    """The rows it is fitted to, in words (``fit_rows.block_rows`` selects them)."""


FIGURES = (
    Figure("a100_plateau", "a100-80gb: matmul.points (>= 1e10 FLOPs)", "rows", 0.88, 0.55, 0.90, 0.01,
           "at most the isolated cuBLAS rate (270-280 of 312 TFLOP/s, NVIDIA's Matrix Multiplication "
           "guide), at least the curve's 1e9-FLOP point (0.55: the curve rises with size); prior the "
           "isolated rate, 0.88",
           ALL_ROWS),
    Figure("h100_plateau", "h100-sxm: matmul.points (>= 1e10 FLOPs, cuBLAS shape)", "rows", 0.71, 0.44, 0.76,
           0.01, "at most the boost-clock cuBLAS rate (750 of 989 TFLOP/s), at least where the 1e10 point "
           "meets the 1e9 one (0.35 = 0.81 x 0.44); prior this project's H100 probe, 698-706 TFLOP/s "
           "isolated (topologies/catalog/profiles/h100-80gb-hbm3.md)", ALL_ROWS),
    Figure("kernel_overhead_us", "every entry: kernel_overhead_us", "rows", 7.0, 3.0, 60.0, 1.0,
           "one CUDA launch gap (3-5 us) to a dozen per modelled kernel; prior the H100 probe's launch "
           "of a one-element kernel, 7.3 us", ALL_ROWS),
    Figure("host_overhead_us", "every entry: host_overhead_us", "rows", 75.0, 10.0, 200.0, 1.0,
           "eager PyTorch's dispatch per op (about 10 us) to twenty ops per modelled kernel; prior the "
           "H100 probe's host time per modelled kernel, 74.8 us",
           ALL_ROWS),
    Figure("comm_compute_interference", "every entry: comm_compute_interference", "rows", 1.7, 1.0, 4.8, 0.1,
           "no slow-down to the worst measured (Agrawal et al. 2024, arXiv 2412.14335: 21-42% of the ideal "
           "overlap, factor 2.4-4.8); prior an H100 GEMM beside a 24-block NCCL all-gather, 1.7x (NVIDIA "
           "developer forum, 2025)",
           ALL_ROWS),
    Figure("triton_ratio", "h100-sxm: attention.kernels.triton (flash2 / ratio)", "rows", 1.8, 1.3, 2.5, 0.05,
           "Dao 2023 (arXiv 2307.08691) Sec. 4.1: FlashAttention-2 1.3-2.5x the Triton kernel; prior the "
           "range's geometric middle", ALL_ROWS + " (it moves the H100 rows that run the Triton kernel: llm-foundry)"),
    Figure("tpu_plateau", "tpu-v4, tpu-v5e, tpu-v5p (extended to tpu-v6e, tpu7x): matmul.points (>= 1e10 FLOPs)",
           "tpu", 0.88, 0.71, 0.95, 0.01,
           "at least the highest model-FLOPs utilisation MaxText publishes (0.7147, v5p 32B: a step cannot "
           "run its matmuls faster than its GEMMs' rate), at most 0.95 of the MXU peak; prior the A100 "
           "plateau's prior, an isolated dense GEMM at 0.88 of peak (no public MXU GEMM sweep)",
           "the TPU rows of dev_accelerators.csv that bench/published_accelerators.py predicts (MaxText's "
           "v4, v5e and v5p tables); no GPU row"),
    Figure("trainium_plateau", "trn1 (extended to trn2): matmul.points (>= 1e10 FLOPs)", "trainium", 0.88, 0.33, 0.95,
           0.01,
           "at least the highest model-FLOPs utilisation Neuron's trn1 tables publish (0.3314, GPT3-175B on "
           "512 chips; the definition is not printed, and a step cannot run its matmuls faster than its "
           "GEMMs' rate), at most 0.95 of the TensorEngine peak (the TPU family's bound); prior the A100 "
           "plateau's prior, an isolated dense GEMM at 0.88 of peak (no public Trainium GEMM sweep)",
           "the trn1 rows of dev_accelerators.csv that bench/published_accelerators.py predicts (Neuron's "
           "trn1 performance tables, one source: left out, the figure is its prior); no GPU or TPU row"),
    Figure("ascend_plateau", "ascend-910b: matmul.points (>= 1e10 FLOPs)", "ascend", 0.70, 0.30, 0.95, 0.01,
           "at least 0.30, about the lowest model-FLOPs utilisation MindSpeed-LLM's 910B table implies at 354 "
           "TFLOP/s (0.25-0.54 over its rows, counting 6 x params and causal attention per token: the table "
           "prints no MFU, and attention runs at its own rate, so the highest is no bound), at most 0.95 of the "
           "Cube peak (the TPU family's bound); prior Huawei's own model's compute_efficiency, 0.7 "
           "(Ascend/msmodeling tensor_cast/device.py @84fec853: 'something we need to calibrate')",
           "the 910B rows of dev_accelerators.csv that bench/published_accelerators.py predicts (MindSpeed-LLM's "
           "2024 table, one source: left out, the figure is its prior); no GPU, TPU or Trainium row"),
    Figure("ascend_interference", "ascend-910b: comm_compute_interference", "ascend", 1.7, 1.0, 4.8, 0.1,
           "as comm_compute_interference (no slow-down to the worst measured on GPUs, 4.8): how far MC2's fused "
           "matmul-communication kernels (MindSpeed-LLM mc2_linears_seq_parallel.py @a27b45f00) fall short of "
           "hiding TP's traffic; prior the GPUs' (an H100 GEMM beside an all-gather, 1.7x): no Ascend figure "
           "is stored",
           "the 910B rows of dev_accelerators.csv that bench/published_accelerators.py predicts (the TP rows "
           "decide it; one source: left out, the figure is its prior)"),
    Figure("fp8_matmul_ratio", "h100-sxm: fp8_matmul_ratio", "fp8", 0.97, 0.5, 1.0, 0.01,
           "at 0.5 an FP8 GEMM gains nothing over BF16 (twice the peak), at 1.0 it keeps BF16's share; "
           "prior the calibrated H100's FP8 GEMM at 0.97 of BF16's (bench/RESULTS.md, sixteenth session)",
           "the FP8/BF16 pairs of dev_modern.csv whose recipe takes the ratio (delayed, tensorwise)"),
    Figure("fp8_rowwise", "h100-sxm: fp8_recipes.rowwise", "rowwise", 0.97, 0.5, 1.0, 0.01,
           "as fp8_matmul_ratio; prior the per-tensor GEMM's ratio as measured (0.97)",
           "the rowwise/BF16 pair of dev_modern.csv (torchao float8, H100)"),
    Figure("h100_500w_clock", "h100-sxm-96gb-500w: the h100-sxm curves x factor", "clock500", 1.0, 0.714, 1.0,
           0.01, "at most the 700 W part's throughput, at least 500/700 (throughput falling as fast as "
                 "the power limit); prior 1.0, the datasheet peaks the part shares with the H100 SXM",
           "torchtitan's own Llama 3.1 8B tables on that fleet (bench/torchtitan_fleet.py ROWS; not in "
           "../shared/validation)"),
)
BY_NAME = {f.name: f for f in FIGURES}
BLOCKS = ("rows", "fp8", "rowwise", "clock500", "tpu", "trainium", "ascend")
#: The accelerator families: block -> (its plateau figure, the entries it is written to).
PLATEAUS = {"tpu": ("tpu_plateau", TPU), "trainium": ("trainium_plateau", TRAINIUM),
            "ascend": ("ascend_plateau", ASCEND)}


def _points(e: dict) -> list[list[float]]:
    return e["matmul"]["points"]


def _curve_at(points, x: float) -> float:
    """The efficiency curve at ``x`` FLOPs, piecewise linear in log10 (EfficiencyCurve.at)."""
    pts = sorted(points)
    if x <= pts[0][0]:
        return pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            t = (math.log10(x) - math.log10(x0)) / (math.log10(x1) - math.log10(x0))
            return y0 + t * (y1 - y0)
    return pts[-1][1]


def _r(v: float, digits: int) -> float:
    return float(round(v, digits))


def _set_framework(eff: dict, v: dict) -> None:
    for name in A100:
        eff[name]["matmul"]["points"] = [[x, v["a100_plateau"] if x >= A100_PLATEAU_FROM else y]
                                         for x, y in _points(eff[name])]
    shape = dict(H100_SHAPE)
    for name in H100:
        eff[name]["matmul"]["points"] = [[x, _r(v["h100_plateau"] * shape[x], 2) if x in shape else y]
                                         for x, y in _points(eff[name])]
    if v["h100_plateau"] != BASE["h100-sxm"]["matmul"]["points"][-1][1]:   # derived only when it moved
        h100 = _points(eff["h100-sxm"])
        for name in B200_FAMILY:
            ratio = dict(B200_RATIO)
            eff[name]["matmul"]["points"] = [[x, _r(_curve_at(h100, x) * ratio[x], 3) if x in ratio else y]
                                             for x, y in _points(eff[name])]
    families = {n for _, names in PLATEAUS.values() for n in names}
    for name, e in eff.items():
        if name in families:   # an accelerator family's own figures (``_set_accelerators``)
            continue
        for key in ("kernel_overhead_us", "host_overhead_us", "comm_compute_interference"):
            if key in e:
                e[key] = float(v[key])


def _set_hopper(eff: dict, v: dict) -> None:
    for name in H100:
        kernels = eff[name]["attention"]["kernels"]
        kernels["triton"]["forward"] = _r(kernels["flash2"]["forward"] / v["triton_ratio"], 3)
        kernels["triton"]["backward"] = _r(kernels["flash2"]["backward"] / v["triton_ratio"], 3)
    for name in HOPPER_FP8:
        eff[name]["fp8_matmul_ratio"] = float(v["fp8_matmul_ratio"])
        eff[name]["fp8_recipes"] = {**eff[name].get("fp8_recipes", {}), "rowwise": float(v["fp8_rowwise"])}
    f, h100, low = v["h100_500w_clock"], eff["h100-sxm"], eff[H100_500W]
    low["matmul"]["points"] = [[x, _r(y * f, 4)] for x, y in _points(h100)]
    for key in ("forward", "backward"):
        low["attention"][key] = _r(h100["attention"][key] * f, 3)
        for kernel, fr in h100["attention"]["kernels"].items():
            low["attention"]["kernels"][kernel][key] = _r(fr[key] * f, 3)


def _set_accelerators(eff: dict, v: dict) -> None:
    for figure, names in PLATEAUS.values():
        for name in names:
            if name in eff:
                eff[name]["matmul"]["points"] = [[x, v[figure] if x >= A100_PLATEAU_FROM else y]
                                                 for x, y in _points(eff[name])]
    for name in ASCEND:
        eff[name]["comm_compute_interference"] = float(v["ascend_interference"])


def efficiency_with(values: dict) -> dict:
    """The catalog's efficiency entries with ``values`` (figure name -> value) written in,
    and every figure derived from them derived again."""
    eff = copy.deepcopy(BASE)
    v = {**stored_values(), **values}
    _set_framework(eff, v)
    _set_hopper(eff, v)
    _set_accelerators(eff, v)
    return eff


def stored_values(eff: dict | None = None) -> dict:
    """The fitted figures as ``eff`` (default: the catalog as stored) holds them."""
    eff = BASE if eff is None else eff
    h100 = eff["h100-sxm"]
    flash2, triton = h100["attention"]["kernels"]["flash2"], h100["attention"]["kernels"]["triton"]
    return {"a100_plateau": _points(eff["a100-80gb"])[-1][1], "h100_plateau": _points(h100)[-1][1],
            "kernel_overhead_us": eff["a100-80gb"]["kernel_overhead_us"],
            "host_overhead_us": eff["a100-80gb"]["host_overhead_us"],
            "comm_compute_interference": eff["a100-80gb"]["comm_compute_interference"],
            "triton_ratio": _r(flash2["forward"] / triton["forward"], 2),
            "fp8_matmul_ratio": h100["fp8_matmul_ratio"], "fp8_rowwise": h100["fp8_recipes"]["rowwise"],
            "h100_500w_clock": _r(_points(eff[H100_500W])[-1][1] / _points(h100)[-1][1], 2),
            "tpu_plateau": _points(eff[TPU[0]])[-1][1], "trainium_plateau": _points(eff[TRAINIUM[0]])[-1][1],
            "ascend_plateau": _points(eff[ASCEND[0]])[-1][1],
            "ascend_interference": eff[ASCEND[0]]["comm_compute_interference"]}


@contextlib.contextmanager
def override(values: dict | None):
    """Predict with ``values`` written into the loaded catalog (the process's own copy; the
    files are untouched); restored on exit. None: the catalog as stored."""
    from simcore.model import compute

    eff = load_catalog().efficiency
    saved = copy.deepcopy(eff)
    try:
        if values:
            new = efficiency_with(values)
            for name in new:
                eff[name] = new[name]
        compute.device_model.cache_clear()
        yield
    finally:
        for name in saved:
            eff[name] = saved[name]
        compute.device_model.cache_clear()


def on_grid(f: Figure, x: float) -> float:
    """``x`` on the figure's grid (multiples of its stored step), clamped to its bounds."""
    digits = len(repr(f.step).split(".")[1].rstrip("0")) if f.step < 1 else 0
    return min(max(_r(round(x / f.step) * f.step, digits), f.lo), f.hi)
