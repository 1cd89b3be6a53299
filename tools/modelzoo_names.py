"""Which ``cerebras.pytorch`` / ``cerebras.appliance`` names a Model Zoo checkout references, and
which of them resolve with cstream installed.

    python tools/modelzoo_names.py PATH [PATH ...] [--json OUT] [--missing]
    python tools/modelzoo_names.py PATH [PATH ...] --table [--real-python PY]

PATH is a Model Zoo checkout (or any folder of Python files). Every ``.py`` file is parsed (never
imported); a name is each dotted chain rooted at an import of ``cerebras_pytorch``,
``cerebras.pytorch``, ``cerebras_appliance`` or ``cerebras.appliance``: ``cstorch.optim.Adam`` after
``import cerebras.pytorch as cstorch``, ``dist.get_worker_state`` after ``import
cerebras_pytorch.distributed as dist``, ``modes.TRAIN`` after ``from cerebras_pytorch.core import
modes``. The chain stops at a call or a subscript: ``cstorch.backend(...).device`` counts as
``cerebras.pytorch.backend``. Both spellings are counted as the ``cerebras.*`` one.

``--table`` prints a markdown table, one row per PATH: the names referenced, how many resolve
with cstream and, with ``--real-python`` (the interpreter of a virtual environment holding the
Cerebras package), how many resolve with that package; then the names that package does not
resolve, with the releases that reference them and what it said.

A name resolves when importing its longest module prefix and reading the rest as attributes works,
or when reading it from the top package as attributes does (importing submodules on the way), as
``cstorch.backends.csx.debug`` does after ``import cerebras.pytorch as cstorch``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import pathlib
import sys
from collections import defaultdict

ROOTS = {"cerebras_pytorch": "cerebras.pytorch", "cerebras_appliance": "cerebras.appliance",
         "cerebras.pytorch": "cerebras.pytorch", "cerebras.appliance": "cerebras.appliance"}


def canonical(module: str) -> str | None:
    for root, canon in ROOTS.items():
        if module == root or module.startswith(root + "."):
            return canon + module[len(root):]
    return None


def _chain(node: ast.AST) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"] when the chain is names and attributes only."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


def _mark_parents(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._parent = node


def scan(paths: list[pathlib.Path]) -> dict[str, list[str]]:
    """name -> files (relative) that reference it."""
    where: dict[str, list[str]] = defaultdict(list)
    for root in paths:
        for f in sorted(root.rglob("*.py")):
            try:
                src = f.read_text(encoding="utf-8", errors="replace")
                tree = ast.parse(src)
            except SyntaxError:
                continue
            _mark_parents(tree)
            for name in _names(tree):
                where[name].append(str(f.relative_to(root)))
    return dict(where)


def _names(tree: ast.AST) -> set[str]:
    """The canonical dotted names a parsed file references (parents marked)."""
    bound: dict[str, str] = {}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                canon = canonical(a.name)
                if canon is None:
                    continue
                found.add(canon)
                if a.asname:
                    bound[a.asname] = canon
                else:
                    top = a.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "cerebras":
                for a in node.names:
                    c = canonical("cerebras." + a.name)
                    if c:
                        found.add(c)
                        bound[a.asname or a.name] = c
                continue
            canon = canonical(node.module)
            if canon is None:
                continue
            for a in node.names:
                if a.name == "*":
                    found.add(canon)
                else:
                    found.add(f"{canon}.{a.name}")
                    bound[a.asname or a.name] = f"{canon}.{a.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or isinstance(getattr(node, "_parent", None), ast.Attribute):
            continue
        chain = _chain(node)
        if not chain or chain[0] not in bound:
            continue
        dotted = ".".join([bound[chain[0]]] + chain[1:])
        canon = canonical(dotted)
        if canon:
            found.add(canon)
    return found


def _by_attributes(parts: list[str]):
    """``parts`` read as Python reads ``a.b.c`` after ``import a``: an attribute of the object so
    far, or else the submodule of that name (imported). A package attribute that shadows a
    submodule wins (``cstorch.backends`` is the settings object, not the module of that name)."""
    obj = importlib.import_module(".".join(parts[:2]))
    for i in range(2, len(parts)):
        if hasattr(obj, parts[i]):
            obj = getattr(obj, parts[i])
            continue
        if not isinstance(obj, type(sys)):
            raise AttributeError(".".join(parts[:i + 1]))
        obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj


def resolves(name: str) -> tuple[bool, str]:
    """Whether ``name`` resolves, and why not. It does when importing its longest module prefix
    and reading the rest as attributes works (``from a.b import c``), or when reading it from the
    top package as attributes does (``cstorch.backends.csx.debug``)."""
    parts = name.split(".")
    why = f"no module {parts[0]}"
    for cut in range(len(parts), 1, -1):
        module = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and (module == e.name or module.startswith(e.name + ".")):
                continue  # this prefix is not a module: read the rest as attributes
            return False, f"importing {module}: {e}"
        except Exception as e:  # noqa: BLE001 - report what the import raised
            return False, f"importing {module}: {type(e).__name__}: {e}"
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            return True, ""
        except AttributeError:
            why = f"{module} has no {'.'.join(parts[cut:])}"
            break
    try:
        _by_attributes(parts)
        return True, ""
    except Exception:  # noqa: BLE001 - the first way's reason is the one reported
        return False, why


def _real_results(python: str, path: pathlib.Path) -> dict:
    """``{name: {"resolves", "why", "files"}}`` for ``path`` as another interpreter (one with the
    Cerebras package, without cstream on its path) resolves the names."""
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "names.json"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run([python, str(pathlib.Path(__file__).resolve()), str(path), "--json",
                        str(out)], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
        if not out.exists():
            raise SystemExit(f"--real-python {python}: the run on {path} wrote no results")
        return json.loads(out.read_text())


def table(paths: list[pathlib.Path], real_python: str | None) -> str:
    rows = ["| release | referenced | resolve in cstream | resolve in the real package |",
            "| --- | --- | --- | --- |"]
    real_lacks: dict[str, list] = defaultdict(list)
    for path in paths:
        where = scan([path])
        ours = {name: resolves(name)[0] for name in where}
        real = _real_results(real_python, path) if real_python else None
        n = len(where)
        real_cell = "-" if real is None else f"{sum(v['resolves'] for v in real.values())} of {n}"
        rows.append(f"| {path.name.replace('Release_', '')} | {n} | {sum(ours.values())} of {n} "
                    f"| {real_cell} |")
        for name, v in (real or {}).items():
            if not v["resolves"]:
                real_lacks[name].append((path.name.replace("Release_", ""), ours[name], v["why"]))
    if real_lacks:
        rows += ["", "| name | referenced by | resolves in cstream | the real package says |",
                 "| --- | --- | --- | --- |"]
        for name in sorted(real_lacks):
            seen = real_lacks[name]
            releases = seen[0][0] if len(seen) == 1 else f"{seen[0][0]} to {seen[-1][0]}"
            rows.append(f"| `{name}` | {releases} | {'yes' if all(s[1] for s in seen) else 'no'} "
                        f"| {seen[-1][2]} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=pathlib.Path)
    ap.add_argument("--json", type=pathlib.Path, help="write every name, its result and files here")
    ap.add_argument("--missing", action="store_true", help="list the names that do not resolve")
    ap.add_argument("--table", action="store_true", help="a markdown table, one row per path")
    ap.add_argument("--real-python", help="with --table: an interpreter with the Cerebras package")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.paths, args.real_python))
        return 0
    where = scan(args.paths)
    results = {name: resolves(name) for name in sorted(where)}
    ok = sum(1 for good, _ in results.values() if good)
    print(f"{ok} of {len(results)} referenced names resolve ({100 * ok / max(1, len(results)):.0f}%)"
          f" in {', '.join(map(str, args.paths))}")
    if args.missing:
        for name, (good, why) in results.items():
            if not good:
                more = f" +{len(where[name]) - 1}" if len(where[name]) > 1 else ""
                print(f"  {name}: {why}  [{where[name][0]}{more}]")
    if args.json:
        args.json.write_text(json.dumps({n: {"resolves": g, "why": w, "files": where[n]}
                                         for n, (g, w) in results.items()}, indent=1))
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
