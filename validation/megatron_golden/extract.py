"""Rebuild cases.csv from a checkout (or bare mirror) of NVIDIA/Megatron-LM.

    python validation/megatron_golden/extract.py <megatron git dir> [commit]

One row per functional test case x golden-values file under
tests/functional_tests/test_cases/<model>/<case>/ that holds iteration-time or
mem-max-allocated-bytes. The launch is what tests/functional_tests/shell_test_utils/
_run_training.sh builds from model_config.yaml: MODEL_ARGS (MODEL_ARGS_2 for a
golden_values_*_2nd.json, the second run), ``true`` a bare flag, an empty value left out,
``[a, b]`` the values one by one, ${VAR} as the CI recipe sets it. Nodes x GPUs come from
the case name (``1N8G``), else from the CI recipe (tests/test_utils/recipes/<h100|gb200>/*.yaml
``spec.nodes``/``spec.gpus``) that lists the case; the training script likewise.
"""
from __future__ import annotations

import json
import math
import re
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

CASES = "tests/functional_tests/test_cases"
RECIPES = "tests/test_utils/recipes"
#: the recipes' ARGUMENTS (tests/test_utils/recipes/h100/gpt.yaml)
CI_VARS = {"DATA_PATH": "/mnt/artifacts", "DATA_CACHE_PATH": "/workspace/data/cache",
           "OUTPUT_PATH": "/opt/output", "TENSORBOARD_PATH": "/opt/output/tensorboard",
           "CHECKPOINT_SAVE_PATH": "/opt/artifacts/checkpoints", "CHECKPOINT_LOAD_PATH": "/mnt/artifacts/"}
#: options that only name where output, checkpoints and logs go (nothing a step computes):
#: left out to keep the file small
DROPPED = re.compile(r"--(save|load|tensorboard-dir|data-cache-path|wandb-[\w-]+|log-[\w-]*to-tensorboard)$")
GOLDEN = re.compile(r"golden_values_(dev|lts)(?:_(.+?))?(_2nd)?\.json$")


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


def recipes(repo: str, commit: str) -> dict:
    """(family, model, test_case) -> (nodes, gpus, script); family 'gb200' or 'h100'."""
    out: dict = {}
    for path in git(repo, "ls-tree", "-r", "--name-only", commit, RECIPES).split():
        family = path.split("/")[-2]
        doc = yaml.safe_load(git(repo, "show", f"{commit}:{path}"))
        spec = (doc or {}).get("spec") or {}
        if not doc or "products" not in doc or "nodes" not in spec:
            continue
        m = re.search(r"TRAINING_SCRIPT_PATH=([^\"\s]+)", str(spec.get("script", "")))
        script = m.group(1) if m else ""
        for product in doc["products"] or []:
            for case in product.get("test_case", []):
                key = (family, spec.get("model"), case)
                if key not in out or (not out[key][2].startswith("pretrain") and script.startswith("pretrain")):
                    out[key] = (int(spec["nodes"]), int(spec["gpus"]), script)
    return out


def _value(v) -> list[str]:
    if v is True:
        return []
    if isinstance(v, list):
        return [str(x) for x in v]
    return [str(v)]


def launch_args(args: dict) -> str:
    words = []
    for key, value in (args or {}).items():
        if value == "" or value is None or DROPPED.match(key):
            continue
        text = [re.sub(r"\$\{?(\w+)\}?", lambda m: CI_VARS.get(m.group(1), m.group(0)), x) for x in _value(value)]
        words += [key, *text]
    return " ".join(shlex.quote(w) for w in words)


def _floats(metric: dict) -> list[tuple[int, float]]:
    out = []
    values = metric.get("values") if isinstance(metric, dict) else None
    for step, v in (values if isinstance(values, dict) else {}).items():
        try:
            x = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out.append((int(step), x))
    return sorted(out)


