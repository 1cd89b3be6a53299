"""Which module of the project imports which, the layers they must keep to, and the circles.

Every ``import`` and ``from ... import`` of a file counts, at the top or inside a function (a
lazy import is still a dependency). A name resolves to the longest dotted prefix that is one of
the project's modules (``from cstream.utils import data`` is ``cstream.utils.data`` where that
module exists, else ``cstream.utils``).

The layers: ``cstream`` (the API) may import ``executor`` and ``workers``, ``executor`` may
import ``workers``, ``workers`` neither; ``cstream_tools`` stands on all three and none of them
imports it. The scripts beside them (``benchmarks/``, ``tools/``, ``examples/``) may import the
packages and their own folder's modules, never the tests' (``tests/``: the test files,
``helpers``, ``reference``): what both need lives in a package (the small models in
``cstream_tools.models``).

    python tools/import_graph.py        # the circles and the layer breaks, one a line
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("cstream", "cstream_tools", "executor", "workers")

#: the packages each package may import besides itself
MAY_IMPORT = {
    "cstream": {"executor", "workers"},
    "executor": {"workers"},
    "workers": set(),
    "cstream_tools": {"cstream", "executor", "workers"},
}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(root: Path, packages) -> dict[str, Path]:
    return {module_name(p, root): p for package in packages
            for p in sorted((root / package).rglob("*.py"))}


def _resolve(name: str, known) -> str | None:
    parts = name.split(".")
    while parts:
        if ".".join(parts) in known:
            return ".".join(parts)
        parts.pop()
    return None


def imports(root: Path = REPO, packages=PACKAGES) -> dict[str, dict[str, int]]:
    """``{module: {imported project module: first line}}`` for every module of ``packages``."""
    known = _modules(root, packages)
    graph = {}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = {}
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] or [base]
            for target in targets:
                found = _resolve(target, known)
                if found is not None and found != name:
                    edges.setdefault(found, node.lineno)
        graph[name] = edges
    return graph


def circles(graph: dict[str, dict]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found)


def layer_breaks(graph: dict[str, dict], root: Path = REPO) -> list[str]:
    """``"path:line a imports b"`` for each import that crosses the layers the wrong way."""
    known = _modules(root, MAY_IMPORT)
    rows = []
    for name, edges in sorted(graph.items()):
        own = name.split(".")[0]
        for target, line in sorted(edges.items()):
            other = target.split(".")[0]
            if other != own and other not in MAY_IMPORT[own]:
                rows.append(f"{known[name].relative_to(root)}:{line} {name} imports {target}")
    return rows


SCRIPT_FOLDERS = ("benchmarks", "tools", "examples")


def _tests_names(root: Path) -> set[str]:
    """The names the tests' modules are imported by: ``tests``, each module in ``tests/`` and
    each folder there that holds Python files."""
    tests = root / "tests"
    names = {"tests"} | {p.stem for p in tests.glob("*.py")}
    return names | {d.name for d in tests.iterdir() if d.is_dir() and any(d.glob("*.py"))}


def imports_of_tests(root: Path = REPO, folders=SCRIPT_FOLDERS) -> list[str]:
    """``"path:line module imports name"`` for each import in the script folders of one of the
    tests' modules (a name that is also a module of the importing file's own folder is that
    module: a script imports its siblings by their names)."""
    tests = _tests_names(root)
    rows = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            own = {p.stem for p in path.parent.glob("*.py")}
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top in tests and top not in own:
                        rows.append(f"{path.relative_to(root)}:{node.lineno} "
                                    f"{module_name(path, root)} imports {name}")
    return rows


def circles_per_package(graph: dict[str, dict]) -> dict[str, list[list[str]]]:
    """Each package's circles (one that spans packages is listed under each of them; it is
    also a layer break)."""
    per = {package: [] for package in PACKAGES}
    for group in circles(graph):
        for package in sorted({m.split(".")[0] for m in group}):
            per[package].append(group)
    return per


def main() -> int:
    graph = imports()
    found = circles(graph)
    breaks = layer_breaks(graph) + imports_of_tests()
    print(f"import circles: {len(found)}")
    for group in found:
        print("  " + " <-> ".join(group))
    print(f"imports against the layers: {len(breaks)}")
    for row in breaks:
        print("  " + row)
    return 1 if found or breaks else 0


if __name__ == "__main__":
    sys.exit(main())
