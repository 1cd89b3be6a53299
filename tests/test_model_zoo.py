"""Models users port, trained on CSX (Ray and in-process) against the CPU backend.

Tiny configs built in code (nothing is downloaded), random init, 10 steps each. Every CSX run
equals the CPU backend run at the same thread count bit for bit, and the default CPU backend
(all cores) within 1e-5 per step (1e-4 for weights after AdamW): eager PyTorch itself differs
between thread counts by about that much.

The first tests reproduce what users hit when porting (device idioms, seeds, plain-tensor step
arguments, a traced function reused, BatchNorm(momentum=None), transformers' mask check).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

import cstream as cstorch

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

THREADS = 1  # the thread count the "bit for bit" comparisons run at
VOCAB, SEQ, BATCH = 64, 16, 4


@pytest.fixture
def one_thread():
    """The CPU backend (and the in-process wafer) at THREADS threads, as the Ray wafer."""
    saved = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    yield
    torch.set_num_threads(saved)


def csx_options(where: str) -> dict:
    if where == "in_process":
        return {"in_process": True}  # the wafer computes with this process's threads
    return {"num_threads": THREADS}  # the Ray wafer computes with as many threads as the CPU run


def run_steps(step, executor):
    losses = []

    @cstorch.step_closure
    def keep(loss):
        losses.append(loss.item())

    for batch in executor:
        keep(step(batch))
    return losses


def executor_of(input_fn, steps, **kwargs):
    return cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn),
                                           num_steps=steps, **kwargs)


def vectors(n=10, rows=BATCH, cols=8, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, cols, generator=g), torch.randn(rows, 1, generator=g))
            for _ in range(n)]


# -- 1. device idioms ---------------------------------------------------------------------------

class DeviceIdioms(torch.nn.Module):
    """The ways library code keeps tensors together: none of them moves a value to the host."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 0.5, dtype=torch.float64))

    def forward(self, x):
        h = self.lin(x)
        pos = torch.arange(h.shape[-1], device=h.device).to(h.device)  # modeling_gpt2's idiom
        h = h + pos.to(device=h.device, dtype=h.dtype)
        h = h * self.scale.to(h)                      # .to(tensor): device and dtype of h
        h = h * self.scale.type_as(h)
        h = h + h.new_ones(h.shape) + h.new_zeros(8, device=x.device)
        h = h + torch.zeros_like(h, device=h.device) + h.to(torch.float64).to(h.dtype)
        h = h * h.new_full((8,), 0.5) + h.new_tensor([1.0] * 8) + torch.tensor(0.25, device=h.device)
        h = h * torch.ones(8, device=x.device, dtype=x.dtype).type(h.dtype)
        return _helper_to(h, ref=x)


def _helper_to(t, ref):
    return t.to(ref.device).to(ref.device, ref.dtype)


