"""Refusing value reads while a step is traced, with the user's source line.

A read is decided by what is called and with which arguments, never by who calls it: the same
``.item()`` or ``.to("cpu")`` is refused in the user's step and inside a library, and moves that
read nothing (``.to(x.device)``, ``.to(tensor)``, dtype casts) pass wherever they are written.
The error names the line, the module it happened in, and a fix; BatchNorm's cumulative average
gets its specific way around. Branches in libraries that pick a faster path when the value
allows it (transformers' mask checks) take their general path, as when torch traces them.
"""

from __future__ import annotations

import inspect
import linecache
import os

import torch
from torch.overrides import TorchFunctionMode

from executor.engine.errors import TracingError
from workers.torch_compat import BatchNormBase, FakeTensor, observe_grouped_devices

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
    f = inspect.currentframe().f_back
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


def module_of_frame():
    """``(module, "path.in.model")`` of the innermost ``nn.Module.forward`` on the stack, or None.

    The path is the module's name inside the outermost module on the stack (the user's model).
    """
    inner = outer = None
    f = inspect.currentframe().f_back
    while f is not None:
        obj = f.f_locals.get("self")
        if isinstance(obj, torch.nn.Module):
            inner = inner or obj
            outer = obj
        f = f.f_back
    if inner is None:
        return None
    path = next((n for n, m in outer.named_modules() if m is inner), "")
    return inner, path


def _module_hint(found) -> tuple[str, str]:
    """(where in the model, a fix specific to that module or "")."""
    if found is None:
        return "", ""
    module, path = found
    cls = type(module)
    name = (f"torch.nn.{cls.__qualname__}" if cls.__module__.startswith("torch.nn.modules")
            else f"{cls.__module__}.{cls.__qualname__}")
    where = f" It happened inside {name}" + (f" `{path}`" if path else "") + "."
    fix = ""
    if isinstance(module, BatchNormBase) and module.momentum is None:
        fix = (
            " BatchNorm with momentum=None (a cumulative moving average) computes its factor "
            "1/num_batches_tracked with float() in Python, which needs the value. Fix: give "
            "the layer a number, e.g. momentum=0.1 (PyTorch's default); or, for a cumulative "
            "average, subclass it and update the running statistics with tensor ops: "
            "`self.num_batches_tracked.add_(1); self.running_mean.add_((mean - "
            "self.running_mean) / self.num_batches_tracked)`."
        )
    return where, fix


# Python branches on a tensor inside libraries users port that only choose a faster path when
# the value allows it, and take the general path when the library knows it is being traced: the
# answer given there while a step is traced (the general path, as under torch.fx or dynamo).
# transformers' masking_utils asks "does every token attend?" (`fast_all(mask)`, `.all()`) to
# skip building the attention mask; False builds it, which is right for any mask.
TRACED_BRANCHES = {
    os.path.join("transformers", "masking_utils.py"): False,
}


def traced_branch(fn: str):
    """The answer a bool() of a tensor gets at a line of ``fn`` while a step is traced, or None."""
    return next((answer for path, answer in TRACED_BRANCHES.items() if fn.endswith(path)), None)


HOST_MOVE_FIX = (
    " Fix: to keep the tensor where it is, move it to the device of a tensor of the step, "
    "`t.to(x.device)` (a device taken before the step, e.g. `device = 'cpu'`, names the host), "
    "or drop the call; to read the value, pass the tensor to a @cstream.step_closure and read "
    "it there, after the step."
)


def read_error(what: str, fix: str = "") -> TracingError:
    fn, line, src = user_frame()
    where = f"{fn}:{line}" + (f" (`{src}`)" if src else "")
    inside, module_fix = _module_hint(module_of_frame())
    fix = module_fix or fix
    return TracingError(
        f"{what} at {where} reads a tensor's value inside a traced step, which is not allowed."
        f"{inside} The step is traced once into a static graph that runs on the wafer; at trace "
        "time the value does not exist yet, and anything computed from it would be baked into "
        "the graph as a constant."
        + (fix or " Fix: express the logic with tensor ops (e.g. torch.where instead of a "
           "Python `if`), or pass the tensor to a @cstream.step_closure and read it there, after "
           "the step.")
    )


