"""Summaries: scalars a step writes to the run's TensorBoard writer (``cstream.summarize_scalar``,
after Cerebras' ``cerebras.pytorch.summarize_scalar``)."""

from __future__ import annotations

import torch

from cstream.closures import step_closure
from executor import runtime


def _writer_and_step():
    """The running DataExecutor's writer and the step its current step's summaries are written
    at; ``(None, None)`` without an executor or a writer."""
    executor = runtime.current_executor()
    writer = None if executor is None else executor.writer
    if writer is None:
        return None, None
    return writer, summary_step(executor, writer)


@step_closure
def _write_scalar(name: str, value) -> None:
    writer, step = _writer_and_step()
    if writer is None:
        return
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"summarize_scalar({name!r}, ...): expected a scalar (one element), got a tensor "
                f"of shape {tuple(value.shape)}. Reduce it first, e.g. value.mean().")
        value = value.item()
    writer.add_scalar(name, float(value), step)


def summary_step(executor, writer) -> int:
    """The step a summary of the executor's current step is written at: ``base_step + s - 1``
    for a :class:`cstream.utils.tensorboard.SummaryWriter`, ``s`` for another writer."""
    return getattr(writer, "base_step", 1) + executor.user_iteration - 1


@step_closure
def _write_tensor(name: str, value) -> None:
    writer, step = _writer_and_step()
    if writer is None:
        return
    if hasattr(writer, "add_tensor"):
        writer.add_tensor(name, value, step)
    else:
        writer.add_histogram(name, value.detach().float(), step)


def summarize_tensor(name: str, tensor: torch.Tensor) -> None:
    """Write ``tensor`` to the DataExecutor's ``writer`` under the tag ``name``, at every step
    (a histogram of its values; on CSX fetched at the end of the step, as
    :func:`summarize_scalar`)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"summarize_tensor: name must be a non-empty string, got {name!r}.")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"summarize_tensor({name!r}, ...): expected a tensor, got "
                        f"{type(tensor).__name__}.")
    if runtime.current_executor() is None:
        raise RuntimeError(
            f"summarize_tensor({name!r}, ...) was called outside a DataExecutor run; it writes "
            "to the executor's writer at the current step. Call it inside the traced step or "
            "the loop over the executor.")
    _write_tensor(name, tensor)


def summarize_scalar(name: str, scalar) -> None:
    """Write ``scalar`` to the DataExecutor's ``writer`` under the tag ``name``, at every step.

    Call it inside the traced step (or a step closure) with a 0-d tensor or a number. On the
    CSX backend the value is fetched from the wafer at the end of each step (a step closure);
    without a writer nothing is written.

    >>> import torch, cstream
    >>> from torch.utils.tensorboard import SummaryWriter
    >>> import tempfile
    >>> _ = cstream.backend("CPU", artifact_dir=tempfile.mkdtemp())
    >>> loader = cstream.utils.data.DataLoader(lambda: [torch.ones(2, 3)] * 4)
    >>> writer = SummaryWriter(tempfile.mkdtemp())
    >>> executor = cstream.utils.data.DataExecutor(loader, num_steps=3, writer=writer)
    >>> for batch in executor:
    ...     cstream.summarize_scalar("batch_sum", batch.sum())
    >>> writer.close()
    >>> cstream.current_backend().shutdown()
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"summarize_scalar: name must be a non-empty string (the TensorBoard "
                        f"tag), got {name!r}.")
    if runtime.current_executor() is None:
        raise RuntimeError(
            f"summarize_scalar({name!r}, ...) was called outside a DataExecutor run; it writes "
            "to the executor's writer at the current step. Call it inside the traced step or "
            "the loop over the executor.")
    _write_scalar(name, scalar)
