"""The Cerebras loggers: ``logger`` (``"cerebras"``), the class loggers of
:func:`named_class_logger`, and the cluster servers' ``wsc_logger`` (``"cerebras.wsc"``) with its
children, one per server role.

Every logger under ``cerebras`` has ``verbose(...)`` and ``trace(...)`` methods for the levels
VERBOSE (15) and TRACE (5), as in the Cerebras package. Programs set levels on ``wsc_logger``
(or ``wsc_logger.getChild(role)``) to tune what the appliance's servers log. cstream has no such
servers; the levels are plain ``logging`` levels and :func:`collect_wsc_log_settings` reads them
back (the run records them, without effect).

>>> @named_class_logger("RunSchedule")
... class RunSchedule(ClassLogger):
...     pass
>>> RunSchedule.logger.name, callable(RunSchedule.logger.verbose), RunSchedule._should_log_trace()
('cerebras.RunSchedule', True, False)
"""

from __future__ import annotations

import logging
import types
from dataclasses import dataclass
from typing import ClassVar, Optional, Protocol, Union

VERBOSE = 15
TRACE = 5
ROLES = ("crd", "wrk", "wgt", "act", "cmd", "br", "chf")
ROOTNAME = "cerebras"
_LEVELS = {"verbose": ("VERBOSE", VERBOSE), "trace": ("TRACE", TRACE)}


def _add_level_methods(name: str, alogger) -> None:
    """Give a ``cerebras`` logger its ``verbose`` / ``trace`` methods and level names."""
    if not isinstance(alogger, logging.Logger) or not (
            name == ROOTNAME or name.startswith(ROOTNAME + ".")):
        return
    for method, (_, level) in _LEVELS.items():
        def log_at(self, msg, *args, _level=level, **kwargs):
            kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 1
            self.log(_level, msg, *args, **kwargs)
        setattr(alogger, method, types.MethodType(log_at, alogger))


def _install_level_methods() -> None:
    """Extend the ``cerebras`` loggers that exist and those created from now on."""
    for level_name, level in _LEVELS.values():
        logging.addLevelName(level, level_name)
    manager = logging.Logger.manager
    if getattr(manager, "_cerebras_levels", False):
        return
    plain_get = manager.getLogger

    def get_logger(name):
        alogger = plain_get(name)
        _add_level_methods(name, alogger)
        return alogger

    manager.getLogger = get_logger
    manager._cerebras_levels = True
    for name, alogger in list(manager.loggerDict.items()):
        _add_level_methods(name, alogger)


_install_level_methods()
logger = logging.getLogger(ROOTNAME)
wsc_logger = logging.getLogger(f"{ROOTNAME}.wsc")


class ClassLogger(Protocol):
    """A class with a ``logger`` (set by :func:`named_class_logger`) and level checks."""

    logger: ClassVar[logging.Logger]

    @classmethod
    def _should_log_info(cls) -> bool: ...

    @classmethod
    def _should_log_verbose(cls) -> bool: ...

    @classmethod
    def _should_log_debug(cls) -> bool: ...

    @classmethod
    def _should_log_trace(cls) -> bool: ...


def _give_logger(cls: type, name: Optional[str] = None) -> type:
    if name:
        full = name if name.startswith(ROOTNAME + ".") else f"{ROOTNAME}.{name}"
    else:
        full = f"{ROOTNAME}.{cls.__module__}.{cls.__name__}"
    cls.logger = logging.getLogger(full)
    for method, level in (("_should_log_info", logging.INFO), ("_should_log_verbose", VERBOSE),
                          ("_should_log_debug", logging.DEBUG), ("_should_log_trace", TRACE)):
        setattr(cls, method, classmethod(lambda c, _level=level: c.logger.isEnabledFor(_level)))
    return cls


def named_class_logger(cls_or_namespace: Union[type, str, None] = None):
    """Class decorator giving the class a ``logger``: ``cerebras.<namespace>``, or
    ``cerebras.<module>.<class>`` without one. Use bare or with a namespace."""
    if isinstance(cls_or_namespace, type):
        return _give_logger(cls_or_namespace)
    if cls_or_namespace is None or isinstance(cls_or_namespace, str):
        return lambda cls: _give_logger(cls, cls_or_namespace)
    raise TypeError(f"`cls_or_namespace` must be a type, str, or None. Got "
                    f"`{type(cls_or_namespace)}`.")


def get_level_name(level):
    """``logging.getLevelName`` that also knows VERBOSE (15) and TRACE (5), both ways.

    >>> get_level_name("verbose"), get_level_name(5), get_level_name("INFO")
    (15, 'TRACE', 20)
    """
    if isinstance(level, str):
        level = level.upper()
    names = {"VERBOSE": VERBOSE, "TRACE": TRACE}
    if level in names:
        return names[level]
    for name, value in names.items():
        if level == value:
            return name
    return logging.getLevelName(level)


@dataclass(frozen=True)
class WscLogSetting:
    """One level set on a cluster server logger: ``tag``/``role`` None mean all."""

    level: int
    tag: Optional[str] = None
    mode: Optional[str] = None
    role: Optional[str] = None


def collect_wsc_log_settings() -> list[WscLogSetting]:
    """The levels set on ``wsc_logger`` and its ``<role>`` / ``<role>.<tag>`` children."""
    settings = []
    if wsc_logger.level != logging.NOTSET:
        settings.append(WscLogSetting(wsc_logger.level))
    prefix = wsc_logger.name + "."
    for name, logger in sorted(logging.root.manager.loggerDict.items()):
        if not name.startswith(prefix) or not isinstance(logger, logging.Logger):
            continue
        if logger.level == logging.NOTSET:
            continue
        role, _, tag = name[len(prefix):].partition(".")
        if role in ROLES:
            settings.append(WscLogSetting(logger.level, tag=tag or None, role=role))
        else:
            settings.append(WscLogSetting(logger.level, tag=name[len(prefix):]))
    return settings
