"""``SummaryWriter``: TensorBoard's writer whose step count starts at ``base_step``.

``cstream.summarize_scalar`` / ``summarize_tensor`` write the executor's step ``s`` (counted from
1) at ``base_step + s - 1``, so a resumed run that passes its first global step as ``base_step``
continues the curves. Steps the program passes to ``add_scalar`` itself are written as given.
:meth:`add_tensor` writes a tensor summary as a histogram.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter as _TorchSummaryWriter

from workers import torch_compat

from cstream.summaries import summarize_scalar, summarize_tensor  # noqa: F401  (Release 2.3's place)


class SummaryWriter(_TorchSummaryWriter):
    def __init__(self, log_dir=None, *args, base_step: int = 1, **kwargs):
        super().__init__(log_dir, *args, **kwargs)
        if isinstance(base_step, bool) or not isinstance(base_step, int) or base_step < 0:
            raise ValueError(f"SummaryWriter(base_step={base_step!r}): expected an int >= 0.")
        self.base_step = base_step
        # beside the event file, the Cerebras stack's folder for summaries outside TensorBoard's
        # format, named after it: events.out.tfevents.X -> events.out.csevents.X
        events_file = Path(torch_compat.summary_event_file(self))
        self.cs_events_dir = events_file.parent / events_file.name.replace(
            "events.out.tfevents.", "events.out.csevents.")
        self.cs_events_dir.mkdir(parents=True, exist_ok=True)

    def add_tensor(self, tag: str, tensor: torch.Tensor, global_step=None, walltime=None):
        """Write ``tensor`` under ``tag`` (as a histogram of its values)."""
        t = tensor.detach().to("cpu")
        if t.is_floating_point() and t.dtype != torch.float32:
            t = t.float()
        self.add_histogram(tag, t, global_step, walltime=walltime)
