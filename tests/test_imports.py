"""The architecture, read from the source: which room imports which, no circle, no room too big.

The data flow of docs/design.md, lowest first: topologies (hardware, cluster graphs) ->
simcore.plan (the Plan contract and the tools' files) and simcore.results (the StepResult
schema) -> simcore.model (Plan -> StepCosts) -> simcore.engine (StepCosts -> StepResult) ->
simcore.planner (search, what-if, money); executors (run a Plan, measure it) and
executors.calibrate (probe this host) beside the prediction; reports (draw and write what
both produced); trainplan (the command line and the jobs that join the parts) on top, the only
code that imports executors and reports together.
"""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "simcore", "executors", "reports", "trainplan")

#: Room -> the rooms it may import (itself always). A module's room is the longest prefix of
#: its dotted name listed here.
BASE = {"topologies", "simcore.results", "simcore.plan"}
MAY_IMPORT = {
    "topologies": set(),
    "simcore": set(),
    "simcore.results": set(),
    "simcore.plan": {"topologies", "simcore.results"},
    "simcore.model": BASE,
    "simcore.serving": BASE | {"simcore.model"},
    "simcore.engine": BASE | {"simcore.model", "simcore.serving"},
    "simcore.planner": BASE | {"simcore.model", "simcore.engine", "simcore.serving"},
    "executors": BASE | {"simcore.model"},
    "executors.calibrate": BASE | {"simcore.model", "simcore.engine", "executors"},
    "reports": BASE | {"simcore.model", "simcore.engine", "simcore.planner"},
    "trainplan": set(),   # the edge: anything
}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80


def imported_modules(path: Path) -> set[str]:
    """Top-level package names a file imports (anywhere in it, function bodies included)."""
    return {name.split(".")[0] for name in imported_names(path)}


def imported_names(path: Path) -> set[str]:
    """Every dotted name a file imports, with ``from a import b`` read as ``a.b``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in python_files(pkg)}


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module a dotted import name lands in (``a.b.c`` -> ``a.b`` if c is a name)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def room(module: str) -> str:
    return max((r for r in MAY_IMPORT if module == r or module.startswith(r + ".")), key=len)


def import_graph() -> nx.DiGraph:
    modules = project_modules()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for imported in imported_names(path):
            target = resolve(imported, modules)
            if target and target != name and not name.startswith(target + "."):
                graph.add_edge(name, target)
    return graph


def test_no_room_imports_one_above_it():
    graph = import_graph()
    wrong = sorted(f"{a} -> {b}" for a, b in graph.edges
                   if room(a) != "trainplan" and room(b) != room(a) and room(b) not in MAY_IMPORT[room(a)])
    assert wrong == []


def test_no_import_circle():
    cycles = list(nx.simple_cycles(import_graph()))
    assert cycles == []


def test_only_the_command_line_imports_executors_and_reports_together():
    graph = import_graph()
    both = [m for m in graph if {"executors", "reports"} <= {room(t).split(".")[0] for t in graph.successors(m)}]
    assert all(room(m) == "trainplan" for m in both)


def test_no_module_or_function_too_long():
    long_modules, long_functions = [], []
    for path in [p for pkg in (*PACKAGES, "tests") for p in python_files(pkg)]:
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            long_modules.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long_functions.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
    assert long_modules == [] and long_functions == []


def test_simulator_packages_never_import_torch():
    offenders = [str(p.relative_to(ROOT)) for pkg in ("simcore", "topologies") for p in python_files(pkg)
                 if "torch" in imported_modules(p)]
    assert offenders == []


def test_only_the_engine_imports_simpy():
    importers = {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in python_files(pkg)
                 if "simpy" in imported_modules(p)}
    assert importers and all(p.startswith("simcore/engine/") for p in importers)


def test_the_reader_sees_imports_and_rooms(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch.nn as nn\nfrom simpy import Environment\n"
                     "def f():\n    from simcore.model import workload\n")
    assert {"torch", "simpy", "simcore"} <= imported_modules(probe)
    assert "simcore.model.workload" in imported_names(probe)
    assert room("executors.calibrate.probes") == "executors.calibrate"
    assert room("executors.launch") == "executors"
    assert room("simcore.results") == "simcore.results"
    graph = nx.DiGraph([("simcore.model.a", "simcore.planner.b")])
    assert [f"{a} -> {b}" for a, b in graph.edges
            if room(b) not in MAY_IMPORT[room(a)]] == ["simcore.model.a -> simcore.planner.b"]
