"""torch's private names and error texts that cstream depends on, in one place.

A torch release may rename, move or remove anything with a leading underscore, and reword any
error message. Every such use in ``cstream``, ``executor`` and ``workers`` goes through this
module, one section per use, each saying what it is for; ``tests/test_torch_compat.py`` checks
every name here and the behaviour cstream relies on, and names what changed when a torch
release breaks one. A name torch no longer has makes this module's import fail, naming it.

Adding a use: add a section (the name through :func:`_private`, or a function around it, and a
comment saying what it is for), and a check in ``tests/test_torch_compat.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import re
import threading
from types import SimpleNamespace
from typing import Callable, Iterator, Optional

import torch

PRIVATE_NAMES: dict[str, str] = {}
"""Every private name of torch this module reaches: ``"module:attribute"`` -> what for."""
_MISSING: list[str] = []


def resolve(path: str):
    """The object ``path`` (``"package.module:attr.attr"``) names; ImportError or
    AttributeError when torch has no such name."""
    module, _, attrs = path.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attrs.split(".")):
        obj = getattr(obj, part)
    return obj


def _private(path: str, purpose: str):
    """Register ``path`` with its ``purpose`` and return the object it names (None, and the
    import fails at the end of this module, when torch has no such name)."""
    PRIVATE_NAMES[path] = purpose
    try:
        return resolve(path)
    except (ImportError, AttributeError):
        _MISSING.append(path)
        return None


# -- fake tensors: the step is captured on tensors that have a shape and dtype but no data
#    (executor.engine.capture, executor.engine.warmup); the two exceptions are what fake
#    tensors raise for an op whose output shape or value depends on data (guards' errors)
FakeTensorMode = _private("torch._subclasses.fake_tensor:FakeTensorMode",
                          "placeholders a step is captured on")
FakeTensor = _private("torch._subclasses.fake_tensor:FakeTensor",
                      "the placeholders' type: the devices of tensors a captured step creates")
DynamicOutputShapeException = _private(
    "torch._subclasses.fake_tensor:DynamicOutputShapeException",
    "a captured op whose output shape depends on values (x[mask], nonzero)")
DataDependentOutputException = _private(
    "torch._subclasses.fake_tensor:DataDependentOutputException",
    "a captured op whose result depends on values (torch.equal)")

# -- fake modes on a torch built with CUDA where no GPU is available: entering one installs a
#    stand-in CUDA device guard (the first entry only, process-wide) that torch keeps in the
#    entering thread's thread-local storage; once that thread ends, the process's guard
#    registry points at freed memory, and the next fake mode or the process's first backward
#    pass crashes (torch 2.11+cu130 on a CPU-only machine: a trace in a background thread, then
#    a segmentation fault). Installed first from a thread that lives as long as the process,
#    later entries find it and leave it (executor.engine.warmup, executor.driver)
_ensure_cuda_guard = _private("torch._C:_ensureCUDADeviceGuardSet",
                              "a fake mode's stand-in CUDA device guard where no GPU is")


def install_fake_cuda_guard_here() -> bool:
    """Install fake modes' stand-in CUDA device guard from the calling thread if it is the
    main thread and torch is built with CUDA but has no GPU (elsewhere there is nothing to
    install); call it before another thread enters a fake mode. Whether it asked torch to."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if not torch.backends.cuda.is_built() or torch.cuda.is_available():
        return False
    _ensure_cuda_guard()
    return True


# -- error texts of a capture: torch raises these as plain TypeError / AssertionError, and
#    their text is all that tells them from other errors of the same type
#    (executor.engine.capture._as_tracing_error)
SCALAR_GIVEN_A_TENSOR = re.compile(r"argument '(\w+)' must be Number, not (\w+)")
NON_FAKE_INPUT = ("convert all Tensors to FakeTensors", "on non-Fake Tensor inputs")


