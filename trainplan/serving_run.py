"""serve --run and serve --calibrate: a serving plan on this host's serving loop
(``executors.serving_loop``), measured into the serving engine's ``ServingResult`` beside the
prediction; and the loop's costs on this host calibrated for the plan's model
(``simcore.serving.host``, probes in ``executors.calibrate.serving_probes``).

The loop and the engine take the same requests: the arrivals and lengths of
``simcore.engine.serving_measure`` from the plan's traffic and seed, the plan's scheduler limits
and the KV blocks ``simcore.serving.cost.replica_cost`` gives a replica. The calibration lives in a
file beside the host's profile (``serving_calibration_path``), one entry per model and precision.
"""
from __future__ import annotations

import datetime as _dt
import os
import socket
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from simcore.engine.serving_measure import ServingResult, arrival_times, measure, request_lengths
from simcore.plan.spec import PlanError
from simcore.results import atomic_write_text
from simcore.serving.cost import iteration_s, replica_cost
from simcore.serving.host import HostCosts, calibration_entry, fit_host, host_costs_from, model_key
from simcore.serving.spec import Arrival, Dtype, ServingPlan
from topologies.profile import default_profile_path

#: Where the serving calibration is kept, where not beside the profile.
SERVING_PROFILE_ENV = "TRAINPLAN_SERVING_PROFILE"


def serving_calibration_path() -> Path:
    """The serving calibration file: ``$TRAINPLAN_SERVING_PROFILE``, else beside the host's profile
    (``localhost.yaml`` -> ``localhost-serving.yaml``)."""
    env = os.environ.get(SERVING_PROFILE_ENV)
    if env:
        return Path(env)
    profile = default_profile_path()
    return profile.with_name(f"{profile.stem}-serving{profile.suffix or '.yaml'}")


def _read(path: Path) -> dict:
    if not path.exists():
        return {}
    doc = yaml.safe_load(path.read_text())
    return doc if isinstance(doc, dict) else {}


def _precision(plan: ServingPlan) -> str:
    return str(plan.precision.activations)


def host_costs_for(plan: ServingPlan) -> HostCosts | None:
    """This host's serving-loop figures for the plan's model, where the plan runs on localhost and
    ``serve --calibrate`` measured them; else None (a catalog node's iteration is its roofline)."""
    if plan.cluster.node.name != "localhost":
        return None
    return host_costs_from(_read(serving_calibration_path()), model_key(plan.model, _precision(plan)))


def serving_device() -> str:
    """Where the serving loop runs: this machine's GPU where it has one (CUDA), else its CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


#: The precisions the loop runs (weights, activations and KV cache alike), per device: fp32 on a
#: CPU (its bf16 GEMMs are emulated, slower than fp32's), bf16 too on a GPU.
LOOP_DTYPES = {"cpu": (Dtype.FP32,), "cuda": (Dtype.FP32, Dtype.BF16)}


def loop_model(plan: ServingPlan, seq_len: int | None = None):
    """The executor's model of the plan (``executors.model``), on ``serving_device`` in the plan's
    precision, for inference; ``seq_len``: positions beyond the plan's."""
    import torch

    from executors.model import build_model

    spec = plan.model if seq_len is None else replace(plan.model, seq_len=seq_len)
    dtype = torch.bfloat16 if plan.precision.activations == Dtype.BF16 else torch.float32
    return build_model(spec, plan.traffic.seed).eval().to(device=serving_device(), dtype=dtype)


def _device_name() -> str:
    import torch

    return f"{torch.cuda.get_device_name()} (torch {torch.__version__})" if serving_device() == "cuda" else "the CPU"


def check_runnable(plan: ServingPlan) -> None:
    """The plans the serving loop cannot run on this host, one sentence naming the field."""
    m, pr = plan.model, plan.precision
    device = serving_device()
    dtypes = LOOP_DTYPES[device]
    rules = [
        (plan.cluster.node.name != "localhost",
         f"hardware.node={plan.cluster.node.name}: the serving loop runs on this machine, hardware: {{node: localhost}}"),
        (plan.tp != 1, f"parallel.tp={plan.tp}: the serving loop runs one replica of TP 1 on this host"),
        (plan.replicas != 1, f"parallel.replicas={plan.replicas}: the serving loop runs one replica on this host"),
        (plan.disaggregation is not None, "disaggregation: the serving loop runs one co-located replica"),
        (m.moe, f"model.experts={m.experts}: the serving loop runs dense models"),
        (m.mla, "model.kv_lora_rank: the serving loop's KV cache holds plain K and V (no multi-latent attention)"),
        (m.sliding_window > 0, f"model.sliding_window={m.sliding_window}: the serving loop attends to whole contexts"),
        (len({pr.weights, pr.activations, pr.kv_cache}) > 1 or pr.weights not in dtypes,
         f"precision.weights={pr.weights}/activations={pr.activations}/kv_cache={pr.kv_cache}: the serving loop on "
         f"this {'GPU' if device == 'cuda' else 'CPU'} runs " + " or ".join(map(str, dtypes)) + ", all three alike "
         "(precision: {weights: fp32, activations: fp32, kv_cache: fp32})"),
        (plan.traffic.arrival == Arrival.CONCURRENCY,
         "traffic.arrival=concurrency: the serving loop replays offline, Poisson or traced arrivals"),
    ]
    for broken, sentence in rules:
        if broken:
            raise PlanError(sentence)


