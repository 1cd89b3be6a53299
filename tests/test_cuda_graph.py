"""A CUDA wafer replays the captured step as a CUDA graph where the step can be recorded.

Without a GPU: the decision (recordable or not, and every reason) is made by a pure function
over the captured graph and its input spec (executor.wafer.cuda_graph.plan); it is checked
here on steps captured for ``device="cuda"`` with ``validate_only`` (nothing runs), and on
plain ``make_fx`` graphs of what cstream's capture refuses. The recording and replay
themselves are checked by the tests marked ``cuda``, which skip without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import cstream as cstorch
from executor.backends.options import CSXOptions
from executor.engine.errors import TracingError
from executor.wafer.cuda_graph import plan, spec_of
from helpers.models import TinyLM, lm_batches, mlp, mse, next_token, vectors

HAS_CUDA = torch.cuda.is_available()


def traced_for(build, input_fn, loss_of, num_steps=1, **options) -> dict:
    """One training step (Adam) of ``build()`` traced for a CUDA wafer with validate_only; the
    backend's report."""
    backend = cstorch.backend("CSX", in_process=True, validate_only=True, device="cuda",
                              **options)
    try:
        torch.manual_seed(0)
        model = build()
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.Adam(model.parameters(), lr=1e-3)

        @cstorch.trace
        def step(batch):
            loss = loss_of(compiled, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn),
                                                   num_steps=num_steps)
        for batch in executor:
            step(batch)
        return dict(backend.last_compile)
    finally:
        backend.shutdown()


class DropoutMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 32), torch.nn.Linear(32, 1)

    def forward(self, x):
        return self.b(torch.nn.functional.dropout(torch.relu(self.a(x)), 0.25, self.training))


# -- recordable steps ------------------------------------------------------------------------------

@pytest.mark.parametrize("build, input_fn, loss_of", [
    (mlp, vectors, mse), (TinyLM, lm_batches, next_token), (DropoutMLP, vectors, mse)],
    ids=["mlp_adam", "lm_sdpa_causal", "dropout"])
def test_a_captured_training_step_is_recordable(build, input_fn, loss_of):
    report = traced_for(build, input_fn, loss_of)
    assert report["cuda_graph"] == {"option": "auto", "recordable": True, "why_not": []}
    assert report["ops"] > 20


def test_dropout_draws_from_the_wafers_generator_which_a_graph_can_record():
    """The dropout mask's op takes a generator, so the replay passes the wafer's own; a CUDA
    graph registers that generator and advances it on every replay."""
    def f(x):
        return torch.nn.functional.dropout(x, 0.5, True)

    gm = make_fx(f)(torch.randn(4, 4))
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert "aten.bernoulli_.float" in ops
    assert plan(gm, [((4, 4), torch.float32, "cuda")], "cuda").record


# -- steps that cannot be recorded -----------------------------------------------------------------

def test_value_shaped_ops_are_refused_by_capture_and_named_by_the_plan():
    """A boolean mask's ``nonzero`` (``x[x > 0]``) has a shape the host must read: cstream's
    capture refuses it in the step; in a graph that holds it (plain make_fx), the plan names
    both ops and says why."""
    def masked(compiled, batch):
        x, y = batch
        out = compiled(x)
        return out[out > 0].sum() + torch.nonzero(y).float().sum()

    with pytest.raises(TracingError):
        traced_for(mlp, vectors, masked)

    def f(x):
        return x[x > 0].sum(), torch.nonzero(x)

    gm = make_fx(f)(torch.randn(5))
    got = plan(gm, [((5,), torch.float32, "cuda")], "cuda")
    assert not got.record
    assert got.reasons == (
        "index: aten.index.Tensor makes an output whose shape depends on values "
        "(data-dependent shape; the host must read it)",
        "nonzero: aten.nonzero.default makes an output whose shape depends on values "
        "(data-dependent shape; the host must read it)")


def test_indexing_by_position_is_fixed_in_shape_and_recordable():
    def f(x, idx):
        return x[idx] * 2

    gm = make_fx(f)(torch.randn(6, 3), torch.tensor([0, 2, 5]))
    assert "aten.index.Tensor" in [str(n.target) for n in gm.graph.nodes]
    assert spec_of([torch.randn(6, 3, device="meta")]) == [((6, 3), torch.float32, "meta")]
    assert plan(gm, [((6, 3), torch.float32, "cuda"), ((3,), torch.int64, "cuda")], "cuda").record