def scalar_argument_given_a_tensor(e: BaseException, tensor_type: str) -> Optional[str]:
    """The argument's name when ``e`` is torch's refusal of a ``tensor_type`` instance given
    where it takes a Python number (``x.add_(y, alpha=t)``), else None."""
    if not isinstance(e, TypeError):
        return None
    m = SCALAR_GIVEN_A_TENSOR.search(str(e))
    return m.group(1) if m is not None and m.group(2) == tensor_type else None


def is_non_fake_input_error(e: BaseException) -> bool:
    """Whether ``e`` is a fake-tensor mode's refusal of a real tensor among an op's inputs
    (a tensor from outside the captured step)."""
    return isinstance(e, AssertionError) and any(text in str(e) for text in NON_FAKE_INPUT)


# -- grouping tensors by (device, dtype): torch's multi-tensor code (clip_grad_norm_, the
#    foreach optimizers) groups with this C++ function, whose devices reach Python without
#    passing a torch-function mode; cstream's optimizers group the same way so a total
#    norm sums in torch's order (cstream.optim.optimizer.group_tensors)
group_tensors_by_device_and_dtype = _private(
    "torch.utils._foreach_utils:_group_tensors_by_device_and_dtype",
    "cstream's optimizers and clipping group tensors as torch's multi-tensor code does")
_GROUPING_PATH = "torch._C:_group_tensors_by_device_and_dtype"
_private(_GROUPING_PATH, "the devices clip_grad_norm_ moves to, seen while a step is captured")
_observers = threading.local()
_install_lock = threading.Lock()
_installed: dict = {"count": 0, "original": None}


def _observed_grouping(*args, **kwargs):
    grouped = _installed["original"](*args, **kwargs)
    for callback in getattr(_observers, "stack", ())[-1:]:
        callback(grouped)
    return grouped


@contextlib.contextmanager
def observe_grouped_devices(callback: Callable[[dict], None]) -> Iterator[None]:
    """Call ``callback(grouped)`` with every result of torch's grouping by (device, dtype)
    made in this thread while the context is active. torch has no hook for it, so its
    function is replaced while at least one thread observes and restored when the last one
    leaves; calls from other threads get torch's result untouched."""
    stack = getattr(_observers, "stack", None)
    if stack is None:
        stack = _observers.stack = []
    with _install_lock:
        if _installed["count"] == 0:
            _installed["original"] = torch._C._group_tensors_by_device_and_dtype
            torch._C._group_tensors_by_device_and_dtype = _observed_grouping
        _installed["count"] += 1
    stack.append(callback)
    try:
        yield
    finally:
        stack.pop()
        with _install_lock:
            _installed["count"] -= 1
            if _installed["count"] == 0:
                torch._C._group_tensors_by_device_and_dtype = _installed["original"]
                _installed["original"] = None


# -- multi-tensor ops: one kernel over a list of tensors, as torch's own optimizers use them;
#    a traced step gets one op per stage for any number of parameters (cstream.optim,
#    cstream.amp.grad_scaler)
FOREACH_OPS = ("add", "add_", "addcmul_", "clamp_max_", "clamp_min_", "div", "maximum_", "mul",
               "mul_", "neg", "norm", "sqrt", "sub_")
foreach = SimpleNamespace(**{
    name: _private(f"torch:_foreach_{name}", "multi-tensor arithmetic of optimizers and clipping")
    for name in FOREACH_OPS})
"""``foreach.mul_(tensors, x)`` is ``torch._foreach_mul_(tensors, x)``."""


# -- pytree: flattening nested containers of tensors the way torch does (steps' arguments and
#    outputs, batches, checkpoints' trees)
TreeSpec = _private("torch.utils._pytree:TreeSpec", "the structure of a flattened tree")
tree_flatten = _private("torch.utils._pytree:tree_flatten", "a tree's leaves and structure")
tree_unflatten = _private("torch.utils._pytree:tree_unflatten", "a tree from leaves and structure")
tree_leaves = _private("torch.utils._pytree:tree_leaves", "a tree's leaves")
tree_map_only = _private("torch.utils._pytree:tree_map_only", "a tree with leaves of one type mapped")


