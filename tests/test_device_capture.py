"""A step captured for a CUDA wafer holds no op or device argument tied to the CPU.

Runs without a GPU: ``validate_only`` traces the step for ``device="cuda"`` and reports what in
the graph cannot run there (executor.engine.devices); the models are those the suite trains on
CSX. The engine's passes are also checked on plain ``make_fx`` graphs, and a retargeted graph is
run on the ``meta`` device, where a tensor left on the CPU meets one on the target and fails.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import cstream as cstorch
from executor.engine.devices import (DeviceBoundError, check_device_clean, device_bound_ops,
                                     neutral_dispatch, op_runs_on, retarget)
from helpers.models import TinyLM, lm_batches, mlp, mse, next_token, vectors


# -- the engine's passes on plain graphs -----------------------------------------------------------

def attention_step(x, w):
    """A causal attention layer's forward and backward, with a position index made in the step."""
    q = (x @ w).view(2, 8, 4, 4).transpose(1, 2)
    a = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    positions = torch.arange(x.shape[1])
    loss = a.sum() + positions.float().sum()
    loss.backward()
    return loss, w.grad


def attention_inputs(device="cpu"):
    return torch.randn(2, 8, 16, device=device), torch.randn(16, 16, device=device,
                                                             requires_grad=True)


def test_a_cpu_capture_holds_the_cpu_attention_kernel_and_a_cpu_device():
    gm = make_fx(attention_step)(*attention_inputs())
    found = device_bound_ops(gm, "cuda")
    assert any("_scaled_dot_product_flash_attention_for_cpu.default has no kernel for cuda" in f
               for f in found), found
    assert any("aten.arange.default is given device cpu" in f for f in found), found
    with pytest.raises(DeviceBoundError, match=r"cannot run on cuda: \d+ of its nodes") as e:
        check_device_clean(gm, "cuda")
    assert "_scaled_dot_product_flash_attention_for_cpu" in str(e.value)
    assert device_bound_ops(gm, "cpu") == []  # where it was made, it runs


def test_neutral_dispatch_and_retarget_make_the_graph_run_anywhere():
    with neutral_dispatch("cuda"):
        gm = make_fx(attention_step)(*attention_inputs())
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert "aten._scaled_dot_product_flash_attention_for_cpu.default" not in ops
    assert {"aten.bmm.default", "aten._safe_softmax.default"} <= ops  # the math path
    assert [f for f in device_bound_ops(gm, "cuda") if "no kernel" in f] == []
    assert any("given device cpu" in f for f in device_bound_ops(gm, "cuda"))
    retarget(gm, "meta")
    assert device_bound_ops(gm, "meta") == []
    # every tensor the graph makes is on the target: run on meta inputs, a CPU tensor would
    # meet a meta one and fail
    loss, grad = gm(*attention_inputs("meta"))
    assert loss.device.type == grad.device.type == "meta" and grad.shape == (16, 16)


def test_neutral_dispatch_leaves_a_cpu_capture_and_torchs_settings_as_they_were():
    mkldnn = torch.backends.mkldnn.enabled
    with neutral_dispatch("cpu"):
        cpu = make_fx(attention_step)(*attention_inputs())
    with neutral_dispatch("cuda"):
        assert torch.backends.mkldnn.enabled is False
    assert torch.backends.mkldnn.enabled is mkldnn
    plain = make_fx(attention_step)(*attention_inputs())
    assert cpu.code == plain.code
    assert retarget(plain, "cpu").code == cpu.code


def test_an_lstm_takes_no_onednn_kernel_for_a_gpu():
    lstm = torch.nn.LSTM(4, 4)

    def step(x):
        y, _ = lstm(x)
        loss = y.sum()
        loss.backward()
        return loss

    x = torch.randn(3, 2, 4)
    saved = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = True  # as by default, where oneDNN is built in
    try:
        bound = device_bound_ops(make_fx(step)(x), "cuda")
        with neutral_dispatch("cuda"):
            neutral = device_bound_ops(retarget(make_fx(step)(x), "cuda"), "cuda")
    finally:
        torch.backends.mkldnn.enabled = saved
    if torch.backends.mkldnn.is_available():
        assert any("mkldnn_rnn_layer" in f for f in bound), bound
    assert neutral == []


def test_the_dispatcher_knows_cpu_kernels():
    """Where torch has the backend compiled in, the dispatcher decides (the CPU always)."""
    aten = torch.ops.aten
    assert op_runs_on(aten.mm.default, "cpu") and op_runs_on(aten.t.default, "cpu")
    assert op_runs_on(aten._scaled_dot_product_flash_attention_for_cpu.default, "cpu")
    if not torch.backends.cuda.is_built():
        # CUDA's own attention kernel: no CPU kernel; a CPU-only torch decides for CUDA by name
        assert not op_runs_on(aten._scaled_dot_product_flash_attention.default, "cpu")
        assert op_runs_on(aten.mm.default, "cuda")
        assert not op_runs_on(aten.mkldnn_rnn_layer.default, "cuda")


