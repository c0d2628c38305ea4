"""The commands on one Plan file and the model: catalog, check, topology, simulate, memory,
schedule, collectives, import, export. Each parses nothing: it takes argparse's namespace,
calls one function of simcore/topologies/reports, and prints."""
from __future__ import annotations

import sys

from simcore.plan.bounds import check_event_budget, check_graph_budget
from simcore.plan.load import dump_plan, load_plan
from topologies.hardware import load_catalog
from trainplan.common import (UsageError, check_prediction, fmt_s, plan_model_notes, print_json, print_prediction,
                              warn)


def cmd_catalog(args) -> None:
    from reports.tables import catalog_tables

    tables = catalog_tables(load_catalog())
    kinds = [args.kind] if args.kind else list(tables)
    if args.json:
        print_json({k: tables[k].to_dict(orient="records") for k in kinds})
        return
    for kind in kinds:
        table = tables[kind]
        print(f"== {kind} ==")
        print(table.drop(columns=["source"]).to_string(index=False))
        print("sources:")
        for name, source in zip(table.iloc[:, 0], table["source"]):
            print(f"  {name}: {source}")
        print()


def _model_size(plan) -> dict:
    """The model's parameter count, and per token for MoE, so an import shows which model it means."""
    from simcore.model.workload import active_params_per_token, param_counts

    pc = param_counts(plan.model)
    out = {"params_total": pc.total}
    if plan.model.moe:
        out["params_active"] = int(active_params_per_token(plan.model))
    if pc.mtp:   # the MTP modules' own, beside the main model's count (``ParamCounts.mtp``)
        out["params_mtp"] = pc.mtp
    return out


def cmd_check(args) -> None:
    from simcore.plan.describe import plan_summary

    plan = load_plan(args.plan)
    warn(plan_model_notes(args.plan))
    summary = plan_summary(plan)
    summary["derived"] = {**_model_size(plan), **summary["derived"]}
    if args.json:
        print_json(summary)
        return
    print(f"# {args.plan}: valid")
    print(dump_plan(plan), end="")
    print("# derived")
    for key, value in summary["derived"].items():
        print(f"#   {key}: {value}")


def cmd_topology(args) -> None:
    from topologies.build import build_cluster
    from topologies.routes import cluster_summary

    from tqdm import tqdm

    plan = load_plan(args.plan)
    check_graph_budget(plan)
    steps = 3 if args.draw else 2   # a bar only when it takes over two seconds (100k GPUs: ~10 s)
    with tqdm(total=steps, desc="topology: graph", unit="phase", delay=2, leave=False,
              disable=not sys.stderr.isatty()) as bar:
        graph = build_cluster(plan.cluster)
        bar.set_description("topology: bisection (max flow)")
        bar.update()
        summary = cluster_summary(graph, plan.cluster)
        bar.update()
        if args.draw:
            from reports.plots import save_figure, topology_figure

            bar.set_description("topology: drawing")
            summary["drawing"] = str(save_figure(topology_figure(graph, plan.cluster), args.draw))
            bar.update()
    if args.json:
        print_json(summary)
    else:
        for key, value in summary.items():
            print(f"{key:>32}: {value}")


def cmd_simulate(args) -> None:
    from simcore.engine.predict import simulate

    plan = load_plan(args.plan)
    warn(plan_model_notes(args.plan))
    kwargs = {}
    if args.engine == "des":
        check_event_budget(plan, "the event engine", args.granularity, args.mode)
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

    check_prediction(plan, result)
    interval = interval_fields(plan, result)
    if args.trace:
        from simcore.results import write_chrome_trace

        write_chrome_trace(result.spans, args.trace, f"{plan.name} predicted")
    if args.gantt:
        from reports.plots import gantt_figure, save_figure

        save_figure(gantt_figure(result.spans, f"{plan.name}: predicted step ({args.engine})"), args.gantt)
    if args.json:
        print_json({**result.to_json(), **interval, **_model_size(plan)})
    else:
        size = _model_size(plan)
        active = f", {size['params_active'] / 1e9:.1f} B active per token" if "params_active" in size else ""
        mtp = f" (+{size['params_mtp'] / 1e9:.2f} B in {plan.model.mtp_layers} MTP modules)" if "params_mtp" in size else ""
        print(f"{plan.name}: {plan.model.name}, {size['params_total'] / 1e9:.2f} B parameters{mtp}{active}")
        print_prediction(result, plan)
        if interval["interval_s"]:
            lo, hi = interval["interval_s"]
            print(f"  {interval['interval_level']:.0%} interval of the step time: {fmt_s(lo)} - {fmt_s(hi)} "
                  f"({interval['interval_source']})")
            if interval.get("extrapolated"):
                print(f"  {interval['extrapolated']}")
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