def test_device_idioms_of_library_code_trace_as_in_eager():
    def run(kind, **options):
        torch.manual_seed(0)
        backend = cstorch.backend(kind, **options)
        model = DeviceIdioms()
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.SGD(model.parameters(), lr=0.01)

        @cstorch.trace
        def step(batch):
            x, y = batch
            loss = ((compiled(x).mean(-1, keepdim=True) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        losses = run_steps(step, executor_of(vectors, 3))
        backend.shutdown()
        return losses

    cpu = run("CPU")
    assert len(cpu) == 3 and all(math.isfinite(v) for v in cpu)
    assert run("CSX", in_process=True) == cpu


HOST_READS = {
    "to_cpu_string": ("h.to('cpu')", ".to('cpu')"),
    "to_cpu_device": ("h.to(torch.device('cpu'))", ".to('cpu')"),
    "to_cpu_kwarg": ("h.to(device='cpu', dtype=torch.float64)", ".to('cpu')"),
    "cpu": ("h.cpu()", ".cpu()"),
}


@pytest.mark.parametrize("name", sorted(HOST_READS))
@pytest.mark.parametrize("caller", ["step", "library"])
def test_a_host_read_is_refused_whoever_calls_it(name, caller):
    """The decision looks at the arguments, not at who called: the same read inside a helper
    module (as library code would) is refused with that module's line."""
    code, what = HOST_READS[name]
    backend = cstorch.backend("CSX", in_process=True)

    class Library(torch.nn.Module):
        def forward(self, h):
            return eval(code, {"h": h, "torch": torch})  # the library's read

    lib = Library()

    @cstorch.trace
    def step(batch):
        x, _ = batch
        if caller == "step":
            return eval(code, {"h": x, "torch": torch})  # the user's read
        return lib(x)

    with pytest.raises(cstorch.TracingError) as info:
        run_steps(step, executor_of(vectors, 2))
    msg = str(info.value)
    assert what in msg and "reads a tensor's value" in msg and "eval(code" in msg
    assert "test_model_zoo.py" in msg and "step_closure" in msg
    if caller == "library":
        assert "inside test_model_zoo" in msg and "Library" in msg
    backend.shutdown()


def test_moving_a_traced_tensor_to_another_device_names_the_fix():
    backend = cstorch.backend("CSX", in_process=True)

    @cstorch.trace
    def step(batch):
        x, _ = batch
        return x.to("meta")

    with pytest.raises(cstorch.TracingError) as info:
        run_steps(step, executor_of(vectors, 2))
    msg = str(info.value)
    assert "moves a traced tensor to meta" in msg and "x.to(\"meta\")" in msg
    assert "t.to(x.device)" in msg
    backend.shutdown()


# -- 2. randomness ------------------------------------------------------------------------------

class DropoutMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Dropout(0.5),
            torch.nn.Linear(32, 32), torch.nn.Dropout(0.2), torch.nn.Linear(32, 1))

    def forward(self, x):
        return self.net(x)


def train_dropout(backend, steps=10, resume=None, checkpoint_steps=None):
    """``steps`` steps of the dropout MLP on ``backend`` (seeded with 0 first); returns the
    losses and the checkpoints ({step: what the checkpoint closure saved, read back})."""
    torch.manual_seed(0)
    model = DropoutMLP()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataloader = cstorch.utils.data.DataLoader(vectors, 12)
    if resume is not None:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        dataloader.load_state_dict(resume["dataloader"])
        cstorch.set_rng_state(resume["rng_state"])
    saved = {}

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = ((compiled(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    @cstorch.checkpoint_closure
    def checkpoint(i):
        cstorch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                      "dataloader": dataloader.state_dict(),
                      "rng_state": cstorch.get_rng_state()}, f"ckpt_{i}.h5")
        saved[i] = cstorch.load(f"ckpt_{i}.h5")

    executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=steps,
                                               checkpoint_steps=checkpoint_steps)
    losses = []

    @cstorch.step_closure
    def keep(loss):
        losses.append(loss.item())

    for i, batch in enumerate(executor, 1):
        keep(step(batch))
        checkpoint(i)
    return losses, saved


def test_dropout_masks_follow_the_users_seed(one_thread):
    """Runs of one CSX backend started after the same torch.manual_seed draw the same masks (the
    CPU backend's); another seed draws other masks. (On a Ray wafer:
    test_every_model_on_a_ray_wafer_equals_the_cpu_backend.)"""
    torch.manual_seed(0)
    backend = cstorch.backend("CSX", in_process=True)
    model = DropoutMLP()
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def step(batch):
        x, y = batch
        return ((compiled(x) - y) ** 2).mean()  # forward only: the weights stay as they are

    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.append(run_steps(step, executor_of(vectors, 10)))
    backend.shutdown()

    torch.manual_seed(0)
    backend = cstorch.backend("CPU")
    model = DropoutMLP()
    compiled = cstorch.compile(model, backend)
    torch.manual_seed(0)
    cpu = run_steps(step, executor_of(vectors, 10))
    backend.shutdown()
    assert runs[0] == runs[1] == cpu
    assert runs[2] != runs[0]
    assert len(set(cpu)) == len(cpu)  # fresh masks every step: no two losses alike


def test_a_resumed_run_draws_the_uninterrupted_runs_dropout_masks(ray_session, one_thread):
    with cstorch.backend("CPU") as cpu:
        cpu_full, cpu_saved = train_dropout(cpu, checkpoint_steps=4)
    with cstorch.backend("CPU") as cpu:
        cpu_resumed, _ = train_dropout(cpu, steps=6, resume=cpu_saved[4])
    assert cpu_resumed == cpu_full[4:]
    with cstorch.backend("CSX", **csx_options("ray")) as csx:
        full, saved = train_dropout(csx, checkpoint_steps=4)
        assert sorted(saved) == [4, 8, 10]  # the last step is a checkpoint step too
        # a new run, as after a restart: the weights, the optimizer, the input position and
        # the random stream come from the step-4 checkpoint
        resumed, _ = train_dropout(csx, steps=6, resume=saved[4])
    assert full == cpu_full
    assert saved[4]["rng_state"].dtype == torch.uint8
    assert torch.equal(saved[4]["rng_state"], cpu_saved[4]["rng_state"])
    assert resumed == full[4:]


def test_the_rng_state_is_read_on_checkpoint_steps_and_set_between_runs():
    backend = cstorch.backend("CSX", in_process=True)
    model = DropoutMLP()
    compiled = cstorch.compile(model, backend)
    errors = []

    @cstorch.trace
    def step(batch):
        x, _ = batch
        return compiled(x).sum()

    @cstorch.step_closure
    def read(_):
        for call in (cstorch.get_rng_state, lambda: cstorch.set_rng_state(torch.get_rng_state())):
            try:
                call()
            except RuntimeError as e:
                errors.append(str(e))

    for batch in executor_of(vectors, 2):
        read(step(batch))
    assert "inside a @cstream.checkpoint_closure" in errors[0]
    assert "Set it before iterating the executor" in errors[1]
    with pytest.raises(TypeError, match="uint8 tensor cstream.get_rng_state"):
        cstorch.set_rng_state([1, 2])
    backend.shutdown()


# -- 4. plain-tensor arguments, 5. a traced function in several runs ---------------------------

def test_a_plain_tensor_argument_is_a_graph_input_fed_every_step():
    def run(kind):
        torch.manual_seed(0)
        backend = cstorch.backend(kind, **({"in_process": True} if kind == "CSX" else {}))
        model = torch.nn.Linear(8, 2)
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.SGD(model.parameters(), lr=0.1)

        @cstorch.trace
        def step(batch, weights):
            x, _ = batch
            loss = (compiled(x) * weights).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        losses = []

        @cstorch.step_closure
        def keep(loss):
            losses.append(loss.item())

        for i, batch in enumerate(executor_of(vectors, 6)):
            keep(step(batch, torch.tensor([1.0, -2.0]) * (1 + i // 2)))  # changes every 2 steps
        backend.shutdown()
        return losses

    assert run("CSX") == run("CPU")


@pytest.mark.timeout(180)  # a hang guard: a run that waits forever fails, a slow one not
def test_a_run_left_early_does_not_wait_for_plain_tensor_arguments_never_given():
    """The wafer waits for each step's arguments; a loop that breaks early stops it instead."""
    backend = cstorch.backend("CSX", in_process=True)
    model = torch.nn.Linear(8, 2)
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def step(batch, weights):
        x, _ = batch
        return (compiled(x) * weights).sum()

    seen = []
    for i, batch in enumerate(executor_of(vectors, 8)):
        seen.append(step(batch, torch.ones(2)))
        if i == 1:
            break
    assert len(seen) == 2
    backend.shutdown()


def test_one_traced_function_serves_runs_with_different_batch_sizes():
    def run(kind, **options):
        torch.manual_seed(0)
        backend = cstorch.backend(kind, **options)
        model = torch.nn.Linear(8, 1)
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.SGD(model.parameters(), lr=0.1)

        @cstorch.trace
        def step(batch):
            x, y = batch
            loss = ((compiled(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        losses = []
        for rows in (4, 6):
            losses.append(run_steps(step, executor_of(lambda: vectors(rows=rows), 3)))
        backend.shutdown()
        return losses

    csx = run("CSX", in_process=True)
    assert csx == run("CPU")
    assert len(csx) == 2 and len(csx[1]) == 3


def test_within_one_run_a_graph_that_changes_is_still_refused():
    backend = cstorch.backend("CSX", in_process=True, retrace_every_iteration=True)
    model = torch.nn.Linear(8, 1)
    compiled = cstorch.compile(model, backend)
    calls = []

    @cstorch.trace
    def step(batch):
        x, _ = batch
        calls.append(1)
        out = compiled(x)
        return out.sum() if len(calls) == 1 else out.mean()

    with pytest.raises(cstorch.errors.CompileError, match="changed at step 2"):
        run_steps(step, executor_of(vectors, 3))
    backend.shutdown()


# -- 6. BatchNorm(momentum=None), transformers' mask check ------------------------------------

def test_batchnorm_with_a_cumulative_average_names_the_module_and_the_fix():
    backend = cstorch.backend("CSX", in_process=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4, momentum=None))
    compiled = cstorch.compile(model, backend)

    @cstorch.trace
    def step(batch):
        x, _ = batch
        return compiled(x).sum()

    with pytest.raises(cstorch.TracingError) as info:
        run_steps(step, executor_of(vectors, 2))
    msg = str(info.value)
    assert "float() of a tensor" in msg and "inside torch.nn.BatchNorm1d `1`" in msg
    assert "momentum=None" in msg and "momentum=0.1" in msg
    assert "num_batches_tracked" in msg and "test_model_zoo.py" in msg
    backend.shutdown()


def test_a_transformers_mask_without_padding_takes_the_masked_path_on_the_wafer(one_thread):
    """transformers skips a mask of ones in eager; traced, its check takes the general path
    (the mask is built), which equals eager up to rounding."""
    def run(kind, **options):
        torch.manual_seed(0)
        with cstorch.backend(kind, **options):
            model = transformers.BertForMaskedLM(bert_config())
            compiled = cstorch.compile(model, cstorch.current_backend())

            @cstorch.trace
            def step(batch):
                return compiled(input_ids=batch["input_ids"], labels=batch["labels"],
                                attention_mask=torch.ones_like(batch["input_ids"])).loss

            return run_steps(step, executor_of(masked_tokens, 3))

    cpu, csx = run("CPU"), run("CSX", in_process=True)
    assert len(csx) == 3
    assert max(abs(a - b) for a, b in zip(cpu, csx)) <= 1e-5


# -- the zoo ------------------------------------------------------------------------------------

def tokens(n=10):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(n)]


def masked_tokens(n=10):
    """BERT's masked-LM batches: 15% of the tokens replaced by [MASK] (id 3) and predicted."""
    out = []
    for ids in tokens(n):
        g = torch.Generator().manual_seed(int(ids.sum()))
        chosen = torch.rand(ids.shape, generator=g) < 0.15
        out.append({"input_ids": torch.where(chosen, torch.full_like(ids, 3), ids),
                    "labels": torch.where(chosen, ids, torch.full_like(ids, -100))})
    return out


def images(n=10):
    g = torch.Generator().manual_seed(2)
    return [(torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g))
            for _ in range(n)]


def gpt2_config():
    return transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                   n_head=4, bos_token_id=0, eos_token_id=0)


def bert_config():
    return transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=SEQ, pad_token_id=0)


def llama_config():
    # RoPE, RMSNorm, SwiGLU (silu-gated MLP) and grouped-query attention (4 heads, 2 KV heads)
    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=SEQ,
                                    bos_token_id=0, eos_token_id=0, pad_token_id=0)


class BasicBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            torch.nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


class ResNet(torch.nn.Module):
    """ResNet-style: stem, two stages of basic blocks, global pooling, classifier."""

    def __init__(self, classes=5):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 1, 1, bias=False),
                                        torch.nn.BatchNorm2d(8), torch.nn.ReLU())
        self.layers = torch.nn.Sequential(BasicBlock(8, 8, 1), BasicBlock(8, 16, 2))
        self.fc = torch.nn.Linear(16, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


def lm_loss(compiled, ids):
    return compiled(input_ids=ids, labels=ids).loss


def mlm_loss(compiled, batch):
    return compiled(input_ids=batch["input_ids"], labels=batch["labels"]).loss


def cnn_loss(compiled, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(compiled(x), y)


def mse_loss(compiled, batch):
    x, y = batch
    return ((compiled(x) - y) ** 2).mean()


def bf16_loss(compiled, batch):
    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
    return ((out.float() - y) ** 2).mean()


def padded_tokens(n=10):
    """Causal-LM batches with right padding (id 0, attention_mask 0, label -100) in two rows."""
    out = []
    for ids in tokens(n):
        mask = torch.ones_like(ids)
        mask[1, SEQ - 4:] = 0
        mask[3, SEQ - 7:] = 0
        out.append({"input_ids": torch.where(mask.bool(), ids, 0), "attention_mask": mask,
                    "labels": torch.where(mask.bool(), ids, -100)})
    return out


def padded_lm_loss(compiled, batch):
    return compiled(**batch).loss


def half_vectors(dtype):
    """Inputs in ``dtype`` (16-bit: as the Model Zoo's pipelines make under mixed_precision) and
    int32 class labels."""
    def make(n=10):
        g = torch.Generator().manual_seed(4)
        return [(torch.randn(BATCH, 8, generator=g).to(dtype),
                 torch.randint(0, 3, (BATCH,), generator=g, dtype=torch.int32))
                for _ in range(n)]
    return make


def int32_images(n=10):
    return [(x, y.int()) for x, y in images(n)]


class LayerStack(torch.nn.Module):
    """Layer stacks made by deep copies, built under the backend's device: a ModuleList of
    copies of one block (the Model Zoo's transformers) and torch's TransformerEncoder (which
    copies its layer itself)."""

    def __init__(self):
        super().__init__()
        with cstorch.current_backend().device:
            block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
            self.inp = torch.nn.Linear(8, 16)
            self.blocks = torch.nn.ModuleList([copy.deepcopy(block) for _ in range(3)])
            layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.out = torch.nn.Linear(16, 3)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(self.encoder(h.view(BATCH, 2, 8).repeat(1, 1, 2)).mean(1))


def ce_loss(compiled, batch):
    x, y = batch
    return torch.nn.CrossEntropyLoss()(compiled(x), y)  # int32 labels, as the real stack takes


@dataclass
class Case:
    build: Callable[[], torch.nn.Module]
    input_fn: Callable
    loss: Callable
    adam: bool = True       # AdamW (weights compared at 1e-4 with the default CPU backend)
    micro_batches: int = 1  # gradient accumulation inside the step
    bf16: bool = False      # 16-bit matmuls: thread counts differ by the 16-bit rounding
    clip: Optional[float] = None  # torch.nn.utils.clip_grad_norm_ in the step
    half: Optional[torch.dtype] = None  # mixed precision with this half dtype


class BF16Net(torch.nn.Module):
    def __init__(self, outputs=1):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.GELU(),
                                       torch.nn.LayerNorm(64), torch.nn.Linear(64, outputs))

    def forward(self, x):
        return self.net(x)


CASES = {
    "gpt2": Case(lambda: transformers.GPT2LMHeadModel(gpt2_config()), tokens, lm_loss),
    "bert_mlm": Case(lambda: transformers.BertForMaskedLM(bert_config()), masked_tokens,
                     mlm_loss),
    "llama": Case(lambda: transformers.LlamaForCausalLM(llama_config()), tokens, lm_loss),
    "resnet_batchnorm": Case(ResNet, images, cnn_loss, adam=False),
    "dropout": Case(DropoutMLP, vectors, mse_loss, adam=False),
    "bf16_autocast": Case(BF16Net, vectors, bf16_loss, bf16=True),
    "grad_accumulation": Case(BF16Net, vectors, mse_loss, micro_batches=2),
    "gpt2_padded_clipped": Case(lambda: transformers.GPT2LMHeadModel(gpt2_config()),
                                padded_tokens, padded_lm_loss, clip=0.5),
    "deepcopied_layers": Case(LayerStack, half_vectors(torch.float32), ce_loss, adam=False,
                              clip=1.0),
    "int32_labels": Case(ResNet, int32_images, ce_loss, adam=False),
    "mixed_precision_fp16": Case(lambda: BF16Net(3), half_vectors(torch.float16), ce_loss, bf16=True,
                                 clip=1.0, half=torch.float16),
    "mixed_precision_bf16": Case(lambda: BF16Net(3), half_vectors(torch.bfloat16), ce_loss, bf16=True,
                                 half=torch.bfloat16),
}


def train(case: Case, backend, steps=10):
    """Losses and final state (model and optimizer) of ``steps`` steps of ``case``."""
    if case.half is not None:
        cstorch.amp.set_half_dtype(case.half)  # turns mixed precision on
    try:
        return _train(case, backend, steps)
    finally:
        cstorch.amp.enable_mixed_precision(False)
        cstorch.amp.use_bfloat16(False)


def _train(case: Case, backend, steps):
    torch.manual_seed(0)
    model = case.build()
    compiled = cstorch.compile(model, backend)
    if case.adam:
        opt = cstorch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.01)
    else:
        opt = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    @cstorch.trace
    def step(batch):
        if case.micro_batches == 1:
            loss = case.loss(compiled, batch)
            loss.backward()
        else:
            parts = zip(*(t.chunk(case.micro_batches) for t in batch))
            loss = 0
            for part in parts:
                micro = case.loss(compiled, part) / case.micro_batches
                micro.backward()
                loss = loss + micro.detach()
        if case.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), case.clip)
        opt.step()
        opt.zero_grad()
        return loss

    losses = run_steps(step, executor_of(case.input_fn, steps))
    final = {f"model.{k}": v.to("cpu").clone() for k, v in model.state_dict().items()}
    for i, s in enumerate(opt.state.values()):
        final.update({f"opt.{i}.{k}": v.to("cpu").clone() for k, v in s.items()
                      if isinstance(v, torch.Tensor)})
    return losses, final


