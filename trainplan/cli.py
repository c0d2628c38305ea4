"""The ``trainplan`` command line: parse, call one function, print (the commands are in
``trainplan.commands_model`` and ``trainplan.commands_jobs``).

Every user error (a bad Plan, an unknown name, an unreadable file) ends with one
sentence on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simcore.plan.spec import PlanError
from simcore.planner.stacks import ANY, STACKS
from topologies.components import CatalogError
from trainplan import commands_compare as compare
from trainplan import commands_jobs as jobs
from trainplan import commands_model as model
from trainplan import commands_serve as serve
from trainplan.common import SEARCH_TOP_K, UsageError, check_numbers, check_outputs, stop_on_signals
from trainplan.help_text import describe


def _plan_file_commands(sub) -> None:
    """The commands on one Plan file: check it, draw its cluster, predict, schedule, memory."""
    p = sub.add_parser("catalog", help="list GPUs, nodes, fabrics, storage, prices and models with sources")
    p.add_argument("--kind", choices=["gpus", "nodes", "fabrics", "storage", "prices", "models"])
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=model.cmd_catalog)

    p = sub.add_parser("check", help="validate a Plan file and print it resolved")
    p.add_argument("plan", type=Path)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=model.cmd_check)

    p = sub.add_parser("topology", help="build the cluster graph of a Plan; summary and drawing")
    p.add_argument("plan", type=Path)
    p.add_argument("--draw", type=Path, metavar="PNG", help="write a picture of the cluster graph")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=model.cmd_topology)

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
    p.set_defaults(func=model.cmd_simulate)

    p = sub.add_parser("schedule", help="the per-rank pipeline action grid (torch's notation: 0F0 0B0 ...)")
    p.add_argument("plan", type=Path)
    p.add_argument("--lowered", action="store_true", help="with SEND/RECV and UNSHARD/RESHARD actions")
    p.add_argument("--by", choices=["rank", "step"], default="rank")
    p.add_argument("--all", action="store_true", help="every time step (default: the first blocks that fit the terminal)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=model.cmd_schedule)

    p = sub.add_parser("collectives", help="the collectives each rank issues per step, as torch issues them")
    p.add_argument("plan", type=Path)
    p.add_argument("--json", action="store_true", help="counts per (kind, axis) for the first rank of each stage")
    p.add_argument("--wire", choices=("plan", "executor"), default="plan",
                   help="bytes in the plan's dtypes (default: 16-bit parameters, gradients as its stacks reduce them) "
                        "or in trainplan's executor's (fp32 parameters and gradients under autocast)")
    p.set_defaults(func=model.cmd_collectives)

    p = sub.add_parser("memory", help="bytes per GPU by term, per pipeline rank, and whether it fits")
    p.add_argument("plan", type=Path)
    p.add_argument("--json", action="store_true")
    p.add_argument("--torch", action="store_true",
                   help="also trace the executor's model under FakeTensorMode with torch's FSDPMemTracker "
                        "(its first 8 layers at most, which take seconds; the model compared on the same)")
    p.set_defaults(func=model.cmd_memory)


def _measured_commands(sub) -> None:
    """A real run set beside its Plan: the stacks' logs and profiler traces."""
    p = sub.add_parser("compare", help="a real run's log (Megatron, torchtitan, DeepSpeed, Composer, HF, MLPerf) "
                                       "or PyTorch profiler traces vs the prediction")
    p.add_argument("plan", type=Path)
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--log", type=Path, help="a log file, or a directory of rank logs")
    what.add_argument("--trace", type=Path, help="a PyTorch profiler (Kineto) trace, or a directory of one per "
                                                 "rank (.json or .json.gz): phase by phase against the prediction")
    p.add_argument("--out", type=Path, help="with --trace: write trace.json (both timelines) and the report here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=compare.cmd_compare)


def _serving_commands(sub) -> None:
    """Serving plans: their traffic on the event engine, and the cheapest capacity for a rate."""
    p = sub.add_parser("serve", help="serve a serving plan's traffic: TTFT, TPOT, latency percentiles, throughput, KV use")
    p.add_argument("plan", type=Path)
    p.add_argument("--json", action="store_true")
    p.add_argument("--trace", type=Path, metavar="JSON", help="write the iterations as a Chrome trace")
    p.add_argument("--plot", type=Path, metavar="PNG", help="draw the KV cache, the decoding requests and the "
                                                             "latency distributions (format from the suffix)")
    p.add_argument("--run", action="store_true", help="also serve the traffic for real on this host's serving loop "
                   "(hardware: {node: localhost}, TP 1, fp32) and print the measured figures beside the predicted")
    p.add_argument("--calibrate", action="store_true", help="first measure the serving loop's costs for the plan's "
                   "model on this host (kept beside the host's profile; --run does it where none are kept)")
    p.set_defaults(func=serve.cmd_serve)

    p = sub.add_parser("serve-plan", help="the cheapest GPU kind, TP x replicas and precision that serves a rate "
                                          "within the SLO, $ per million output tokens, each option's frontier")
    p.add_argument("plan", type=Path)
    p.add_argument("--rate", type=float, help="requests per second (default: the plan's traffic.rate)")
    p.add_argument("--ttft-ms", type=float, help="TTFT target (default: the plan's slo.ttft_ms)")
    p.add_argument("--tpot-ms", type=float, help="TPOT target (default: the plan's slo.tpot_ms)")
    p.add_argument("--percentile", type=float, help="the percentile the targets hold at (default: the plan's, or 99)")
    p.add_argument("--gpus", help="GPU kinds to search, comma-separated (default: every priced kind the cost model covers)")
    p.add_argument("--precisions", help="bf16,fp8 (default: both; fp8 where the GPU has an FP8 peak); the weight-only "
                                        "w8a16, w4a16 when named")
    p.add_argument("--tp", help="TP degrees, comma-separated (default: 1,2,4,8 within a node)")
    p.add_argument("--max-gpus", type=int, default=512, help="the most GPUs an option may use")
    p.add_argument("--mode", choices=["on_demand", "reserved", "buy"], default="on_demand", help="the price ranked by")
    p.add_argument("--top", type=int, default=15, help="options printed")
    p.add_argument("--frontier", type=int, default=3, help="options whose throughput-latency frontier is printed")
    p.add_argument("--jobs", type=int, default=1, help="processes for the search")
    p.add_argument("--disaggregate", action="store_true", help="search prefill and decode pools (each pair of "
                   "TP degrees) instead of co-located replicas")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=serve.cmd_serve_plan)


