"""``cstorch.backends``: the Cerebras API's process-wide settings tree (Release 2.3 on).

``cstorch.backends.csx.precision.optimization_level = 2``, ``...performance.micro_batch_size``,
``...debug.ini.ws_opt_...`` and so on: the settings of the Cerebras compiler and cluster. Each
group checks what is set as the Cerebras package does (a name it does not have, a value of the
wrong type or out of range is an error naming the rule), ``DEFAULT`` resets a setting, a group
is a context manager that restores its settings on exit, and ``asdict()`` / ``load_flags()``
save and restore them.

None of these settings changes what cstream computes: they steer the compiler's precision
choices, micro-batching, weight transfers and the cluster's servers (see docs/modelzoo.md,
"Accepted without effect"). :func:`changed_settings` lists the ones set away from their defaults;
a CSX backend records them in its ``accepted_without_effect``. Two have meaning here and are
read where they apply: ``storage.s3.profile`` is the ``AWS_PROFILE`` variable, and
``debug.debug_args`` / ``debug.ini`` are the :class:`~cstream.appliance.run_utils.DebugArgs` a
run records.

>>> import cstream
>>> csx = cstream.backends.csx
>>> with csx.precision:
...     csx.precision.optimization_level = 2
...     csx.precision.optimization_level
2
>>> csx.precision.optimization_level
1
>>> csx.precision.optimization_level = 3
Traceback (most recent call last):
ValueError: optimization_level must be an integer in range [0, 3). Got 3
"""

from __future__ import annotations

import copy
import os
from typing import Any, Callable

from cstream.appliance.run_utils import DebugArgs, set_ini

DEFAULT = object()
"""Set a setting to this to reset it to its default."""

MAX_MESSAGE_LENGTH = (1 << 31) - 1
"""The largest transfer the Cerebras client allows in one message (bytes)."""
MAX_TRANSFER_BYTES = 256 << 20
FABRIC_TYPES = ("cs2", "cs3")


def _type_error(name, expected, value):
    return TypeError(f"Expected {expected} for `{name}`. Got {type(value)}: {value}")


def _bool(name, value):
    if not isinstance(value, bool):
        raise _type_error(name, "bool", value)
    return value


def _optional_str(name, value):
    if value is not None and not isinstance(value, str):
        raise _type_error(name, "Optional[str]", value)
    return value