def train_alone(case: Case, kind, threads: int, **options):
    """``train`` on a backend of its own, with ``threads`` threads in this process."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with cstorch.backend(kind, **options) as backend:
            return train(case, backend)
    finally:
        torch.set_num_threads(saved)


@pytest.fixture(scope="module")
def cpu_reference():
    """The CPU backend's run of a case at a thread count, computed once per module."""
    runs = {}

    def get(name: str, threads: int):
        if (name, threads) not in runs:
            runs[name, threads] = train_alone(CASES[name], "CPU", threads)
        return runs[name, threads]

    return get


def assert_same(run, reference, where):
    (losses, final), (ref_losses, ref_final) = run, reference
    assert losses == ref_losses, where  # bit for bit
    assert final.keys() == ref_final.keys()
    for k in ref_final:
        assert torch.equal(final[k], ref_final[k]), (where, k)


DEFAULT_THREADS = torch.get_num_threads()


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_model_on_the_in_process_wafer_equals_the_cpu_backend(name, cpu_reference):
    case = CASES[name]
    cpu = cpu_reference(name, THREADS)
    assert len(cpu[0]) == 10 and all(math.isfinite(v) for v in cpu[0])
    assert len(set(cpu[0])) > 1  # it trains
    assert_same(train_alone(case, "CSX", THREADS, in_process=True), cpu, f"{THREADS} threads")
    if DEFAULT_THREADS == THREADS:
        return
    # the default CPU backend (all cores): the wafer at that thread count equals it bit for
    # bit; eager at another thread count is as close as its own rounding allows
    default = cpu_reference(name, DEFAULT_THREADS)
    assert_same(train_alone(case, "CSX", DEFAULT_THREADS, in_process=True), default,
                f"{DEFAULT_THREADS} threads")
    loss_tol, weight_tol = (2 ** -8, 2 ** -8) if case.bf16 else (
        1e-5, 1e-4 if case.adam else 1e-5)
    assert max(abs(a - b) for a, b in zip(default[0], cpu[0])) <= loss_tol
    for k, v in cpu[1].items():
        if v.is_floating_point():
            assert torch.allclose(default[1][k], v, rtol=0, atol=weight_tol), k


