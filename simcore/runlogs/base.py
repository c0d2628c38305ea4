"""The shape every stack's parser fills, and the warm-up rule and median every comparison uses."""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

#: ANSI colour codes (torchtitan colours its metrics line).
ANSI = re.compile(r"\x1b\[[0-9;]*m")

#: Warm-up rule: drop every logged entry at a step <= max(first logged step, WARMUP_FRACTION x last
#: logged step), but keep at least MIN_KEPT entries (then only the first is dropped, or none).
WARMUP_FRACTION = 0.1
MIN_KEPT = 2


class LogError(ValueError):
    """A log that cannot be read: one sentence naming what is missing."""


@dataclass
class Sample:
    """One logged step (or one averaged log interval / timed block ending at ``step``)."""

    step: int
    step_s: float | None = None
    tflops_per_gpu: float | None = None
    tokens_per_s_per_gpu: float | None = None
    samples_per_s: float | None = None
    mfu: float | None = None
    memory_bytes: float | None = None


@dataclass
class RunLog:
    """What one log file says about a run."""

    stack: str
    path: str
    samples: list[Sample] = field(default_factory=list)
    peak_memory_bytes: float | None = None
    memory_what: str = ""
    layout: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    step_what: str = "per-iteration lines"


def steady(samples: list[Sample]) -> tuple[list[Sample], str]:
    """The samples after the warm-up rule, and the rule as applied (one phrase)."""
    samples = sorted(samples, key=lambda s: s.step)
    if len(samples) <= MIN_KEPT:
        return samples, f"all {len(samples)} kept (too few entries to drop a warm-up)"
    cut = max(samples[0].step, WARMUP_FRACTION * samples[-1].step)
    kept = [s for s in samples if s.step > cut]
    if len(kept) < MIN_KEPT:
        kept = samples[1:]
        cut = samples[0].step
    return kept, (f"dropped {len(samples) - len(kept)} warm-up entr{'y' if len(samples) - len(kept) == 1 else 'ies'} "
                  f"(steps <= {cut:g}: the first logged step and the first {WARMUP_FRACTION:.0%} of the run), "
                  f"median of {len(kept)}")


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(log: RunLog) -> dict:
    """Median step time (s), TFLOP/s per GPU, tokens/s per GPU, samples/s and MFU over the steady
    samples, the peak memory (bytes), and the warm-up rule as applied."""
    kept, rule = steady(log.samples)
    out = {name: _median(getattr(s, name) for s in kept)
           for name in ("step_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "samples_per_s", "mfu")}
    mems = [s.memory_bytes for s in log.samples if s.memory_bytes is not None]
    peak = max(mems + ([log.peak_memory_bytes] if log.peak_memory_bytes else []), default=None)
    out.update(peak_memory_bytes=peak, rule=rule, entries=len(log.samples), kept=len(kept))
    return out


def number(text: str) -> float:
    """A logged number, thousands separators allowed ("5,856")."""
    return float(text.replace(",", ""))