# ops whose output shape (or Python result) depends on tensor values: what users write that
# reaches each, and a fixed-size way around (docs/models.md, "What cannot trace")
_VALUE_SHAPED = {
    "nonzero": ("boolean mask indexing `x[mask]`, `nonzero()`, `argwhere()` or one-argument "
                "`torch.where(cond)`",
                "`torch.where(mask, x, 0)` instead of `x[mask]` (the shape stays, the elements "
                "left out become 0); `(x * mask).sum() / mask.sum()` for a masked mean"),
    "masked_select": ("`masked_select`",
                      "`torch.where(mask, x, 0)` instead of `x.masked_select(mask)` (the shape "
                      "stays, the elements left out become 0); `(x * mask).sum()` for a masked "
                      "sum"),
    "_unique2": ("`unique()`",
                 "`torch.nn.functional.one_hot(x, n).amax(0)`, with n the number of values x "
                 "can take (1 where a value occurs), instead of `unique()`"),
    "unique_dim": ("`unique(dim=...)`",
                   "`torch.nn.functional.one_hot(x, n).amax(0)`, with n the number of values x "
                   "can take, instead of `unique()`"),
    "unique_consecutive": ("`unique_consecutive()`",
                           "`x[1:] != x[:-1]` marks where a new run starts, at a fixed size"),
    "repeat_interleave": ("`repeat_interleave` with tensor repeats",
                          "pass `output_size=` (a Python int) so the length is known"),
    "bincount": ("`bincount()`",
                 "`torch.zeros(n).index_add_(0, x, torch.ones(len(x)))`: counts of a fixed "
                 "length n"),
    "equal": ("`torch.equal()`, which returns a Python bool",
              "`(a == b).all()`, a tensor, with torch.where"),
}


def value_dependent_error(exc: RuntimeError) -> TracingError:
    """The error for torch's ``DynamicOutputShapeException`` / ``DataDependentOutputException``
    raised while a step is captured: the op, the user's line, what they wrote and the way
    around."""
    op = getattr(exc, "func", None)
    name = getattr(getattr(op, "overloadpacket", None), "__name__", str(op))
    fn, line, src = user_frame_of(exc.__traceback__)
    where = f"{fn}:{line}" + (f" (`{src}`)" if src else "")
    idiom, fix = _VALUE_SHAPED.get(name, ("", "fixed-size ops: torch.where, masks multiplied in"))
    shaped = type(exc).__name__ == "DynamicOutputShapeException"
    return TracingError(
        f"aten.{name} at {where} is an operation whose output "
        + ("shape " if shaped else "") + "depends on tensor values"
        + (f" ({idiom})" if idiom else "") + ", which a traced step cannot hold: the step is "
        "traced once into a static graph, "
        + ("whose shapes are fixed before any value exists. " if shaped else
           "before any value exists, so a result computed from values would be baked in. ")
        + f"Fix: {fix}."
    )


def scalar_argument_error(name: str, exc: TypeError) -> TracingError:
    """The error for a traced tensor given where torch takes a Python number (``alpha=``,
    ``value=``): torch's argument parsing refuses it before any mode sees the call."""
    fn, line, src = user_frame_of(exc.__traceback__)
    return TracingError(
        f"`{name}=` was given a traced tensor at {fn}:{line}" + (f" (`{src}`)" if src else "")
        + f": `{name}` must be a Python number, and a traced tensor has no value at trace "
        "time (it would be read as a random or stale value). Fix: multiply explicitly, e.g. "
        f"`x.add_(y * t)` instead of `x.add_(y, {name}=t)`."
    )


def not_state_error() -> TracingError:
    """The error for a plain tensor from outside the step used in it (not state, not batch)."""
    return TracingError(
        "the traced step used a tensor that is neither a state tensor (model parameter or "
        "buffer, optimizer state created in preinitialize, cstream.zeros/full/...) nor "
        "part of the batch, so its current value would be baked into the graph. Create "
        "it with cstream's creation ops (cstream.zeros_like, cstream.full, ...) or "
        "register it as a module buffer before cstream.compile."
    )


_DEVICE_OF = _T.device.__get__
_MOVES = (_T.to, _T.cuda)