def loop_limits(plan: ServingPlan, kv_blocks: int):
    from executors.serving_loop import LoopLimits

    s = plan.scheduler
    return LoopLimits(max_num_seqs=s.max_num_seqs, max_num_batched_tokens=s.max_num_batched_tokens,
                      chunked_prefill=s.chunked_prefill, kv_blocks=kv_blocks, block_size=plan.kv_cache.block_size,
                      policy=str(s.capacity_policy))


def calibrate_serving(plan: ServingPlan, progress=None) -> tuple[HostCosts, Path]:
    """Measure the loop's GEMMs and costs for the plan's model on this host; store them (atomically,
    beside the other models' entries) and return them with the file's path."""
    from executors.calibrate.serving_probes import bench_linear, bench_serving_loop, bench_wake, describe, probe_longest

    check_runnable(plan)
    model = loop_model(plan, max(plan.model.seq_len, probe_longest()))
    linear, logits = bench_linear(model)
    tables = HostCosts(0.0, 0.0, 0.0, 0.0, 0.0, linear=tuple((float(n), t) for n, t in linear),
                       logits=tuple((float(n), t) for n, t in logits), wake=tuple(bench_wake(model)))
    rc = replica_cost(plan, host=tables)
    # each probe iteration: (measured s, the model's s without the loop's terms, (prefill tokens, chunks, decodes, KV read))
    rows = [(sec, iteration_s(rc, *shape[:4], chunks=shape[4], decodes=shape[5], idle_s=shape[6]),
             (shape[0] - shape[5], shape[4], shape[5], shape[2]))
            for sec, shape in bench_serving_loop(model, progress=progress)]
    costs, groups = fit_host(tables, rows)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    path = serving_calibration_path()
    doc = _read(path)
    doc["about"] = ("trainplan's serving loop (executors/serving_loop.py) on this host, per model and precision: "
                    "simcore/serving/host.py says what each figure is and how it is fitted")
    doc.setdefault("models", {})[model_key(plan.model, _precision(plan))] = calibration_entry(
        costs, groups, f"{describe()}; on {_device_name()}", socket.gethostname(), date)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(doc, sort_keys=False))
    return host_costs_for(plan) or costs, path


def requests(plan: ServingPlan) -> tuple[np.ndarray, list[list[int]], np.ndarray, np.ndarray]:
    """The engine's requests: arrivals and lengths as ``simulate_serving`` draws them, and each
    prompt's tokens (uniform over the vocabulary, seeded apart from both)."""
    arrivals = arrival_times(plan)
    prompt, output = request_lengths(plan)
    rng = np.random.default_rng([plan.traffic.seed, 2])
    prompts = [rng.integers(0, plan.model.vocab, int(n)).tolist() for n in prompt]
    return arrivals, prompts, prompt, output


def run_serving(plan: ServingPlan, model=None):
    """Serve the plan's traffic on this host's loop; the measured ``ServingResult`` and the loop's record."""
    from executors.serving_loop import run_loop

    check_runnable(plan)
    kv_blocks = replica_cost(plan).kv_blocks
    arrivals, prompts, prompt, output = requests(plan)
    model = model if model is not None else loop_model(plan)
    rec = run_loop(model, loop_limits(plan, kv_blocks), arrivals.tolist(), prompts, output.tolist())
    return measured_result(plan, rec, prompt, output, kv_blocks), rec


def measured_result(plan: ServingPlan, rec, prompt: np.ndarray, output: np.ndarray, kv_blocks: int) -> ServingResult:
    """The loop's record measured as the engine measures a simulated run (``serving_measure.measure``)."""
    return measure([rec], np.asarray(rec.arrivals, dtype=float), np.asarray(rec.first, dtype=float),
                   np.asarray(rec.finish, dtype=float), prompt, output, kv_blocks, plan.slo)

