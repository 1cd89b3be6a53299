"""Refusing value reads while a step is traced (seed 003), with the user's source line."""

from __future__ import annotations

import linecache
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

from executor.engine.errors import TracingError

_T = torch.Tensor
READS = {
    _T.item: ".item()",
    _T.tolist: ".tolist()",
    _T.numpy: ".numpy()",
    _T.__bool__: "bool() of a tensor (a Python `if`/`while`/`and`/`or` on a tensor)",
    _T.__int__: "int() of a tensor",
    _T.__float__: "float() of a tensor",
    _T.__index__: "using a tensor as a Python index",
    _T.__repr__: "printing a tensor (print/repr)",
    _T.__str__: "printing a tensor (print/str)",
    _T.__format__: "formatting a tensor (f-string/print)",
    _T.cpu: ".cpu()",
}
SCALAR_KWARGS = ("alpha", "value")

_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
def _package_dirs(*names):
    import importlib.util

    dirs = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            dirs += [os.path.join(p, "") for p in spec.submodule_search_locations]
    return tuple(dirs)


# frames in these never are the user's own line (ray wraps print() once it is initialised)
_INTERNAL = tuple(
    os.path.join(_HERE, d) + os.sep for d in ("executor", "cstream", "workers")
) + _package_dirs("ray") + (os.path.dirname(torch.__file__) + os.sep,)


def user_frame(skip_internal: bool = True):
    """(filename, lineno, source) of the innermost frame outside torch and cstream."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not (skip_internal and (fn.startswith(_INTERNAL) or fn.startswith("<"))):
            return fn, f.f_lineno, linecache.getline(fn, f.f_lineno).strip()
        f = f.f_back
    return "<unknown>", 0, ""


def user_frame_of(tb):
    """(filename, lineno, source) of the innermost user frame of a traceback."""
    found = ("<unknown>", 0, "")
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if not (fn.startswith(_INTERNAL) or fn.startswith("<")):
            found = (fn, tb.tb_lineno, linecache.getline(fn, tb.tb_lineno).strip())
        tb = tb.tb_next
    return found


def _called_from_torch() -> bool:
    f = sys._getframe(3)
    return f is not None and f.f_code.co_filename.startswith(_INTERNAL[-1])


def read_error(what: str) -> TracingError:
    fn, line, src = user_frame()
    where = f"{fn}:{line}" + (f" (`{src}`)" if src else "")
    return TracingError(
        f"{what} at {where} reads a tensor's value inside a traced step, which is not allowed. "
        "The step is traced once into a static graph that runs on the wafer; at trace time the "
        "value does not exist yet, and anything computed from it would be baked into the graph "
        "as a constant. Fix: express the logic with tensor ops (e.g. torch.where instead of a "
        "Python `if`), or pass the tensor to a @cstream.step_closure and read it there, after "
        "the step."
    )


class ReadGuard(TorchFunctionMode):
    """Active while a step is captured: value reads raise :class:`TracingError`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        what = READS.get(func)
        if what is not None:
            if func in (_T.__repr__, _T.__str__, _T.__format__, _T.cpu) and _called_from_torch():
                pass
            else:
                raise read_error(what)
        elif func is _T.to and not _called_from_torch():
            device = kwargs.get("device")
            if device is None:
                device = next((a for a in args[1:] if isinstance(a, (str, torch.device))), None)
            if device is not None and torch.device(device).type == "cpu":
                raise read_error(".to('cpu')")
        for name in SCALAR_KWARGS:
            v = kwargs.get(name)
            if isinstance(v, torch.Tensor):
                fn, line, src = user_frame()
                raise TracingError(
                    f"{getattr(func, '__name__', func)}({name}=<traced tensor>) at {fn}:{line}"
                    + (f" (`{src}`)" if src else "")
                    + f": `{name}` must be a Python number, and a traced tensor has no value at "
                    f"trace time (eager PyTorch would read it with .item(); here it would be a "
                    f"random value). Fix: multiply explicitly, e.g. `x.add_(y * {name})` instead "
                    f"of `x.add_(y, {name}={name})`."
                )
        return func(*args, **kwargs)
