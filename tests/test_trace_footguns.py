"""Every way a traced step behaves differently from eager PyTorch (Cerebras' pages on static graphs
and on tracing rules).

Each test says what eager PyTorch would give, and shows what the static graph gives instead.
"""

from __future__ import annotations

import pytest
import torch

import cstream as cstorch
from cstream.errors import CompileError


def _setup(num_steps=5, **backend_options):
    backend = cstorch.backend("CSX", in_process=True, **backend_options)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    compiled = cstorch.compile(model, backend)

    def input_fn():
        g = torch.Generator().manual_seed(0)
        return [(torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g))
                for _ in range(4)]

    loader = cstorch.utils.data.DataLoader(input_fn)
    executor = cstorch.utils.data.DataExecutor(loader, num_steps=num_steps)
    return backend, compiled, executor


@pytest.mark.parametrize("retrace_every_iteration, calls_in_five_steps", [(False, 1), (True, 5)])
def test_a_python_counter_in_the_step_goes_up_once_unless_retraced_every_iteration(
        retrace_every_iteration, calls_in_five_steps):
    # eager: 5 (the function body runs every step); traced: once, or every step with
    # retrace_every_iteration
    _, model, executor = _setup(retrace_every_iteration=retrace_every_iteration)
    calls = []

    @cstorch.trace
    def step(batch):
        calls.append(1)
        x, y = batch
        return ((model(x) - y) ** 2).mean()

    for batch in executor:
        step(batch)
    assert len(calls) == calls_in_five_steps


def test_a_python_value_read_in_the_step_is_frozen_at_its_first_value():
    # eager: the scale would be 1, 2, 3, 4 on successive steps; traced: always the first one
    _, model, executor = _setup(num_steps=4)
    scale = {"value": 1.0}
    seen = []

    @cstorch.step_closure
    def record(out):
        seen.append(out.item())

    @cstorch.trace
    def step(batch):
        x, _ = batch
        return model.bias.sum() * 0 + scale["value"]

    for batch in executor:
        record(step(batch))
        scale["value"] += 1.0
    assert seen == [1.0, 1.0, 1.0, 1.0]


def test_a_python_loop_whose_length_changes_is_a_compile_error_under_retracing():
    _, model, executor = _setup(retrace_every_iteration=True)
    n = {"layers": 1}

    @cstorch.trace
    def step(batch):
        x, y = batch
        out = model(x)
        for _ in range(n["layers"]):
            out = out * 2
        n["layers"] += 1
        return ((out - y) ** 2).mean()

    with pytest.raises(CompileError, match=r"changed at step 2: op #\d+"):
        for batch in executor:
            step(batch)


def test_a_loop_with_a_fixed_length_is_unrolled_and_runs_every_step():
    _, model, executor = _setup(num_steps=3)
    seen = []

    @cstorch.step_closure
    def record(out):
        seen.append(out.clone())

    @cstorch.trace
    def step(batch):
        x, _ = batch
        acc = torch.zeros_like(x[:, 0])
        for i in range(3):
            acc = acc + x[:, i]
        return acc

    batches = []
    for batch in executor:
        record(step(batch))
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        x, _ = torch.randn(3, 4, generator=g), torch.randn(3, 2, generator=g)
        batches.append(x[:, 0] + x[:, 1] + x[:, 2])
    for got, want in zip(seen, batches):
        assert torch.equal(got, want)


READS = {
    "item": ("loss.item()", ".item()"),
    "bool": ("bool(loss > 0)", "bool()"),
    "if": ("1 if loss > 0 else 0", "bool()"),
    "print": ("print(loss)", "printing a tensor"),
    "repr": ("repr(loss)", "printing a tensor"),
    "int": ("int(loss)", "int()"),
    "float": ("float(loss)", "float()"),
    "tolist": ("loss.tolist()", ".tolist()"),
    "numpy": ("loss.numpy()", ".numpy()"),
    "cpu": ("loss.cpu()", ".cpu()"),
    "to_cpu": ("loss.to('cpu')", ".to('cpu')"),
}


@pytest.mark.parametrize("kind", sorted(READS))
def test_reading_a_tensor_inside_the_step_raises_a_tracing_error_with_the_source_line(kind):
    _, model, executor = _setup()
    code, what = READS[kind]

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = ((model(x) - y) ** 2).mean()
        eval(code, {"loss": loss})  # the read under test
        return loss

    with pytest.raises(cstorch.TracingError) as info:
        for batch in executor:
            step(batch)
    msg = str(info.value)
    assert what in msg
    assert "test_trace_footguns.py" in msg and "eval(code" in msg
    assert "not allowed" in msg and "step_closure" in msg
    # a host move is told how to keep the tensor on the wafer; other reads, how to branch
    assert ("t.to(x.device)" if kind in ("cpu", "to_cpu") else "torch.where") in msg


