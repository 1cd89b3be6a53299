"""The pickled parts of a ``cerebras.pytorch`` checkpoint, read without running code from the file.

The real package stores a value that is not a tensor, number, string or ``None`` (``bytes``, a
``complex``, a ``torch.dtype``, ...) as a ``dill`` pickle (its ``ObjectSerializer``). Unpickling
calls whatever functions the pickle names, so :func:`loads` admits only the globals such a value
needs and refuses any other with :class:`UnsafePickleError`, naming it. The globals a real file's
pickles name (read with ``pickletools``): ``torch.<dtype>`` (``torch.float16``),
``dill._dill._load_type`` with a builtin type's name (``'complex'``, ``'set'``), ``builtins`` types
(``complex``, ``set``, ``frozenset``, ``bytearray``, ``slice``, ``range``), ``torch.Size`` and
``collections.OrderedDict``; ``bytes`` need none. The layouts of ``cerebras.pytorch`` 2.0 and
earlier (0.1 to 0.4) also pickle the tree spec itself: :func:`loads_spec` reads it with the same
rules plus the spec's own classes, ``torch.utils._pytree.TreeSpec`` and ``LeafSpec``, which become
plain stand-ins (:class:`SpecNode`). :func:`dumps` writes those values with the
standard ``pickle`` module in protocol 4, which is what ``dill`` reads and writes for them.
"""

from __future__ import annotations

import collections
import io
import pickle

import torch

_BUILTIN_TYPES = {t.__name__: t for t in (complex, set, frozenset, bytearray, slice, range)}
_CONTAINERS = {t.__name__: t for t in (dict, list, tuple)}  # the types a tree spec names
_DTYPES = {name: getattr(torch, name) for name in dir(torch)
           if isinstance(getattr(torch, name, None), torch.dtype)}
ADMITTED = ("builtins." + ", builtins.".join(_BUILTIN_TYPES) + ", torch dtypes (torch.float16, ...), "
            "torch.Size, collections.OrderedDict, dill._dill._load_type of those builtin types and "
            "of dict, list and tuple")


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle that names a function or class cstream does not admit (it would run code)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _load_type(name):
    """What ``dill._dill._load_type(name)`` gives, for the admitted builtin types only."""
    if name in _BUILTIN_TYPES:
        return _BUILTIN_TYPES[name]
    if name in _CONTAINERS:
        return _CONTAINERS[name]
    raise UnsafePickleError(f"dill._dill._load_type({name!r})")


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "builtins" and name in _BUILTIN_TYPES:
            return _BUILTIN_TYPES[name]
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        if (module, name) == ("torch", "Size"):
            return torch.Size
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("dill._dill", "_load_type"):
            return _load_type
        raise UnsafePickleError(f"{module}.{name}")

    def persistent_load(self, pid):
        raise UnsafePickleError(f"a persistent id {pid!r}")


class SpecNode:
    """What a pickled ``torch.utils._pytree.TreeSpec`` or ``LeafSpec`` becomes: its attributes only
    (``type``, ``context``, ``children_specs``), no torch class and no code run."""

    leaf = False


class LeafNode(SpecNode):
    leaf = True


class _SpecUnpickler(_Unpickler):
    """Admits, beside :class:`_Unpickler`'s globals, the tree spec's classes (as stand-ins) and the
    container types a spec names (dict, list, tuple, OrderedDict, TensorScalarDict as dict)."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch.utils._pytree", "TreeSpec"):
            return SpecNode
        if (module, name) == ("torch.utils._pytree", "LeafSpec"):
            return LeafNode
        if module == "builtins" and name in _CONTAINERS:
            return _CONTAINERS[name]
        if (module, name) == ("cerebras_pytorch.utils.tensor_scalar_dict", "TensorScalarDict"):
            return dict  # cerebras.pytorch's own legacy reader reads it as a dict
        return super().find_class(module, name)


def _load(unpickler: pickle.Unpickler):
    """``unpickler.load()``; a damaged pickle raises :class:`pickle.UnpicklingError` whatever the
    unpickler met (a length past the end, one too large for memory or for a string's size, a
    missing memo entry, a wrong argument to a constructor: ``EOFError``, ``MemoryError``,
    ``OverflowError``, ``KeyError``, ``TypeError`` ...), and a refused global
    :class:`UnsafePickleError`."""
    try:
        return unpickler.load()
    except pickle.UnpicklingError:
        raise
    except Exception as e:  # noqa: BLE001 (the file's bytes decide which; the caller says which file)
        raise pickle.UnpicklingError(f"{type(e).__name__}: {e}") from e


def loads_spec(data: bytes) -> SpecNode:
    """Unpickle the tree spec of a ``cerebras.pytorch`` 2.0 checkpoint (layout 0.4 and earlier).

    ``dill`` wrote it: ``torch.utils._pytree.TreeSpec`` / ``LeafSpec`` objects (``NEWOBJ`` +
    ``BUILD``) whose ``type`` is ``dill._dill._load_type('dict')`` or ``collections.OrderedDict``.
    Those classes become :class:`SpecNode` / :class:`LeafNode`; anything else is refused as in
    :func:`loads`.
    """
    node = _load(_SpecUnpickler(io.BytesIO(data)))
    if not isinstance(node, SpecNode):
        raise pickle.UnpicklingError(f"the spec is a {type(node).__name__}, not a TreeSpec")
    return node


def loads(data: bytes):
    """Unpickle ``data``, admitting only the globals listed in :data:`ADMITTED`.

    >>> loads(dumps(torch.bfloat16)), loads(dumps(1 + 2j)), loads(dumps(b"x"))
    (torch.bfloat16, (1+2j), b'x')
    >>> import os
    >>> loads(pickle.dumps(os.system))
    Traceback (most recent call last):
    ...
    cstream.checkpoint.safe_pickle.UnsafePickleError: posix.system
    >>> loads(b"\\x80\\x04X\\xff\\xff\\xff\\xff")  # a string's length past the end
    Traceback (most recent call last):
    ...
    _pickle.UnpicklingError: pickle data was truncated
    """
    return _load(_Unpickler(io.BytesIO(data)))


def dumps(value) -> bytes:
    """Pickle a value :func:`loads` admits (protocol 4, as ``dill`` writes it)."""
    return pickle.dumps(value, protocol=4)


def is_admitted(value) -> bool:
    """Whether ``value`` pickles to globals :func:`loads` admits (the types cstream.save pickles)."""
    return type(value) in (bytes, bytearray, complex) or isinstance(value, torch.dtype)
