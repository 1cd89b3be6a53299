"""Input stalls: the wafer waited for a step's input longer than a bound, so the run stops with a
diagnosis instead of waiting for ever. Before the first step, the wait for the first batch and
for the duplicate check's first batches of every worker is bounded alike.

The bound is ``CSConfig.input_stall_timeout_s``; None derives it from the batch costs seen so far
(:func:`stall_bound`): ``max(STALL_FLOOR_S, STALL_COST_FACTOR x the slowest batch)``. Past it,
the wafer raises :class:`InputStallError` naming each CS-X whose part of the step is missing, the
workers that owe batches (global batch numbers and the steps they are) and what the threads of
those workers are doing: their Python stacks, gathered inside the workers, your own frames
first (:func:`thread_stacks`, :func:`format_threads`).
"""

from __future__ import annotations

import os
import sys
import threading
import traceback

__all__ = ["InputStallError", "STALL_COST_FACTOR", "STALL_FLOOR_S", "format_threads",
           "stall_bound", "thread_stacks"]

STALL_FLOOR_S = 600.0
"""The least default bound. The wait for the first batch includes building the loader (an
``input_fn`` may read an index or tokenize for minutes), a worker that restarts or a file on a
slow share takes seconds to minutes; a stuck worker never ends. On Ray a worker that delivers
nothing that a step waits for is reported as a straggler, with its stack, after
``CSConfig.straggler_timeout_s`` (60 s) already, long before this."""
STALL_COST_FACTOR = 20
"""The default bound is at least this many times the slowest batch seen."""


def stall_bound(cs_config, slowest_batch_s: float | None) -> tuple[float, str]:
    """``(bound in seconds, the rule that gave it)`` for a run with ``cs_config`` whose slowest
    batch so far took ``slowest_batch_s`` (None: none seen yet).

    >>> from workers.config import CSConfig
    >>> stall_bound(CSConfig(), 30.0)[0], stall_bound(CSConfig(input_stall_timeout_s=5), 30.0)
    (600.0, (5.0, 'CSConfig.input_stall_timeout_s=5'))
    """
    if cs_config.input_stall_timeout_s is not None:
        v = float(cs_config.input_stall_timeout_s)
        return v, f"CSConfig.input_stall_timeout_s={v:g}"
    slowest = slowest_batch_s or 0.0
    seen = f"{slowest:.3g} s" if slowest_batch_s is not None else "none seen yet"
    return max(STALL_FLOOR_S, STALL_COST_FACTOR * slowest), (
        f"the default, max({STALL_FLOOR_S:g} s, {STALL_COST_FACTOR} x the slowest batch so far: "
        f"{seen})")


# -- stacks ---------------------------------------------------------------------------------------
_STDLIB_DIR = os.path.dirname(os.path.abspath(threading.__file__)) + os.sep


def _library_dirs() -> tuple:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    dirs = [os.path.join(here, d) for d in ("cstream", "executor", "workers")]
    dirs.append(_STDLIB_DIR.rstrip(os.sep))
    for name in ("torch", "ray"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(mod.__file__)))
    return tuple(d + os.sep for d in dirs)


def is_user_file(path: str) -> bool:
    """Whether a frame's file is the user's: not cstream's, torch's, Ray's, the standard
    library's (threading's) or an installed package's."""
    if path.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return False
    return not os.path.abspath(path).startswith(_library_dirs())