# -- aten operators: the captured graph's nodes call ``OpOverload``s; the engine reads their
#    schema (which argument an in-place op writes, whether an op takes a generator), names them
#    to pickle the graph, and calls their C++ entry point in the fx replay
OpOverload = _private("torch._ops:OpOverload", "the type of a captured graph's aten ops")
PRIVATE_NAMES["torch._ops:OpOverload._schema"] = "an op's arguments and their aliasing"
PRIVATE_NAMES["torch._ops:OpOverload._overloadname"] = "an op's overload, to pickle it by name"
PRIVATE_NAMES["torch._ops:OpOverload._op"] = "an op's C++ entry point, called by the fx replay"


def op_schema(op) -> "torch._C.FunctionSchema":
    """``op``'s schema: its arguments, with their names, aliasing and mutation."""
    return op._schema


def op_overload_name(op) -> str:
    """``"default"``, ``"Tensor"``, ...: the overload of ``op`` within its packet."""
    return op._overloadname


def op_entry_point(op) -> Callable:
    """``op``'s C++ entry point: calling it skips ``OpOverload.__call__``'s Python frame."""
    return op._op


_has_kernel = _private("torch._C:_dispatch_has_kernel_for_dispatch_key",
                       "whether an op has a kernel for a device (a graph for the wafer's device)")


def has_kernel_for(op_name: str, dispatch_key: str) -> bool:
    """Whether the dispatcher holds a kernel of ``op_name`` (``"aten::mm"``) for
    ``dispatch_key`` (``"CPU"``, ``"CUDA"``, ``"CompositeExplicitAutograd"``, ...)."""
    return bool(_has_kernel(op_name, dispatch_key))


# -- tensor subclasses: a state handle is a wrapper subclass (shape, dtype, no storage) whose
#    torch functions run with subclass dispatch off (executor.engine.handles)
make_wrapper_subclass = _private("torch:Tensor._make_wrapper_subclass",
                                 "a state handle: a tensor with metadata and no storage")
DisableTorchFunctionSubclass = _private("torch._C:DisableTorchFunctionSubclass",
                                        "a state handle's torch functions, run as torch's own")


# -- fx graphs: a graph made by make_fx keeps its pytree input/output structure in its code
#    generator, which the fx replay and the portable pickle carry over
PRIVATE_NAMES["torch.fx:Graph._codegen"] = "a graph's input/output structure (pytree_info)"


def graph_codegen(graph: torch.fx.Graph):
    """The code generator of ``graph`` (its ``pytree_info`` holds the in/out structure)."""
    return graph._codegen


def set_graph_codegen(graph: torch.fx.Graph, codegen) -> None:
    graph._codegen = codegen


# -- inductor: the compiled step is saved and loaded as a standalone artifact
#    (executor.engine.compiler); imported when used, as inductor takes seconds to import
_STANDALONE_COMPILE = "torch._inductor:standalone_compile"
_COMPILED_ARTIFACT = "torch._inductor.standalone_compile:CompiledArtifact"
PRIVATE_NAMES[_STANDALONE_COMPILE] = "compiling a captured step into a saved artifact"
PRIVATE_NAMES[_COMPILED_ARTIFACT] = "loading a saved compiled step"


def standalone_compile(gm: torch.fx.GraphModule, example_inputs: list, **kwargs):
    """inductor's compile of ``gm`` into an artifact that can be saved and loaded."""
    return resolve(_STANDALONE_COMPILE)(gm, example_inputs, **kwargs)


def load_compiled_artifact(path: str, format: str):
    """A compiled step saved by ``standalone_compile(...).save(path=, format=)``."""
    return resolve(_COMPILED_ARTIFACT).load(path=path, format=format)