def _fit_class_note(peak_bytes: float, hbm_bytes: float, bare: bool = False) -> str:
    """The memory model's class of a peak (``headroom.fit_class``) as a clause: thin or may not fit
    say the prediction is within the model's error of the GPU (``--min-headroom`` in ``plan``)."""
    from simcore.planner.headroom import FITS, MAY_NOT_FIT, THIN, fit_class, memory_margin

    cls = fit_class(peak_bytes, hbm_bytes)
    words = {FITS: "fits", THIN: "fits, thin: within the memory model's error of the GPU",
             MAY_NOT_FIT: "may not fit: over the GPU by less than the memory model's error",
             None: "does not fit, even within the memory model's error"}[cls]
    if bare:
        return f"{words} ({memory_margin().describe()})"
    return "" if cls == FITS else f"; {words}"


def cmd_memory(args) -> None:
    from simcore.model.step_costs import memory_report

    plan = load_plan(args.plan)
    report = memory_report(plan)
    if getattr(args, "torch", False):
        report["torch"] = _torch_trace(plan)
    if args.json:
        print_json(report)
        return
    gib = 1024**3
    ranks = report["ranks"]
    unit, div = ("GiB", gib) if report["max_gpu_bytes"] >= gib else ("MiB", 1024**2)
    print(f"{plan.name}: bytes per GPU ({unit}) by term, per pipeline rank; HBM {report['hbm_bytes'] / gib:.1f} GiB")
    print(f"  {'term':<32}" + "".join(f"{'rank ' + str(r['pp_rank']):>10}" for r in ranks))
    for term in ranks[0]["terms"]:
        if any(r["terms"][term] for r in ranks):
            print(f"  {term:<32}" + "".join(f"{r['terms'][term] / div:>10.2f}" for r in ranks))
    print(f"  {'total':<32}" + "".join(f"{r['total'] / div:>10.2f}" for r in ranks))
    if report.get("host_offload_bytes_per_node"):
        print(f"  host memory for offload per node: {report['host_offload_bytes_per_node'] / gib:.1f} GiB "
              f"of {report['host_memory_bytes_per_node'] / gib:.0f} GiB")
    print(f"  allocator margin {report['allocator_margin']:.1%} of the tensors, {report['context_label']} "
          f"{report['cuda_context_bytes'] / gib:.2f} GiB (both in the total)")
    if report["stream_cache_bytes"]:
        print(f"  FSDP2's side-stream pools cache {report['stream_cache_bytes'] / gib:.2f} GiB more (all-gather "
              f"outputs, sharded gradients): torch's max_memory_reserved counts them, the allocator frees them on demand")
    from simcore.planner.formatting import headroom_gib

    room = headroom_gib(report["hbm_bytes"] / gib, report["memory_per_gpu_gib"])
    print(f"  fits: {'yes' if report['fits'] else 'NO'} (most loaded GPU {report['memory_per_gpu_gib']:.2f} GiB, "
          f"headroom {room:.2f} GiB){_fit_class_note(report['memory_per_gpu_gib'] * gib, report['hbm_bytes'])}")
    if report["allocator_margin"] and not report["fits"]:
        bare = max(r["total"] - r["terms"]["allocator_margin"] for r in ranks)
        print(f"  without the allocator's assumed {report['allocator_margin']:.0%} margin (an assumption, not a "
              f"measurement; none under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, training.allocator_margin: "
              f"0): {bare / gib:.2f} GiB, {_fit_class_note(bare, report['hbm_bytes'], bare=True)}")
    if "torch" in report:
        t = report["torch"]
        kinds = ", ".join(f"{k} {v / gib:.2f}" for k, v in t["torch_by_kind"].items() if v and k != "Total")
        cut = (f"; its first {t['layers_traced']} of {t['layers']} layers, what torch traces within seconds"
               if t["layers_traced"] < t["layers"] else "")
        print(f"  torch's {t['tracker']} on the executor's model (fake tensors, one micro-batch a step{cut}): "
              f"peak {t['torch_peak_bytes'] / gib:.2f} GiB of tensors ({kinds})")
        print(f"  the model's tensors for the same step{' and layers' if cut else ''}: "
              f"{t['analytic_tensor_bytes'] / gib:.2f} GiB "
              f"({t['difference']:+.1%}); the trace is eager PyTorch (norms, RoPE, SiLU keep their own "
              f"tensors), the model counts fused kernels (Megatron/TE, torch.compile) as Korthikanti et al.")
        if plan.parallel.tp > 1:
            print("  under TP both count torch's loss_parallel (the saved fp32 log-softmax of the local logits, "
                  "and in backward zeros_like, exp and their sum)")
            if plan.parallel.dp == 1:
                print("  TP alone: torch's row-parallel embedding keeps a whole-table gradient on every rank "
                      "(DTensor has no row-sharded embedding backward); the model counts Megatron's shard")
        if t["traced_loss_differs"]:
            print(f"  (both with the executor's eager loss, not training.loss={plan.training.loss.value})")
        if t.get("traced_autocast_differs"):
            print("  (both under the executor's torch.autocast over fp32 parameters, training.autocast: true, "
                  "where the Plan keeps 16-bit parameters with an fp32 master copy)")
        if plan.training.attention_unpad:
            print("  the trace runs SDPA on the whole batch; the model also counts flash-attn's unpadded output "
                  "(training.attention_unpad: true)")


