"""The entry points of the Cerebras package's compiled library that Model Zoo code calls.

``set_attribute(tensor, name, value)`` attaches a compiler attribute to the op that produced a
traced tensor (the Model Zoo marks source variables with it). It steers the compiler, not the
values: cstream records the last attribute set under each name (:func:`recorded_attributes`)
and otherwise changes nothing.

>>> import torch
>>> set_attribute(torch.zeros(1), "cs.internal", {"source_vars": ["x"]})
>>> recorded_attributes()["cs.internal"]
{'source_vars': ['x']}
"""

from __future__ import annotations

_ATTRIBUTES: dict = {}


def set_attribute(tensor, name: str, value) -> None:
    if not isinstance(name, str):
        raise TypeError(f"set_attribute: the attribute name must be a string, got {name!r}.")
    _ATTRIBUTES[name] = value


def recorded_attributes() -> dict:
    return dict(_ATTRIBUTES)
