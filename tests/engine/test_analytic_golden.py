"""The analytic path's predictions do not move when it is made faster: a grid of layouts across
models, clusters (a calibrated CPU host included), schedules (interleaved, zero-bubble), ZeRO
0-3 (FSDP2, DeepSpeed), cp, ep MoE, fp8, offload and the recompute policies, each StepResult
figure held to rel 1e-12 against ``analytic_golden.json.gz``, which main's code wrote before the
speed work (issue 29 item 4); and the caches keyed on parts of a Plan answer as cold ones do.

Regenerate the golden file only for a change that means to move predictions:

    PYTHONPATH=. .venv/bin/python -m tests.engine.test_analytic_golden --write
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import math
import random
import sys
from pathlib import Path

import pytest

from simcore.engine.predict import simulate
from simcore.plan.load import plan_from_dict
from simcore.plan.rules import check_plan
from simcore.plan.spec import PlanError

GOLDEN = Path(__file__).with_name("analytic_golden.json.gz")
REL = 1e-12
#: Valid layouts drawn per base plan, and draws tried per base before giving up.
PER_BASE, TRIES = 60, 10000
SEED = 29

TINY = {"name": "tiny", "layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32, "tied_embeddings": False}
BASES = {
    "gpt3-a100": {"model": "gpt3-175b", "cluster": {"node": "dgx-a100-80gb", "nodes": 192},
                  "training": {"global_batch": 1536}},
    "llama70b-h100": {"model": "llama3-70b", "cluster": {"node": "dgx-h100", "nodes": 32},
                      "training": {"global_batch": 512}},
    "mixtral-h100": {"model": "mixtral-8x7b", "cluster": {"node": "dgx-h100", "nodes": 16},
                     "training": {"global_batch": 256}},
    "llama8b-b200": {"model": "llama3-8b", "cluster": {"node": "dgx-b200", "nodes": 4},
                     "training": {"global_batch": 128}},
    "tiny-host": {"model": TINY, "cluster": {"node": "localhost", "gpus_per_node": 4},
                  "training": {"global_batch": 16}},
}
#: Axes a base draws from a narrower set (the CPU host: four ranks, fp32, no flash kernel).
NARROW = {"tiny-host": {"tp": (1, 2), "pp": (1, 2, 4), "cp": (1, 2), "ep": (1,), "vpp": (1, 2),
                        "precision": ("fp32",), "flash_attention": (False,), "micro_batch": (1, 2)}}
AXES = {
    "tp": (1, 2, 4, 8), "pp": (1, 2, 4, 8, 12, 16), "cp": (1, 1, 2, 4), "ep": (1, 2, 4, 8), "vpp": (1, 1, 2, 3),
    "schedule": ("1f1b", "gpipe", "interleaved-1f1b", "zero-bubble"), "zero": (0, 1, 2, 3),
    "zero_impl": ("fsdp2", "fsdp2", "deepspeed"), "sequence_parallel": (False, True),
    "tp_comm_overlap": (False, False, True), "cp_comm": ("p2p", "all_gather", "a2a"),
    "micro_batch": (1, 1, 2, 4), "recompute": ("none", "selective", "full", "op", "layer:2", "full-block:2"),
    "offload": ("none", "none", "optimizer", "optimizer+params"), "precision": ("bf16", "bf16", "fp8", "fp16"),
    "fp8_recipe": ("delayed", "current", "tensorwise", "rowwise"), "loss": ("fused", "eager", "chunked"),
    "flash_attention": (False, True), "grad_compression": ("none", "none", "bf16", "powersgd"),
    "optimizer": ("adamw", "adamw", "sgd"), "master_weights": (True, True, False),
}
PARALLEL = ("tp", "pp", "cp", "ep", "vpp", "schedule", "zero", "zero_impl", "sequence_parallel", "tp_comm_overlap",
            "cp_comm")


RECOMPUTE = {"layer:2": ("layer", 2, "uniform"), "full-block:2": ("full", 2, "block")}


@functools.lru_cache(maxsize=None)
def _base(base: str):
    return plan_from_dict(BASES[base])


def _fields(spec, values: dict):
    """``spec`` with ``values`` in its own field types (enums from their names)."""
    return dataclasses.replace(spec, **{k: type(getattr(spec, k))(v) for k, v in values.items()})


def _plan(base: str, layout: dict):
    """The base plan with the layout's fields, as the planner derives its candidates."""
    plan = _base(base)
    par = {k: layout[k] for k in PARALLEL}
    par["sequence_parallel"] = par["sequence_parallel"] and par["tp"] > 1
    par["tp_comm_overlap"] = par["tp_comm_overlap"] and par["sequence_parallel"]
    par["dp"] = plan.cluster.gpus // (par["tp"] * par["pp"] * par["cp"])
    tr = {k: v for k, v in layout.items() if k not in PARALLEL}
    tr["recompute"], tr["recompute_layers"], tr["recompute_method"] = RECOMPUTE.get(tr["recompute"],
                                                                                    (tr["recompute"], 1, "uniform"))
    if tr["precision"] != "fp8":
        tr["fp8_recipe"] = "delayed"
    plan = dataclasses.replace(plan, parallel=_fields(plan.parallel, par), training=_fields(plan.training, tr))
    check_plan(plan)
    return plan


