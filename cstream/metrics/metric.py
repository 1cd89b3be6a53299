"""The :class:`Metric` base class and the input checks the built-in metrics share."""

from __future__ import annotations

import functools
import math
import warnings
from abc import ABC, abstractmethod

import torch

from cstream.creation import state_tensor

_ACC = torch.float64  # accumulation dtype: exact counts up to 2**53, sums good to ~1e-16


def _counted_update(fn):
    """Wrap a subclass's ``update``: no autograd, and ``num_updates`` counts the outermost call
    (an ``update`` that calls ``super().update`` still counts once)."""

    @functools.wraps(fn)
    def update(self, *args, **kwargs):
        outer = not self.__dict__.get("_in_update", False)
        self.__dict__["_in_update"] = True
        try:
            with torch.no_grad():
                fn(self, *args, **kwargs)
                if outer:
                    self._num_updates.add_(1)
        finally:
            if outer:
                self.__dict__["_in_update"] = False

    return update


def _resetting(fn):
    """Wrap a subclass's ``reset`` so it also zeroes ``num_updates``."""

    @functools.wraps(fn)
    def reset(self):
        with torch.no_grad():
            if "_num_updates" in self._buffers:
                self._num_updates.zero_()
            fn(self)

    return reset


class Metric(torch.nn.Module, ABC):
    """Base class of every metric: ``Metric(name)``.

    Subclasses implement three methods:

    * ``reset()`` defines the state on its first call (from ``__init__``) with
      :meth:`register_state`, and later sets it back to its initial value, in place;
    * ``update(*args, **kwargs)`` accumulates one batch into the state. It is traced into the
      step's static graph, so it changes the state in place with tensor ops only and never
      reads a tensor's value (no ``.item()``, ``bool()``, ``if`` on a tensor, boolean-mask
      indexing). Calling the metric runs ``update``;
    * ``compute()`` turns the state into the value. It runs outside the step (after the run, or
      inside a ``@cstream.step_closure``) and may read values. ``float(metric)`` calls it.

    ``compute_on_system`` is accepted for compatibility with scripts written for the Cerebras
    API; the state always lives with the engine and ``compute`` reads it from there.

    >>> import torch, cstream
    >>> class SumMetric(cstream.metrics.Metric):
    ...     def reset(self):
    ...         self.register_state("total", torch.zeros((), dtype=torch.float64))
    ...     def update(self, values):
    ...         self.total.add_(values.sum())
    ...     def compute(self):
    ...         return float(self.total)
    >>> m = SumMetric("sum")
    >>> m(torch.tensor([1.0, 2.0])); m(torch.tensor([3.5]))
    >>> float(m), m.num_updates
    (6.5, 2)
    >>> m.reset(); float(m), m.num_updates
    (0.0, 0)
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "update" in cls.__dict__ and not getattr(cls.__dict__["update"], "__isabstractmethod__",
                                                    False):
            cls.update = _counted_update(cls.__dict__["update"])
        if "reset" in cls.__dict__ and not getattr(cls.__dict__["reset"], "__isabstractmethod__",
                                                   False):
            cls.reset = _resetting(cls.__dict__["reset"])

    def __init__(self, name: str, compute_on_system: bool | None = None):
        super().__init__()
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"{type(self).__name__}: name must be a non-empty string, got {name!r}; the name "
                "labels the metric in logs, e.g. AccuracyMetric(\"accuracy\")."
            )
        self.name = name
        self.compute_on_system = compute_on_system
        self.register_state("_num_updates", torch.zeros((), dtype=torch.int64))
        self.reset()

    def register_state(self, name: str, tensor: torch.Tensor, persistent: bool = False) -> None:
        """Register ``tensor`` as the state ``name`` (an attribute of the metric).

        The state is made a state tensor of the current backend (on CSX its value lives with
        the engine and is updated by every traced step). Registering an existing name again
        (as ``reset`` does) writes the new value into the existing tensor, in place; its shape
        and dtype cannot change.
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{self.name}: state name must be a Python identifier, got {name!r}.")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{self.name}: state {name!r} must be a torch.Tensor, got "
                            f"{type(tensor).__name__}.")
        existing = self._buffers.get(name)
        if existing is not None:
            if existing.shape != tensor.shape or existing.dtype != tensor.dtype:
                raise ValueError(
                    f"{self.name}: state {name!r} was registered with shape "
                    f"{tuple(existing.shape)} and dtype {existing.dtype}, now with "
                    f"{tuple(tensor.shape)} and {tensor.dtype}. A metric's state has a fixed "
                    "shape and dtype (it is part of the static graph); reset it with the same "
                    "shape and dtype."
                )
            with torch.no_grad():
                existing.copy_(tensor)
            return
        if hasattr(self, name):
            raise ValueError(f"{self.name}: cannot register state {name!r}: the metric already "
                             "has an attribute of that name.")
        self.register_buffer(name, state_tensor(tensor.detach().clone(), readable=True),
                             persistent=persistent)

    @abstractmethod
    def reset(self) -> None:
        """Define (first call) or reset the state tensors, in place."""

    @abstractmethod
    def update(self, *args, **kwargs) -> None:
        """Accumulate a batch into the state, in place, with tensor ops only."""

    @abstractmethod
    def compute(self):
        """The metric's value from the accumulated state."""

    def forward(self, *args, **kwargs) -> None:
        self.update(*args, **kwargs)

    @property
    def num_updates(self) -> int:
        """How many times ``update`` ran since the last ``reset``."""
        return int(self._num_updates)

    def __float__(self) -> float:
        return float(self.compute())

    def extra_repr(self) -> str:
        return repr(self.name)

    # -- helpers for compute (values are read here, outside the step) ----------------------
    def _value(self, state: torch.Tensor) -> torch.Tensor:
        """A plain CPU copy of a state tensor (fetched from the engine on CSX)."""
        return state.to("cpu").clone()

    def _no_data(self, what: str) -> float:
        warnings.warn(f"{type(self).__name__} {self.name!r}: {what} since the last reset(); "
                      "the value is nan.", UserWarning, stacklevel=3)
        return math.nan