def _torch_trace(plan) -> dict:
    from executors.memory_trace import TraceError, compare

    try:
        return compare(plan)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    except (RuntimeError, NotImplementedError) as exc:   # torch could not trace this model
        raise UsageError(f"--torch: torch could not trace this plan: {str(exc).splitlines()[0]}") from None


def cmd_import(args) -> None:
    import yaml

    from simcore.plan.interop import import_plan
    from simcore.plan.load import plan_from_dict

    if not any((args.hf, args.megatron, args.deepspeed, args.torchtitan, args.log, args.maxtext)):
        raise UsageError("import needs at least one of --hf, --megatron, --deepspeed, --torchtitan, --maxtext, --log")
    doc, warnings = import_plan(hf=args.hf, megatron=args.megatron, deepspeed=args.deepspeed,
                                torchtitan=args.torchtitan, log=args.log, cluster=args.cluster, nodes=args.nodes,
                                seq_len=args.seq_len, base_dir=".", maxtext=args.maxtext)
    plan = plan_from_dict(doc, ".")
    from simcore.model.workload import active_params_per_token, param_counts
    from simcore.plan.hf_config import hf_import_notes
    for line in warnings + (hf_import_notes(args.hf) if args.hf else []):
        print(f"trainplan: warning: {line}", file=sys.stderr)
    active = f" ({active_params_per_token(plan.model):,.0f} per token)" if plan.model.moe else ""
    print(f"trainplan: note: built {param_counts(plan.model).total:,} parameters{active}", file=sys.stderr)
    print(yaml.safe_dump(doc, sort_keys=False), end="")


def cmd_export(args) -> None:
    from simcore.plan.writers import export_with_notes

    text, notes = export_with_notes(load_plan(args.plan), args.to, plan_path=str(args.plan))
    for line in notes:
        print(f"trainplan: note: {line}", file=sys.stderr)
    print(text, end="")


#: Blocks of time steps ``schedule`` prints without --all (the rest is counted, not shown).
SCHEDULE_BLOCKS = 4


