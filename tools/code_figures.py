"""The size figures of the three packages and the private names they reach.

For ``cstream/``, ``executor/`` and ``workers/``: the three largest files (lines) and classes
(lines from ``class`` to its last line); then every private name (a leading underscore, not a
dunder) reached outside the compat modules (``torch_compat.py``, ``ray_compat.py``): imported
from another module, or read as an attribute of anything but ``self``/``cls``.

    python tools/code_figures.py [PACKAGE ...]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPAT = ("torch_compat.py", "ray_compat.py")


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def figures(package: str) -> tuple[list, list, list]:
    files, classes, reached = [], [], []
    for path in sorted((REPO / package).rglob("*.py")):
        rel = path.relative_to(REPO)
        text = path.read_text()
        files.append((len(text.splitlines()), str(rel)))
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}"))
            if path.name in COMPAT:
                continue
            if isinstance(node, ast.ImportFrom) and node.module:
                if any(_private(p) for p in node.module.split(".")) or any(
                        _private(a.name) for a in node.names):
                    reached.append(f"{rel}:{node.lineno} from {node.module} import "
                                   + ", ".join(a.name for a in node.names))
            elif isinstance(node, ast.Attribute) and _private(node.attr) and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                reached.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    return sorted(files, reverse=True), sorted(classes, reverse=True), reached


def main(packages: list[str]) -> int:
    for package in packages or ["cstream", "executor", "workers"]:
        files, classes, reached = figures(package)
        print(f"{package}: largest files {files[:3]}")
        print(f"{package}: largest classes {classes[:3]}")
        print(f"{package}: private names reached outside the compat modules: {len(reached)}")
        for row in reached:
            print(f"  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