# -- checks shared by update() implementations (shapes are static, so these may raise) -------

def check_same_shape(metric: Metric, a_name: str, a: torch.Tensor, b_name: str,
                     b: torch.Tensor, rule: str) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{type(metric).__name__} {metric.name!r}: {a_name} has shape {tuple(a.shape)} but "
            f"{b_name} has shape {tuple(b.shape)}; {rule}"
        )


def as_tensor(metric: Metric, arg: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(value, dtype=_ACC)
    raise TypeError(f"{type(metric).__name__} {metric.name!r}: {arg} must be a tensor, got "
                    f"{type(value).__name__}.")


def weights_like(metric: Metric, weights, like: torch.Tensor, like_name: str = "labels"
                 ) -> torch.Tensor:
    """``weights`` broadcast to ``like``'s shape, as float64 (ones when None)."""
    if weights is None:
        return torch.ones_like(like, dtype=_ACC)
    w = as_tensor(metric, "weights", weights)
    try:
        shape = torch.broadcast_shapes(w.shape, like.shape)
    except RuntimeError:
        shape = None
    if shape != like.shape:
        raise ValueError(
            f"{type(metric).__name__} {metric.name!r}: weights has shape {tuple(w.shape)}, which "
            f"does not broadcast to {like_name}' shape {tuple(like.shape)}; pass one weight per "
            f"entry of {like_name} (or a shape that broadcasts to it), or None."
        )
    return w.to(_ACC).expand(like.shape)


def class_ids(metric: Metric, arg: str, t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(
            f"{type(metric).__name__} {metric.name!r}: {arg} must hold class ids (an integer "
            f"tensor), got dtype {t.dtype}; for logits pass logits.argmax(-1)."
        )
    return t.long()


def warn_out_of_range(metric: Metric, count: float, what: str, valid: str) -> None:
    if count:
        warnings.warn(
            f"{type(metric).__name__} {metric.name!r}: {count:g} {what} outside the valid range "
            f"{valid} since the last reset(); those samples were ignored (left out of the "
            "result). Values cannot be checked inside the traced step, so they are counted and "
            "reported here.", UserWarning, stacklevel=3,
        )