def _interop_commands(sub) -> None:
    """The the training stacks' files in and out."""
    p = sub.add_parser("import", help="a Plan from a HF config, Megatron args or log, DeepSpeed JSON, torchtitan TOML "
                       "or a MaxText launch")
    p.add_argument("--hf", metavar="CONFIG_JSON")
    p.add_argument("--megatron", metavar="CMDLINE_OR_FILE")
    p.add_argument("--deepspeed", metavar="DS_CONFIG_JSON")
    p.add_argument("--torchtitan", metavar="TOML")
    p.add_argument("--maxtext", metavar="CMDLINE_OR_FILE", help="a MaxText launch (overrides of base.yml)")
    p.add_argument("--log", metavar="FILE", help="a Megatron-LM run's log: the arguments block it prints at start-up")
    p.add_argument("--cluster", metavar="NODE", help="catalog node type (default: from the inputs, or dgx-h100)")
    p.add_argument("--nodes", type=int)
    p.add_argument("--seq-len", type=int, help="training sequence length (default: the inputs', else min(context, 8192))")
    p.set_defaults(func=model.cmd_import)

    from simcore.plan.writers import TARGETS

    p = sub.add_parser("export", help="the Plan as a Megatron command line, ds_config, torchtitan TOML or sbatch script")
    p.add_argument("plan", type=Path)
    p.add_argument("--to", choices=list(TARGETS), required=True)
    p.set_defaults(func=model.cmd_export)


