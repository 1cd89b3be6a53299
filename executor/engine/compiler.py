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
import warnings
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


def _generator_overload(op):
    """``op`` itself if it takes a ``generator``, else its overload that does, else None."""
    if any(a.name == "generator" for a in op._schema.arguments):
        return op
    packet, name = op.overloadpacket, op._overloadname
    for candidate in ("generator" if name == "default" else f"{name}_generator",):
        alt = getattr(packet, candidate, None)
        if alt is not None and any(a.name == "generator" for a in alt._schema.arguments):
            return alt
    return None


def seed_random_ops(gm: torch.fx.GraphModule, generator: torch.Generator) -> bool:
    """Make every random op of ``gm`` draw from ``generator`` (a private stream, untouched
    by anything else in the process). False if some random op takes no generator."""
    gm._cstream_rng = generator
    node_rng = None
    all_seeded = True
    for node in list(gm.graph.nodes):
        op = node.target
        if node.op != "call_function" or not isinstance(op, torch._ops.OpOverload) or (
                torch.Tag.nondeterministic_seeded not in op.tags):
            continue
        alt = _generator_overload(op)
        if alt is None:
            all_seeded = False
            continue
        if node_rng is None:
            last_placeholder = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
            with gm.graph.inserting_after(last_placeholder), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # fx expects a module/parameter/buffer there
                node_rng = gm.graph.get_attr("_cstream_rng")
        node.target = alt
        node.kwargs = {**node.kwargs, "generator": node_rng}
    gm.recompile()
    return all_seeded


class CompiledStep:
    """Callable ``(state, batch, consts) -> outputs`` that updates ``state`` (a list) in place.

    Random ops draw from ``generator``: through their ``generator=`` argument where the graph
    was rewritten to pass it (``seeded``), else by lending the generator's state to the
    device's default generator for the duration of the step.
    """

    def __init__(self, fn: Callable, changed: Optional[list[int]], compiler: str,
                 generator: Optional[torch.Generator] = None, seeded: bool = True):
        self._fn = fn
        self._changed = changed  # None: the graph mutates state tensors itself (fx)
        self.compiler = compiler
        self._generator = generator
        self._seeded = seeded or generator is None

    def __call__(self, state: list, batch: list, consts: list) -> list:
        if self._seeded:
            return self._run(state, batch, consts)
        default = (torch.default_generator if self._generator.device.type == "cpu"
                   else torch.cuda.default_generators[self._generator.device.index or 0])
        saved = default.get_state()
        default.set_state(self._generator.get_state())
        try:
            return self._run(state, batch, consts)
        finally:
            self._generator.set_state(default.get_state())
            default.set_state(saved)

    def _run(self, state: list, batch: list, consts: list) -> list:
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
                 compile_dir: Optional[Path], generator: Optional[torch.Generator] = None
                 ) -> tuple[CompiledStep, dict]:
    """Compile ``gm`` (captured by :func:`executor.engine.capture.capture`).

    ``example`` holds real ``(state, batch, consts)`` lists on the execution device; the step's
    random ops draw from ``generator`` (the wafer's own), when given.
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
        seeded = seed_random_ops(gm, generator) if generator is not None else True
        step = CompiledStep(gm, None, "fx", generator, seeded)
    else:
        if compile_dir is not None:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(compile_dir) / "inductor")
        pure, changed = functionalize(gm, example)
        from torch._inductor import compile as inductor_compile

        fn = inductor_compile(pure, [*state, *batch, *consts])
        step = CompiledStep(fn, changed, "inductor", generator, seeded=False)
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
