"""The ``trainplan`` command line: parse, call one function, print.

Every user error (a bad Plan, an unknown name, an unreadable file) ends with one
sentence on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simcore.spec import PlanError, dump_plan, load_plan
from topologies.hardware import CatalogError, load_catalog


class UsageError(ValueError):
    """A command-line argument breaks a rule."""


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
    from simcore.describe import plan_summary

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
        from reports.plots import topology_figure
        from reports.render import save_figure

        save_figure(topology_figure(graph, plan.cluster), args.draw)
        summary["drawing"] = str(args.draw)
    if args.json:
        _print_json(summary)
    else:
        for key, value in summary.items():
            print(f"{key:>32}: {value}")


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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (PlanError, CatalogError, UsageError) as exc:
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
