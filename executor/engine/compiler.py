"""Compile a captured step for the execution device, with an on-disk cache.

Two compilers:

* ``"fx"`` -- replay the captured aten graph (state updated in place) as a ``torch.fx``
  GraphModule: no compile time, Python overhead per op.
* ``"inductor"`` -- functionalise the graph (state in -> state out, no mutation) and compile it
  with ``torch._inductor``: fused kernels, the optimizer update fused too; 20+ s cold, a few
  seconds from its cache.

The cache lives in ``compile_dir/<key>/`` where ``key`` hashes the graph, the input spec, the
compiler and the torch/cstream versions; inductor's own artifacts are kept under
``compile_dir/inductor``. A hit is logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.fx.experimental.proxy_tensor import make_fx

log = logging.getLogger("cstream.compile")
COMPILERS = ("fx", "inductor")
CSTREAM_VERSION = "0.1.0"


def cache_key(graph_code: str, input_spec: list, compiler: str, device: str) -> str:
    h = hashlib.sha256()
    for part in (graph_code, repr(input_spec), compiler, device, torch.__version__,
                 CSTREAM_VERSION):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


class CompiledStep:
    """Callable ``(state, batch, consts) -> outputs`` that updates ``state`` (a list) in place."""

    def __init__(self, fn: Callable, changed: Optional[list[int]], compiler: str):
        self._fn = fn
        self._changed = changed  # None: the graph mutates state tensors itself (fx)
        self.compiler = compiler

    def __call__(self, state: list, batch: list, consts: list) -> list:
        if self._changed is None:
            _, outputs = self._fn(state, batch, consts)
            return outputs
        flat = self._fn(*state, *batch, *consts)
        n = len(self._changed)
        for i, value in zip(self._changed, flat[:n]):
            state[i] = value
        return list(flat[n:])


def functionalize(gm: torch.fx.GraphModule, example: tuple):
    """A pure, flat graph ``(*state, *batch, *consts) -> (*changed_state, *outputs)``."""
    state, batch, consts = example
    ns, nb = len(state), len(batch)

    def wrapper(*flat):
        st = [s.clone() for s in flat[:ns]]
        new_state, outs = gm(st, list(flat[ns:ns + nb]), list(flat[ns + nb:]))
        return (*new_state, *outs)

    pure = make_fx(torch.func.functionalize(wrapper, remove="mutations"))(*state, *batch, *consts)
    # a state output that is just a clone of its own input did not change: drop it
    out_node = next(n for n in pure.graph.nodes if n.op == "output")
    placeholders = [n for n in pure.graph.nodes if n.op == "placeholder"]
    outs = list(out_node.args[0])
    changed = []
    for i in range(ns):
        node = outs[i]
        unchanged = (
            node.op == "call_function" and node.target == torch.ops.aten.clone.default
            and node.args[0] is placeholders[i]
        ) or node is placeholders[i]
        if not unchanged:
            changed.append(i)
    out_node.args = (tuple([outs[i] for i in changed] + outs[ns:]),)
    pure.graph.eliminate_dead_code()
    pure.recompile()
    return pure, changed


def _drop_detach(gm: torch.fx.GraphModule) -> None:
    """Remove ``aten.detach`` nodes: the replay records no autograd, so they only cost a call."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()


def compile_step(gm: torch.fx.GraphModule, example: tuple, compiler: str, device: str,
                 compile_dir: Optional[Path]) -> tuple[CompiledStep, dict]:
    """Compile ``gm`` (captured by :func:`executor.engine.capture.capture`).

    ``example`` holds real ``(state, batch, consts)`` lists on the execution device.
    Returns the compiled step and a report: ``{"compiler", "cache_hit", "compile_s", "key"}``.
    """
    if compiler not in COMPILERS:
        raise ValueError(f"compiler: expected one of {COMPILERS}, got {compiler!r}.")
    t0 = time.perf_counter()
    state, batch, consts = example
    spec = [(tuple(t.shape), str(t.dtype)) for t in (*state, *batch, *consts)]
    key = cache_key(gm.code, spec, compiler, device)
    report = {"compiler": compiler, "cache_hit": False, "key": key}
    entry = None
    if compile_dir is not None:
        entry = Path(compile_dir) / key
        manifest = entry / "manifest.json"
        if manifest.exists():
            report["cache_hit"] = True
            log.info("compile cache hit: %s (%s)", key, compiler)
    if compiler == "fx":
        gm = gm.to(device) if device != "cpu" else gm
        _drop_detach(gm)
        step = CompiledStep(gm, None, "fx")
    else:
        if compile_dir is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(compile_dir) / "inductor")
        pure, changed = functionalize(gm, example)
        from torch._inductor import compile as inductor_compile

        fn = inductor_compile(pure, [*state, *batch, *consts])
        step = CompiledStep(fn, changed, "inductor")
    report["compile_s"] = time.perf_counter() - t0
    if entry is not None:
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "graph.py").write_text(gm.code)
        info = {"key": key, "compiler": compiler, "device": device, "torch": torch.__version__,
                "inputs": len(spec), "ops": sum(1 for n in gm.graph.nodes
                                                  if n.op == "call_function"),
                "last_compile_s": report["compile_s"], "cache_hit": report["cache_hit"]}
        tmp = entry / "manifest.json.tmp"
        tmp.write_text(json.dumps(info, indent=1))
        os.replace(tmp, entry / "manifest.json")
    if not report["cache_hit"]:
        log.info("compiled step %s with %s in %.2f s", key, compiler, report["compile_s"])
    return step, report
