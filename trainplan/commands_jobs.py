"""The commands that run, search, price and report: run, validate, plan, cost, whatif, procure, report,
demo, calibrate. Each takes argparse's namespace, calls one job, and prints."""
from __future__ import annotations

import sys
from pathlib import Path

from simcore.plan.load import dump_plan, load_plan
from trainplan.common import (RunFailed, UsageError, check_prediction, compressions, model_doc, model_notes,
                              portable_name, print_json, print_prediction, warn)


def cmd_run(args) -> None:
    from executors.launch import run
    from executors.measure import plan_identity
    from executors.support import block_note

    plan = load_plan(args.plan)
    try:
        result = run(plan, steps=args.steps, warmup=args.warmup, seed=args.seed, trace_path=args.trace,
                     checkpoint_dir=args.checkpoint_dir, resume=args.resume, timeout_s=args.timeout,
                     data_path=args.data)
    except RuntimeError as exc:
        raise RunFailed(str(exc).splitlines()[0] if str(exc) else "the run failed") from None
    note = block_note(plan)   # the block the executor trained, where the Plan's differs
    if args.json:   # with the plan it ran, which `calibrate --from-run` checks
        print_json({**result.to_json(), "plan": plan_identity(plan), **({"block_note": note} if note else {})})
        return
    print_prediction(result)
    if note:
        print(f"  note: {note}")


def _print_comparison(comp) -> None:
    print(f"{comp.plan_name}: predicted ({comp.predicted.source}) against measured")
    print(f"  {'field':<28} {'predicted':>12} {'measured':>12} {'error':>8}")
    for r in comp.table.to_dict(orient="records"):
        err = "" if r["error"] != r["error"] else f"{r['error']:+.1%}"
        print(f"  {r['field']:<28} {r['predicted']:>12.4g} {r['measured']:>12.4g} {err:>8}")


