"""``trainplan calibrate --from-trace DIR --plan PLAN``: the figures a team's own profiler traces
determine, fitted into a profile of the catalog's shape (issue 52, item 3); ``--from-log`` is
refused, since a log's step time moves every figure at once.

The traces are read by ``simcore.runlogs.kineto`` (as ``compare --trace`` reads them), their
process groups held against the Plan's grid by ``reports.trace_steps.AxisMap``; this module
turns them into the plain records ``executors.calibrate.from_trace`` fits, and refuses a trace
that is not the Plan's run in one sentence.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

from simcore.plan.load import load_plan
from trainplan.common import UsageError, print_json

LOG_REFUSAL = ("calibrate --from-log: a training log gives the whole step's time, throughput and memory, which "
               "determine no single figure of the profile (GEMM efficiency, attention rate, bus bandwidth and latency "
               "all move the step time alike), so nothing was written; see how far the Plan is off with `trainplan "
               "compare PLAN --log FILE`, and calibrate from a profiler trace with --from-trace DIR")


def check_trace_matches(traces, plan, where) -> list[str]:
    """Refuse (UsageError, one sentence) traces that are not a run of ``plan``'s layout: another
    world size, a rank beyond it, another GPU, a process group that is no group of the Plan's
    grid. Returns notes on what could not be checked."""
    from reports.trace_steps import AxisMap

    gpus = plan.parallel.gpus
    worlds = sorted({t.world for t in traces if t.world})
    if worlds and worlds != [gpus]:
        raise UsageError(f"--from-trace {where} is a run of {worlds[0]} ranks, not of --plan {plan.name}'s {gpus} "
                         "GPUs; nothing was written")
    beyond = [t.rank for t in traces if t.rank >= gpus]
    if beyond:
        raise UsageError(f"--from-trace {where} holds rank {beyond[0]}, beyond --plan {plan.name}'s {gpus} GPUs; "
                         "nothing was written")
    gpu = plan.cluster.node.gpu.name
    devices = sorted({t.device for t in traces if t.device})
    if devices and not any(gpu.lower().split("-")[0] in d.lower() for d in devices):
        raise UsageError(f"--from-trace {where} ran on {', '.join(devices)}, not --plan {plan.name}'s {gpu}; "
                         "nothing was written")
    axes = AxisMap(plan)
    for t in traces:
        for k in t.kernels:
            if k.klass == "comm" and k.group:
                axes.axis(k.group, t.rank, k.collective)
    bad = [n for n in axes.notes if "matches no axis" in n]
    if bad:
        raise UsageError(f"--from-trace {where} is not a run of --plan {plan.name}'s layout: "
                         f"{bad[0].removesuffix('; counted as dp')}; nothing was written")
    notes = [] if devices else ["the traces name no GPU (no deviceProperties): the GPU was not checked"]
    if not worlds:
        notes.append("the traces give no world size (no distributedInfo): only their ranks were checked")
    return notes


def collective_calls(traces):
    """Every NCCL kernel with a process group and bytes, keyed to match the same call across ranks."""
    from executors.calibrate.from_trace import CollectiveCall

    out, skipped = [], Counter()
    for t in traces:
        seen: Counter = Counter()
        for k in sorted(t.kernels, key=lambda k: k.start_us):
            if k.klass != "comm" or not k.step:
                continue
            if not k.group or k.bytes <= 0 or not k.collective:
                skipped[k.collective or "nccl"] += 1
                continue
            key = (k.step, k.group, k.collective)
            out.append(CollectiveCall(k.collective, k.group, t.rank, k.step, seen[key], k.bytes,
                                      (k.end_us - k.start_us) * 1e-6))
            seen[key] += 1
    notes = [f"{n} {c} kernels carry no process group or no message size (a trace of torch < 2.2): not fitted"
             for c, n in skipped.items()]
    return out, notes


def op_calls(doc: dict) -> list:
    """The GEMM and flash attention ops of one trace with a shape ("Input Dims", recorded with
    ``record_shapes=True``) and the time of the GPU kernels they launched (same "External id")."""
    from executors.calibrate.from_trace import (ATTENTION_OPS, GEMM_OPS, OpCall, attention_flops, gemm_flops,
                                                op_precision)

    events = [e for e in doc.get("traceEvents", []) if isinstance(e, dict) and isinstance(e.get("args"), dict)]
    ops = {e["args"]["External id"]: e for e in events
           if e.get("cat") == "cpu_op" and e.get("name") in {**GEMM_OPS, **ATTENTION_OPS}
           and "External id" in e["args"] and "Input Dims" in e["args"]}
    seconds: dict = defaultdict(float)
    for e in events:
        if e.get("cat") == "kernel" and e["args"].get("External id") in ops and "dur" in e:
            seconds[e["args"]["External id"]] += float(e["dur"]) * 1e-6
    out = []
    for xid, e in ops.items():
        name, args = e["name"], e["args"]
        if seconds[xid] <= 0:
            continue
        if name in GEMM_OPS:
            kind, flops = "gemm", gemm_flops(name, args["Input Dims"])
        else:
            direction, flops = attention_flops(name, args["Input Dims"], args.get("Concrete Inputs"))
            kind = f"attention_{direction}"
        out.append(OpCall(kind, name, flops, seconds[xid], op_precision(args.get("Input type"))))
    return out


def calibrate_from_traces(plan, path) -> dict:
    """The profile document of the traces under ``path`` (UsageError for traces that are not the Plan's)."""
    from executors.calibrate.trace_profile import trace_profile
    from simcore.runlogs import LogError
    from simcore.runlogs.kineto import parse_traces, read_json

    try:
        traces = parse_traces(path)
        docs = [read_json(Path(t.path)) for t in traces]
    except LogError as exc:
        raise UsageError(str(exc)) from None
    notes = check_trace_matches(traces, plan, path)
    calls, skipped = collective_calls(traces)
    ops = [o for d in docs for o in op_calls(d)]
    try:
        return trace_profile(plan, calls, ops, [t.path for t in traces], sorted({t.device for t in traces if t.device}),
                             notes + skipped)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def cmd_calibrate_trace(args) -> None:
    from executors.calibrate.trace_profile import write_profile

    if not args.plan:
        raise UsageError(f"calibrate --from-{'trace' if args.from_trace else 'log'} needs --plan, the plan the "
                         "traced run executed")
    if args.from_log:
        raise UsageError(LOG_REFUSAL)
    plan = load_plan(args.plan)
    profile = calibrate_from_traces(plan, args.from_trace)
    out = write_profile(profile, args.out or Path(f"{plan.cluster.node.gpu.name}-from-trace.yaml"))
    ft = profile["from_trace"]
    if args.json:
        print_json({"profile": str(out), "fitted": ft["fitted"], "kept_from_catalog": ft["kept_from_catalog"],
                    "notes": ft["notes"]})
        return
    print(f"wrote {out}: {plan.cluster.node.gpu.name} from {len(profile['measured_on']['traces'])} profiler "
          f"trace(s) of {plan.name} ({args.from_trace}); {len(ft['fitted'])} figure(s) fitted, the rest the catalog's")
    for key, f in ft["fitted"].items():
        shown = f"{f['catalog']:.4g} -> {f['value']:.4g}" if isinstance(f["value"], float) else "fitted"
        print(f"  fitted {key}: {shown} ({f['kernels']} kernels, residual {f['residual']:.1%})")
    for key, why in ft["kept_from_catalog"].items():
        print(f"  kept {key}: {why}")
    for note in ft["notes"]:
        print(f"  note: {note}")
