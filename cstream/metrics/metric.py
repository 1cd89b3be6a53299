"""The :class:`Metric` base class, the registry of metrics, and helpers the built-in metrics
share."""

from __future__ import annotations

import functools
import inspect
import math
import warnings
import weakref
from abc import ABC, abstractmethod

import torch

from cstream.creation import state_tensor

_ACC = torch.float64  # accumulation dtype: exact counts up to 2**53, sums good to ~1e-16
_RESULT = torch.float32  # the dtype compute() returns (as cerebras.pytorch) unless dtype= is given

# name -> the metrics built under that name, oldest first. Weak references: a metric that is
# gone is left out (the Cerebras package keeps every metric alive forever).
_REGISTRY: dict[str, list[weakref.ref]] = {}


def _inputs_device(args, kwargs):
    """The one device the tensors among ``args`` and ``kwargs`` are on; None if there are none,
    or several devices (then torch's own error says which)."""
    devices = {v.device for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)}
    return devices.pop() if len(devices) == 1 else None


def _follow_inputs(metric: "Metric", args, kwargs) -> None:
    """Move an eager metric's state to the device of its inputs: a metric built on the CPU (or
    before the backend) and updated with a GPU model's outputs accumulates on the GPU. State
    held by the engine (CSX handles, whose values live on the wafer) is left where it is."""
    device = _inputs_device(args, kwargs)
    if device is None:
        return
    states = [s for _, s in metric.named_buffers(recurse=False)]
    if all(type(s) is torch.Tensor and s.device != device for s in states):
        metric.to(device)


def _counted_update(fn):
    """Wrap a subclass's ``update``: no autograd, the state on the inputs' device, and
    ``num_updates`` counts the outermost call (an ``update`` that calls ``super().update``
    still counts once)."""

    @functools.wraps(fn)
    def update(self, *args, **kwargs):
        outer = not self.__dict__.get("_in_update", False)
        self.__dict__["_in_update"] = True
        try:
            if outer:
                _follow_inputs(self, args, kwargs)
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
            if "_num_updates" in dict(self.named_buffers(recurse=False)):
                self._num_updates.zero_()
            fn(self)

    return reset


