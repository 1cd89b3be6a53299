"""What both checkpoint readers share: the error they raise and the lazily read dict they return."""

from __future__ import annotations

import collections
from collections.abc import ItemsView, Mapping, ValuesView


class CheckpointError(ValueError):
    """A file that is not a readable checkpoint (not HDF5, foreign, truncated, corrupted, unsafe)."""


class Lazy:
    """A value not read yet (never handed out: containers replace it on access).

    The same ``Lazy`` may stand in several places (tied weights): it reads once and every place
    gets the same tensor.
    """

    __slots__ = ("read_fn", "value", "dtype", "shape")

    def __init__(self, read_fn, dtype=None, shape=None):
        self.read_fn = read_fn
        self.value = None
        self.dtype, self.shape = dtype, shape  # what describe() shows without reading

    def read(self):
        if self.value is None:
            self.value = self.read_fn()
        return self.value


def real(value):
    return value.read() if isinstance(value, Lazy) else value


class LazyDict(dict):
    """A dict whose tensor values are read from the checkpoint file on first access.

    It is a real ``dict`` and hands out only real tensors (``[]``, ``get``, ``items()``,
    ``values()``, ``pop``, ``dict(d)``, ``{**d}``, ``copy()``), so ``model.load_state_dict`` and
    ``optimizer.load_state_dict`` take it directly. Pickling it (``torch.save``) reads every value
    and stores a ``collections.OrderedDict``, which ``torch.load(weights_only=True)`` accepts.
    """

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if isinstance(value, Lazy):
            value = value.read()
            super().__setitem__(key, value)
        return value

    def __iter__(self):  # a Python-level __iter__ makes dict(d) and {**d} go through __getitem__
        return super().__iter__()

    def get(self, key, default=None):
        return self[key] if key in self else default

    def values(self):
        return ValuesView(self)

    def items(self):
        return ItemsView(self)

    def pop(self, key, *default):
        return real(super().pop(key, *default))

    def popitem(self):
        key, value = super().popitem()
        return key, real(value)

    def setdefault(self, key, default=None):
        if key not in self:
            self[key] = default
        return self[key]

    def copy(self):
        return dict(self.items())

    def __or__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**self, **other}

    def __ror__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return {**other, **self}

    def __eq__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None

    def __reduce_ex__(self, protocol):
        return (collections.OrderedDict, (), None, None, iter(self.items()))

    def __repr__(self) -> str:
        return repr(dict(self.items()))
