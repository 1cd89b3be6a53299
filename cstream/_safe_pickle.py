"""The pickled parts of a ``cerebras.pytorch`` checkpoint, read without running code from the file.

The real package stores a value that is not a tensor, number, string or ``None`` (``bytes``, a
``complex``, a ``torch.dtype``, ...) as a ``dill`` pickle (its ``ObjectSerializer``). Unpickling
calls whatever functions the pickle names, so :func:`loads` admits only the globals such a value
needs and refuses any other with :class:`UnsafePickleError`, naming it. The globals a real file's
pickles name (read with ``pickletools``): ``torch.<dtype>`` (``torch.float16``),
``dill._dill._load_type`` with a builtin type's name (``'complex'``, ``'set'``), ``builtins`` types
(``complex``, ``set``, ``frozenset``, ``bytearray``, ``slice``, ``range``), ``torch.Size`` and
``collections.OrderedDict``; ``bytes`` need none. :func:`dumps` writes those values with the
standard ``pickle`` module in protocol 4, which is what ``dill`` reads and writes for them.
"""

from __future__ import annotations

import collections
import io
import pickle

import torch

_BUILTIN_TYPES = {t.__name__: t for t in (complex, set, frozenset, bytearray, slice, range)}
_DTYPES = {name: getattr(torch, name) for name in dir(torch)
           if isinstance(getattr(torch, name, None), torch.dtype)}
ADMITTED = ("builtins." + ", builtins.".join(_BUILTIN_TYPES) + ", torch dtypes (torch.float16, ...), "
            "torch.Size, collections.OrderedDict, dill._dill._load_type of those builtin types")


class UnsafePickleError(pickle.UnpicklingError):
    """A pickle that names a function or class cstream does not admit (it would run code)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _load_type(name):
    """What ``dill._dill._load_type(name)`` gives, for the admitted builtin types only."""
    if name in _BUILTIN_TYPES:
        return _BUILTIN_TYPES[name]
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


def loads(data: bytes):
    """Unpickle ``data``, admitting only the globals listed in :data:`ADMITTED`.

    >>> loads(dumps(torch.bfloat16)), loads(dumps(1 + 2j)), loads(dumps(b"x"))
    (torch.bfloat16, (1+2j), b'x')
    >>> import os
    >>> loads(pickle.dumps(os.system))
    Traceback (most recent call last):
    ...
    cstream._safe_pickle.UnsafePickleError: posix.system
    """
    return _Unpickler(io.BytesIO(data)).load()


def dumps(value) -> bytes:
    """Pickle a value :func:`loads` admits (protocol 4, as ``dill`` writes it)."""
    return pickle.dumps(value, protocol=4)


def is_admitted(value) -> bool:
    """Whether ``value`` pickles to globals :func:`loads` admits (the types cstream.save pickles)."""
    return type(value) in (bytes, bytearray, complex) or isinstance(value, torch.dtype)
