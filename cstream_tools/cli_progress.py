"""The progress display of ``cstream run``: start-up phases and a bar (or lines) on stderr."""

from __future__ import annotations

import sys
import time


def _rich_phase_column():
    from rich.progress import ProgressColumn
    from rich.text import Text

    class PhaseColumn(ProgressColumn):
        """The start-up phase under way with its elapsed time; then the run's figures."""

        def render(self, task):
            current = task.fields.get("phase")
            if current is not None:
                name, t0 = current
                return Text(f"{name} ... {time.perf_counter() - t0:.1f} s", style="cyan")
            return Text(task.fields.get("info", ""))

    return PhaseColumn()


class ProgressDisplay:
    """Progress on stderr, so that stdout holds only the result (the table, or JSON).

    Start-up phases (:mod:`executor.phases`: starting Ray, the wafer driver, the input workers,
    tracing, compiling, the first step) are shown as they run and with their times when they
    end. On a terminal: a rich progress bar; elsewhere a line per finished phase and a line
    every tenth of the run, each with the figures of the step it names.
    """

    def __init__(self, total: int, name: str, enabled: bool):
        from executor import phases

        self.total = total
        self.enabled = enabled
        self.tty = enabled and sys.stderr.isatty()
        self._bar = None
        self._next_line = 1
        self._stop_listening = phases.listen(self._phase) if enabled else None
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
            from rich.progress import TimeElapsedColumn

            self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), _rich_phase_column(),
                                 TimeElapsedColumn(), console=Console(stderr=True),
                                 transient=False)
            self._task = self._bar.add_task(name, total=total, info="", phase=None)
            self._bar.start()

    def _phase(self, event: str, name: str, elapsed_s: float) -> None:
        if event == "start":
            if self._bar is not None:
                self._bar.update(self._task, phase=(name, time.perf_counter()))
            return
        line = f"{name}: {elapsed_s:.2f} s"
        if self._bar is not None:
            self._bar.update(self._task, phase=None)
            self._bar.console.print(line)
        else:
            print(line, file=sys.stderr, flush=True)

    def wants(self, step: int) -> bool:
        """Whether step ``step`` (from 1) will be shown: its figures are then fetched for it."""
        return self.enabled and self._bar is None and (step >= self._next_line
                                                       or step == self.total)

    @staticmethod
    def _info(p) -> str:
        loss = "-" if p.loss is None else f"{p.loss:.4f}"
        if p.loss is not None and p.loss_step is not None and p.loss_step != p.step:
            loss += f" (step {p.loss_step})"
        rate = "-" if p.rate is None else f"{p.rate:,.1f}"
        fill = "-" if p.buffer_fill is None else f"{p.buffer_fill:.1f}"
        return f"loss {loss}  rate {rate} samples/s  buffer {fill} batches ready"

    def __call__(self, p) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=p.step, info=self._info(p))
        elif p.step >= self._next_line or p.step == p.num_steps:
            print(f"step {p.step}/{p.num_steps}  {self._info(p)}", file=sys.stderr, flush=True)
            self._next_line = p.step + max(1, p.num_steps // 10)

    def close(self) -> None:
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