@pytest.mark.parametrize("name", ["alpha", "value"])
def test_a_traced_tensor_where_torch_expects_a_python_scalar_is_a_clear_error(name):
    _, model, executor = _setup()

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = ((model(x) - y) ** 2).mean()
        if name == "alpha":
            return torch.add(loss, loss, alpha=loss)
        return torch.addcmul(loss, loss, loss, value=loss)

    with pytest.raises(cstorch.TracingError, match=f"`{name}=` was given a traced tensor"):
        for batch in executor:
            step(batch)


def test_torch_where_is_the_traced_replacement_for_a_python_branch():
    # eager with `if loss > 1: loss = loss * 0` would branch per step; torch.where does it in-graph
    _, model, executor = _setup(num_steps=4)
    seen = []

    @cstorch.step_closure
    def record(a, b):
        seen.append((a.item(), b.item()))

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = ((model(x) - y) ** 2).mean()
        clipped = torch.where(loss > 1.0, torch.zeros_like(loss), loss)
        record(loss, clipped)
        return clipped

    for batch in executor:
        step(batch)
    assert len(seen) == 4
    for loss, clipped in seen:
        assert clipped == (0.0 if loss > 1.0 else loss)


def test_a_tensor_from_outside_the_step_that_is_not_state_is_refused():
    _, model, executor = _setup()
    outside = torch.ones(2)

    @cstorch.trace
    def step(batch):
        x, _ = batch
        return model(x) * outside

    with pytest.raises(cstorch.TracingError, match="neither a state tensor"):
        for batch in executor:
            step(batch)


# what each value-dependent idiom is called in the error, and the fix it names
VALUE_SHAPED = {
    "mask": (lambda y: y[y > 0].sum(), "aten.nonzero",
             "boolean mask indexing `x[mask]`", "`torch.where(mask, x, 0)` instead of `x[mask]`"),
    "nonzero": (lambda y: y.nonzero().sum(), "aten.nonzero", "`nonzero()`",
                "`torch.where(mask, x, 0)` instead of `x[mask]`"),
    "unique": (lambda y: torch.unique(y).sum(), "aten._unique2", "(`unique()`)",
               "`torch.nn.functional.one_hot(x, n).amax(0)`, with n the number of values"),
    "masked_select": (lambda y: torch.masked_select(y, y > 0).sum(), "aten.masked_select",
                      "(`masked_select`)",
                      "`torch.where(mask, x, 0)` instead of `x.masked_select(mask)`"),
}


def _value_shaped_error(kind, **backend_options):
    op = VALUE_SHAPED[kind][0]
    backend = cstorch.backend("CSX", **backend_options)
    model = cstorch.compile(torch.nn.Linear(4, 2), backend)
    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(lambda: [torch.ones(3, 4)] * 2), num_steps=2)

    @cstorch.trace
    def step(x):
        return op(model(x))

    try:
        with pytest.raises(cstorch.TracingError) as info:
            for batch in executor:
                step(batch)
    finally:
        backend.shutdown()
    return info


@pytest.mark.parametrize("kind", sorted(VALUE_SHAPED))
def test_an_op_whose_output_shape_depends_on_values_is_a_short_error_with_the_fix(kind):
    # eager: runs, with a shape that changes with the values; traced: refused at trace time
    op, op_name, idiom, fix = VALUE_SHAPED[kind]
    info = _value_shaped_error(kind, in_process=True)
    msg = str(info.value)
    # the user's line: where the op is written
    assert msg.startswith(f"{op_name} at {__file__}:{op.__code__.co_firstlineno} (`\"{kind}\": ")
    assert "is an operation whose output shape depends on tensor values" in msg
    assert idiom in msg and f"Fix: {fix}" in msg
    # torch's own exception is not chained onto it, and the traceback ends in cstream's capture
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert len(info.traceback) <= 6


def test_on_ray_boolean_indexing_in_the_step_is_the_same_error(ray_session):
    info = _value_shaped_error("mask")
    assert str(info.value).startswith("aten.nonzero at ")
    assert "output shape depends on tensor values (boolean mask indexing `x[mask]`" in \
        str(info.value)
