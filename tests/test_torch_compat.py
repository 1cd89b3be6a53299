"""Every private name of torch cstream reaches, and each behaviour it relies on, in this torch.

These fail when a torch release renames, moves or removes one of them, or rewords an error
whose text cstream reads; the failure names it and the section of workers/torch_compat.py to
adapt.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from workers import torch_compat as tc

# a value of each class whose private attributes are listed (instance attributes, not the class's)
INSTANCES = {
    "torch._ops:OpOverload": lambda: torch.ops.aten.add.Tensor,
    "torch.fx:Graph": lambda: torch.fx.Graph(),
}


def _run_python(code: str, env: dict | None = None, timeout: float = 120
                ) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter with the repository on its path (its own process: what it
    breaks in torch stays there)."""
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                          text=True, timeout=timeout,
                          env={"PYTHONPATH": str(root), "PATH": "", **(env or {})})


def _lookup(path: str):
    try:
        return tc.resolve(path)
    except AttributeError:
        owner, _, attr = path.rpartition(".")
        if owner not in INSTANCES:
            raise
        return getattr(INSTANCES[owner](), attr)


def test_every_listed_private_name_exists():
    missing = []
    for path, purpose in tc.PRIVATE_NAMES.items():
        try:
            _lookup(path)
        except (ImportError, AttributeError) as e:
            missing.append(f"{path} ({purpose}): {type(e).__name__}: {e}")
    assert not missing, (f"torch {torch.__version__} changed what cstream uses "
                         "(workers/torch_compat.py):\n" + "\n".join(missing))


def test_every_foreach_op_is_torchs_and_computes():
    for name in tc.FOREACH_OPS:
        assert getattr(tc.foreach, name) is getattr(torch, f"_foreach_{name}"), name
    ts = [torch.ones(2), torch.full((3,), 2.0)]
    tc.foreach.mul_(ts, 3.0)
    assert [t.tolist() for t in ts] == [[3.0, 3.0], [6.0, 6.0, 6.0]]
    assert [float(n) for n in tc.foreach.norm(ts, 2)] == pytest.approx([18 ** 0.5, 108 ** 0.5])


# -- fake tensors and the errors a capture translates ----------------------------------------------

def test_fake_tensors_raise_the_two_value_dependent_exceptions():
    with tc.FakeTensorMode():
        x = torch.ones(3)
        with pytest.raises(tc.DynamicOutputShapeException):
            torch.nonzero(x)
        with pytest.raises(tc.DataDependentOutputException):
            torch.equal(x, x)
        assert isinstance(x, tc.FakeTensor)
        assert x.device is x.device, "a fake tensor's device must be one object (capture notes ids)"


def test_a_real_tensor_given_to_a_fake_mode_is_recognised_by_its_text():
    real = torch.ones(2)
    with tc.FakeTensorMode():
        with pytest.raises(AssertionError) as e:
            torch.ones(2) + real
    assert tc.is_non_fake_input_error(e.value), (
        f"the fake mode's refusal of a real tensor no longer contains any of "
        f"{tc.NON_FAKE_INPUT}: {e.value}")
    assert not tc.is_non_fake_input_error(AssertionError("something else"))


def test_a_tensor_given_for_a_python_number_is_recognised_by_its_text():
    x = torch.ones(())
    with pytest.raises(TypeError) as e:
        torch.add(x, x, alpha=torch.ones((), requires_grad=True))
    assert tc.scalar_argument_given_a_tensor(e.value, "Tensor") == "alpha", (
        f"{tc.SCALAR_GIVEN_A_TENSOR.pattern!r} no longer matches torch's error: {e.value}")
    assert tc.scalar_argument_given_a_tensor(e.value, "StateHandle") is None
    assert tc.scalar_argument_given_a_tensor(TypeError("other"), "Tensor") is None


# -- grouping by device ----------------------------------------------------------------------------

def test_grouping_by_device_and_dtype_has_the_shape_cstream_reads():
    a, b, c = torch.ones(2), torch.ones(3, dtype=torch.float64), torch.ones(4)
    grouped = tc.group_tensors_by_device_and_dtype([[a, b, c]], with_indices=True)
    found = {key: ([t.shape[0] for t in tensors], indices)
             for key, ([tensors], indices) in grouped.items()}
    assert found == {(torch.device("cpu"), torch.float32): ([2, 4], [0, 2]),
                     (torch.device("cpu"), torch.float64): ([3], [1])}