# what the Model Zoo's programs do (the rest: models users port)
ZOO_HABITS = ("deepcopied_layers", "gpt2_padded_clipped", "int32_labels", "mixed_precision_bf16",
              "mixed_precision_fp16")


@pytest.mark.parametrize("group", ["ported", "zoo_habits"])
def test_every_model_on_a_ray_wafer_equals_the_cpu_backend(group, cpu_reference, ray_session):
    """One Ray wafer trains every model of the group in turn (one run each), at the CPU runs'
    thread count. The dropout model draws the CPU backend's masks: the wafer's stream is the
    client's seed."""
    names = [n for n in sorted(CASES) if (n in ZOO_HABITS) == (group == "zoo_habits")]
    references = {name: cpu_reference(name, THREADS) for name in names}
    with cstorch.backend("CSX", **csx_options("ray")) as backend:
        for name in names:
            assert_same(train(CASES[name], backend), references[name], name)


def test_evaluation_from_a_checkpoint_equals_the_cpu_backend(ray_session, one_thread, tmp_path):
    """Train a ResNet with BatchNorm on CSX, save on a checkpoint step; a fresh backend loads it
    and evaluates with model.eval() and torch.no_grad() (running statistics, no update)."""
    torch.manual_seed(0)
    backend = cstorch.backend("CSX", in_process=True)
    model = ResNet()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    @cstorch.trace
    def train_step(batch):
        loss = cnn_loss(compiled, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    @cstorch.checkpoint_closure
    def save(i):
        cstorch.save({"model": model.state_dict()}, tmp_path / f"ckpt_{i}.h5")

    for i, batch in enumerate(executor_of(images, 6, checkpoint_steps=6), 1):
        train_step(batch)
        save(i)
    backend.shutdown()

    def evaluate(kind, **options):
        backend = cstorch.backend(kind, **options)
        model = ResNet()
        model.load_state_dict(cstorch.load(tmp_path / "ckpt_6.h5")["model"])
        compiled = cstorch.compile(model, backend)
        compiled.eval()
        running = model.layers[1].bn2.running_var.to("cpu").clone()

        @cstorch.trace
        @torch.no_grad()
        def eval_step(batch):
            x, y = batch
            logits = compiled(x)
            return torch.nn.functional.cross_entropy(logits, y), (logits.argmax(-1) == y).sum()

        results = []

        @cstorch.step_closure
        def keep(loss, correct):
            results.append((loss.item(), correct.item()))

        for batch in executor_of(lambda: images(4), 4):
            keep(*eval_step(batch))
        after = model.layers[1].bn2.running_var.to("cpu").clone()
        backend.shutdown()
        assert torch.equal(running, after)  # eval mode: running statistics unchanged
        return results

    cpu = evaluate("CPU")
    assert evaluate("CSX", in_process=True) == cpu
    assert evaluate("CSX", **csx_options("ray")) == cpu


# -- what the Model Zoo's training flow does around the step -----------------------------------

def flow_run(kind, **options):
    """The flow's habits: an initial checkpoint before the run, get_last_lr() logged from a step
    closure and returned by the step, a norm summed into ``torch.tensor(0.0).to(model.device)``
    and clip_grad_norm_ in the step."""
    torch.manual_seed(0)
    with cstorch.backend(kind, **options) as backend:
        model = torch.nn.Linear(8, 1)
        compiled = cstorch.compile(model, backend)
        opt = cstorch.optim.SGD(model.parameters(), lr=0.1)
        sched = cstorch.optim.lr_scheduler.LinearLR(
            opt, initial_learning_rate=0.1, end_learning_rate=0.01, total_iters=4)
        logged, saved = [], {}

        @cstorch.trace
        def step(batch):
            x, y = batch
            norm = torch.tensor(0.0).to(compiled.device)
            for p in compiled.parameters():
                norm += torch.norm(p) ** 2
            loss = ((compiled(x) - y) ** 2).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            sched.step()
            opt.zero_grad()
            return loss, norm, sched.get_last_lr()

        @cstorch.step_closure
        def log(loss, norm, lr):
            logged.append((loss.item(), norm.item(), [float(v) for v in lr],
                           [float(v) for v in sched.get_last_lr()]))

        @cstorch.checkpoint_closure
        def save(i):
            saved[i] = {k: v.to("cpu").clone() for k, v in model.state_dict().items()}

        save(0)  # save_initial_checkpoint: before the executor exists
        assert saved == {}
        executor = executor_of(vectors, 4, checkpoint_steps=2)
        for i, batch in enumerate(executor, 1):
            log(*step(batch))
            save(i)
        return logged, saved


def test_the_flows_habits_around_the_step_match_the_cpu_backend(ray_session, one_thread):
    torch.manual_seed(0)
    initial = torch.nn.Linear(8, 1).state_dict()
    cpu_logged, cpu_saved = flow_run("CPU")
    assert sorted(cpu_saved) == [0, 2, 4]
    assert all(torch.equal(cpu_saved[0][k], v) for k, v in initial.items())
    rates = [lr for _, _, lr, _ in cpu_logged]
    assert rates == [[pytest.approx(0.1 - 0.09 * i / 4)] for i in range(1, 5)]
    assert [closure for *_, closure in cpu_logged] == rates
    for where in ("in_process", "ray"):
        logged, saved = flow_run("CSX", **csx_options(where))
        assert logged == cpu_logged, where
        assert sorted(saved) == [0, 2, 4]
        for i in saved:
            for k, v in cpu_saved[i].items():
                assert torch.equal(saved[i][k], v), (where, i, k)


def test_deep_copies_of_lazy_layers_start_equal_and_train_apart():
    with cstorch.backend("CSX", in_process=True) as backend:
        with backend.device:
            layer = torch.nn.Linear(4, 4)
            copies = torch.nn.ModuleList([copy.deepcopy(layer) for _ in range(2)])
        assert all(isinstance(p, torch.nn.Parameter) for p in copies.parameters())
        compiled = cstorch.compile(copies, backend)
        before = {k: v.to("cpu").clone() for k, v in copies.state_dict().items()}
        assert torch.equal(before["0.weight"], before["1.weight"])
        assert torch.equal(before["0.weight"], layer.weight.to("cpu"))
        opt = cstorch.optim.SGD(copies.parameters(), lr=0.5)

        @cstorch.trace
        def step(batch):
            x, _ = batch
            loss = compiled.model[0](x[:, :4]).square().mean()  # only the first copy learns
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        run_steps(step, executor_of(vectors, 2))
        after = {k: v.to("cpu").clone() for k, v in copies.state_dict().items()}
    assert not torch.equal(after["0.weight"], before["0.weight"])
    assert torch.equal(after["1.weight"], before["1.weight"])


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_mixed_precision_runs_the_matrix_products_in_the_half_dtype(half, one_thread):
    """Half inputs meet float32 weights under mixed precision (the backend's option), on CPU
    and CSX with the same numbers; the weights stay float32."""
    data = half_vectors(half)

    def run(kind, **options):
        torch.manual_seed(0)
        cstorch.amp.use_bfloat16(half == torch.bfloat16)
        with cstorch.backend(kind, mixed_precision=True, **options) as backend:
            model = BF16Net(3)
            compiled = cstorch.compile(model, backend)
            dtypes = []

            @cstorch.trace
            def step(batch):
                x, y = batch
                out = compiled(x)
                dtypes.append(out.dtype)
                return torch.nn.functional.cross_entropy(out, y)  # y: int32

            losses = run_steps(step, executor_of(data, 3))
            weight = model.net[0].weight.to("cpu").dtype
        cstorch.amp.use_bfloat16(False)
        return losses, dtypes[0], weight

    cpu = run("CPU")
    assert cpu[1:] == (half, torch.float32)
    assert run("CSX", in_process=True) == cpu
    with cstorch.backend("CPU"):  # without mixed precision torch refuses the mix
        with pytest.raises(RuntimeError, match="dtype"):
            BF16Net(3)(data()[0][0])


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_half_inputs_on_csx_autocast_as_the_real_system_does(half, one_thread):
    """A CSX backend given no mixed_precision (the Model Zoo's CSX call) autocasts a step whose
    batch holds half tensors to their dtype, as the real CSX accepts half inputs to float32
    weights; the numbers are the CPU backend's under mixed precision in that dtype.
    mixed_precision=False keeps torch's refusal."""
    data = half_vectors(half)

    def run(kind, **options):
        torch.manual_seed(0)
        with cstorch.backend(kind, **options) as backend:
            compiled = cstorch.compile(BF16Net(3), backend)

            @cstorch.trace
            def step(batch):
                x, y = batch
                return torch.nn.functional.cross_entropy(compiled(x), y)

            return run_steps(step, executor_of(data, 3))

    cstorch.amp.set_half_dtype(half)
    cpu = run("CPU", mixed_precision=True)
    cstorch.amp.enable_mixed_precision(False)
    assert run("CSX", in_process=True) == cpu
    with pytest.raises(Exception, match="dtype"):
        run("CSX", in_process=True, mixed_precision=False)


def test_the_half_dtype_setting_names_the_accepted_values():
    assert not cstorch.amp.mixed_precision()
    try:
        assert cstorch.amp.set_half_dtype("bfloat16") is torch.bfloat16
        assert cstorch.amp.mixed_precision() and cstorch.amp.get_half_dtype_str() == "bfloat16"
        assert cstorch.amp.get_floating_point_dtype() is torch.bfloat16
    finally:
        cstorch.amp.enable_mixed_precision(False)
        cstorch.amp.use_bfloat16(False)
    assert cstorch.amp.get_floating_point_dtype() is torch.float32
    with pytest.raises(ValueError, match="Invalid half dtype: torch.float32"):
        cstorch.amp.set_half_dtype(torch.float32)
    with pytest.raises(TypeError, match="mixed_precision: expected True or False"):
        cstorch.backend("CPU", mixed_precision="yes")


def shuffled_by_the_global_generator():
    """The Model Zoo's MNIST loader: a torch DataLoader with shuffle=True and no generator of
    its own, so its order comes from torch's global random state when it is iterated."""
    data = torch.utils.data.TensorDataset(torch.arange(32.0).reshape(32, 1))
    return torch.utils.data.DataLoader(data, batch_size=4, shuffle=True, drop_last=True)


def test_a_loader_shuffled_by_the_global_generator_streams_the_cpu_order_on_csx(ray_session):
    """An input worker starts from the client's torch random state as the run starts, so a
    seeded run shuffles as on the CPU backend; another seed shuffles otherwise."""
    def first_rows(seed, kind, **options):
        with cstorch.backend(kind, **options):
            torch.manual_seed(seed)
            compiled = cstorch.compile(torch.nn.Linear(1, 1), cstorch.current_backend())
            torch.randn(3)  # the client draws between seeding and the run, as a flow does

            @cstorch.trace
            def step(batch):
                (x,) = batch
                return compiled(x).sum(), x[:, 0]

            return run_steps(lambda b: step(b)[1].sum(), executor_of(
                shuffled_by_the_global_generator, 8))

    cpu = first_rows(5, "CPU")
    assert cpu != sorted(cpu)  # shuffled: the sums of an epoch in order would rise
    assert first_rows(5, "CSX", **csx_options("ray")) == cpu
    assert first_rows(6, "CSX", **csx_options("ray")) != cpu
