"""docs/design.md shows the tree one line a module: a module added, moved or split without
its line there fails here, and so does a line naming a module that is gone."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("topologies", "simcore", "executors", "reports", "trainplan")


def tree_modules(text: str) -> set[str]:
    """The module paths of the design document's tree block: an indented ``name.py`` line
    under its folder lines (``folder/`` at a lower indentation)."""
    block = text.split("## The tree, one line a module", 1)[1].split("```", 2)[1]
    folders: list[tuple[int, str]] = []
    found = set()
    for line in block.splitlines():
        m = re.match(r"( *)(\S+)", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        folders = [(i, f) for i, f in folders if i < indent]
        if name.endswith("/"):
            folders.append((indent, name))
        elif name.endswith(".py"):
            found.add("".join(f for _, f in folders) + name)
    return found


def code_modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if p.name != "__init__.py"}


def test_the_design_tree_lists_every_module_and_no_other():
    listed = tree_modules((ROOT / "docs" / "design.md").read_text())
    assert sorted(code_modules() - listed) == [] and sorted(listed - code_modules()) == []


def test_the_tree_reader_follows_indentation():
    text = "## The tree, one line a module\n\n```\na/   x\n  b/  y\n    c.py  z\n  d.py\ne.py\n```\n"
    assert tree_modules(text) == {"a/b/c.py", "a/d.py", "e.py"}