def test_grouped_devices_are_observed_in_the_observing_thread_only():
    original = torch._C._group_tensors_by_device_and_dtype
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    seen, other_thread_seen = [], []

    def clip_elsewhere():
        q = torch.nn.Parameter(torch.ones(2))
        q.grad = torch.ones(2)
        torch.nn.utils.clip_grad_norm_([q], 1.0, foreach=True)
        other_thread_seen.append(torch._C._group_tensors_by_device_and_dtype is not original)

    def note(grouped):
        seen.extend((threading.get_ident(), d) for d, _ in grouped)

    with tc.observe_grouped_devices(note):
        torch.nn.utils.clip_grad_norm_([p], 1.0, foreach=True)
        thread = threading.Thread(target=clip_elsewhere)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "clip_grad_norm_ in another thread did not end in 30 s"
    assert seen and all(d == torch.device("cpu") for _, d in seen)
    # the other thread's groupings were not reported here
    assert {ident for ident, _ in seen} == {threading.get_ident()}
    assert other_thread_seen == [True]  # it ran through the wrapper, which passed it through
    assert torch._C._group_tensors_by_device_and_dtype is original  # restored on exit


# -- aten operators --------------------------------------------------------------------------------

def test_an_ops_schema_overload_and_entry_point():
    op = torch.ops.aten.add_.Tensor
    assert isinstance(op, tc.OpOverload)
    schema = tc.op_schema(op)
    assert schema.name == "aten::add_" and schema.is_mutable
    assert [a.name for a in schema.arguments][:2] == ["self", "other"]
    assert schema.arguments[0].alias_info.is_write
    assert tc.op_overload_name(op) == "Tensor"
    assert tc.op_overload_name(torch.ops.aten.mm.default) == "default"
    entry = tc.op_entry_point(torch.ops.aten.mul.Tensor)
    assert entry(torch.full((2,), 3.0), torch.full((2,), 2.0)).tolist() == [6.0, 6.0]


def test_the_dispatcher_answers_which_kernels_an_op_has():
    assert tc.has_kernel_for("aten::mm", "CPU")
    assert tc.has_kernel_for("aten::t", "CompositeExplicitAutograd")
    assert not tc.has_kernel_for("aten::t", "CPU")
    assert tc.has_kernel_for("aten::_scaled_dot_product_flash_attention_for_cpu", "CPU")


# -- tensor subclasses, fx graphs, inductor, norm layers ------------------------------------------

