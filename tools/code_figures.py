"""The size figures of the packages, their import circles and the private names they reach.

For ``cstream/``, ``cstream_tools/``, ``executor/`` and ``workers/``: the three largest files
(lines) and classes (lines from ``class`` to its last line); the import circles within the
package (:mod:`tools.import_graph`); then every private name (a leading underscore, not a
dunder) of another module reached outside the compat modules (``torch_compat.py``,
``ray_compat.py``): imported from another package, or read as an attribute of anything but
``self``/``cls`` that the file itself does not define (assign, bind in a class body, or
declare as a function or class).

    python -m tools.code_figures [PACKAGE ...]
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tools import import_graph

REPO = Path(__file__).resolve().parents[1]
COMPAT = ("torch_compat.py", "ray_compat.py")


#: documented public APIs whose names start with an underscore: a named tuple's fields, and
#: the interpreter's stacks of other threads (``sys._current_frames``, which has no public
#: equivalent); listed apart, not counted
DOCUMENTED = {"_fields", "_asdict", "_replace", "_make", "_current_frames"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in DOCUMENTED


def _own_names(tree: ast.Module) -> set:
    """The names this file defines: attributes it assigns (``x._name = ...``), names it binds
    or annotates in a class body, and its functions and classes. Reading one of them is the
    module's own business, not a reach into another's."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute):
                        own.add(sub.attr)
                    elif isinstance(sub, ast.Name):
                        own.add(sub.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
    return own


def figures(package: str, root: Path = REPO) -> tuple[list, list, list]:
    """``(files, classes, reached)`` of ``root/package``: ``(lines, path)`` of every file and
    ``(lines, "path:line Name")`` of every class, largest first, and each private name of
    another module reached."""
    files, classes, reached = [], [], []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root)
        text = path.read_text()
        files.append((len(text.splitlines()), str(rel)))
        tree = ast.parse(text)
        own = _own_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}"))
            if path.name in COMPAT:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.split(".")[0] != package:  # the package's own modules
                if any(_private(p) for p in node.module.split(".")) or any(
                        _private(a.name) for a in node.names):
                    reached.append(f"{rel}:{node.lineno} from {node.module} import "
                                   + ", ".join(a.name for a in node.names))
            elif isinstance(node, ast.Import):
                reached += [f"{rel}:{node.lineno} import {a.name}" for a in node.names
                            if a.name.split(".")[0] != package
                            and any(_private(p) for p in a.name.split("."))]
            elif isinstance(node, ast.Attribute) and _private(node.attr) and \
                    node.attr not in own and not (isinstance(node.value, ast.Name)
                                                  and node.value.id in ("self", "cls")):
                reached.append(f"{rel}:{node.lineno} {ast.unparse(node)}")
    return sorted(files, reverse=True), sorted(classes, reverse=True), reached


def main(packages: list[str]) -> int:
    circles = import_graph.circles_per_package(import_graph.imports())
    for package in packages or import_graph.PACKAGES:
        files, classes, reached = figures(package)
        print(f"{package}: largest files {files[:3]}")
        print(f"{package}: largest classes {classes[:3]}")
        print(f"{package}: import circles: {len(circles[package])}")
        for group in circles[package]:
            print("  " + " <-> ".join(group))
        print(f"{package}: private names reached outside the compat modules: {len(reached)}")
        for row in reached:
            print(f"  {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
