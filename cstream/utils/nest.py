"""Walking nested structures of tensors (dicts, lists, tuples), with each item's scope.

>>> import torch
>>> batch = {"x": torch.ones(2), "y": [torch.zeros(1), 3]}
>>> [(s, t.shape[0]) for s, t in visit_torch_tensors(batch)]
[(['x'], 2), (['y', '0'], 1)]
>>> from workers.torch_compat import tree_flatten
>>> list(recurse_spec(tree_flatten(batch)[1]))
[['x'], ['y', '0'], ['y', '1']]
"""

from __future__ import annotations

from inspect import isclass
from typing import Any, Callable, Generator, List, Optional, Tuple

import torch

from workers.torch_compat import TreeSpec, tree_flatten, tree_unflatten

Scope = List[str]


def visit_structure(data_structure: Any, select_fn: Callable[[Any], bool], strict: bool = False,
                    scope: Optional[Scope] = None) -> Generator[Tuple[Scope, Any], None, None]:
    """Yield ``(scope, item)`` for every item ``select_fn`` accepts, depth first; with
    ``strict``, an item that is neither a container nor selected is an error."""
    scope = scope or []
    if isinstance(data_structure, dict):
        items = ((str(k), v) for k, v in data_structure.items())
    elif isinstance(data_structure, (list, tuple)):
        items = ((str(i), v) for i, v in enumerate(data_structure))
    else:
        if select_fn(data_structure):
            yield scope, data_structure
        elif strict:
            raise ValueError(f"Unknown data structure at {'.'.join(scope) or '<root>'}: "
                             f"{type(data_structure).__name__}")
        return
    for key, value in items:
        yield from visit_structure(value, select_fn, strict, scope + [key])


def visit_torch_tensors(data_structure: Any, strict: bool = False,
                        scope: Optional[Scope] = None):
    """``(scope, tensor)`` for every torch tensor in the structure."""
    yield from visit_structure(data_structure, lambda x: isinstance(x, torch.Tensor), strict,
                               scope)


def visit_device_tensors(data_structure: Any, device_type: str, strict: bool = False,
                         scope: Optional[Scope] = None):
    for s, t in visit_torch_tensors(data_structure, strict, scope):
        if t.device.type == device_type:
            yield s, t


def recurse_spec(spec: TreeSpec, scope: Optional[Scope] = None):
    """The scope of each leaf of a pytree ``spec``, in ``tree_flatten`` order."""
    if spec.num_leaves == 0:
        return
    scope = scope or []
    context = spec.context
    children = spec.children() if hasattr(spec, "children") else spec.children_specs
    if context:
        if isclass(context) and issubclass(context, tuple) and hasattr(context, "_fields"):
            context = range(len(context._fields))
        for key, child in zip(context, children):
            yield from recurse_spec(child, scope + [str(key)])
    elif not children:
        yield scope
    else:
        for i, child in enumerate(children):
            yield from recurse_spec(child, scope + [str(i)])


def map_structure(map_fn: Callable, data_structure: Any, select_fn: Callable[[Any], bool],
                  scope: Optional[Scope] = None):
    """``data_structure`` with each selected item replaced by ``map_fn(scope, item)``."""
    objs, spec = tree_flatten(data_structure)
    objs = [map_fn(s, t) if select_fn(t) else t for s, t in zip(recurse_spec(spec, scope), objs)]
    return tree_unflatten(objs, spec)


def map_torch_tensors(map_fn: Callable, data_structure: Any, scope: Optional[Scope] = None):
    return map_structure(map_fn, data_structure, lambda x: isinstance(x, torch.Tensor), scope)
