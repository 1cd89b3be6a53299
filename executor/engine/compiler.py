"""Compile a captured step for the execution device, with an on-disk cache.

Two compilers:

* ``"fx"`` -- replay the captured aten graph (state updated in place) as a ``torch.fx``
  GraphModule: no compile time, Python overhead per op.
* ``"inductor"`` -- functionalise the graph (state in -> state out, no mutation) and compile it
  with inductor, torch's compiler: fused kernels, the optimizer update fused too; 20+ s cold, a few
  seconds from its cache.

The cache lives in ``compile_dir/<key>/`` where ``key`` hashes the graph, the input spec, the
device and the torch/cstream versions. An inductor compile leaves its artifact there
(``inductor/``: the compiled module, saved with inductor's ``standalone_compile``), and
inductor's kernel cache lives in ``compile_dir/inductor-cache``. A process that finds the
artifact loads it: nothing is compiled (``cache_hit``). The compile itself runs in a separate
process (:func:`start_inductor_compile`, ``python -m executor.engine.compile_job``), so the
wafer keeps running steps while it compiles.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from workers.torch_compat import (OpOverload, graph_codegen, load_compiled_artifact,
                                  op_entry_point, op_overload_name, op_schema, standalone_compile,
                                  tree_unflatten)


log = logging.getLogger("cstream.compile")
COMPILERS = ("auto", "fx", "inductor")
CSTREAM_VERSION = "0.1.0"


def cache_key(graph_code: str, input_spec: list, device: str,
              num_threads: Optional[int] = None) -> str:
    """The compile cache's key of a captured step. ``num_threads``: on a CPU, the threads its
    ops run on, which inductor bakes into the kernels it generates (a kernel generated for 1
    thread has no parallel loop), so artifacts for different thread counts are kept apart."""
    h = hashlib.sha256()
    threads = "" if num_threads is None else f"threads={num_threads}"
    for part in (graph_code, repr(input_spec), device, threads, torch.__version__,
                 CSTREAM_VERSION):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:24]


def generator_overload(op):
    """``op`` itself if it takes a ``generator``, else its overload that does, else None."""
    if any(a.name == "generator" for a in op_schema(op).arguments):
        return op
    packet, name = op.overloadpacket, op_overload_name(op)
    for candidate in ("generator" if name == "default" else f"{name}_generator",):
        alt = getattr(packet, candidate, None)
        if alt is not None and any(a.name == "generator" for a in op_schema(alt).arguments):
            return alt
    return None


def is_random(node: torch.fx.Node) -> bool:
    op = node.target
    return node.op == "call_function" and isinstance(op, OpOverload) and (
        torch.Tag.nondeterministic_seeded in op.tags)


def has_random_ops(gm: torch.fx.GraphModule) -> bool:
    """Whether some op of ``gm`` draws random numbers."""
    return any(is_random(node) for node in gm.graph.nodes)


def seed_random_ops(gm: torch.fx.GraphModule, generator: torch.Generator) -> bool:
    """Make every random op of ``gm`` draw from ``generator`` (a private stream, untouched
    by anything else in the process). False if some random op takes no generator."""
    gm._cstream_rng = generator
    node_rng = None
    all_seeded = True
    for node in list(gm.graph.nodes):
        if not is_random(node):
            continue
        alt = generator_overload(node.target)
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
                 generator: Optional[torch.Generator] = None, seeded: bool = True,
                 constants: tuple = ()):
        self._fn = fn
        self._changed = changed  # None: the graph mutates state tensors itself (fx)
        self._constants = tuple(constants)  # the graph's own tensors, its last inputs
        self.compiler = compiler
        self._generator = generator
        self._seeded = seeded or generator is None

    @property
    def lends_generator(self) -> bool:
        """Its random ops draw from the device's default generator, lent the wafer's state by
        the host around each step (they take no ``generator=``)."""
        return not self._seeded

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
            after, outputs = self._fn(state, batch, consts)
            for i, value in enumerate(after):  # a state the step assigned a new tensor to
                if value is not state[i]:
                    state[i] = value
            return _unaliased(outputs, state)
        flat = self._fn(*state, *batch, *consts, *self._constants)
        n = len(self._changed)
        for i, value in zip(self._changed, flat[:n]):
            state[i] = value
        return list(flat[n:])


def _unaliased(outputs: list, state: list) -> list:
    """``outputs``, with a copy of each one that shares memory with a state tensor (a step that
    returns state it updated in place): the next step updates the state in place, and the
    output must keep this step's value."""
    memory = {t.untyped_storage().data_ptr() for t in state if isinstance(t, torch.Tensor)}
    return [o.clone() if isinstance(o, torch.Tensor)
            and o.untyped_storage().data_ptr() in memory else o for o in outputs]


