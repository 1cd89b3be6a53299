"""How ``cstream`` shows an exception that ended a run: the user's exception type and message and
the user's own frame, not the first line of Ray's wrapper; ``--debug`` shows the whole chain.

The exception may have crossed processes: an input worker's failure arrives as
:class:`workers.errors.InputWorkerError` (its original type, message and traceback text), a
wafer-side failure as a ``DriverError`` whose message holds the traceback, and anything raised
in an actor call as Ray's ``RayTaskError`` (the original exception in ``.cause``, the remote
traceback in ``.traceback_str``).

>>> def input_fn():
...     raise ValueError("no such column: 'lable'")
>>> try:
...     input_fn()
... except ValueError as e:
...     print(describe(e).headline)
ValueError: no such column: 'lable'
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Optional

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<name>.+)$')
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)?):"
                       r" (?P<message>.*)$")


class CLIError(Exception):
    """A user-facing error of a ``cstream`` command: printed as one line, exit status 2."""


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@dataclass
class Frame:
    file: str
    line: int
    name: str
    source: str = ""

    def format(self) -> str:
        out = f'  File "{self.file}", line {self.line}, in {self.name}'
        return out + (f"\n    {self.source.strip()}" if self.source.strip() else "")


@dataclass
class UserError:
    """What to show of an exception: ``headline`` (``Type: message``), where it happened
    (``context``), the user's frame, and every traceback text seen (for ``--debug``)."""

    exc_type: str
    message: str
    context: str = ""
    frame: Optional[Frame] = None
    tracebacks: list = field(default_factory=list)
    details: str = ""
    """Lines shown whole after the headline (a stall's diagnosis)."""

    @property
    def headline(self) -> str:
        return f"{self.exc_type}: {self.message}" if self.message else self.exc_type


def _library_dirs() -> tuple:
    import executor
    import workers

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.join(here, "cstream"), os.path.dirname(os.path.abspath(executor.__file__)),
            os.path.dirname(os.path.abspath(workers.__file__))]
    for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.__file__)):
        dirs.append(os.path.abspath(p))
    return tuple(d + os.sep for d in dirs)


def _is_user_file(path: str) -> bool:
    if path.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return False
    return not os.path.abspath(path).startswith(_library_dirs())


def user_frame_of_text(text: str) -> Optional[Frame]:
    """The innermost frame of a traceback text that is in the user's code."""
    lines = strip_ansi(text).splitlines()
    found = None
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m and _is_user_file(m["file"]):
            source = lines[i + 1] if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            found = Frame(m["file"], int(m["line"]), m["name"].strip(), source)
    return found


def user_frame_of_traceback(tb) -> Optional[Frame]:
    found = None
    for fs in traceback.extract_tb(tb):
        if _is_user_file(fs.filename):
            found = Frame(fs.filename, fs.lineno or 0, fs.name, fs.line or "")
    return found


def _last_exception_line(text: str) -> tuple[Optional[str], Optional[str]]:
    """(type, message) of the last ``Type: message`` line after a traceback in ``text``."""
    lines = [ln for ln in strip_ansi(text).splitlines() if ln.strip()]
    for line in reversed(lines):
        if line.startswith(" "):
            continue
        m = _EXC_LINE.match(line)
        if m:
            return m["type"].rsplit(".", 1)[-1], m["message"]
    return None, None


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)


def describe(e: BaseException) -> UserError:
    """The user's exception behind ``e`` (see the module docstring)."""
    from workers.errors import InputWorkerError
    from workers.stall import InputStallError

    tracebacks = ["".join(traceback.format_exception(type(e), e, e.__traceback__))]
    local_frame = user_frame_of_traceback(e.__traceback__)
    chain = list(_chain(e))
    for link in chain:
        cause = getattr(link, "cause", None)
        remote_text = getattr(link, "traceback_str", None)
        if remote_text:
            tracebacks.append(strip_ansi(remote_text))
        # a Ray error whose cause is already in the chain (the input side's error, raised in
        # the client with the Ray error as its __cause__) has been unwrapped: go on with it
        if isinstance(cause, BaseException) and type(link).__name__.startswith("RayTaskError") \
                and not any(cause is c for c in chain):
            inner = describe(cause)
            inner.tracebacks = tracebacks + inner.tracebacks
            if inner.frame is None and remote_text:
                inner.frame = user_frame_of_text(remote_text)
            return inner
        if isinstance(link, InputStallError):  # its diagnosis is the message, shown whole
            first, _, rest = str(link).partition("\n")
            return UserError(type(link).__name__, first, "", None, tracebacks, details=rest)
        if isinstance(link, InputWorkerError):
            tracebacks.append(link.traceback_text)
            where = f"in the input function, CS-X {link.wse_id} input worker {link.local_worker_id}"
            return UserError(link.exc_type, strip_ansi(link.exc_message).strip(),
                             f"{where} {link.during}".strip(),
                             user_frame_of_text(link.traceback_text), tracebacks)
    text = strip_ansi(str(e))
    if "Traceback (most recent call last)" in text:  # a failure reported with its traceback
        exc_type, message = _last_exception_line(text)
        if exc_type:
            if text not in tracebacks[0]:
                tracebacks.append(text)
            head = text.split("Traceback (most recent call last)")[0].strip().splitlines()
            context = head[0].split(":")[0] if head else ""
            return UserError(exc_type, message, context, user_frame_of_text(text) or local_frame,
                             tracebacks)
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    message = " ".join(lines[0].split()) if lines else ""
    if len(lines) > 1 and len(message) < 200:
        message = " ".join(" ".join(lines).split())
    return UserError(type(e).__name__, message, "", local_frame, tracebacks)


def format_error(command: str, e: BaseException, debug: bool = False) -> str:
    """The text ``cstream COMMAND`` prints on stderr for ``e``."""
    err = describe(e)
    out = [f"cstream {command}: error: {err.headline}"]
    if err.context:
        out.append(f"  ({err.context})")
    if err.details:
        out.append(err.details)
    if err.frame is not None:
        out.append(err.frame.format())
    if debug:
        out.append("")
        out.append("the whole chain (--debug):")
        for text in err.tracebacks:
            if text and text.strip():
                out.append(strip_ansi(text).rstrip())
    else:
        out.append("(run again with --debug for the whole traceback)")
    return "\n".join(out)