def _optional_int(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise _type_error(name, "Optional[int]", value)
    return value


def _pol(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise _type_error(name, "int", value)
    if not 0 <= value < 3:
        raise ValueError(f"{name} must be an integer in range [0, 3). Got {value}")
    return value


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return value


def _max_transfer_bytes(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MESSAGE_LENGTH:
        raise ValueError(f"{name} must be a positive integer less than {MAX_MESSAGE_LENGTH}, "
                         f"got {value}")
    return value


_MICRO_BATCH_CHOICES = (
    '\t"auto": Automatically choose an optimal micro batch size.\n'
    '\t"explore": Search for an optimal micro batch size and return.\n'
    '\t{"explore": {"min": Optional[<positive_int>], "max": Optional[<positive_int>]}}: Search '
    "for an optimal micro batch size within the min and max bounds and return.\n"
    "\t<positive_int>: Use this micro batch size.\n"
    "\tNone: Disable micro batch tiling.")


def _micro_batch_size(name, value):
    if value is None or value in ("auto", "explore"):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if value > 0:
            return value
    elif isinstance(value, dict) and set(value) == {"explore"} and isinstance(value["explore"], dict):
        bounds = value["explore"]
        if set(bounds) <= {"min", "max"} and all(
                v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)
                for v in bounds.values()):
            return copy.deepcopy(value)
    elif not isinstance(value, (str, dict)):
        raise _type_error(name, 'one of NoneType, int, "explore", "auto", or a dict '
                                '{"explore": {"min": int, "max": int}}', value)
    raise ValueError(f'Invalid value "{value}" for "{name}". Expected one of:\n'
                     f"{_MICRO_BATCH_CHOICES}")


def _fabric_types(name, value):
    if value is None:
        return None
    if not isinstance(value, list) or any(v not in FABRIC_TYPES for v in value):
        raise _type_error(name, f"Optional[List[Literal{list(FABRIC_TYPES)}]]", value)
    return list(value)


class INI:
    """``backends.csx.debug.ini``: INI flags (attributes of any name), a view of the ``ini``
    message of ``backends.csx.debug.debug_args`` (or of its own debug args, standing alone)."""

    def __init__(self, owner: "_Flags | None" = None, **flags):
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_own", DebugArgs())
        set_ini(self._args(), **flags)

    def _args(self) -> DebugArgs:
        owner = object.__getattribute__(self, "_owner")
        return owner.debug_args if owner is not None else object.__getattribute__(self, "_own")

    def _flags(self) -> dict:
        return self._args().ini._fields

    def __getattr__(self, name):
        flags = self._flags()
        if name in flags:
            return flags[name]
        raise AttributeError(f"INI has no flag {name!r}")

    def __setattr__(self, name, value):
        set_ini(self._args(), **{name: value})

    def __delattr__(self, name):
        if name not in self._flags():
            raise AttributeError(f"INI has no flag {name!r}")
        del self._flags()[name]

    def asdict(self) -> dict:
        return {
            k: (v.to_dict() if isinstance(v, DebugArgs) else v) for k, v in self._flags().items()}

    def clear(self) -> None:
        self._flags().clear()

    def __eq__(self, other):
        return isinstance(other, INI) and self.asdict() == other.asdict()

    def __repr__(self):
        return "INI(" + ", ".join(f"{k}={v!r}" for k, v in self.asdict().items()) + ")"


class _Flags:
    """A group of settings: ``FIELDS`` maps a name to ``(default factory, check)`` where check
    is ``check(name, value) -> value`` (raises on a bad value), or to a nested group class."""

    FIELDS: dict[str, Any] = {}

    def __init__(self):
        for name, spec in self.FIELDS.items():
            if isinstance(spec, type):
                object.__setattr__(self, name, spec())
            else:
                object.__setattr__(self, name, spec[0]())

    def __setattr__(self, name, value):
        if name.startswith("_"):
            return object.__setattr__(self, name, value)
        if name not in self.FIELDS:
            raise AttributeError(f"'_{type(self).__name__.lstrip('_')}' has no flag '{name}'")
        spec = self.FIELDS[name]
        if isinstance(spec, type):
            if value is not getattr(self, name):
                raise AttributeError(f"{name} is a nested flag and cannot be set directly")
            return None
        default, check = spec
        value = default() if value is DEFAULT else check(name, value)
        object.__setattr__(self, name, value)
        self._changed(name, value)
        return None

    def _changed(self, name, value) -> None:
        """What setting ``name`` does beyond storing it (nothing unless a group says so)."""

    def asdict(self) -> dict:
        out = {}
        for name, spec in self.FIELDS.items():
            value = getattr(self, name)
            if isinstance(spec, type):
                out[name] = value.asdict()
            elif isinstance(value, INI):
                out[name] = value.asdict()
            elif isinstance(value, DebugArgs):
                out[name] = value.to_dict()
            else:
                out[name] = copy.deepcopy(value)
        return out

    def __iter__(self):
        yield from self.asdict().items()

    def load_flags(self, data) -> None:
        """Set the settings of ``data`` (a dict as :meth:`asdict` gives, or a group of this
        kind), nested groups recursively."""
        if isinstance(data, _Flags):
            if not isinstance(data, type(self)):
                raise ValueError(f"Expected a {type(self).__name__}. Got {type(data)}")
            data = data.asdict()
        if not isinstance(data, dict):
            raise ValueError(f"Expected a dictionary, got {type(data)}")
        for name, value in data.items():
            current = getattr(self, name, None)
            if isinstance(current, _Flags):
                current.load_flags(value)
            else:
                setattr(self, name, copy.deepcopy(value))

    def reset(self, recurse: bool = True) -> None:
        for name, spec in self.FIELDS.items():
            if isinstance(spec, type):
                if recurse:
                    getattr(self, name).reset(recurse)
            else:
                setattr(self, name, DEFAULT)

    def changed(self, prefix: str = "") -> dict:
        """The settings away from their defaults, by dotted name."""
        out = {}
        for name, spec in self.FIELDS.items():
            value = getattr(self, name)
            if isinstance(spec, type):
                out.update(value.changed(f"{prefix}{name}."))
                continue
            plain = value.asdict() if isinstance(value, INI) else (
                value.to_dict() if isinstance(value, DebugArgs) else value)
            default = spec[0]()
            default = default.asdict() if isinstance(default, INI) else (
                default.to_dict() if isinstance(default, DebugArgs) else default)
            if plain != default:
                out[prefix + name] = plain
        return out

    def __enter__(self):
        self.__dict__.setdefault("_saved", []).append(self.asdict())
        return self

    def __exit__(self, *exc):
        saved = self.__dict__.get("_saved", [])
        if saved:
            self.load_flags(saved.pop())
        return False

    def __repr__(self):
        return f"{type(self).__name__.lstrip('_')}({self.asdict()})"


def _constant(value) -> Callable[[], Any]:
    return lambda: copy.deepcopy(value)


class _precision(_Flags):
    FIELDS = {"optimization_level": (_constant(1), _pol)}


class _performance(_Flags):
    FIELDS = {
        "micro_batch_size": (_constant("auto"), _micro_batch_size),
        "transfer_processes": (_constant(5), _positive_int),
        "max_transfer_bytes": (_constant(MAX_TRANSFER_BYTES), _max_transfer_bytes),
        "compress_weights": (_constant(False), _bool),
        "use_speculative_optimizers": (_constant(True), _bool),
    }

    def _changed(self, name, value):
        if name == "use_speculative_optimizers":
            set_ini(backends.csx.debug.debug_args, ws_opt_disable_speculate_optimizer=not value)


class _cluster(_Flags):
    FIELDS = {"auto_taint": (_constant(False), _bool)}

    def _changed(self, name, value):
        set_ini(backends.csx.debug.debug_args, ws_fwk_auto_taint=value)


class _s3(_Flags):
    """``profile`` is the ``AWS_PROFILE`` environment variable (None: unset)."""

    FIELDS = {"profile": (_constant(None), _optional_str)}

    def __getattribute__(self, name):
        if name == "profile":
            return os.environ.get("AWS_PROFILE")
        return object.__getattribute__(self, name)

    def _changed(self, name, value):
        if value is None:
            os.environ.pop("AWS_PROFILE", None)
        else:
            os.environ["AWS_PROFILE"] = value


class _storage(_Flags):
    FIELDS = {"s3": _s3}


def _debug_args(name, value):
    if isinstance(value, dict):
        return DebugArgs(value)
    if not isinstance(value, DebugArgs):
        raise _type_error(name, "DebugArgs or a dict", value)
    return value


class _debug(_Flags):
    FIELDS = {
        "ini": (INI, None),
        "debug_args": (DebugArgs, _debug_args),
        "drop_data": (_constant(False), _bool),
        "lazy_initialization": (_constant(True), _bool),
        "skip_weight_init": (_constant(False), _bool),
        "optimize_initialization": (_constant(True), _bool),
        "log_initialization": (_constant(True), _bool),
        "retrace_every_iteration": (_constant(False), _bool),
        "implicit_cast_cb16_to_fp32": (_constant(False), _bool),
        "save_gpv": (_constant(False), _bool),
        "check_constraints": (_constant(False), _bool),
        "op_definition_module": (_constant(None), _optional_str),
        "skip_connectivity_check": (_constant(False), _bool),
        "fabric_type_blacklist": (_constant(None), _fabric_types),
        **{f"{role}_memory_gi": (_constant(None), _optional_int)
           for role in ("compile_crd", "execute_crd", "wrk", "act", "cmd", "wgt", "chf")},
    }

    def __init__(self):
        super().__init__()
        object.__setattr__(self, "ini", INI(self))

    def __setattr__(self, name, value):
        if name == "ini":
            if isinstance(value, INI):
                value = value.asdict()
            if value is DEFAULT:
                value = {}
            if not isinstance(value, dict):
                raise _type_error(name, "INI or a dict", value)
            self.ini.clear()
            set_ini(self.debug_args, **value)
            return
        super().__setattr__(name, value)


class _csx(_Flags):
    FIELDS = {"precision": _precision, "performance": _performance, "cluster": _cluster,
              "storage": _storage, "debug": _debug}


class _backends(_Flags):
    FIELDS = {"csx": _csx}
    DEFAULT = DEFAULT


backends = _backends()
"""The settings tree: ``cstream.backends`` (``cerebras.pytorch.backends``)."""


def changed_settings() -> dict:
    """The settings set away from their defaults, by dotted name (``csx.precision.optimization_level``)."""
    return backends.changed()
