"""A captured graph that pickles node for node.

A plain ``GraphModule`` pickles as its generated code and is traced again when unpickled
(symbolically): an op none of whose inputs is a graph input -- ``aten.zeros``,
``aten.arange``, ``aten.lift_fresh_copy`` of a ``torch.tensor([...])`` -- then runs once, at
unpickling, and its result becomes a tensor constant of the graph. An in-place op of the step
on such a tensor (``z = torch.zeros(5); z.scatter_add_(...)``) would mutate that constant,
so its effect would carry over from one step to the next. :class:`PortableGraphModule` pickles
the nodes themselves (ops by name, node inputs by position) and its tensor attributes, and
rebuilds the same graph: every op of the step runs in every replay.
"""

from __future__ import annotations

import torch
from torch.fx.node import map_aggregate

from workers.torch_compat import (OpOverload, graph_codegen, op_overload_name, op_schema,
                                  set_graph_codegen)


class _Ref:
    """An input of a node that is the ``index``-th node of the graph."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Op:
    """An ``OpOverload`` by name (``torch.ops.<namespace>.<packet>.<overload>``)."""

    __slots__ = ("namespace", "packet", "overload")

    def __init__(self, op: OpOverload):
        self.namespace = op.namespace
        self.packet = op_schema(op).name.split("::", 1)[1]
        self.overload = op_overload_name(op)

    def resolve(self) -> OpOverload:
        return getattr(getattr(getattr(torch.ops, self.namespace), self.packet), self.overload)


class _TorchName:
    """A ``torch.dtype``, ``torch.memory_format`` or ``torch.layout`` argument by its name.
    Pickled as is, such an object names itself by a bare string that pickle looks up in every
    loaded module: a user's ``__main__`` that imports torch is found first, and the process
    that unpickles (a Ray driver) has no such ``__main__.torch``."""

    __slots__ = ("name",)
    TYPES = (torch.dtype, torch.memory_format, torch.layout)

    def __init__(self, value):
        self.name = str(value).split(".", 1)[1]  # "torch.preserve_format" -> "preserve_format"

    def resolve(self):
        return getattr(torch, self.name)


def _attr(gm: torch.nn.Module, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _rebuild(nodes: list, attrs: dict, codegen) -> "PortableGraphModule":
    graph = torch.fx.Graph()
    built: list[torch.fx.Node] = []
    for op, name, target, args, kwargs in nodes:
        if isinstance(target, _Op):
            target = target.resolve()
        args, kwargs = map_aggregate(
            (args, kwargs), lambda a: built[a.index] if isinstance(a, _Ref)
            else a.resolve() if isinstance(a, _TorchName) else a)
        built.append(graph.create_node(op, target, args, kwargs, name=name))
    set_graph_codegen(graph, codegen)
    return PortableGraphModule(attrs, graph)


class PortableGraphModule(torch.fx.GraphModule):
    """A ``GraphModule`` whose pickle rebuilds its graph node for node (no re-tracing)."""

    def __reduce__(self):
        index = {node: i for i, node in enumerate(self.graph.nodes)}
        nodes, attrs = [], {}
        for node in self.graph.nodes:
            target = node.target
            if isinstance(target, OpOverload):
                target = _Op(target)
            elif node.op == "get_attr":
                attrs[target] = _attr(self, target)
            args, kwargs = map_aggregate(
                (node.args, node.kwargs),
                lambda a: _Ref(index[a]) if isinstance(a, torch.fx.Node)
                else _TorchName(a) if isinstance(a, _TorchName.TYPES) else a)
            nodes.append((node.op, node.name, target, args, kwargs))
        return _rebuild, (nodes, attrs, graph_codegen(self.graph))


def portable(gm: torch.fx.GraphModule) -> PortableGraphModule:
    """``gm`` (same graph, same attributes) as a :class:`PortableGraphModule`."""
    return PortableGraphModule(gm, gm.graph)