_TRITON_WRAP = "torch._higher_order_ops.triton_kernel_wrap"
PRIVATE_NAMES[_TRITON_WRAP + ":"] = "imported before captured graphs are unpickled"


def import_for_unpickling_graphs() -> None:
    """Import what unpickling a captured graph needs in a fresh process: torch registers its
    higher-order ops there on import, and a graph names them."""
    importlib.import_module(_TRITON_WRAP)


# -- normalisation layers: BatchNorm's base (momentum=None's error names it) and the base of
#    batch and instance norm (weight decay leaves their parameters out)
BatchNormBase = _private("torch.nn.modules.batchnorm:_BatchNorm", "every BatchNorm layer")
NormBase = _private("torch.nn.modules.batchnorm:_NormBase", "every batch or instance norm layer")


# -- the single-process DataLoader iterator: an input worker steps it without the per-batch
#    profiler annotation torch's own __next__ enters (~0.15 ms a batch) and keeps the sample
#    indices of the last batch (workers.resume)
_SingleProcessDataLoaderIter = _private("torch.utils.data.dataloader:_SingleProcessDataLoaderIter",
                                        "the single-process iterator an input worker steps")
_profiler_enabled = _private("torch.autograd:_profiler_enabled",
                             "whether a profiler runs (then the iterator's own path is taken)")
_pin_memory = _private("torch.utils.data._utils.pin_memory:pin_memory",
                       "pinning a batch as the iterator does")
SINGLE_PROCESS_ITER_ATTRS = ("_next_index", "_dataset_fetcher", "_pin_memory", "_sampler_iter",
                             "_num_yielded", "_IterableDataset_len_called", "_pin_memory_device")
"""The fields of torch's ``_SingleProcessDataLoaderIter`` that :class:`LeanLoaderIter` reads."""


def single_process_iter(it) -> bool:
    """Whether ``it`` (``iter(a DataLoader)``) is torch's single-process iterator with every
    field :class:`LeanLoaderIter` reads."""
    return type(it) is _SingleProcessDataLoaderIter and all(
        hasattr(it, a) for a in SINGLE_PROCESS_ITER_ATTRS)


_MapDatasetFetcher = _private("torch.utils.data._utils.fetch:_MapDatasetFetcher",
                              "the fetcher of a map-style dataset's batches")


def tensor_dataset_rows(it) -> Optional[tuple]:
    """The tensors of the loader's dataset where a batch of it is those tensors' rows at the
    batch's indices: a ``TensorDataset`` (not a subclass) of plain tensors, batched by a
    sampler and collated by ``default_collate``. None otherwise.

    Such a batch, which torch makes with one ``dataset[i]`` a sample and a ``torch.stack``, is
    then one index of each tensor (:meth:`LeanLoaderIter.__next__`): the same values, dtypes
    and shapes, in the same list, at a fifth of the cost for a 64-row batch."""
    fetcher = getattr(it, "_dataset_fetcher", None)
    if type(fetcher) is not _MapDatasetFetcher or not fetcher.auto_collation or \
            fetcher.collate_fn is not torch.utils.data.default_collate:
        return None
    dataset = fetcher.dataset
    if type(dataset) is not torch.utils.data.TensorDataset or not dataset.tensors or any(
            type(t) is not torch.Tensor or t.requires_grad for t in dataset.tensors):
        return None
    return tuple(dataset.tensors)