def move_error(what: str, target: torch.device, here: torch.device) -> TracingError:
    fn, line, src = user_frame()
    where = f"{fn}:{line}" + (f" (`{src}`)" if src else "")
    return TracingError(
        f"{what} at {where} moves a traced tensor to {target}, but the step runs on the wafer "
        f"driver's {here} device and every tensor in it stays there. Fix: leave the tensor "
        "where it is (`t.to(x.device)` with `x` any tensor of the step, or only a dtype: "
        "`t.to(torch.float16)`)."
    )


class ReadGuard(TorchFunctionMode):
    """Active while a step is captured: value reads raise :class:`TracingError`.

    Every tensor of the step lives on the wafer. A ``torch.device`` read from one of them
    (``x.device``) names the wafer, so ``t.to(x.device)``, ``t.to(x)`` or a dtype-only ``.to``
    move no value and run as in eager; so do the devices torch's grouping of tensors by device
    returns (``clip_grad_norm_``'s ``clip_coef.to(device)``) and those of tensors the step
    creates. A device the user names (``"cpu"``, ``.cpu()``) asks for the value on the host:
    that is a read, refused like ``.item()``, whoever calls it.
    """

    def __init__(self, devices=()):
        super().__init__()
        # devices read from the step's tensors, by id, and ``devices`` (the backend's, as
        # ``compiled_model.device`` gives it); kept alive so their ids stay theirs
        self._wafer_devices: dict[int, torch.device] = {id(d): d for d in devices}
        self._wafer_ids = self._wafer_devices.keys()
        self._grouping = None

    def _note_wafer_device(self, device: torch.device) -> torch.device:
        self._wafer_devices.setdefault(id(device), device)
        return device

    def _note_grouped(self, grouped: dict) -> None:
        """torch's grouping of tensors by (device, dtype), as used by clip_grad_norm_ and the
        foreach optimizers: the devices it returns are those of step tensors, the wafer."""
        for device, _ in grouped:
            self._note_wafer_device(device)

    def _note_created(self, out) -> None:
        """The devices of fake tensors the step created itself (``torch.arange(t)`` and ops
        on it): their ``.device`` property answers without passing this mode."""
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, FakeTensor):
                self._note_wafer_device(t.device)

    def __enter__(self):
        # torch's grouping by device hands its devices to Python below any mode: observed in
        # this thread while the step is traced
        self._grouping = observe_grouped_devices(self._note_grouped)
        self._grouping.__enter__()
        try:
            return super().__enter__()
        except BaseException:
            self._grouping.__exit__(None, None, None)
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._grouping.__exit__(None, None, None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == _DEVICE_OF:  # a method-wrapper: a new object on every attribute access
            return self._note_wafer_device(func(*args, **kwargs))
        what = READS.get(func)
        if func is _T.__bool__:
            answer = traced_branch(user_frame()[0])
            if answer is not None:
                return answer
        if what is not None:
            raise read_error(what, HOST_MOVE_FIX if func is _T.cpu else "")
        if func in _MOVES:
            self._check_move(func, args, kwargs)
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
        out = func(*args, **kwargs)
        self._note_created(out)
        return out

    def _check_move(self, func, args, kwargs) -> None:
        """Refuse a ``.to``/``.cuda`` that moves a value off the wafer's device."""
        here = args[0].device if isinstance(args[0], torch.Tensor) else None
        if func is _T.cuda:
            target = torch.device("cuda" if not args[1:] and "device" not in kwargs
                                  else kwargs.get("device", args[1] if args[1:] else None))
            if here is None or here.type != "cuda":
                raise move_error(".cuda()", target, here)
            return
        rest = args[1:]
        if rest and isinstance(rest[0], torch.Tensor) or isinstance(kwargs.get("other"),
                                                                        torch.Tensor):
            return  # .to(other): other is a tensor of the step, on the wafer
        device = kwargs.get("device", rest[0] if rest and not isinstance(rest[0],
                                                                          torch.dtype) else None)
        if device is None or id(device) in self._wafer_ids:
            return
        target = torch.device(device) if isinstance(device, (str, int)) else device
        if target.type == "cpu":
            raise read_error(f".to({str(device)!r})", HOST_MOVE_FIX)
        if here is None or target.type != here.type or (
                target.index is not None and target != here):
            raise move_error(f".to({str(device)!r})", target, here)