def name_first_also(init):
    """Let a constructor whose first parameter is ``num_classes``, ``k`` or ``num_thresholds``
    (cerebras.pytorch's order, ``name`` later) also take the name first, as in
    ``MeanIOUMetric("miou", 6)``: a ``str`` first argument is the name, and the positional
    arguments after it fill the other parameters in order. ``inspect.signature`` still shows
    the Cerebras signature."""
    params = [p.name for p in list(inspect.signature(init).parameters.values())[1:]
              if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and p.name != "name"]

    @functools.wraps(init)
    def wrapper(self, *args, **kwargs):
        if args and isinstance(args[0], str):
            kind = type(self).__name__
            if "name" in kwargs:
                raise TypeError(f"{kind}: the name was given twice, first ({args[0]!r}) and as "
                                f"name={kwargs['name']!r}; give it once.")
            if len(args) - 1 > len(params):
                raise TypeError(f"{kind}: after the name, at most {len(params)} positional "
                                f"arguments ({', '.join(params)}), got {len(args) - 1}.")
            for param, value in zip(params, args[1:]):
                if param in kwargs:
                    raise TypeError(f"{kind}: got two values for {param!r}.")
                kwargs[param] = value
            kwargs["name"], args = args[0], ()
        init(self, *args, **kwargs)

    return wrapper


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

    ``name`` labels the metric (it need not be unique); ``None`` or ``""`` means the class name.
    Every metric is listed by :func:`get_all_metrics`. ``compute_on_system`` is accepted for
    scripts written for the Cerebras API; the state always lives with the engine and
    ``compute`` reads it from there.

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

    def __init__(self, name: str | None, *, compute_on_system: bool | None = None):
        super().__init__()
        if name is not None and not isinstance(name, str):
            raise TypeError(
                f"{type(self).__name__}: name must be a string (or None for the class name), got "
                f"{name!r}; the name labels the metric in logs, e.g. AccuracyMetric(\"accuracy\")."
            )
        self.name = name or type(self).__name__
        self.compute_on_system = compute_on_system
        self._dtype = None
        self.register_state("_num_updates", torch.zeros((), dtype=torch.int64))
        self.reset()
        _REGISTRY.setdefault(self.name, []).append(weakref.ref(self))

    def register_state(self, name: str, tensor: torch.Tensor, persistent: bool = False) -> None:
        """Register ``tensor`` as the state ``name`` (an attribute of the metric).

        The state is made a state tensor of the current backend, on its device (on CSX its
        value lives with the engine and is updated by every traced step); an ``update`` with
        tensors on another device moves the state there first. Registering an existing name again
        (as ``reset`` does) writes the new value into the existing tensor, in place; its shape
        and dtype cannot change.
        """
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"{self.name}: state name must be a Python identifier, got {name!r}.")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{self.name}: state {name!r} must be a torch.Tensor, got "
                            f"{type(tensor).__name__}.")
        existing = dict(self.named_buffers(recurse=False)).get(name)
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

    def _result(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` as the 0-d tensor ``compute`` returns: float32, or the ``dtype`` the last
        ``update`` asked for."""
        return value.to(_RESULT).to(self._dtype or _RESULT)

    def _warn_nan(self, value, what: str):
        if math.isnan(float(value)):
            warnings.warn(f"{type(self).__name__} {self.name!r}: {what} since the last reset(); "
                          "the value is nan.", UserWarning, stacklevel=3)
        return value


def get_all_metrics():
    """Yield ``(name, metric)`` for every metric alive, in the order they were built; a name
    that several metrics share gets ``.0``, ``.1``, ... appended.

    >>> import cstream
    >>> acc = cstream.metrics.AccuracyMetric("doc/accuracy")
    >>> [name for name, m in cstream.metrics.get_all_metrics() if name.startswith("doc/")]
    ['doc/accuracy']
    """
    for name, refs in list(_REGISTRY.items()):
        alive = [m for m in (r() for r in refs) if m is not None]
        if not alive:
            del _REGISTRY[name]
            continue
        for i, metric in enumerate(alive):
            yield (f"{name}.{i}" if len(alive) > 1 else name), metric


def compute_all_metrics() -> dict[str, float]:
    """``{name: float(metric)}`` for every metric alive, named as :func:`get_all_metrics`."""
    return {name: float(metric) for name, metric in get_all_metrics()}


# -- helpers shared by update() and compute() implementations ---------------------------------

def divide_no_nan(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den``, and 0 where ``den`` is 0."""
    return torch.where(den == 0, torch.zeros_like(num), num) / torch.where(
        den == 0, torch.ones_like(den), den)


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
        return torch.tensor(value, dtype=torch.float32)
    raise TypeError(f"{type(metric).__name__} {metric.name!r}: {arg} must be a tensor, got "
                    f"{type(value).__name__}.")


def class_ids(metric: Metric, arg: str, t: torch.Tensor) -> torch.Tensor:
    """Class ids as int64; float ids are truncated, as cerebras.pytorch does."""
    if t.is_complex():
        raise TypeError(f"{type(metric).__name__} {metric.name!r}: {arg} must hold class ids, "
                        f"got dtype {t.dtype}; for logits pass logits.argmax(-1).")
    return t.long()


def warn_out_of_range(metric: Metric, count: float, what: str, valid: str) -> None:
    if count:
        warnings.warn(
            f"{type(metric).__name__} {metric.name!r}: {count:g} {what} outside the valid range "
            f"{valid} since the last reset(); those samples were ignored (left out of the "
            "result). Values cannot be checked inside the traced step, so they are counted and "
            "reported here.", UserWarning, stacklevel=3,
        )
