"""Op annotations (``cerebras.pytorch.core.annotation``): attributes that the Cerebras compiler
attaches to the ops a function runs (a named matmul, a recompute region, an attention-mask
range, the number of key/value groups). They steer how the compiler lays out the ops, not the
values, and cstream runs every op with PyTorch: an annotated function runs unchanged. The
configuration is checked (it is built from the keyword arguments, as on a CS-X) and the
attribute it gives is recorded (:func:`recorded_attributes`). As the Cerebras package does, off
the CSX backend the annotation warns that it has no effect.

>>> from dataclasses import dataclass
>>> @dataclass
... class NamedConfig(AnnotationMode.Config):
...     name: str = ""
...     enable_fwd: bool = True
...     enable_bwd: bool = True
>>> import warnings, cstream
>>> backend = cstream.backend("CPU")
>>> with warnings.catch_warnings(record=True) as caught:
...     double = create_annotation(NamedConfig, lambda c, is_backward:
...                                AnnotationMode.Attribute("named", c.name), name="x")(
...                                    lambda t: 2 * t)
>>> double(3), recorded_attributes()["named"], str(caught[0].message).endswith("any effect.")
(6, 'x', True)
>>> backend.shutdown()
"""

from __future__ import annotations

import functools
import warnings
from abc import ABC
from dataclasses import dataclass
from typing import Any, Callable, Optional

_RECORDED: dict[str, Any] = {}


def recorded_attributes() -> dict[str, Any]:
    """The attributes annotations asked for in this process: name -> the last value."""
    return dict(_RECORDED)


class AnnotationMode(ABC):
    """An annotation kind: its :class:`Config` (what the user sets) and the :class:`Attribute`
    it gives the ops."""

    @dataclass
    class Config:
        """Base class of an annotation's configuration."""

        enable_fwd: bool
        enable_bwd: bool

    @dataclass
    class Attribute:
        """The attribute set on the annotated ops."""

        name: str
        value: Optional[Any]

    def __init__(self, config: "AnnotationMode.Config", get_attribute_fn: Callable):
        self.config = config
        self.get_attribute_fn = get_attribute_fn

    def get_attribute(self, config: "AnnotationMode.Config", is_backward: bool):
        return self.get_attribute_fn(config, is_backward)


def annotate(annotation_mode: AnnotationMode):
    """A decorator that runs the function unchanged and records ``annotation_mode``'s
    attribute."""
    from cstream.backend import current_backend

    backend = current_backend()
    if backend is None or not backend.is_csx:
        where = backend.name.lower() if backend is not None else "None"
        warnings.warn(f'Setting {type(annotation_mode).__name__} for "{where}" device doesn\'t '
                      f"have any effect.")
        if backend is None:
            return lambda fn: fn
    attribute = annotation_mode.get_attribute(annotation_mode.config, is_backward=False)

    def decorate(fn):
        @functools.wraps(fn)
        def annotated(*args, **kwargs):
            if attribute is not None and attribute.value is not None:
                _RECORDED[attribute.name] = attribute.value
            return fn(*args, **kwargs)

        return annotated

    return decorate


def create_annotation(annotation_config: type, get_attribute_fn: Callable, **kwargs):
    """The decorator of an annotation configured by ``annotation_config(**kwargs)`` (a
    :class:`AnnotationMode.Config` dataclass, checked here), whose ops get
    ``get_attribute_fn(config, is_backward)``."""
    mode = type(f"{annotation_config.__name__}AnnotationMode", (AnnotationMode,), {})
    return annotate(mode(annotation_config(**kwargs), get_attribute_fn))