def test_a_host_read_is_named_with_its_op():
    def f(x):
        return x * x.sum().item()

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(5))
    reasons = plan(gm, [((5,), torch.float32, "cuda")], "cuda").reasons
    assert reasons[0] == ("_local_scalar_dense: aten._local_scalar_dense.default reads a value "
                          "on the host (a synchronisation the graph cannot hold)")
    assert any("shape that is not fixed" in r for r in reasons[1:]), reasons


def test_control_flow_on_a_value_is_named():
    def f(x):
        return torch.cond(x.sum() > 0, lambda x: x + 1, lambda x: x - 1, (x,))

    gm = make_fx(f)(torch.randn(3))
    assert plan(gm, [((3,), torch.float32, "cuda")], "cuda").reasons == (
        "cond: cond is control flow on a value (dynamic control flow); a CUDA graph replays one "
        "path",)


def test_a_cpu_op_in_the_step_makes_it_unrecordable():
    def loss_of(compiled, batch):
        x, y = batch
        h = compiled(x).view(1, 1, 4, 1).expand(1, 1, 4, 8)
        a = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(h, h, h)[0]
        return ((a.mean(-1) - y.view(1, 1, 4)) ** 2).mean()

    report = traced_for(mlp, vectors, loss_of)
    graph = report["cuda_graph"]
    assert graph["recordable"] is False
    cpu = [r for r in graph["why_not"] if r.endswith("(a CPU op)")]
    assert cpu and all("_scaled_dot_product_flash_attention_for_cpu" in r for r in cpu), graph
    assert len(cpu) == len(report["device_bound_ops"])


def test_a_cpu_tensor_among_the_inputs_makes_it_unrecordable():
    gm = make_fx(lambda x, s: x * s)(torch.randn(3), torch.tensor(2.0))
    got = plan(gm, [((3,), torch.float32, "cuda:0"), ((), torch.float32, "cpu")], "cuda:0")
    assert got.reasons == ("input 1 ([] torch.float32) is a CPU tensor: a graph would keep the "
                           "value it had when recorded",)


def test_retrace_every_iteration_and_the_option_turn_it_off_and_say_so():
    report = traced_for(mlp, vectors, mse, retrace_every_iteration=True)
    assert report["cuda_graph"] == {
        "option": "auto", "recordable": False,
        "why_not": ["retrace_every_iteration=True traces the step again every iteration"]}
    report = traced_for(mlp, vectors, mse, cuda_graph=False)
    assert report["cuda_graph"]["why_not"] == ["cuda_graph=False"]


def test_a_cpu_wafer_records_no_graph():
    gm = make_fx(lambda x: x + 1)(torch.randn(3))
    assert plan(gm, [((3,), torch.float32, "cpu")], "cpu").reasons == (
        "the wafer runs on cpu; CUDA graphs need device='cuda'",
        "input 0 ([3] torch.float32) is a CPU tensor: a graph would keep the value it had when "
        "recorded")


def test_the_option_takes_true_false_or_auto_and_true_needs_a_cuda_wafer():
    assert CSXOptions().cuda_graph == "auto"
    assert CSXOptions(device="cuda", cuda_graph=True).cuda_graph is True
    with pytest.raises(ValueError, match=r'cuda_graph=\'yes\'\): choose True, False or "auto"'):
        CSXOptions(cuda_graph="yes")
    with pytest.raises(ValueError, match=r"cuda_graph=1\): choose"):
        CSXOptions(cuda_graph=1)
    with pytest.raises(ValueError, match=r"CUDA graphs are recorded on a CUDA wafer only\. Set "
                                         r'device="cuda"'):
        CSXOptions(cuda_graph=True)


# -- on a CUDA GPU: recording and replay ---------------------------------------------------------