def steady_time(metric: dict) -> tuple[float | None, int]:
    """Median iteration-time over the steps after warm-up: past the first 10% of the run
    and past its first three steps (the first holds compilation and allocation)."""
    pts = _floats(metric)
    if not pts:
        return None, 0
    first, last = pts[0][0], pts[-1][0]
    cut = first + max(3, (last - first) // 10)
    kept = [x for s, x in pts if s > cut] or [x for _, x in pts[len(pts) // 2:]]
    return statistics.median(kept), len(kept)


#: the training script of a model family's recipes, for a case no recipe lists
FAMILY_SCRIPT = {"gpt": "pretrain_gpt.py", "moe": "pretrain_gpt.py", "mixtral": "pretrain_gpt.py",
                 "bert": "examples/bert/pretrain_bert.py", "t5": "examples/t5/pretrain_t5.py",
                 "hybrid": "pretrain_hybrid.py", "nemotron": "pretrain_hybrid.py"}


def cases(repo: str, commit: str) -> list[dict]:
    """One entry per test case, its golden files (those with a step time or a peak) under it."""
    rec = recipes(repo, commit)
    files = git(repo, "ls-tree", "-r", "--name-only", commit, CASES).split()
    out: dict = {}
    for path in files:
        m = GOLDEN.search(path)
        if not m:
            continue
        case_dir = path.rsplit("/", 1)[0]
        model, case = case_dir.split("/")[-2:]
        try:
            golden = json.loads(git(repo, "show", f"{commit}:{path}"))
            config = yaml.safe_load(git(repo, "show", f"{commit}:{case_dir}/model_config.yaml"))
        except (subprocess.CalledProcessError, json.JSONDecodeError, yaml.YAMLError):
            continue
        if not isinstance(golden, dict) or not isinstance(config, dict):
            continue
        t, n = steady_time(golden.get("iteration-time"))
        mem = _floats(golden.get("mem-max-allocated-bytes"))
        if t is None and not mem:
            continue
        env, hardware, second = m.group(1), m.group(2) or "", bool(m.group(3))
        family = "gb200" if "gb200" in hardware else "h100"
        named = re.search(r"(\d+)N(\d+)G", case)
        nodes, gpus, script = rec.get((family, model, case), (None, None, ""))
        layout_from = "recipe" if nodes else ""
        if named:
            nodes, gpus, layout_from = int(named.group(1)), int(named.group(2)), "case name"
        elif not nodes and hardware and family == "h100" and config.get("TEST_TYPE") != "release":
            # _run_training.sh: GPUS_PER_NODE defaults to 8, NUM_NODES to the job's (one, as
            # every h100-family training recipe here)
            nodes, gpus, layout_from = 1, 8, "default"
        script = script or FAMILY_SCRIPT.get(model, "")
        entry = out.setdefault(f"{model}/{case}", {
            "case": f"{model}/{case}", "script": script, "test_type": config.get("TEST_TYPE", ""),
            "model_args": launch_args(config.get("MODEL_ARGS")), "golden": []})
        run = 1
        if second and isinstance(config.get("MODEL_ARGS_2"), dict):
            run = 2
            entry["model_args_2"] = launch_args(config["MODEL_ARGS_2"])
        entry["golden"].append({
            "file": path.rsplit("/", 1)[1], "environment": env, "hardware": hardware,
            "nodes": nodes, "gpus_per_node": gpus, "layout_from": layout_from, "run": run,
            "iteration_time_s": float(f"{t:.5g}") if t is not None else None, "iteration_time_steps": n,
            "mem_max_allocated_bytes": int(max(x for _, x in mem)) if mem else None})
    return list(out.values())


def main(argv: list[str]) -> None:
    repo = argv[1]
    commit = git(repo, "rev-parse", argv[2] if len(argv) > 2 else "HEAD").strip()
    found = cases(repo, commit)
    target = Path(__file__).with_name("cases.yaml")
    doc = {"repository": "NVIDIA/Megatron-LM", "commit": commit, "cases": found}
    target.write_text("# written by validation/megatron_golden/extract.py; see SOURCES.md\n"
                      + yaml.safe_dump(doc, sort_keys=False, width=1 << 20, default_flow_style=None))
    print(f"{sum(len(c['golden']) for c in found)} golden files, {len(found)} cases -> {target}")


if __name__ == "__main__":
    main(sys.argv)
