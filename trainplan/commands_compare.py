"""``trainplan compare PLAN --log FILE``: a real run's log (Megatron-LM/NeMo/Megatron-Bridge,
torchtitan, DeepSpeed, Hugging Face Trainer, MLPerf) against the Plan's prediction and its
interval, one line per quantity, and the log's layout against the Plan's (issue 52, item 1).
``--trace DIR`` (profiler traces, phase by phase) is trainplan.commands_compare_trace."""
from __future__ import annotations

import math

from simcore.plan.load import load_plan
from trainplan.common import UsageError, check_prediction, fmt_s, print_json

GIB = 2**30


def _measure(logs, plan) -> dict:
    """The log's steady-state numbers, step time derived where the log gives only a rate."""
    from simcore.runlogs import summarize

    sums = [summarize(log) for log in logs]
    pick = max(sums, key=lambda s: s["step_s"] or 0.0)   # the slowest rank's log sets the step
    layout = logs[0].layout
    batch = layout.get("global_batch", plan.training.global_batch)
    seq = layout.get("seq_len", plan.model.seq_len)
    gpus = layout.get("gpus", plan.parallel.gpus)
    out = dict(pick, how="as logged", batch=batch, seq=seq, gpus=gpus)
    if out["step_s"] is None and out["tokens_per_s_per_gpu"]:
        out["step_s"] = batch * seq / (out["tokens_per_s_per_gpu"] * gpus)
        out["how"] = f"from tokens/s per GPU, {batch} x {seq} tokens a step on {gpus} GPUs"
    elif out["step_s"] is None and out["samples_per_s"]:
        out["step_s"] = batch / out["samples_per_s"]
        out["how"] = f"from samples/s, {batch} samples a step"
    if out["tokens_per_s_per_gpu"] is None and out["step_s"]:
        out["tokens_per_s_per_gpu"] = batch * seq / out["step_s"] / gpus
    mems = [s["peak_memory_bytes"] for s in sums if s["peak_memory_bytes"]]
    out["peak_memory_bytes"] = max(mems) if mems else None
    return out


def _verdict(measured: float, value: float, lo: float | None, hi: float | None) -> str:
    ratio = f"measured/predicted {measured / value:.2f}" if value else "no prediction"
    if lo is None:
        return ratio
    return f"{ratio}, {'inside' if lo <= measured <= hi else 'OUTSIDE'} the interval"


def _rows(plan, result, meas: dict) -> list[tuple]:
    """(name, measured, predicted, lo, hi, format, note) for each quantity the log gives."""
    from simcore.planner.uncertainty import interval_fields, memory_log_bounds

    band = interval_fields(plan, result)["interval_s"]
    step = result.step_time_s
    tok = result.tokens_per_s / plan.parallel.gpus
    rows = []
    if meas["step_s"]:
        rows.append(("step time", meas["step_s"], step, *(band or (None, None)), fmt_s, meas["how"]))
        inv = (tok * step / band[1], tok * step / band[0]) if band else (None, None)
        rows.append(("tokens/s per GPU", meas["tokens_per_s_per_gpu"], tok, *inv, "{:,.0f}".format, ""))
        mfu = meas["mfu"] if meas["mfu"] is not None else result.mfu * meas["tokens_per_s_per_gpu"] / tok
        mfu_inv = (result.mfu * step / band[1], result.mfu * step / band[0]) if band else (None, None)
        note = "the log's own" if meas["mfu"] is not None else "the Plan's FLOPs per token at the measured tokens/s"
        if meas["tflops_per_gpu"]:
            note += f"; the log says {meas['tflops_per_gpu']:.1f} TFLOP/s per GPU"
        rows.append(("MFU", mfu, result.mfu, *mfu_inv, "{:.1%}".format, note))
    if meas["peak_memory_bytes"]:
        lo, hi, n, _ = memory_log_bounds()
        pred = result.memory_per_gpu_gib
        bounds = (pred * math.exp(lo), pred * math.exp(hi)) if n else (None, None)
        rows.append(("peak memory", meas["peak_memory_bytes"] / GIB, pred, *bounds, "{:.2f} GiB".format,
                     meas["memory_what"]))
    return rows


def layout_differences(plan, layout: dict) -> list[str]:
    """One line per layout field the log names that differs from the Plan's."""
    par, tr = plan.parallel, plan.training
    mine = {"tp": par.tp, "pp": par.pp, "cp": par.cp, "ep": par.ep, "dp": par.dp, "vpp": par.vpp,
            "micro_batch": tr.micro_batch, "global_batch": tr.global_batch, "seq_len": plan.model.seq_len,
            "layers": plan.model.layers, "gpus": par.gpus, "dp_replicate": par.dp_replicate}
    return [f"{field}: log {value}, plan {mine[field]}" for field, value in layout.items()
            if field in mine and value != mine[field]]


def cmd_compare(args) -> None:
    from simcore.engine.predict import simulate
    from simcore.runlogs import LogError, parse_path

    if getattr(args, "trace", None) is not None:
        from trainplan.commands_compare_trace import cmd_compare_trace

        return cmd_compare_trace(args)
    if getattr(args, "out", None) is not None:
        raise UsageError("--out writes the trace comparison: it needs --trace DIR")
    plan = load_plan(args.plan)
    try:
        logs = parse_path(args.log)
    except LogError as exc:
        raise UsageError(str(exc)) from None
    result = simulate(plan, engine="analytic")
    check_prediction(plan, result)
    meas = _measure(logs, plan)
    meas["memory_what"] = next((log.memory_what for log in logs if log.memory_what), "")
    rows = _rows(plan, result, meas)
    diffs = layout_differences(plan, logs[0].layout)
    if args.json:
        print_json({"plan": plan.name, "stack": logs[0].stack, "files": [log.path for log in logs],
                    "rule": meas["rule"], "layout_differences": diffs,
                    "rows": [{"quantity": r[0], "measured": r[1], "predicted": r[2], "lo": r[3], "hi": r[4],
                              "note": r[6]} for r in rows]})
        return
    _print(plan, logs, meas, rows, diffs)


def _print(plan, logs, meas, rows, diffs) -> None:
    files = logs[0].path if len(logs) == 1 else f"{len(logs)} rank logs (the slowest median step)"
    print(f"{plan.name} vs {files}: {logs[0].stack}, {logs[0].step_what}")
    print(f"  {meas['entries']} entries; {meas['rule']}")
    for name, measured, pred, lo, hi, fmt, note in rows:
        band = f" (90% interval {fmt(lo)} - {fmt(hi)})" if lo is not None else " (no interval)"
        print(f"  {name}: measured {fmt(measured)}, predicted {fmt(pred)}{band}; "
              f"{_verdict(measured, pred, lo, hi)}" + (f"; {note}" if note else ""))
    for log in logs[:1]:
        for note in log.notes:
            print(f"  note: {note}")
    if not logs[0].layout:
        print("  layout: the log names none; not checked")
    elif not diffs:
        print(f"  layout: the log's {', '.join(sorted(logs[0].layout))} match the Plan")
    for line in diffs:
        print(f"  layout differs: {line}")