def test_a_wrapper_subclass_has_metadata_and_runs_torch_functions_as_torchs_own():
    class Meta(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            raise NotImplementedError

    t = tc.make_wrapper_subclass(Meta, (2, 3), dtype=torch.float16, device="cpu",
                                 requires_grad=False, strides=(3, 1))
    assert isinstance(t, Meta) and t.shape == (2, 3) and t.dtype == torch.float16
    with tc.DisableTorchFunctionSubclass():
        assert torch.ones(2).add(1).tolist() == [2.0, 2.0]


def test_a_make_fx_graph_keeps_its_structure_in_its_code_generator():
    gm = make_fx(lambda xs: [xs[0] + 1, xs[1] * 2])([torch.ones(2), torch.ones(2)])
    info = tc.graph_codegen(gm.graph).pytree_info
    assert info.out_spec is not None
    assert tc.tree_unflatten([1, 2], info.out_spec) == [1, 2]
    graph = torch.fx.Graph()
    tc.set_graph_codegen(graph, tc.graph_codegen(gm.graph))
    assert tc.graph_codegen(graph) is tc.graph_codegen(gm.graph)


def test_inductors_standalone_compile_and_artifact_loader_exist():
    assert callable(tc.resolve(tc._STANDALONE_COMPILE))
    assert callable(tc.resolve(tc._COMPILED_ARTIFACT).load)
    tc.import_for_unpickling_graphs()


def test_the_norm_layer_bases():
    assert issubclass(torch.nn.BatchNorm2d, tc.BatchNormBase)
    assert issubclass(torch.nn.SyncBatchNorm, tc.BatchNormBase)
    assert issubclass(torch.nn.InstanceNorm1d, tc.NormBase)
    assert not issubclass(torch.nn.LayerNorm, tc.NormBase)


def test_pytree_flattens_as_cstream_expects():
    leaves, spec = tc.tree_flatten({"a": torch.ones(1), "b": [2, torch.zeros(1)]})
    assert isinstance(spec, tc.TreeSpec) and len(leaves) == 3
    assert tc.tree_leaves((1, [2, 3])) == [1, 2, 3]
    assert tc.tree_map_only(int, lambda x: x + 1, (1, "s", [2])) == (2, "s", [3])
    assert tc.tree_unflatten(leaves, spec)["b"][0] == 2


def test_a_spec_rebuilt_by_dataclasses_replace_as_programs_for_older_torch_do():
    """The Model Zoo 2.10 Trainer turns tuples into lists with ``dataclasses.replace``, which
    passes TreeSpec's field names (``_context``, ``_children``) to its constructor."""
    import dataclasses

    import cerebras.pytorch  # noqa: F401  (a Cerebras program's import installs the shim)

    def tuples_to_lists(spec):
        if spec.num_children == 0:
            return spec
        children = [tuples_to_lists(spec.child(i)) for i in range(spec.num_children)]
        return dataclasses.replace(spec, type=list if spec.type is tuple else spec.type,
                                   children_specs=children)

    leaves, spec = tc.tree_flatten({"a": (1, (2, 3)), "b": [4]})
    assert tc.tree_unflatten(leaves, tuples_to_lists(spec)) == {"a": [1, [2, 3]], "b": [4]}
    leaf = tc.TreeSpec(None, None, [])
    assert dataclasses.replace(leaf) == leaf
    assert tc.accept_treespec_field_names()  # installed once; a second call changes nothing


def test_a_summary_writers_event_file_is_the_file_it_writes(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(tmp_path))
    path = Path(tc.summary_event_file(writer))
    writer.close()
    assert path.parent == tmp_path and path.name.startswith("events.out.tfevents.")
    assert path.is_file()


def test_a_name_torch_no_longer_has_fails_the_import_naming_it():
    """As a torch without ``_foreach_neg`` and ``_subclasses.fake_tensor.FakeTensor`` would."""
    proc = _run_python("import torch, torch._subclasses.fake_tensor as f\n"
                       "del torch._foreach_neg, f.FakeTensor\n"
                       "import workers.torch_compat\n")
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ImportError: torch {torch.__version__} lacks 2 private name(s)"), last
    assert "torch:_foreach_neg (multi-tensor arithmetic" in last
    assert "torch._subclasses.fake_tensor:FakeTensor (the placeholders' type" in last


def test_the_fake_cuda_guard_is_installed_from_the_main_thread_only_where_torch_needs_one():
    needed = torch.backends.cuda.is_built() and not torch.cuda.is_available()
    assert tc.install_fake_cuda_guard_here() is needed
    in_thread = []
    t = threading.Thread(target=lambda: in_thread.append(tc.install_fake_cuda_guard_here()))
    t.start()
    t.join(timeout=60)
    assert in_thread == [False]


def test_a_backend_then_fake_modes_and_a_backward_pass_after_the_warm_up_thread_ended():
    """With torch 2.11+cu130 on a machine without a GPU, the warm-up thread's fake mode left
    the process's CUDA device guard freed when the thread ended: the next backward pass or
    fake mode was a segmentation fault. (A CPU-only torch has no CUDA guard to free.)"""
    proc = _run_python("import torch, cstream\n"
                       "from executor.engine import warmup\n"
                       "from workers.torch_compat import FakeTensorMode\n"
                       "b = cstream.backend('CSX', in_process=True)\n"
                       "warmup.wait()\n"
                       "x = torch.ones(3, requires_grad=True)\n"
                       "(2 * x).sum().backward()\n"
                       "with FakeTensorMode():\n"
                       "    pass\n"
                       "b.shutdown()\n"
                       "print(x.grad.tolist())\n",
                       env={"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[2.0, 2.0, 2.0]"