def cmd_validate(args) -> None:
    from trainplan.validate import load_plan_for_validate, validate_matrix, validate_plan

    if bool(args.plan) == bool(args.matrix):
        raise UsageError("validate needs either a PLAN or --matrix FILE")
    from topologies.profile import default_profile_path
    from trainplan.jobs import host_conditions
    from trainplan.validate import matrix_layouts

    # the input is refused before the profile's host speed is re-measured into it (a mistyped --only was not)
    if args.matrix:
        matrix_layouts(args.matrix, args.only)
    elif default_profile_path().exists():
        load_plan(args.plan)
    for line in host_conditions(default_profile_path()):   # the load, a fresh host speed, how far to trust
        print(f"trainplan: host: {line}", file=sys.stderr)
    if args.plan:
        plan = load_plan_for_validate(args.plan, progress=not args.json)
        try:
            comp = validate_plan(plan, steps=args.steps, warmup=args.warmup, trace_dir=args.trace_dir)
        except RuntimeError as exc:
            raise RunFailed(str(exc).splitlines()[0] if str(exc) else "the run failed") from None
        if args.json:
            from executors.measure import plan_identity

            print_json({**comp.to_json(), "plan": plan_identity(plan)})
        else:
            _print_comparison(comp)
        return
    result = validate_matrix(args.matrix, steps=args.steps, warmup=args.warmup, only=args.only,
                             progress=not args.json, trace_dir=args.trace_dir)
    if args.json:
        print_json({"layouts": result.table.to_dict(orient="records"), "failures": dict(result.failures)})
        return
    if len(result.table):
        print(result.table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        errs = result.table["step_err"].abs()
        print(f"step time: median |error| {errs.median():.1%}, max {errs.max():.1%} over {len(errs)} layouts")
    for name, why in result.failures:
        print(f"  {name}: not run: {why}")


def _parse_prices(items: list[str] | None) -> dict[str, float]:
    out = {}
    for item in items or []:
        key, _, value = item.partition("=")
        try:
            out[key] = float(value)
        except ValueError:
            raise UsageError(f"--price {item!r} must be KEY=NUMBER, e.g. on_demand_usd=2.5") from None
    return out


def _executor_refuses():
    """Why trainplan's executor cannot run a plan on GPU nodes (its sentence), or None."""
    from executors.support import check_executable
    from simcore.planner.stacks import refusal_of

    return refusal_of(lambda plan: check_executable(plan, "cuda"))


def cmd_plan(args) -> None:
    from simcore.planner.search import search, summary_table
    from simcore.plan.load import plan_to_dict
    from simcore.results import atomic_write_text

    model = model_doc(args.model, args.seq_len)
    warn(model_notes(args.model))
    cluster = {"node": args.cluster, "nodes": args.nodes}
    if args.fabric:
        cluster["fabric"] = args.fabric
    if args.storage:
        cluster["storage"] = args.storage
    if not args.min_headroom >= 0:
        raise UsageError(f"--min-headroom {args.min_headroom:g} must be a number of GiB, 0 or more")
    res = search(model, cluster, args.global_batch, objective=args.objective, top_k=args.top_k, jobs=args.jobs,
                 tokens=args.tokens, progress=sys.stderr.isatty() and not args.json,
                 allow_fewer_gpus=args.allow_fewer_gpus, min_headroom_gib=args.min_headroom,
                 activation_offload=args.activation_offload, stack=args.stack,
                 refuses=_executor_refuses() if args.stack == "executor" else None,
                 precisions=_csv(args.precision, "--precision"), hybrid=getattr(args, "hybrid", False),
                 compressions=compressions(args.compression))
    out = args.out or Path(portable_name(res.best.name) + ".yaml")
    atomic_write_text(out, dump_plan(res.best))
    if args.json:
        from simcore.planner.formatting import json_safe

        print_json(json_safe({"best": plan_to_dict(res.best), "best_plan_file": str(out),
                              "table": res.table.head(args.rows).to_dict(orient="records"),
                              "pareto": res.pareto.to_dict(orient="records"), "explanations": res.explanations}))
        return
    print(summary_table(res, args.rows))
    print()
    for line in res.explanations:
        print(f"- {line}")
    print(f"\nbest plan written to {out}")


def cmd_cost(args) -> None:
    from simcore.planner.runcost import run_cost, summary_lines
    from simcore.engine.predict import simulate

    from simcore.planner.sanity import cost_warnings

    ckw = _checkpoint_options(args)
    plan = load_plan(args.plan)
    prediction = simulate(plan)
    check_prediction(plan, prediction)
    common = dict(prices=_parse_prices(args.price), storage=args.storage, seed=args.seed)
    rc = run_cost(plan, prediction, args.tokens, monte_carlo=args.monte_carlo,
                  tiered_checkpoints=args.tiered_checkpoints, **common, **ckw)
    rows = None
    if args.checkpoint == "compare":
        from simcore.planner.checkpoint_compare import compare

        rows = compare(plan, prediction, args.tokens, compression=ckw["checkpoint_compression"],
                       checkpoint_dedup=ckw["checkpoint_dedup"], **common)
    warn(cost_warnings(rc))
    if args.json:
        from simcore.planner.formatting import json_safe

        print_json(rc.to_json() | ({"checkpoint_choices": json_safe(rows)} if rows else {}))
    else:
        from simcore.planner.checkpoint_compare import compare_lines

        print("\n".join(summary_lines(rc) + (compare_lines(rows) if rows else [])))


def _checkpoint_options(args) -> dict:
    """The cost command's checkpoint options as run_cost's keywords; one sentence when bad."""
    from simcore.planner.checkpoints import check_compression

    if args.checkpoint not in (None, "sync", "async", "compare"):
        raise UsageError(f"--checkpoint takes sync, async or compare, not '{args.checkpoint}'")
    if args.checkpoint_writes not in ("dedup", "replicated"):
        raise UsageError(f"--checkpoint-writes takes dedup or replicated, not '{args.checkpoint_writes}'")
    if args.tiered_checkpoints and args.checkpoint == "sync":
        raise UsageError("--tiered-checkpoints is --checkpoint async; it contradicts --checkpoint sync")
    return {"checkpoint": None if args.checkpoint == "compare" else args.checkpoint,
            "checkpoint_compression": check_compression(args.checkpoint_compression),
            "checkpoint_dedup": args.checkpoint_writes == "dedup"}


def cmd_whatif(args) -> None:
    from simcore.planner.whatif import run_whatif

    res = run_whatif(args.sweep, progress=sys.stderr.isatty() and not args.json)
    html = None
    if args.report:
        from trainplan.jobs import write_whatif_report

        html = write_whatif_report(res, args.report)
    if args.json:
        from simcore.planner.formatting import json_safe

        print_json(json_safe({"cells": res.table.to_dict(orient="records"), "assumptions": res.assumptions}))
        return
    print(res.display_table().to_string(index=False))
    sources = res.table["interval_source"].dropna().unique() if "interval_source" in res.table else []
    print()
    for source in sources:
        print(f"intervals (90%): {source}")
    for note in res.notes():
        print(f"  note: {note}")
    if html:
        print(f"\nreport written to {html} and {html.parent / 'report.md'}")


def cmd_report(args) -> None:
    from trainplan.jobs import open_hint, plan_job, validate_job, whatif_job

    progress = sys.stderr.isatty()
    if args.kind == "plan":
        if not (args.model and args.cluster and args.tokens):
            raise UsageError("report plan needs --model, --cluster and --tokens")
        html = plan_job(model=args.model, cluster=args.cluster, nodes=args.nodes, global_batch=args.global_batch,
                        seq_len=args.seq_len, tokens=args.tokens, out=args.out, top_k=args.top_k, jobs=args.jobs,
                        progress=progress)
    elif args.kind == "whatif":
        if not args.sweep:
            raise UsageError("report whatif needs a SWEEP file")
        html = whatif_job(args.sweep, args.out, progress=progress)
    else:
        if not args.matrix:
            raise UsageError("report validate needs --matrix FILE")
        html = validate_job(args.matrix, args.out, steps=args.steps, warmup=args.warmup, only=args.only,
                            progress=progress)
    print(f"wrote {html} and {html.parent / 'report.md'}; open {open_hint(html)}")


#: The headings of the demo's answers on the terminal, by report.
DEMO_HEADINGS = {"plan": "the answer (planning report)", "whatif": "what-if", "validate": "validation on this machine"}


def cmd_demo(args) -> None:
    from trainplan.jobs import DEMO_PLAN, demo, open_hint

    done = demo(args.out)
    d = DEMO_PLAN
    print(f"\n{d['model']} on {d['nodes']} x {d['cluster']}, {d['tokens']:.3g} tokens, global batch "
          f"{d['global_batch']} x {d['seq_len']} tokens (intervals: 90%)")
    for name, cards in done.answers.items():
        print(f"\n{DEMO_HEADINGS.get(name, name)}:")
        width = max((len(label) for label, _ in cards), default=0)
        for label, value in cards:
            print(f"  {label:<{width}}  {value}")
    print("\nreports:")
    for name, html in done.reports.items():
        print(f"  {name:>9}: {open_hint(html)}")


def cmd_calibrate(args) -> None:
    from executors.calibrate.profile import calibrate
    from topologies.profile import default_profile_path

    _check_calibrate_flags(args)
    if args.from_trace or args.from_log:   # a cluster's profile from its own traces (not this host's)
        from trainplan.commands_calibrate_trace import cmd_calibrate_trace

        return cmd_calibrate_trace(args)
    out = args.out or default_profile_path()
    if args.refresh:
        from executors.calibrate.profile import refresh_host_speed

        if not Path(out).exists():
            raise UsageError(f"no profile at {out} to refresh; run `trainplan calibrate` first")
        refresh_host_speed(out)
        print(f"refreshed the host speed figures in {out}")
        return
    if args.from_run:
        from executors.calibrate.refit import refit_profile

        if not args.plan:
            raise UsageError("calibrate --from-run needs --plan, the plan the measured run executed")
        if not Path(out).exists():
            raise UsageError(f"no profile at {out} to refit; run `trainplan calibrate` first")
        refit = refit_profile(out, args.from_run, load_plan(args.plan))["refits"][-1]
        print(f"refitted {out} from {args.from_run} (the previous profile kept as {refit['backup']}): "
              + (", ".join(f"{k} x{v:.3g}" for k, v in refit["ratios"].items()) or "no phase to refit"))
        for key, (old, new) in refit["changed"].items():
            print(f"  {key}: {old:.4g} -> {new:.4g}" + (f" (x{new / old:.3g})" if old else ""))
        return
    profile = calibrate(out, quick=args.quick, progress=not args.json)
    if args.json:
        print_json({"profile": str(out), "device": profile["device"]})
    else:
        dev = profile["device"]
        peaks = ", ".join(f"{k} {v:.3f}" for k, v in dev["dense_tflops"].items() if v)
        print(f"wrote {out}: {dev['name']}, peak TFLOP/s {peaks}, "
              f"memory {dev['hbm_tbyte_per_s'] * 1e3:.1f} GB/s, link {dev['intra_link_gbyte_per_s_bidir'] / 2:.2f} GB/s")


def _check_calibrate_flags(args) -> None:
    """One way of calibrating at a time, its own flags only: a flag of another way (``--plan``
    without ``--from-run`` ran a full calibration over the cached profile) is one sentence."""
    sources = [f for f in ("from_run", "from_trace", "from_log") if getattr(args, f, None)]
    if args.plan and not sources:
        raise UsageError("calibrate --plan names the plan of a measured run and needs --from-run RUN_JSON "
                         "(or --from-trace DIR); nothing was measured or written")
    if len(sources) > 1:
        raise UsageError(f"calibrate {' and '.join('--' + f.replace('_', '-') for f in sources)} are two ways of "
                         "calibrating: give one")
    if args.refresh and sources:
        raise UsageError(f"calibrate --refresh and --{sources[0].replace('_', '-')} are two ways of updating a "
                         "profile: give one")
    if args.quick and (args.refresh or sources):
        raise UsageError(f"calibrate --quick shortens a full calibration; --{'refresh' if args.refresh else sources[0].replace('_', '-')} "
                         "measures nothing it would shorten")


def _csv(text: str | None, flag: str, kind=str) -> list | None:
    """A comma-separated command-line list, each item of ``kind``; UsageError naming the flag."""
    if text is None:
        return None
    try:
        return [kind(item.strip()) for item in text.split(",") if item.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r} must be a comma-separated list of whole numbers") from None


def _procure_doc(args) -> dict:
    """The candidates: the file's fields (if any) with the command line's on top."""
    from simcore.plan.load import read_yaml_file
    from simcore.planner.procure_input import DEFAULT_NODES

    doc = {}
    if args.candidates:
        doc = read_yaml_file(args.candidates, "candidates file")
        if not isinstance(doc, dict):
            raise UsageError(f"candidates file {args.candidates} must hold a mapping")
        doc.setdefault("name", Path(args.candidates).stem)
    if args.model:
        doc["model"] = args.model
        warn(model_notes(args.model))
    if args.seq_len is not None:
        doc["model"] = model_doc(doc.get("model"), args.seq_len)
    over = {"tokens": args.tokens, "global_batch": args.global_batch, "deadline_days": args.deadline_days,
            "budget_usd": args.budget, "jobs": args.jobs, "gpus": _csv(args.gpus, "--gpus"),
            "nodes": _csv(args.nodes, "--nodes", int), "fabrics": _csv(args.fabrics, "--fabrics"),
            "modes": _csv(args.modes, "--modes"), "stack": args.stack}
    doc.update({k: v for k, v in over.items() if v is not None})
    if args.precision:
        doc["space"] = {**(doc.get("space") or {}), "precision": _csv(args.precision, "--precision")}
    buy = {"life_years": args.life_years, "utilisation": args.utilisation}
    if any(v is not None for v in buy.values()):
        doc["buy"] = {**(doc.get("buy") or {}), **{k: v for k, v in buy.items() if v is not None}}
    if args.no_resimulate:
        doc["resimulate"] = False
    for pair in _csv(args.mixed, "--mixed") or []:
        base, plus, other = pair.partition("+")
        if not plus or not base or not other:
            raise UsageError(f"--mixed {pair!r} must be BASE+OTHER, e.g. h100-sxm+a100-80gb")
        nodes = doc.get("nodes") or list(DEFAULT_NODES)
        doc["mixed"] = [*(doc.get("mixed") or []), {"gpus": [base, other], "nodes": nodes}]
    if "model" not in doc or "tokens" not in doc:
        raise UsageError("procure needs --model and --tokens, or a candidates file that names them")
    return doc


def cmd_procure(args) -> None:
    from simcore.planner.formatting import json_safe
    from simcore.planner.procure import run_procure
    from simcore.planner.procure_answer import answer_lines, display_table, frontier_table
    from simcore.planner.procure_input import candidates_from_dict
    from simcore.planner.procure_serving import serving_answer, serving_doc, serving_table

    c = candidates_from_dict(_procure_doc(args))
    res = run_procure(c, progress=sys.stderr.isatty() and not args.json)
    html = None
    if args.report:
        from trainplan.jobs import write_procure_report

        html = write_procure_report(res, args.report)
    if args.json:
        serving = {} if res.serving is None else {"serving": serving_doc(res.serving, c.serving)}
        print_json(json_safe({"answers": answer_lines(res), "left_out": list(res.left_out),
                              "options": res.options.to_dict(orient="records"),
                              "front": frontier_table(res.options).to_dict(orient="records"),
                              "assumptions": res.assumptions, "seconds": res.seconds, **serving}))
        return
    cells = res.cells
    print(f"{len(cells)} hardware cells ({int(cells['fits'].sum())} fit), {len(res.options)} options, "
          f"{res.resimulated} re-simulated on the event engine, {res.seconds:.1f} s")
    for line in res.left_out:
        print(f"  left out: {line}")
    print()
    print("front of each way of paying (* = front of all):")
    print(frontier_table(res.options).to_string(index=False))
    print(f"\nfastest options (first {args.rows}):")
    print(display_table(res.options, args.rows).to_string(index=False))
    print()
    for line in answer_lines(res):
        print(f"answer: {line}")
    if res.serving is not None:
        print(f"\nserving (cheapest first, ranked by {res.serving.mode.replace('_', '-')}):")
        print(serving_table(res.serving, args.rows).to_string(index=False))
        print(f"\nanswer: {serving_answer(res.serving, c.serving)}")
    if html:
        print(f"\nreport written to {html} and {html.parent / 'report.md'}")