def wrapped_grid(sched: dict, by: str, format_grid, *, show_all: bool = False, width: int | None = None) -> str:
    """The rank-by-step grid cut into blocks of time steps that fit the terminal's width, each
    headed by its step range; at most SCHEDULE_BLOCKS blocks unless ``show_all``."""
    import shutil

    if by != "rank":
        return format_grid(sched, by=by)
    width = width or shutil.get_terminal_size((120, 24)).columns
    steps = max((len(a) for a in sched.values()), default=0)
    cell = max((len(str(a)) for acts in sched.values() for a in acts if a is not None), default=1) + 1
    label = max(len(f"Rank {r}: ") for r in sched)
    per_block = max(1, (width - label) // cell)
    starts = list(range(0, steps, per_block))
    shown = starts if show_all else starts[:SCHEDULE_BLOCKS]
    blocks = [f"steps {a}-{min(a + per_block, steps) - 1}:\n"
              + format_grid({r: acts[a:a + per_block] for r, acts in sched.items()}, by="rank") for a in shown]
    if len(shown) < len(starts):
        left = steps - shown[-1] - per_block
        blocks.append(f"... {left} more steps not shown (--all prints them)")
    return "\n".join(blocks)


def cmd_schedule(args) -> None:
    from simcore.model.schedules import build_schedule, format_grid, lower

    plan = load_plan(args.plan)
    check_event_budget(plan, "trainplan schedule")
    par = plan.parallel
    # DualPipeV's overlapped pairs as torch's pipeline_order prints them: (0F5;5B2)OVERLAP_F_B
    sched = build_schedule(par.schedule, par.pp, plan.num_microbatches, par.vpp, par.microbatch_group, paired=True)
    if args.lowered:
        sched = lower(sched, par.pp, plan.num_microbatches, par.vpp)
    if args.json:
        print_json({str(r): [str(a) if a else "" for a in acts] for r, acts in sched.items()})
    else:
        print(f"{plan.name}: {par.schedule.value}, pp={par.pp}, vpp={par.vpp}, "
              f"{plan.num_microbatches} micro-batches")
        print(wrapped_grid(sched, args.by, format_grid, show_all=args.all))


def cmd_collectives(args) -> None:
    from simcore.model.collective_plan import executor_wire, expected_collectives, format_collectives, plan_wire
    from topologies.placement import rank_grid

    plan = load_plan(args.plan)
    check_event_budget(plan, "trainplan collectives", per_stage=True)
    if args.json:
        par = plan.parallel
        grid = rank_grid(par.pp, par.dp, par.cp, par.tp)
        firsts = {grid.rank(pp=i) for i in range(par.pp)}
        counts = expected_collectives(plan)
        print_json({str(r): {f"{k}/{a}": n for (k, a), n in sorted(counts[r].items())} for r in sorted(firsts)})
    else:
        executor = args.wire == "executor"
        wire = executor_wire(plan) if executor else plan_wire(plan)
        print(format_collectives(plan, wire))
        print(wire_note(plan, wire, executor))
        if (r := plan.parallel.kv_replicator) > 1:
            print(f"axis kv: each key/value head copied {r} times (parallel.kv_replicator), as NeuronX Distributed runs it: "
                  f"its kv shared group of {r} ranks all-reduces the K and V output gradients in fp32, once per layer "
                  "and micro-batch in the backward (the executor does not run it)")


def wire_note(plan, wire, executor: bool) -> str:
    """What the listed bytes are: the calls trainplan's executor issues (torch's APIs), their
    buffers in ``wire``'s dtypes (``simcore.model.collective_plan.Wire``)."""
    act = plan.training.precision.value
    gc = plan.training.grad_compression
    grads = f"gradients reduced at {wire.grad} bytes an element" + (
        f" ({'FSDP2 groups' if plan.parallel.zero >= 2 else 'DDP buckets'} at {gc.bits / 8:g} and an fp32 scale a "
        f"group: grad_compression {gc.value})" if gc.bits else "")
    params = f"parameters gathered or broadcast at {wire.param} bytes" + (
        " (the blocks' linear weights at 1, fp8_param_gather)" if wire.fp8_weights else "")
    if executor:
        return (f"calls and bytes as trainplan's executor issues them: it trains {act} by autocast over fp32 parameters, "
                f"so {params} and {grads}; activations in {act} (--wire plan: the plan's own dtypes)")
    from simcore.plan.maxtext_writer import on_tpu

    tpu = ("; on a TPU the step's collectives are the ones XLA partitions MaxText's mesh into, not these torch calls"
           if on_tpu(plan) else "")
    return (f"calls as trainplan's executor issues them (torch's APIs), bytes in the plan's dtypes: {params}, {grads}, "
            f"activations in {act}; the executor itself moves fp32 parameters and gradients (--wire executor){tpu}")