def _lift_constants(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """Make every tensor ``gm`` holds (a ``torch.tensor([...])`` of the step, ...) an input
    after its others, in place; returns their values. Inductor takes a graph's tensor
    attributes as inputs of the function it compiles, which a saved artifact does not
    remember; as inputs of the graph they are passed like the others."""
    last = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
    values, lifted = [], {}
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        if node.target in lifted:
            node.replace_all_uses_with(lifted[node.target])
            gm.graph.erase_node(node)
            continue
        *path, name = node.target.split(".")
        owner = gm
        for part in path:
            owner = getattr(owner, part)
        value = getattr(owner, name)
        if not isinstance(value, torch.Tensor):
            continue
        with gm.graph.inserting_after(last):
            last = lifted[node.target] = gm.graph.placeholder(f"graph_constant_{len(values)}")
        node.replace_all_uses_with(last)
        gm.graph.erase_node(node)
        delattr(owner, name)  # inductor would take it as an input too
        values.append(value.detach().clone())
    gm.graph.lint()
    gm.recompile()
    return values


def functionalize(gm: torch.fx.GraphModule, example: tuple):
    """A pure, flat graph ``(*state, *batch, *consts, *constants) -> (*changed_state,
    *outputs)``, the indices of the changed state and the graph's own ``constants``."""
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
    constants = _lift_constants(pure)
    return pure, changed, constants


def _drop_detach(gm: torch.fx.GraphModule) -> None:
    """Remove ``aten.detach`` nodes: the replay records no autograd, so they only cost a call."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.detach.default:
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.recompile()


def input_spec(example: tuple) -> list:
    state, batch, consts = example
    return [(tuple(t.shape), str(t.dtype)) for t in (*state, *batch, *consts)]


_LITERALS = (bool, int, str, type(None))


def _structured(gm: torch.fx.GraphModule, outputs):
    """The output node's values in the structure ``gm`` returns them in: a graph built with
    pytree inputs and outputs (``make_fx``) keeps them flat and unflattens on return."""
    info = getattr(graph_codegen(gm.graph), "pytree_info", None)
    if info is None or info.out_spec is None:
        return outputs
    return tree_unflatten(list(outputs), info.out_spec)


class _ReplaySource:
    """The source of :func:`replay_function`'s function, one line per node of ``gm``, and the
    objects it names (``env``, its globals)."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.env: dict = {}
        self.names: dict = {}  # node -> its variable
        self.params: list[str] = []
        self.lines: list[str] = []
        for i, node in enumerate(gm.graph.nodes):
            self._add(f"v{i}", node)

    def _bind(self, value, prefix: str) -> str:
        name = f"{prefix}{len(self.env)}"
        self.env[name] = value
        return name

    def _render(self, a) -> str:
        if isinstance(a, torch.fx.Node):
            return self.names[a]
        if isinstance(a, dict):
            return "{" + ", ".join(f"{self._render(k)}: {self._render(v)}" for k, v in a.items()) + "}"
        if isinstance(a, list):
            return "[" + ", ".join(self._render(x) for x in a) + "]"
        if isinstance(a, tuple):
            return "(" + "".join(self._render(x) + ", " for x in a) + ")"
        if isinstance(a, _LITERALS):
            return repr(a)
        return self._bind(a, "_c")

    def _add(self, name: str, node: torch.fx.Node) -> None:
        self.names[node] = name
        if node.op == "placeholder":
            self.params.append(name)
        elif node.op == "get_attr":
            obj = self.gm
            for part in node.target.split("."):
                obj = getattr(obj, part)
            self.lines.append(f"{name} = {self._bind(obj, '_a')}")
        elif node.op == "call_function":
            target = node.target
            fn = op_entry_point(target) if isinstance(target, OpOverload) else target
            args = [self._render(a) for a in node.args]
            args += [f"{k}={self._render(v)}" for k, v in node.kwargs.items()]
            self.lines.append(f"{name} = {self._bind(fn, '_f')}({', '.join(args)})")
        elif node.op == "output":
            self.lines.append(f"return {self._render(_structured(self.gm, node.args[0]))}")
        else:
            raise NotImplementedError(f"replay of an fx {node.op!r} node ({node.format_node()})")

    def source(self) -> str:
        info = getattr(graph_codegen(self.gm.graph), "pytree_info", None)
        # a pytree graph takes the leaves of (state, batch, consts); a plain one the three lists
        inputs = "(*state, *batch, *consts)" if info is not None else "(state, batch, consts)"
        body = "\n".join("        " + line for line in self.lines)
        return (f"def replay(state, batch, consts):\n"
                f"    {''.join(p + ', ' for p in self.params)}= {inputs}\n"
                f"    with _no_grad():\n{body}\n")


def replay_function(gm: torch.fx.GraphModule) -> Callable:
    """``gm`` as one plain Python function ``(state, batch, consts) -> gm's output``, run
    without autograd.

    ``GraphModule``'s own code calls each aten op through ``OpOverload.__call__``, a Python
    frame per op, and flattens its inputs with pytree on every call; here each op is bound to
    its C++ entry point (:func:`workers.torch_compat.op_entry_point`) and the inputs are taken
    as they come. Constants other than ints, bools, strings and None (floats, dtypes, devices,
    ...) are bound as globals, so every value is the graph's own object."""
    code = _ReplaySource(gm)
    src = code.source()
    env = code.env
    env["_no_grad"] = torch.no_grad
    exec(compile(src, "<cstream replay>", "exec"), env)
    replay = env["replay"]
    replay.source = src
    return replay


def fx_step(gm: torch.fx.GraphModule, device: str,
            generator: Optional[torch.Generator] = None) -> CompiledStep:
    """The captured graph replayed op by op (:func:`replay_function`), state updated in place:
    nothing to compile. Its random ops draw from ``generator`` (the wafer's own), when given."""
    gm = gm.to(device) if device != "cpu" else gm
    _drop_detach(gm)
    seeded = seed_random_ops(gm, generator) if generator is not None else True
    return CompiledStep(replay_function(gm), None, "fx", generator, seeded)


class CacheEntry:
    """``compile_dir/<key>/``: the graph's code, a manifest, and the inductor artifact."""

    def __init__(self, compile_dir: Path, key: str):
        self.compile_dir = Path(compile_dir)
        self.key = key
        self.dir = self.compile_dir / key

    @property
    def inductor_cache(self) -> Path:
        return self.compile_dir / "inductor-cache"

    @property
    def artifact(self) -> Path:
        return self.dir / "inductor"

    @property
    def changed_file(self) -> Path:
        return self.dir / "inductor.changed.json"

    @property
    def constants_file(self) -> Path:
        return self.dir / "inductor.constants.pt"

    def has_artifact(self) -> bool:
        return all(p.exists() for p in (self.artifact, self.constants_file, self.changed_file))

    def write_manifest(self, gm: torch.fx.GraphModule, spec: list, device: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "graph.py").write_text(gm.code)
        info = {"key": self.key, "device": device, "torch": torch.__version__,
                "inputs": len(spec), "ops": sum(1 for n in gm.graph.nodes
                                                if n.op == "call_function"),
                "inductor_artifact": self.has_artifact()}
        _write_atomic(self.dir / "manifest.json", json.dumps(info, indent=1))


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def _inductor_env(entry: CacheEntry) -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(entry.inductor_cache)


def compile_inductor_artifact(gm: torch.fx.GraphModule, example: tuple, entry: CacheEntry) -> None:
    """Functionalise ``gm``, compile it with inductor and save the artifact in ``entry``."""
    _inductor_env(entry)
    pure, changed, constants = functionalize(gm, example)
    state, batch, consts = example
    artifact = standalone_compile(pure, [*state, *batch, *consts, *constants],
                                  dynamic_shapes="from_example_inputs")
    entry.dir.mkdir(parents=True, exist_ok=True)
    tmp = entry.dir / f"inductor.tmp{os.getpid()}"
    artifact.save(path=str(tmp), format="binary")
    os.replace(tmp, entry.artifact)
    torch.save(constants, tmp)
    os.replace(tmp, entry.constants_file)
    _write_atomic(entry.changed_file, json.dumps(changed))  # last: the artifact is complete


def load_inductor_artifact(entry: CacheEntry, generator: Optional[torch.Generator] = None,
                           random: bool = True) -> CompiledStep:
    """The compiled step saved in ``entry`` (no compile; inductor's kernel cache is reused).
    ``random``: the graph has random ops; they draw from ``generator``'s state, lent to the
    default generator for each step. False: there is nothing to lend."""
    _inductor_env(entry)
    fn = load_compiled_artifact(path=str(entry.artifact), format="binary")
    changed = json.loads(entry.changed_file.read_text())
    constants = torch.load(entry.constants_file, weights_only=True)
    return CompiledStep(fn, changed, "inductor", generator, seeded=not random,
                        constants=constants)


def start_inductor_compile(gm: torch.fx.GraphModule, example: tuple,
                           entry: CacheEntry) -> subprocess.Popen:
    """Compile in a separate process (``python -m executor.engine.compile_job JOB``), which
    leaves the artifact in ``entry``; the caller keeps running meanwhile."""
    entry.dir.mkdir(parents=True, exist_ok=True)
    job = entry.dir / f"job.{os.getpid()}.pkl"
    metas = tuple([(tuple(t.shape), t.dtype) for t in part] for part in example)
    threads = torch.get_num_threads()
    with open(job, "wb") as f:
        pickle.dump({"graph": gm, "metas": metas, "device": str(example[0][0].device)
                     if example[0] else "cpu", "compile_dir": str(entry.compile_dir),
                     "key": entry.key, "num_threads": threads}, f)
    # the kernels are generated for the caller's thread count, not the job's environment's
    # (a Ray actor's OMP_NUM_THREADS is its num_cpus, 1 by default)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(entry.inductor_cache),
               OMP_NUM_THREADS=str(threads))
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    log_file = open(entry.dir / "compile.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "executor.engine.compile_job", str(job)],
                            env=env, stdout=log_file, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