def thread_stacks(idents=None, skip=()) -> list[dict]:
    """The Python stacks of this process's threads (only those in ``idents`` when given, never
    those in ``skip``): ``[{"thread": name, "frames": [(file, line, function, source), ...]}]``,
    outermost frame first; threads running user code come first."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in frames.items():
        if ident in skip or (idents is not None and ident not in idents):
            continue
        summary = traceback.extract_stack(frame)
        out.append({"thread": names.get(ident, f"thread {ident}"),
                    "frames": [(fs.filename, fs.lineno, fs.name, (fs.line or "").strip())
                               for fs in summary]})
    out.sort(key=lambda s: not any(is_user_file(f[0]) for f in s["frames"]))
    return out


def _frame_text(frame, indent: str) -> str:
    file, line, name, source = frame
    text = f'{indent}File "{file}", line {line}, in {name}'
    return text + (f"\n{indent}  {source}" if source else "")


def format_threads(threads: list, indent: str = "  ") -> str:
    """:func:`thread_stacks` as text: for a thread running user code, the user's frames
    first (innermost last), then its whole stack; for any other, where it waits."""
    out = []
    for t in threads:
        frames = t["frames"]
        user = [f for f in frames if is_user_file(f[0])]
        if not user:  # where it waits: its innermost frame outside the standard library
            outside = [f for f in frames if not f[0].startswith(_STDLIB_DIR)]
            f = (outside or frames or [("?", 0, "?", "")])[-1]
            out.append(f'{indent}Thread "{t["thread"]}" is in {f[2]} ({f[0]}:{f[1]})'
                       + (f": {f[3]}" if f[3] else ""))
            continue
        out.append(f'{indent}Thread "{t["thread"]}", in your code (innermost last):')
        out.extend(_frame_text(f, indent + "  ") for f in user)
        out.append(f"{indent}  its whole stack (innermost last):")
        out.extend(_frame_text(f, indent + "    ") for f in frames)
    return "\n".join(out)


# -- the error ------------------------------------------------------------------------------------
class InputStallError(RuntimeError):
    """The wafer waited for a step's input longer than the bound, so the run was stopped.

    Fields: ``step`` (the step waited for, counted from 1 in this run), ``waited_s``,
    ``bound_s``, ``bound_rule`` (how the bound was set) and ``owed``: one dict per input worker
    that owes batches of a CS-X whose part is missing, ``{"wse_id", "local_worker_id", "pid",
    "batches": [(global batch number, step), ...], "threads": thread_stacks(...) or [],
    "note": why there are no stacks, or ""}``; the worker the step waits for comes first.
    Every field travels with the exception (it pickles whole).

    >>> e = InputStallError(6, 3.5, 3.0, "CSConfig.input_stall_timeout_s=3", [
    ...     {"wse_id": 0, "local_worker_id": 1, "pid": 42, "batches": [(5, 6)], "threads": []}])
    >>> str(e).splitlines()[1]
    'CS-X 0, input worker 1 (pid 42) owes global batch 5 (step 6).'
    """

    def __init__(self, step: int, waited_s: float, bound_s: float, bound_rule: str,
                 owed: list):
        self.step = step
        self.waited_s = waited_s
        self.bound_s = bound_s
        self.bound_rule = bound_rule
        self.owed = owed
        super().__init__(self._text())

    def _text(self) -> str:
        csx = sorted({o["wse_id"] for o in self.owed})
        which = ", ".join(f"CS-X {c}" for c in csx) or "the input side"
        lines = [f"the wafer waited {self.waited_s:.1f} s for the input of step {self.step} from "
                 f"{which}, longer than the bound of {self.bound_s:g} s ({self.bound_rule}); "
                 "the run was stopped."]
        for o in self.owed:
            who = f"CS-X {o['wse_id']}, " + ("no input worker" if o["local_worker_id"] is None
                                              else f"input worker {o['local_worker_id']}")
            if o.get("pid") is not None:
                who += f" (pid {o['pid']})"
            owes = ", ".join(f"global batch {n} (step {s})" for n, s in o["batches"])
            lines.append(f"{who} owes {owes or 'no batch'}.")
            if o.get("threads"):
                lines.append(format_threads(o["threads"]))
            elif o.get("note"):
                lines.append(f"  {o['note']}")
        lines.append(
            "If the input is slow rather than stuck, raise the bound: "
            "cstream.utils.CSConfig(input_stall_timeout_s=SECONDS) (in an experiment file, "
            "cs_config: {input_stall_timeout_s: SECONDS}); None, the default, is "
            f"max({STALL_FLOOR_S:g} s, {STALL_COST_FACTOR} x the slowest batch seen).")
        return "\n".join(lines)

    def __reduce__(self):
        return (type(self), (self.step, self.waited_s, self.bound_s, self.bound_rule,
                             self.owed))
