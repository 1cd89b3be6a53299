"""The cluster servers' loggers: ``wsc_logger`` and its children, one per server role.

Programs set levels on ``wsc_logger`` (or ``wsc_logger.getChild(role)``) to tune what the
appliance's servers log. cstream has no such servers; the levels are plain ``logging`` levels
and :func:`collect_wsc_log_settings` reads them back (the run records them, without effect).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

VERBOSE = 15
TRACE = 5
ROLES = ("crd", "wrk", "wgt", "act", "cmd", "br", "chf")

wsc_logger = logging.getLogger("wsc")


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
    """The levels set on ``wsc_logger`` and its ``wsc.<role>`` / ``wsc.<role>.<tag>`` children."""
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
