"""Runs the tests record: what the wafer saw, step by step, and a small training run written as
the porting guide's user code."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

import cstream as cstorch


@dataclass
class Recorded:
    """What a recorded run saw: ``seen`` (every value the wafer's steps returned, flat, or one
    list a step), the loader's ``states`` at the checkpoint steps (by step index), its
    ``executor``, and the exception of a type in ``expect`` that ended it (or None)."""

    seen: list
    states: dict = field(default_factory=dict)
    executor: object = None
    error: BaseException | None = None


def first_part(batch):
    """A dict batch's ``"x"``, else the batch's first element (a tensor's first row)."""
    return batch["x"] if isinstance(batch, dict) else batch[0]


def whole_batch(batch):
    """The batch itself (a tensor of sample ids)."""
    return batch


def record_run(kind, input_fn, steps, cs_config=None, *, resume=None, checkpoint_steps=None,
               value=first_part, per_step=False, expect=(), loader_options=None,
               **options) -> Recorded:
    """Run ``steps`` steps of a step that returns ``value(batch)`` unchanged, on a ``kind``
    backend made with ``options``; record every value the wafer saw (``per_step``: a list a
    step) and ``DataLoader(input_fn, **loader_options)``'s state at the checkpoint steps. The
    backend is shut down at the end, also on an error."""
    backend = cstorch.backend(kind, **options)
    compiled = cstorch.compile(torch.nn.Linear(1, 1), backend)
    run = Recorded(seen=[])

    @cstorch.trace
    def step(batch):
        x = value(batch)
        return x + compiled.weight.sum().to(x.dtype) * 0

    @cstorch.step_closure
    def record(x):
        if per_step:
            run.seen.append(x.tolist())
        else:
            run.seen.extend(x.reshape(-1).to(torch.int64).tolist())

    loader = cstorch.utils.data.DataLoader(input_fn, **(loader_options or {}))
    if resume is not None:
        loader.load_state_dict(resume)

    @cstorch.checkpoint_closure
    def checkpoint(i):
        run.states[i] = loader.state_dict()

    run.executor = cstorch.utils.data.DataExecutor(loader, num_steps=steps, cs_config=cs_config,
                                                   checkpoint_steps=checkpoint_steps)
    try:
        for i, batch in enumerate(run.executor):
            record(step(batch))
            if checkpoint_steps is not None:
                checkpoint(i)
    except expect as e:
        run.error = e
    finally:
        backend.shutdown()
    return run


@dataclass
class Trained:
    """A training run's losses (read in a step closure), the model's state at the checkpoint
    steps (by step index) and after the run, on the CPU."""

    losses: list
    snapshots: dict
    final: dict


def train_by_hand(kind, build, input_fn, *, steps, lr, momentum, cs_config=None,
                  checkpoint_steps=None, build_on_device=False, on_step=None,
                  **options) -> Trained:
    """SGD with momentum written as the porting guide's user code (the velocity made with
    ``cstorch.zeros_like``, the rate with ``cstorch.full``, the update in the traced step), on
    cross-entropy; ``build()`` is the model, made under the backend's device with
    ``build_on_device``; ``on_step(loss)`` is called after each step."""
    torch.manual_seed(0)
    backend = cstorch.backend(kind, **options)
    if build_on_device:
        with backend.device:
            model = build()
    else:
        model = build()
    compiled = cstorch.compile(model, backend)
    params = list(model.parameters())
    velocity = [cstorch.zeros_like(p) for p in params]
    rate = cstorch.full((), lr)
    run = Trained(losses=[], snapshots={}, final={})

    @cstorch.step_closure
    def record(loss):
        run.losses.append(loss.item())

    @cstorch.checkpoint_closure
    def checkpoint(i):
        run.snapshots[i] = {k: v.to("cpu").clone() for k, v in model.state_dict().items()}

    @cstorch.trace
    def step(batch):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(compiled(x), y)
        loss.backward()
        with torch.no_grad():
            for p, v in zip(params, velocity):
                v.mul_(momentum).add_(p.grad)
                p.sub_(v * rate)
                p.grad = None
        return loss

    executor = cstorch.utils.data.DataExecutor(
        cstorch.utils.data.DataLoader(input_fn), num_steps=steps, cs_config=cs_config,
        checkpoint_steps=checkpoint_steps)
    for i, batch in enumerate(executor):
        loss = step(batch)
        record(loss)
        if checkpoint_steps is not None:
            checkpoint(i)
        if on_step is not None:
            on_step(loss)
    run.final = {k: v.to("cpu").clone() for k, v in model.state_dict().items()}
    backend.shutdown()
    return run