# -- the models the suite trains on CSX, traced for a CUDA wafer ----------------------------------

def validate_for(device: str, build, input_fn, loss_of, adam=True, clip=None,
                 half=None) -> dict:
    """Trace one training step of ``build()`` for ``device`` with validate_only (nothing
    runs); the backend's report."""
    if half is not None:
        cstorch.amp.set_half_dtype(half)
    backend = cstorch.backend("CSX", in_process=True, validate_only=True, device=device)
    try:
        torch.manual_seed(0)
        model = build()
        compiled = cstorch.compile(model, backend)
        opt = (cstorch.optim.AdamW(model.parameters(), lr=2e-3) if adam
               else cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))

        @cstorch.trace
        def step(batch):
            loss = loss_of(compiled, batch)
            loss.backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            opt.zero_grad()
            return loss

        executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn),
                                                   num_steps=1)
        for batch in executor:
            step(batch)
        return dict(backend.last_compile)
    finally:
        backend.shutdown()
        cstorch.amp.enable_mixed_precision(False)
        cstorch.amp.use_bfloat16(False)


OWN_MODELS = {
    "mlp": (mlp, vectors, mse, {}),
    "tiny_lm_sdpa_causal": (TinyLM, lm_batches, next_token, {"clip": 1.0}),
}


@pytest.mark.parametrize("name", sorted(OWN_MODELS))
def test_a_step_for_cuda_holds_nothing_tied_to_the_cpu(name):
    build, input_fn, loss_of, extra = OWN_MODELS[name]
    report = validate_for("cuda", build, input_fn, loss_of, **extra)
    assert report["validated"] and report["device"] == "cuda" and report["ops"] > 20
    assert report["device_bound_ops"] == []


def test_the_report_for_the_cpu_checks_nothing_and_the_graph_is_the_cpus_own():
    report = validate_for("cpu", TinyLM, lm_batches, next_token)
    assert report["device"] == "cpu" and report["device_bound_ops"] == []


ZOO = ["gpt2", "bert_mlm", "llama", "resnet_batchnorm", "dropout", "bf16_autocast",
       "gpt2_padded_clipped", "deepcopied_layers", "mixed_precision_fp16", "mixed_precision_bf16"]


@pytest.mark.parametrize("name", ZOO)
def test_a_zoo_step_for_cuda_holds_nothing_tied_to_the_cpu(name):
    pytest.importorskip("transformers")
    from test_model_zoo import CASES

    case = CASES[name]
    assert case.micro_batches == 1
    report = validate_for("cuda", case.build, case.input_fn, case.loss, adam=case.adam,
                          clip=case.clip, half=case.half)
    assert report["ops"] > 20
    assert report["device_bound_ops"] == []


def test_an_op_called_by_its_cpu_name_is_reported_for_cuda():
    def loss_of(compiled, batch):
        x, y = batch
        h = compiled(x).view(1, 1, 4, 1).expand(1, 1, 4, 8)
        a = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(h, h, h)[0]
        return ((a.mean(-1) - y.view(1, 1, 4)) ** 2).mean()

    report = validate_for("cuda", mlp, vectors, loss_of)
    assert any("_scaled_dot_product_flash_attention_for_cpu" in f
               for f in report["device_bound_ops"]), report["device_bound_ops"]


# -- the wafer's devices, as the capture's read guard sees them -------------------------------------

class CreatesItsOwn(torch.nn.Module):
    """Tensors the step makes itself (no state in them), moved to their own device, and
    clip_grad_norm_, whose devices come from torch's grouping by device."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x):
        pos = torch.arange(8).float()
        pos = pos.to(pos.device) / 8
        return self.lin(x + pos.unsqueeze(0).to(device=pos.device))


def test_moves_to_the_devices_of_step_tensors_and_of_torchs_grouping_are_no_reads():
    def run(kind, **options):
        torch.manual_seed(0)
        backend = cstorch.backend(kind, **options)
        model = CreatesItsOwn()
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.SGD(model.parameters(), lr=0.05)
        losses = []

        @cstorch.trace
        def step(batch):
            loss = mse(compiled, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad()
            return loss

        @cstorch.step_closure
        def keep(loss):
            losses.append(loss.item())

        executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(vectors),
                                                   num_steps=3)
        for batch in executor:
            keep(step(batch))
        backend.shutdown()
        return losses

    cpu = run("CPU")
    assert len(cpu) == 3
    assert run("CSX", in_process=True) == cpu