class LeanLoaderIter:
    """The steps of the single-process iterator's ``__next__`` without its per-batch profiler
    annotation while no profiler runs, keeping the sample indices of the last batch
    (:attr:`last_index`). torch's ``_SingleProcessDataLoaderIter._next_data`` is what it
    follows; on a thread that runs torch's ops on one thread, a batch of a ``TensorDataset``
    is gathered with one index a tensor (:func:`tensor_dataset_rows`)."""

    __slots__ = ("it", "last_index", "rows_of")

    def __init__(self, it):
        self.it = it
        self.last_index = None
        self.rows_of = tensor_dataset_rows(it)

    def __iter__(self):
        return self

    def __next__(self):
        it = self.it
        if it._sampler_iter is None or it._IterableDataset_len_called is not None \
                or _profiler_enabled():
            self.last_index = None
            return next(it)  # the loader's own path: reset, length warnings, profiling
        index = it._next_index()
        # on a thread whose ops run single-threaded only (an input worker's, as Ray starts
        # it): a gather of over 32,768 elements runs as an OpenMP parallel region, which on
        # any other thread starts a pool of threads of its own, and a wafer in the same
        # process then waits for its threads to wake at every op (in_process=True, the MLP
        # 784: 3.3 ms a step against 1.9)
        if self.rows_of is not None and torch.get_num_threads() == 1 and \
                type(index) is list and index and all(type(i) is int for i in index):
            rows = torch.tensor(index)
            data = [t[rows] for t in self.rows_of]
        else:
            data = it._dataset_fetcher.fetch(index)
        if it._pin_memory:
            data = _pin_memory(data, it._pin_memory_device)
        it._num_yielded += 1
        self.last_index = index
        return data
# -- control flow in a graph: ``torch.ops.higher_order.cond`` and the like are neither aten ops
#    nor plain Python; a CUDA graph cannot hold a branch taken on a value
HigherOrderOperator = _private("torch._ops:HigherOrderOperator",
                               "the type of control-flow ops in a graph (cond, while_loop, ...)")


# -- what runs around the ops of a step: the TorchFunctionModes active (an eager step runs with
#    none unless it needs one), and the dispatch-level mode tests count host reads with
torch_function_mode_depth = _private("torch._C:_len_torch_function_stack",
                                     "how many TorchFunctionModes are active")
TorchDispatchMode = _private("torch.utils._python_dispatch:TorchDispatchMode",
                             "a mode that sees every aten op")


# -- pytree specs built by field name (programs written for torch <= 2.5) ----------------------
# torch 2.6 renamed TreeSpec's dataclass fields ``context`` / ``children_specs`` to ``_context`` /
# ``_children`` but kept the old names in ``__init__``. ``dataclasses.replace(spec, ...)``
# passes every init field by its field name, so code written for the old names (the Model Zoo
# 2.10 Trainer's config serialiser) fails with "unexpected keyword argument '_context'".
# TreeSpec's constructor is given the field names as well as the old ones.


def accept_treespec_field_names() -> bool:
    """Let ``TreeSpec(type=..., _context=..., _children=...)`` build a spec (once per process).

    Returns False where TreeSpec already takes its field names (nothing to do).
    """
    if getattr(TreeSpec.__init__, "_cstream_field_names", False):
        return True
    if "_context" not in {f.name for f in dataclasses.fields(TreeSpec) if f.init}:
        return False
    original = TreeSpec.__init__

    def __init__(self, type, context=None, children_specs=None, *, _context=None,
                 _children=None):
        children = _children if children_specs is None else children_specs
        original(self, type, _context if context is None else context,
                 [] if children is None else children)

    __init__._cstream_field_names = True
    TreeSpec.__init__ = __init__
    return True


# -- TensorBoard: the path of a SummaryWriter's event file (its file writer's private names)
def summary_event_file(writer) -> str:
    """The event file ``writer`` (a ``torch.utils.tensorboard.SummaryWriter``) writes."""
    return writer._get_file_writer().event_writer._file_name


if _MISSING:
    raise ImportError(
        f"torch {torch.__version__} lacks {len(_MISSING)} private name(s) cstream uses: "
        + "; ".join(f"{p} ({PRIVATE_NAMES[p]})" for p in _MISSING)
        + ". workers/torch_compat.py is where cstream reaches them: adapt that section.")
