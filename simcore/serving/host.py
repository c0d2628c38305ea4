"""A CPU host's serving costs, measured for the serving loop (``executors.serving_loop``).

On a GPU the engines run CUDA graphs and the roofline is the iteration (``cost``'s docstring). On
a CPU host the eager loop's own work shows, and GEMMs of a few rows (the decoding requests') run
far below the FLOP-indexed matmul curve of the host's profile. So on a host calibrated for serving
(``trainplan serve PLAN --calibrate``) an iteration is

    layers x one layer's linear GEMMs at its tokens + the output layer at its emitting rows
    + attention (the profile's roofline) + KV bytes read and written (the profile's bandwidth)
    + per iteration + per decoding request x decodes + per prefill token x tokens + per chunk x chunks
    + per cached token read x the KV tokens its attention reads
    + after the loop idled for a while, what its first iteration costs more (measured at idle waits)

The GEMM times are measured at the model's own shapes (``executors.calibrate.serving_probes
.bench_linear``: its layer's linear modules at 1 to 512 rows, its output layer likewise),
interpolated between the measured row counts. The last four terms are the loop's own costs
(the scheduler and the batch's index tensors in Python, one dispatch per op, the norms and
elementwise ops): ``trainplan serve PLAN --calibrate`` runs the loop on the plan's model over probe
workloads of its own (offline, fixed shapes, none of them a validation cell:
``serving_probes.bench_serving_loop``), and ``fit_host`` fits them by least squares to the
residual (measured iteration - the terms above), over the probe iterations grouped by their
composition, each group's median residual once (a coefficient that comes out negative is
dropped and the rest refitted). The figures are kept per model and precision in a calibration
file beside the host's profile, each entry with its source and the probe groups that gave it.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from simcore.plan.spec import ModelSpec

#: The fitted terms, in the order of ``features``.
TERMS = ("iteration_us", "decode_us", "prefill_token_us", "chunk_us", "kv_token_us")


def _interp(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise linear through ``points`` (sorted by x), extended along the end segments."""
    if x <= 0:
        return 0.0
    xs = [p[0] for p in points]
    i = min(max(1, int(np.searchsorted(xs, x))), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass(frozen=True, slots=True)
class HostCosts:
    """A serving-calibrated CPU host's figures for one model (module docstring), seconds."""

    iteration_s: float
    decode_s: float
    prefill_token_s: float
    chunk_s: float
    kv_token_s: float
    linear: tuple[tuple[float, float], ...]
    """(tokens, seconds) of one layer's linear GEMMs."""
    logits: tuple[tuple[float, float], ...]
    """(rows, seconds) of the output layer."""
    wake: tuple[tuple[float, float], ...] = ()
    """(idle seconds, extra seconds) of the first iteration after the loop waited that long for work;
    interpolated from (0, 0), the last figure beyond the longest wait measured."""
    source: str = ""

    def seconds(self, prefill_tokens: float, chunks: float, decodes: float, kv_tokens: float) -> float:
        """The loop's own terms."""
        return float(np.dot(self.terms(), features(prefill_tokens, chunks, decodes, kv_tokens)))

    def terms(self) -> tuple[float, ...]:
        return (self.iteration_s, self.decode_s, self.prefill_token_s, self.chunk_s, self.kv_token_s)

    def gemm_s(self, layers: int, tokens: float, rows: float) -> float:
        """The measured GEMMs: every layer's linear modules over ``tokens``, the output layer over ``rows``."""
        return layers * _interp(self.linear, tokens) + _interp(self.logits, rows)

    def wake_s(self, idle_s: float) -> float:
        """What the first iteration after ``idle_s`` seconds without work costs more."""
        if not self.wake or idle_s <= 0:
            return 0.0
        return _interp(((0.0, 0.0), *self.wake), min(idle_s, self.wake[-1][0]))

    def without_terms(self) -> "HostCosts":
        """The GEMM tables alone (the loop's terms 0): what the fit's residual is taken against."""
        return HostCosts(0.0, 0.0, 0.0, 0.0, 0.0, self.linear, self.logits, self.wake, self.source)


def features(prefill_tokens: float, chunks: float, decodes: float, kv_tokens: float) -> tuple[float, ...]:
    """The loop terms' multipliers, in ``TERMS`` order."""
    return (1.0, float(decodes), float(prefill_tokens), float(chunks), float(kv_tokens))


def model_key(model: ModelSpec, precision: str) -> str:
    """The calibration's key: the dimensions and structure that set the loop's costs."""
    return (f"L{model.layers}-h{model.hidden}-a{model.heads}/{model.kv_heads}x{model.head_dim}-f{model.ffn_hidden}"
            f"-v{model.vocab}-{'gated' if model.gated_mlp else 'gelu'}-{model.position_embedding}"
            f"-{'tied' if model.tied_embeddings else 'untied'}-{precision}")


def fit_host(tables: HostCosts, rows: list[tuple[float, float, tuple]]) -> tuple[HostCosts, dict]:
    """The loop's terms beside the measured GEMM ``tables``, from probe iterations (measured s,
    the cost model's s with ``tables.without_terms()``, (prefill tokens, chunks, decodes, KV tokens read)): least
    squares over the compositions' median residuals, negative terms dropped. Also the groups
    (composition -> (iterations, median residual s)) it was fitted on."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for measured, device, comp in rows:
        groups[tuple(comp)].append(measured - device)
    comps = sorted(groups)
    x = np.array([features(*c) for c in comps])
    y = np.array([float(np.median(groups[c])) for c in comps])
    keep = list(range(len(TERMS)))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, keep], y, rcond=None)
        if len(keep) == 1 or coef.min() >= 0:
            break
        keep.pop(int(np.argmin(coef)))
    full = np.zeros(len(TERMS))
    full[keep] = np.maximum(coef, 0.0)
    costs = HostCosts(*map(float, full), linear=tables.linear, logits=tables.logits, wake=tables.wake,
                      source=tables.source)
    return costs, {c: (len(groups[c]), float(v)) for c, v in zip(comps, y)}


def calibration_entry(costs: HostCosts, groups: dict, probe: str, host: str, date: str) -> dict:
    """One model's entry of the serving calibration file, with its source and probe groups."""
    source = (f"measured by trainplan serve --calibrate on {host}, {date}; GEMMs: the model's linear "
              f"modules timed alone at each row count; loop terms: {probe}; least squares of (loop iteration "
              "- simcore.serving.cost.iteration_s without them) over the probe compositions' median residuals")
    out: dict = {t: round(v * 1e6, 3) for t, v in zip(TERMS, costs.terms())}
    out["layer_linear_us"] = [[int(n), round(t * 1e6, 2)] for n, t in costs.linear]
    out["logits_us"] = [[int(n), round(t * 1e6, 2)] for n, t in costs.logits]
    out["wake_us"] = [[round(d * 1e3, 3), round(t * 1e6, 2)] for d, t in costs.wake]
    out["wake_unit"] = "[idle ms, extra us]"
    out["source"] = source
    out["probe_groups"] = [{"prefill_tokens": c[0], "chunks": c[1], "decodes": c[2], "kv_tokens": c[3],
                            "iterations": n, "residual_us": round(r * 1e6, 2)} for c, (n, r) in groups.items()]
    return out


def host_costs_from(doc: dict | None, key: str) -> HostCosts | None:
    """The entry ``key`` of a serving calibration document, or None where it has none (or a broken one)."""
    entry = ((doc or {}).get("models") or {}).get(key)
    if not isinstance(entry, dict):
        return None
    try:
        def table(name: str) -> tuple[tuple[float, float], ...]:
            pts = tuple(sorted((float(n), float(t) * 1e-6) for n, t in entry[name]))
            if len(pts) < 2:
                raise ValueError(name)
            return pts

        wake = tuple(sorted((float(d) * 1e-3, float(t) * 1e-6) for d, t in entry.get("wake_us") or ()))
        return HostCosts(*(float(entry[t]) * 1e-6 for t in TERMS), linear=table("layer_linear_us"),
                         logits=table("logits_us"), wake=wake, source=str(entry.get("source", "")))
    except (KeyError, TypeError, ValueError):
        return None
