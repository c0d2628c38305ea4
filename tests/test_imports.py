"""Package boundaries: simcore/ and topologies/ never import torch; only engine.py imports simpy."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_simulator_packages_never_import_torch():
    offenders = [str(p.relative_to(ROOT)) for pkg in ("simcore", "topologies") for p in python_files(pkg)
                 if "torch" in imported_modules(p)]
    assert offenders == []


def test_only_the_engine_imports_simpy():
    importers = {str(p.relative_to(ROOT)) for pkg in ("simcore", "topologies", "reports", "executors")
                 for p in python_files(pkg) if "simpy" in imported_modules(p)}
    assert importers <= {"simcore/engine/des.py"}


def test_the_reader_sees_imports(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import torch.nn as nn\nfrom simpy import Environment\n")
    assert {"torch", "simpy"} <= imported_modules(probe)
