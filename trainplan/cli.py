"""The ``trainplan`` command line: parse, call one function, print.

Every user error (a bad Plan, an unknown name, an unreadable file) ends with one
sentence on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simcore.plan.spec import PlanError, dump_plan, load_plan
from topologies.hardware import CatalogError, load_catalog


class UsageError(ValueError):
    """A command-line argument breaks a rule."""


class RunFailed(ValueError):
    """A real run failed (a rank raised, hung past the timeout, or torch refused the layout)."""


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=2, default=str))


# --------------------------------------------------------------------------- commands

def cmd_catalog(args) -> None:
    from reports.tables import catalog_tables

    tables = catalog_tables(load_catalog())
    kinds = [args.kind] if args.kind else list(tables)
    if args.json:
        _print_json({k: tables[k].to_dict(orient="records") for k in kinds})
        return
    for kind in kinds:
        table = tables[kind]
        print(f"== {kind} ==")
        print(table.drop(columns=["source"]).to_string(index=False))
        print("sources:")
        for name, source in zip(table.iloc[:, 0], table["source"]):
            print(f"  {name}: {source}")
        print()


def cmd_check(args) -> None:
    from simcore.plan.describe import plan_summary

    plan = load_plan(args.plan)
    summary = plan_summary(plan)
    if args.json:
        _print_json(summary)
        return
    print(f"# {args.plan}: valid")
    print(dump_plan(plan), end="")
    print("# derived")
    for key, value in summary["derived"].items():
        print(f"#   {key}: {value}")


def cmd_topology(args) -> None:
    from topologies.build import build_cluster
    from topologies.routes import cluster_summary

    plan = load_plan(args.plan)
    graph = build_cluster(plan.cluster)
    summary = cluster_summary(graph, plan.cluster)
    if args.draw:
        from reports.plots import save_figure, topology_figure

        summary["drawing"] = str(save_figure(topology_figure(graph, plan.cluster), args.draw))
    if args.json:
        _print_json(summary)
    else:
        for key, value in summary.items():
            print(f"{key:>32}: {value}")


def _fmt_s(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.3f} s"


def print_prediction(result) -> None:
    """A readable breakdown of a StepResult (predicted or measured)."""
    rows = [
        ("step time", _fmt_s(result.step_time_s)),
        ("  compute", _fmt_s(result.compute_s)),
        ("  exposed communication", _fmt_s(result.exposed_comm_s)),
        ("  pipeline bubble", _fmt_s(result.bubble_s)),
        ("  offload stall", _fmt_s(result.offload_s)),
        ("tokens/s", f"{result.tokens_per_s:,.0f}"),
        ("model TFLOP/s per GPU", f"{result.model_tflops_per_gpu:.1f}"),
        ("hardware TFLOP/s per GPU", f"{result.hardware_tflops_per_gpu:.1f}"),
        ("MFU / HFU", f"{result.mfu:.1%} / {result.hfu:.1%}"),
        ("memory per GPU", f"{result.memory_per_gpu_gib:.2f} GiB ({'fits' if result.fits else 'DOES NOT FIT'})"),
    ]
    print(f"{result.plan_name} ({result.source})")
    for k, v in rows:
        print(f"  {k:<28} {v}")
    if result.time_s:
        print("  time per phase (critical rank):")
        for k, v in result.time_s.items():
            if v:
                print(f"    {k:<26} {_fmt_s(v)}")
    for note in result.notes:
        print(f"  note: {note}")


def cmd_simulate(args) -> None:
    from simcore.engine.predict import simulate

    plan = load_plan(args.plan)
    kwargs = {}
    if args.engine == "des":
        kwargs = {"granularity": args.granularity, "mode": args.mode}
        if args.slow:
            kwargs["stragglers"] = _parse_stragglers(args.slow)
        if args.slow_stage:
            from simcore.engine.des import stage_stragglers

            kwargs["stragglers"] = {**kwargs.get("stragglers", {}),
                                    **stage_stragglers(plan, _parse_stragglers(args.slow_stage, "--slow-stage"))}
    elif args.trace or args.gantt or args.slow or args.slow_stage or args.stage_gpu:
        raise UsageError("--trace, --gantt, --slow, --slow-stage and --stage-gpu need --engine des "
                         "(the analytic path has no timeline)")
    if args.stage_gpu:
        from simcore.engine.des import simulate_des
        from simcore.model.mixed import mixed_costs

        stage_gpus = {}
        for item in args.stage_gpu:
            stage, _, gpu = item.partition("=")
            if not stage.isdigit() or not gpu:
                raise UsageError(f"--stage-gpu {item!r} must be STAGE=GPU, e.g. 0=a100-80gb")
            stage_gpus[int(stage)] = gpu
        result = simulate_des(mixed_costs(plan, stage_gpus), **kwargs)
    else:
        result = simulate(plan, engine=args.engine, **kwargs)
    from simcore.planner.uncertainty import interval_fields

    interval = interval_fields(plan, result)
    if args.trace:
        from simcore.results import write_chrome_trace

        write_chrome_trace(result.spans, args.trace, f"{plan.name} predicted")
    if args.gantt:
        from reports.plots import gantt_figure, save_figure

        save_figure(gantt_figure(result.spans, f"{plan.name}: predicted step ({args.engine})"), args.gantt)
    if args.json:
        _print_json({**result.to_json(), **interval})
    else:
        print_prediction(result)
        if interval["interval_s"]:
            lo, hi = interval["interval_s"]
            print(f"  {interval['interval_level']:.0%} interval of the step time: {_fmt_s(lo)} - {_fmt_s(hi)} "
                  f"({interval['interval_source']})")
        else:
            print(f"  no interval: {interval['interval_source']}")


def _parse_stragglers(items: list[str], flag: str = "--slow") -> dict[int, float]:
    out = {}
    for item in items:
        rank, _, factor = item.partition("=")
        try:
            out[int(rank)] = float(factor)
        except ValueError:
            raise UsageError(f"{flag} {item!r} must be INDEX=FACTOR, e.g. 3=1.5") from None
        if out[int(rank)] <= 0:
            raise UsageError(f"{flag} {item!r}: the factor must be positive")
    return out


def cmd_memory(args) -> None:
    from simcore.model.step_costs import memory_report

    plan = load_plan(args.plan)
    report = memory_report(plan)
    if args.json:
        _print_json(report)
        return
    gib = 1024**3
    kinds = ["weights", "gradients", "optimizer_states", "activations", "comm_buffers", "framework", "total"]
    print(f"{plan.name}: bytes per GPU by kind (GiB), per pipeline rank; HBM {report['hbm_bytes'] / gib:.1f} GiB")
    print(f"  {'pp rank':>8} " + " ".join(f"{k:>16}" for k in kinds))
    for r in report["ranks"]:
        print(f"  {r['pp_rank']:>8} " + " ".join(f"{r[k] / gib:>16.2f}" for k in kinds))
    if report.get("host_offload_bytes_per_node"):
        print(f"  host memory for offload per node: {report['host_offload_bytes_per_node'] / gib:.1f} GiB "
              f"of {report['host_memory_bytes_per_node'] / gib:.0f} GiB")
    print(f"  fits: {'yes' if report['fits'] else 'NO'} (most loaded GPU {report['memory_per_gpu_gib']:.2f} GiB)")


def cmd_import(args) -> None:
    import yaml

    from simcore.plan.interop import import_plan
    from simcore.plan.spec import plan_from_dict

    if not any((args.hf, args.megatron, args.deepspeed, args.torchtitan)):
        raise UsageError("import needs at least one of --hf, --megatron, --deepspeed, --torchtitan")
    doc, warnings = import_plan(hf=args.hf, megatron=args.megatron, deepspeed=args.deepspeed,
                                torchtitan=args.torchtitan, cluster=args.cluster, nodes=args.nodes, base_dir=".")
    plan_from_dict(doc, ".")
    for line in warnings:
        print(f"trainplan: warning: {line}", file=sys.stderr)
    print(yaml.safe_dump(doc, sort_keys=False), end="")


def cmd_export(args) -> None:
    from simcore.plan.writers import export_plan

    print(export_plan(load_plan(args.plan), args.to), end="")


def cmd_schedule(args) -> None:
    from simcore.model.schedules import build_schedule, format_grid, lower

    plan = load_plan(args.plan)
    par = plan.parallel
    sched = build_schedule(par.schedule, par.pp, plan.num_microbatches, par.vpp)
    if args.lowered:
        sched = lower(sched, par.pp, plan.num_microbatches, par.vpp)
    if args.json:
        _print_json({str(r): [str(a) if a else "" for a in acts] for r, acts in sched.items()})
    else:
        print(f"{plan.name}: {par.schedule.value}, pp={par.pp}, vpp={par.vpp}, "
              f"{plan.num_microbatches} micro-batches")
        print(format_grid(sched, by=args.by))


def cmd_run(args) -> None:
    from executors.launch import run

    plan = load_plan(args.plan)
    try:
        result = run(plan, steps=args.steps, warmup=args.warmup, seed=args.seed, trace_path=args.trace,
                     checkpoint_dir=args.checkpoint_dir, resume=args.resume, timeout_s=args.timeout,
                     data_path=args.data)
    except RuntimeError as exc:
        raise RunFailed(str(exc).splitlines()[0] if str(exc) else "the run failed") from None
    if args.json:
        _print_json(result.to_json())
    else:
        print_prediction(result)


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
    if args.plan:
        plan = load_plan_for_validate(args.plan, progress=not args.json)
        try:
            comp = validate_plan(plan, steps=args.steps, warmup=args.warmup, trace_dir=args.trace_dir)
        except RuntimeError as exc:
            raise RunFailed(str(exc).splitlines()[0] if str(exc) else "the run failed") from None
        if args.json:
            _print_json(comp.to_json())
        else:
            _print_comparison(comp)
        return
    result = validate_matrix(args.matrix, steps=args.steps, warmup=args.warmup, only=args.only,
                             progress=not args.json, trace_dir=args.trace_dir)
    if args.json:
        _print_json({"layouts": result.table.to_dict(orient="records"), "failures": dict(result.failures)})
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


def cmd_plan(args) -> None:
    from simcore.planner.search import search, summary_table
    from simcore.plan.spec import plan_to_dict
    from simcore.results import atomic_write_text

    model = {"name": args.model}
    if args.seq_len:
        model["seq_len"] = args.seq_len
    cluster = {"node": args.cluster, "nodes": args.nodes}
    if args.fabric:
        cluster["fabric"] = args.fabric
    if args.storage:
        cluster["storage"] = args.storage
    res = search(model, cluster, args.global_batch, objective=args.objective, top_k=args.top_k, jobs=args.jobs,
                 tokens=args.tokens, progress=sys.stderr.isatty() and not args.json,
                 allow_fewer_gpus=args.allow_fewer_gpus)
    out = args.out or Path(f"{res.best.name}.yaml")
    atomic_write_text(out, dump_plan(res.best))
    if args.json:
        _print_json({"best": plan_to_dict(res.best), "best_plan_file": str(out),
                     "table": res.table.head(args.rows).to_dict(orient="records"),
                     "pareto": res.pareto.to_dict(orient="records"), "explanations": res.explanations})
        return
    print(summary_table(res, args.rows))
    print()
    for line in res.explanations:
        print(f"- {line}")
    print(f"\nbest plan written to {out}")


def cmd_cost(args) -> None:
    from simcore.planner.runcost import run_cost, summary_lines
    from simcore.engine.predict import simulate

    plan = load_plan(args.plan)
    rc = run_cost(plan, simulate(plan), args.tokens, prices=_parse_prices(args.price), storage=args.storage,
                  monte_carlo=args.monte_carlo, seed=args.seed, tiered_checkpoints=args.tiered_checkpoints)
    if args.json:
        _print_json(rc.to_json())
    else:
        print("\n".join(summary_lines(rc)))


def cmd_whatif(args) -> None:
    from simcore.planner.whatif import run_whatif

    res = run_whatif(args.sweep, progress=sys.stderr.isatty() and not args.json)
    if args.report:
        from reports.planning_plots import write_whatif

        write_whatif(res, args.report)
    if args.json:
        _print_json({"cells": res.table.to_dict(orient="records"), "assumptions": res.assumptions})
        return
    print(res.table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    if args.report:
        print(f"\nreport written to {args.report}")


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


def cmd_demo(args) -> None:
    from trainplan.jobs import demo, open_hint

    reports = demo(args.out)
    print("\nreports:")
    for name, html in reports.items():
        print(f"  {name:>9}: {open_hint(html)}")


def cmd_collectives(args) -> None:
    from simcore.model.collective_plan import expected_collectives, format_collectives
    from topologies.placement import rank_grid

    plan = load_plan(args.plan)
    if args.json:
        par = plan.parallel
        grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
        firsts = {grid.rank(pp=i) for i in range(par.pp)}
        counts = expected_collectives(plan)
        _print_json({str(r): {f"{k}/{a}": n for (k, a), n in sorted(counts[r].items())} for r in sorted(firsts)})
    else:
        print(format_collectives(plan))


def cmd_calibrate(args) -> None:
    from executors.calibrate.profile import calibrate
    from topologies.hardware import default_profile_path

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
        profile = refit_profile(out, args.from_run, load_plan(args.plan))
        ratios = profile.get("refits", [{}])[-1].get("ratios", {})
        print(f"refitted {out} from {args.from_run}: " + ", ".join(f"{k} x{v:.3g}" for k, v in ratios.items()))
        return
    profile = calibrate(out, quick=args.quick, progress=not args.json)
    if args.json:
        _print_json({"profile": str(out), "device": profile["device"]})
    else:
        dev = profile["device"]
        peaks = ", ".join(f"{k} {v:.3f}" for k, v in dev["dense_tflops"].items() if v)
        print(f"wrote {out}: {dev['name']}, peak TFLOP/s {peaks}, "
              f"memory {dev['hbm_tbyte_per_s'] * 1e3:.1f} GB/s, link {dev['intra_link_gbyte_per_s_bidir'] / 2:.2f} GB/s")


# --------------------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainplan",
        description="Plan, simulate, price and validate large-model training layouts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("catalog", help="list GPUs, nodes, fabrics, storage, prices and models with sources")
    p.add_argument("--kind", choices=["gpus", "nodes", "fabrics", "storage", "prices", "models"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_catalog)

    p = sub.add_parser("check", help="validate a Plan file and print it resolved")
    p.add_argument("plan", type=Path)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("topology", help="build the cluster graph of a Plan; summary and drawing")
    p.add_argument("plan", type=Path)
    p.add_argument("--draw", type=Path, metavar="PNG", help="write a picture of the cluster graph")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_topology)

    p = sub.add_parser("simulate", help="predict one training step: time breakdown, MFU, memory")
    p.add_argument("plan", type=Path)
    p.add_argument("--engine", choices=["analytic", "des"], default="analytic",
                   help="analytic closed forms (fast) or the SimPy event engine (exact order)")
    p.add_argument("--granularity", choices=["microbatch", "layer"], default="microbatch")
    p.add_argument("--mode", choices=["representative", "full"], default="representative")
    p.add_argument("--slow", action="append", metavar="RANK=FACTOR", help="straggler: slow one global rank")
    p.add_argument("--slow-stage", action="append", metavar="STAGE=FACTOR",
                   help="slow every rank of a pipeline stage (e.g. a slower node)")
    p.add_argument("--stage-gpu", action="append", metavar="STAGE=GPU",
                   help="mixed hardware: run a pipeline stage on another catalog GPU type")
    p.add_argument("--trace", type=Path, metavar="JSON", help="write the predicted step as a Chrome trace")
    p.add_argument("--gantt", type=Path, metavar="PNG", help="draw the predicted step as a Gantt chart")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("schedule", help="the per-rank pipeline action grid (torch's notation: 0F0 0B0 ...)")
    p.add_argument("plan", type=Path)
    p.add_argument("--lowered", action="store_true", help="with SEND/RECV and UNSHARD/RESHARD actions")
    p.add_argument("--by", choices=["rank", "step"], default="rank")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_schedule)

    p = sub.add_parser("collectives", help="the collectives each rank issues per step, as torch issues them")
    p.add_argument("plan", type=Path)
    p.add_argument("--json", action="store_true", help="counts per (kind, axis) for the first rank of each stage")
    p.set_defaults(func=cmd_collectives)

    p = sub.add_parser("memory", help="bytes per GPU by kind, per pipeline rank, and whether it fits")
    p.add_argument("plan", type=Path)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_memory)

    p = sub.add_parser("import", help="a Plan from a HF config, Megatron args, DeepSpeed JSON or torchtitan TOML")
    p.add_argument("--hf", metavar="CONFIG_JSON")
    p.add_argument("--megatron", metavar="CMDLINE_OR_FILE")
    p.add_argument("--deepspeed", metavar="DS_CONFIG_JSON")
    p.add_argument("--torchtitan", metavar="TOML")
    p.add_argument("--cluster", metavar="NODE", help="catalog node type (default: from the inputs, or dgx-h100)")
    p.add_argument("--nodes", type=int)
    p.set_defaults(func=cmd_import)

    from simcore.plan.writers import TARGETS

    p = sub.add_parser("export", help="the Plan as a Megatron command line, ds_config, torchtitan TOML or sbatch script")
    p.add_argument("plan", type=Path)
    p.add_argument("--to", choices=list(TARGETS), required=True)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("plan", help="search every valid layout of a model on a cluster; rank by time or cost")
    p.add_argument("--model", required=True, help="catalog model name (trainplan catalog --kind models)")
    p.add_argument("--cluster", required=True, metavar="NODE", help="catalog node type, e.g. dgx-h100")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--fabric")
    p.add_argument("--storage")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--tokens", type=float, help="tokens to train, for days and $ of the whole run")
    p.add_argument("--objective", choices=["time", "cost", "pareto"], default="time")
    p.add_argument("--top-k", type=int, default=10, help="re-simulate the best K with the event engine")
    p.add_argument("--jobs", type=int, default=1, help="processes for the search")
    p.add_argument("--allow-fewer-gpus", action="store_true", help="also try layouts using part of the cluster")
    p.add_argument("--rows", type=int, default=20, help="rows of the ranked table to print")
    p.add_argument("--out", type=Path, help="where to write the best Plan (default: NAME.yaml)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("cost", help="time to train, GPU-hours, $, energy, checkpoints and failures of a run")
    p.add_argument("plan", type=Path)
    p.add_argument("--tokens", type=float, required=True)
    p.add_argument("--price", action="append", metavar="KEY=VALUE",
                   help="override a price: on_demand_usd, reserved_usd, spot_usd, usd_per_kwh, pue, "
                        "failures_per_gpu_hour, restart_s, spot_preemptions_per_node_hour")
    p.add_argument("--storage", help="storage tier for checkpoints (catalog name)")
    p.add_argument("--tiered-checkpoints", action="store_true", help="to host memory first, then the file system")
    p.add_argument("--monte-carlo", type=int, default=200, help="SimPy runs of the whole training (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cost)

    p = sub.add_parser("whatif", help="a grid over GPU type, nodes, fabric, storage, prices: best layout per cell")
    p.add_argument("sweep", type=Path)
    p.add_argument("--report", type=Path, metavar="DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_whatif)

    p = sub.add_parser("report", help="write an HTML + Markdown report: plan, whatif or validate")
    p.add_argument("kind", choices=["plan", "whatif", "validate"])
    p.add_argument("sweep", type=Path, nargs="?", help="the sweep file (report whatif)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR")
    p.add_argument("--model")
    p.add_argument("--cluster", metavar="NODE")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=1024)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--tokens", type=float)
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--matrix", type=Path)
    p.add_argument("--only", action="append", metavar="LAYOUT")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("demo", help="the main job: plan, price, what-if and validate on an embedded default")
    p.add_argument("--out", type=Path, default=Path("out/demo"))
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("run", help="run a Plan for real with torch.distributed and measure it")
    p.add_argument("plan", type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", type=Path, metavar="JSON", help="write a measured step as a Chrome trace")
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir")
    p.add_argument("--data", type=Path, help="a token file (numpy uint16/int32 memmap); synthetic by default")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before a hung run is ended")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("validate", help="predict, run, and compare a Plan (or a matrix of layouts)")
    p.add_argument("plan", type=Path, nargs="?")
    p.add_argument("--matrix", type=Path, help="a matrix file such as validation/local.yaml")
    p.add_argument("--only", action="append", metavar="LAYOUT", help="validate only these layouts of the matrix")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--trace-dir", type=Path, help="write predicted and measured Chrome traces here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("calibrate", help="microbenchmark this host into a hardware profile (node: localhost)")
    p.add_argument("--out", type=Path, help="profile path (default: the cached profile of this host); a full "
                   "calibration over an earlier one of this host pools the torch-wrapper host costs of the last five")
    p.add_argument("--quick", action="store_true", help="fewer shapes, sizes and group sizes (about 10 s)")
    p.add_argument("--from-run", type=Path, metavar="MEASURED_JSON",
                   help="refit the profile from a measured run (`trainplan run --json` output)")
    p.add_argument("--plan", type=Path, help="the plan the measured run executed (with --from-run)")
    p.add_argument("--refresh", action="store_true",
                   help="re-measure only the load-sensitive host speed (about 25 s on a CPU host) in the existing profile")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_calibrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (PlanError, CatalogError, UsageError, ValueError) as exc:
        print(f"trainplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