def grid() -> list[dict]:
    """The layouts and their figures: per base, ``PER_BASE`` that pass the Plan checks and
    that the analytic path predicts, drawn from ``AXES`` with a fixed seed."""
    rng = random.Random(SEED)
    out = []
    for base in BASES:
        found = 0
        for _ in range(TRIES):
            layout = {k: rng.choice(NARROW.get(base, {}).get(k, v)) for k, v in AXES.items()}
            try:
                result = figures(_plan(base, layout))
            except (PlanError, ValueError, ZeroDivisionError):
                continue
            out.append({"base": base, "layout": layout, "result": result})
            found += 1
            if found == PER_BASE:
                break
    return out


def figures(plan) -> dict:
    """Every number of the plan's analytic StepResult."""
    r = simulate(plan)
    out = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)
           if isinstance(getattr(r, f.name), (int, float)) and f.name != "fits"}
    out["fits"] = bool(r.fits)
    out.update({f"memory_bytes.{k}": v for k, v in r.memory_bytes.items()})
    out.update({f"time_s.{k}": v for k, v in r.time_s.items()})
    out["memory_per_rank_gib"] = list(r.memory_per_rank_gib)
    out["notes"] = list(r.notes)
    return out


def _same(a, b) -> bool:
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (bool, str)) or isinstance(b, (bool, str)):
        return a == b
    return math.isclose(a, b, rel_tol=REL, abs_tol=0.0) or a == b or math.isnan(a) and math.isnan(b)


def _differences(want: dict, got: dict) -> list[str]:
    keys = sorted(set(want) | set(got))
    return [f"{k}: {want.get(k)!r} -> {got.get(k)!r}" for k in keys
            if k not in want or k not in got or not _same(want[k], got[k])]


@functools.lru_cache(maxsize=1)
def _golden() -> list[dict]:
    doc = json.loads(gzip.decompress(GOLDEN.read_bytes()))
    return [{"base": b, "layout": dict(zip(doc["layout"], lay)), "result": {k: v for k, v in zip(doc["result"], res) if v is not None}}
            for b, lay, res in doc["rows"]]


def test_the_grid_covers_the_features():
    rows = _golden()
    assert len(rows) >= 298   # 300 drawn; two zero-bubble layouts torch's rounds rule refuses were taken out
    seen = {(k, str(v)) for row in rows for k, v in row["layout"].items()}
    for key, values in AXES.items():
        for v in set(values):
            assert (key, str(v)) in seen, f"no layout with {key}={v}"
    assert {row["base"] for row in rows} == set(BASES)


@pytest.mark.parametrize("base", sorted(BASES))
def test_predictions_equal_main_before_the_speed_work(base):
    bad = []
    for row in _golden():
        if row["base"] == base:
            diff = _differences(row["result"], figures(_plan(base, row["layout"])))
            if diff:
                bad.append(f"{row['layout']}: {diff[:4]}")
    assert not bad, f"{len(bad)} layouts moved; first: {bad[:3]}"


def _clear_caches() -> None:
    """Every functools cache in simcore and topologies (catalog loading included)."""
    for name, module in list(sys.modules.items()):
        if name.startswith(("simcore", "topologies")):
            for obj in list(vars(module).values()):
                if callable(getattr(obj, "cache_clear", None)):
                    obj.cache_clear()


def test_caches_keyed_on_parts_of_a_plan_answer_as_cold_ones():
    rows = _golden()
    warm = [figures(_plan(r["base"], r["layout"])) for r in rows]   # every cache filled by the whole grid
    for row, got in list(zip(rows, warm))[::7]:
        _clear_caches()
        cold = figures(_plan(row["base"], row["layout"]))
        assert not _differences(cold, got), (row["layout"], _differences(cold, got)[:4])


def write() -> None:
    rows = grid()
    keys = {part: sorted({k for r in rows for k in r[part]}) for part in ("layout", "result")}
    doc = {**keys, "rows": [[r["base"], *([r[part].get(k) for k in keys[part]] for part in keys)] for r in rows]}
    GOLDEN.write_bytes(gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), mtime=0))
    print(f"{len(rows)} layouts -> {GOLDEN} ({GOLDEN.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__" and "--write" in sys.argv:
    import tests.conftest  # noqa: F401  (the suite's committed localhost profile)
    write()