def train(tmp_path, build, input_fn, loss_of, steps=8, checkpoint_steps=None, **options):
    """Train ``steps`` Adam steps on a CUDA wafer in this process; the losses read in a step
    closure every step, the final weights, the state at the checkpoint steps, the run's
    summary and its report."""
    torch.manual_seed(0)
    backend = cstorch.backend("CSX", device="cuda", in_process=True,
                              artifact_dir=tmp_path / f"run{len(list(tmp_path.iterdir()))}",
                              **options)
    try:
        model = build()
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.Adam(model.parameters(), lr=1e-3)
        losses, snapshots = [], {}

        @cstorch.trace
        def step(batch):
            loss = loss_of(compiled, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        @cstorch.step_closure
        def record(loss):
            losses.append(loss.item())

        @cstorch.checkpoint_closure
        def save(step_no):
            snapshots[step_no] = {k: v.clone() for k, v in model.state_dict().items()}

        executor = cstorch.utils.data.DataExecutor(
            cstorch.utils.data.DataLoader(input_fn), num_steps=steps,
            checkpoint_steps=checkpoint_steps)
        for batch in executor:
            record(step(batch))
            if executor.on_checkpoint_step:
                save(executor.user_iteration)
        weights = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        return losses, weights, snapshots, executor.summary, executor.report
    finally:
        backend.shutdown()


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU: torch.cuda.is_available() is False "
                                         "here")
@pytest.mark.parametrize("build, input_fn, loss_of", [
    (mlp, lambda: vectors(8), mse), (TinyLM, lambda: lm_batches(8), next_token),
    (DropoutMLP, lambda: vectors(8), mse)], ids=["mlp", "lm", "dropout"])
def test_the_graph_replay_gives_the_plain_replays_numbers(tmp_path, build, input_fn, loss_of):
    graphed = train(tmp_path, build, input_fn, loss_of, checkpoint_steps=4, cuda_graph=True)
    plain = train(tmp_path, build, input_fn, loss_of, checkpoint_steps=4, cuda_graph=False)
    assert graphed[0] == plain[0]  # the same kernels on the same device: bit for bit
    for k in plain[1]:
        assert torch.equal(graphed[1][k], plain[1][k]), k
    assert sorted(graphed[2]) == [4, 8]
    for s in graphed[2]:
        for k in graphed[2][s]:
            assert torch.equal(graphed[2][s][k], plain[2][s][k]), (s, k)
    report = graphed[3]["compile"]["cuda_graph"]
    assert report["recordable"] is True and report["recorded_at_step"] == 2, report
    assert report["replays"] == 7 and report["plain_steps"] == 1
    assert plain[3]["compile"]["cuda_graph"]["why_not"] == ["cuda_graph=False"]
    assert plain[3]["compile"]["cuda_graph"]["replays"] == 0
    for run in (graphed, plain):  # the device's own timing, from CUDA events
        assert run[4]["gpu_timed_steps"] >= 6 and 0 < run[4]["gpu_busy_fraction"] <= 1


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU: torch.cuda.is_available() is False "
                                         "here")
def test_the_eager_backend_copies_batches_to_the_gpu_through_pinned_memory():
    from executor.backends.cpu import _to_device

    batch = {"x": torch.randn(64, 8), "y": [torch.arange(64)]}
    moved = _to_device(batch, torch.device("cuda", 0))
    assert moved["x"].device.type == "cuda" and moved["y"][0].device.type == "cuda"
    assert torch.equal(moved["x"].cpu(), batch["x"]) and torch.equal(moved["y"][0].cpu(),
                                                                      batch["y"][0])
    assert not batch["x"].is_pinned()  # the user's tensor is left as it was
    back = _to_device(moved, "cpu", only_from=torch.device("cuda", 0))
    assert torch.equal(back["x"], batch["x"])  # read back synchronously: the values are there


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU: torch.cuda.is_available() is False "
                                         "here")
def test_the_inductor_step_is_recorded_too_and_gives_its_plain_replays_numbers(tmp_path):
    """compiler="inductor" (compiled before the first step, ~20 s cold): its functional step
    writes the state back inside the graph."""
    graphed = train(tmp_path, mlp, lambda: vectors(8), mse, compiler="inductor",
                    compile_dir=tmp_path / "cache", cuda_graph="auto")
    plain = train(tmp_path, mlp, lambda: vectors(8), mse, compiler="inductor",
                  compile_dir=tmp_path / "cache", cuda_graph=False)
    assert graphed[0] == plain[0]
    for k in plain[1]:
        assert torch.equal(graphed[1][k], plain[1][k]), k
    report = graphed[3]["compile"]["cuda_graph"]
    assert report["recorded_at_step"] == 2 and report["recorded_for"] == "inductor", report