def _plan_command(sub) -> None:
    """``trainplan plan``: the layout search."""
    p = sub.add_parser("plan", help="search every valid layout of a model on a cluster; rank by time or cost")
    p.add_argument("--model", required=True, help="catalog model name (trainplan catalog --kind models) or a Hugging Face config.json")
    p.add_argument("--cluster", required=True, metavar="NODE", help="catalog node type, e.g. dgx-h100")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--fabric")
    p.add_argument("--storage")
    p.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--tokens", type=float, help="tokens to train, for days and $ of the whole run")
    p.add_argument("--objective", choices=["time", "cost", "pareto"], default="time")
    p.add_argument("--top-k", type=int, default=SEARCH_TOP_K, help="re-simulate the best K with the event engine")
    p.add_argument("--jobs", type=int, default=1, help="processes for the search")
    p.add_argument("--allow-fewer-gpus", action="store_true", help="also try layouts using part of the cluster")
    p.add_argument("--rows", type=int, default=20, help="rows of the ranked table to print")
    p.add_argument("--stack", choices=[*STACKS, "executor", ANY],
                   help="rank only layouts this stack runs: its exporter writes them (executor: trainplan's own, on "
                        "GPUs; any: every layout, where the chip has a stack of its own: TPU, Trainium, Ascend)")
    p.add_argument("--no-activation-offload", dest="activation_offload", action="store_false",
                   help="rank no layout that offloads activations to host memory (for stacks without it)")
    p.add_argument("--min-headroom", type=float, default=0.0, metavar="GIB",
                   help="rank only layouts that leave this much GPU memory (default 0: every layout that fits)")
    p.add_argument("--precision", metavar="P,Q", help="training precisions to search, e.g. bf16,fp8 (fp8, mxfp8, "
                   "nvfp4 where the GPU has them), or 'all' (default: bf16)")
    p.add_argument("--hybrid", action="store_true", help="also rank hybrid sharding (parallel.dp_replicate)")
    p.add_argument("--compression", metavar="M,N", help="communication compression to rank beside none, where a "
                   "layout can take it: bf16, fp16, powersgd, int8, int8_ef, int4, onebit_adam, onebit_lamb, "
                   "zero_one_adam, zeropp (--stack deepspeed), fp8_param_gather (fp8); the answer says what each "
                   "costs in accuracy")
    p.add_argument("--out", type=Path, help="where to write the best Plan (default: NAME.yaml)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=jobs.cmd_plan)


def _planning_commands(sub) -> None:
    """The search, price, what-if, reports and the demo."""
    _plan_command(sub)

    p = sub.add_parser("cost", help="time to train, GPU-hours, $, energy, checkpoints and failures of a run "
                       "(DeepSpeed's 1-bit optimizers: the steps before their steady state as DeepSpeed runs them)")
    p.add_argument("plan", type=Path)
    p.add_argument("--tokens", type=float, required=True)
    p.add_argument("--price", action="append", metavar="KEY=VALUE",
                   help="override a price: on_demand_usd, reserved_usd, spot_usd, usd_per_kwh, pue, "
                        "failures_per_gpu_hour, restart_s, spot_preemptions_per_node_hour")
    p.add_argument("--storage", help="storage tier for checkpoints (catalog name)")
    p.add_argument("--tiered-checkpoints", action="store_true", help="the same as --checkpoint async (kept)")
    p.add_argument("--checkpoint", metavar="sync|async|compare",
                   help="sync: the step blocks for the whole write (default); async: only for the copy to host "
                        "memory, the write goes on beside training (torch DCP async_save, Megatron --async-save); "
                        "compare: a line per choice saying what it saves against sync")
    p.add_argument("--checkpoint-compression", metavar="R", default="1",
                   help="stated ratio of logical to stored checkpoint bytes (default 1: none)")
    p.add_argument("--checkpoint-writes", metavar="dedup|replicated", default="dedup",
                   help="dedup: the state written once (DCP, Megatron dist-checkpointing; default); "
                        "replicated: every data-parallel replica writes the copy it holds")
    p.add_argument("--monte-carlo", type=int, default=200, help="SimPy runs of the whole training (0: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=jobs.cmd_cost)

    p = sub.add_parser("whatif", help="a grid over GPU type, nodes, fabric, storage, prices: best layout per cell")
    p.add_argument("sweep", type=Path)
    p.add_argument("--report", type=Path, metavar="DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=jobs.cmd_whatif)

    _procure_command(sub)

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
    p.add_argument("--top-k", type=int, default=SEARCH_TOP_K, help="re-simulate the best K with the event engine")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--matrix", type=Path)
    p.add_argument("--only", action="append", metavar="LAYOUT")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.set_defaults(func=jobs.cmd_report)

    p = sub.add_parser("demo", help="the main job: plan, price, what-if and validate on an embedded default")
    p.add_argument("--out", type=Path, default=Path("out/demo"))
    p.set_defaults(func=jobs.cmd_demo)


def _procure_command(sub) -> None:
    """What to buy or rent: hardware and layout searched together, the front of days against $."""
    p = sub.add_parser("procure", help="what to buy or rent to train a model by a deadline or within a budget")
    p.add_argument("candidates", type=Path, nargs="?", help="a candidates file (sweeps/procure-llama3-70b.yaml)")
    p.add_argument("--model", help="catalog model name or a config.json (default: the file's)")
    p.add_argument("--seq-len", type=int)
    p.add_argument("--tokens", type=float)
    p.add_argument("--global-batch", type=int)
    p.add_argument("--deadline-days", type=float, help="answer: the cheapest option done within this many days")
    p.add_argument("--budget", type=float, metavar="USD", help="answer: the fastest option within this many dollars")
    p.add_argument("--gpus", metavar="A,B", help="GPU types (default: those priced to rent and to buy with a node)")
    p.add_argument("--nodes", metavar="N,M", help="cluster sizes in nodes (default: 20 sizes, 2-1024)")
    p.add_argument("--fabrics", metavar="F,G", help="fabrics, or 'default' for the node's own")
    p.add_argument("--modes", metavar="M,N", help="ways of paying: on_demand, reserved, spot, buy")
    p.add_argument("--mixed", metavar="BASE+OTHER", help="also mixed pipelines: BASE's nodes, the later half of "
                   "the pipeline stages on OTHER (event engine), e.g. h100-sxm+a100-80gb; comma-separated")
    p.add_argument("--life-years", type=float, help="buying: the servers' life")
    p.add_argument("--utilisation", type=float, help="buying: share of the life the cluster does paid work")
    p.add_argument("--jobs", type=int, help="processes for the cells")
    p.add_argument("--no-resimulate", action="store_true", help="analytic engine only (no event-engine re-simulation)")
    p.add_argument("--stack", choices=[*STACKS, ANY],
                   help="rank only layouts this stack runs (its exporter writes them); any: every layout")
    p.add_argument("--precision", metavar="P,Q",
                   help="training precisions each cell searches, e.g. bf16,fp8, or 'all' (default: the file's, else bf16)")
    p.add_argument("--rows", type=int, default=15, help="rows of the options table to print")
    p.add_argument("--report", type=Path, metavar="DIR", help="write the HTML + Markdown report here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=jobs.cmd_procure)


def _execution_commands(sub) -> None:
    """The run a plan for real, validate it, calibrate this host."""
    p = sub.add_parser("run", help="run a Plan for real with torch.distributed and measure it",
                       description="Run a Plan for real with torch.distributed and measure it. Each rank "
                       "beats a heartbeat after start-up and after every step; a rank silent for --timeout "
                       "seconds ends the run, naming it. SIGINT (Ctrl-C) and SIGTERM (timeout, scancel, "
                       "Kubernetes) end every rank, remove the ranks' temporary files and exit with 130 or "
                       "143 and one sentence; the ranks die with this process.")
    p.add_argument("plan", type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace", type=Path, metavar="JSON", help="write a measured step as a Chrome trace")
    p.add_argument("--checkpoint-dir", type=Path)
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir")
    p.add_argument("--data", type=Path, help="a token file (numpy uint16/int32 memmap); synthetic by default")
    p.add_argument("--timeout", "--progress-timeout", dest="timeout", type=float, default=600.0,
                   help="progress timeout: seconds a rank may go without progress (start-up, one step), "
                        "counted from its last heartbeat, not from the start; then every rank is ended "
                        "(SIGTERM, SIGKILL after a grace period) and the hung rank named (default 600)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=jobs.cmd_run)

    p = sub.add_parser("validate", help="predict, run, and compare a Plan (or a matrix of layouts)")
    p.add_argument("plan", type=Path, nargs="?")
    p.add_argument("--matrix", type=Path, help="a matrix file such as validation/local.yaml")
    p.add_argument("--only", action="append", metavar="LAYOUT", help="validate only these layouts of the matrix")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--trace-dir", type=Path, help="write predicted and measured Chrome traces here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=jobs.cmd_validate)

    p = sub.add_parser("calibrate", help="microbenchmark this host into a hardware profile (node: localhost)")
    p.add_argument("--out", type=Path, help="profile path (default: the cached profile of this host); a full "
                   "calibration over an earlier one of this host pools the torch-wrapper host costs of the last five")
    p.add_argument("--quick", action="store_true", help="fewer shapes, sizes and group sizes (about 10 s)")
    p.add_argument("--from-run", type=Path, metavar="MEASURED_JSON",
                   help="refit the profile from a measured run (`trainplan run --json` output)")
    p.add_argument("--from-trace", type=Path, metavar="DIR",
                   help="fit the figures a team's PyTorch profiler (Kineto) traces determine (GEMM efficiency, "
                        "attention, NCCL bus bandwidth and latency) into a profile of the catalog's shape (--out)")
    p.add_argument("--from-log", type=Path, metavar="FILE",
                   help="refused: a training log's step time determines no single figure (see --from-trace)")
    p.add_argument("--plan", type=Path, help="the plan the measured run, trace or log executed (with --from-run, "
                   "--from-trace or --from-log)")
    p.add_argument("--refresh", action="store_true",
                   help="re-measure only the load-sensitive host speed (about 25 s on a CPU host) in the existing profile")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=jobs.cmd_calibrate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainplan",
        description="Plan, simulate, price and validate large-model training layouts.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    _plan_file_commands(sub)
    _measured_commands(sub)
    _serving_commands(sub)
    _interop_commands(sub)
    _planning_commands(sub)
    _execution_commands(sub)
    describe(parser, sub)   # what each command answers, with one example
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with stop_on_signals():
            check_numbers(args)
            check_outputs(args)
            args.func(args)
    except (PlanError, CatalogError, UsageError, ValueError) as exc:
        print(f"trainplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:   # Stopped, or a run's RunInterrupted: its ranks or workers were ended first
        print(f"trainplan: {exc}" if str(exc) else "trainplan: stopped by SIGINT", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except BrokenPipeError:
        return 0
    except OSError as exc:   # a write the checks could not foresee (disk full, a folder removed meanwhile)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"trainplan: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
