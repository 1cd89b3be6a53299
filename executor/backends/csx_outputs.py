"""What comes back of the wafer's steps to the client of a CSX run: the outputs that stream
back (one ``collect`` call brings every step the wafer finished since the last one, and tells
the wafer how far the client is), outputs fetched one call each, the wafer's per-step figures,
and the acks that keep the wafer within the look-ahead in front of the client."""

from __future__ import annotations

from typing import Optional

from executor.backends.base import RunContext
from workers.flow import FlowPolicy


class WaferOutputs:
    """How far each side is, as steps counted from 0 (-1: none yet): :attr:`wafer_done`,
    :attr:`outputs_through`, :attr:`reported_done`. :attr:`streamed` names the outputs that
    stream back with every step (set once the step is compiled)."""

    def __init__(self, driver, policy: FlowPolicy, context: RunContext):
        self.driver, self.policy, self.context = driver, policy, context
        self.wafer_done = -1
        """The last step the wafer is known to have finished (by a collect, a fetch or an
        ack's reply)."""
        self.outputs_through = -1
        """The last step whose streamed outputs have been collected (the next collect starts
        after it); can trail :attr:`wafer_done`, which acks and fetches also move."""
        self.reported_done = -1
        """The last step the wafer has been told the client finished (by an ack or a
        collect)."""
        self.streamed: list[int] = []  # output indices that stream back for every step
        self.collect_calls = 0
        self.stats: dict[int, dict] = {}
        """The wafer's per-step figures received so far, by step (counted from 1)."""
        self._ack = None  # the last asynchronous ack, read when it is done
        # step -> (the collected stacked outputs holding it, its row in them)
        self._values: dict[int, tuple] = {}

    def step_done(self, step: int) -> None:
        """The client finished ``step``'s closures. The wafer hears of it with the next
        ``collect``, or by an asynchronous ack every ``lookahead // 2`` steps when the client
        has nothing to collect: the wafer stays between half and all of the look-ahead in
        front of the client, for a fraction of the calls."""
        self._values.pop(step, None)
        if step - self.reported_done < self.policy.ack_every_steps \
                and step != self.context.num_steps - 1:
            return
        # the previous ack, sent an ack's interval ago, is read only if its reply is back:
        # nothing here waits for the wafer
        if self._ack is not None and self._ack.ready():
            self.wafer_done = max(self.wafer_done, self._ack.result())  # raises a wafer failure
        self._ack = self.driver.ack_async(step)
        self.reported_done = step

    def collect(self, until: int, more: int = 0) -> None:
        """One round trip: the streamed outputs of every step the wafer finished since the
        last collect, once it has finished ``until`` (and, briefly, ``more`` steps after it);
        acknowledges the client's progress."""
        client_done = self.context.iteration() - 1  # the steps whose closures ran
        got = self.driver.collect(self.outputs_through + 1, until, self.streamed, client_done,
                                  more)
        self.collect_calls += 1
        self.reported_done = max(self.reported_done, client_done)
        if got.values:
            for s in range(max(got.first, client_done + 1), got.done + 1):
                self._values[s] = (got.values, s - got.first)
        self.outputs_through = max(self.outputs_through, got.done)
        self.wafer_done = max(self.wafer_done, got.done)
        self.add_stats(got.stats)

    def outputs_of(self, step: int, indices: list) -> list:
        """Outputs ``indices`` of ``step``: from the collected ones, else fetched."""
        if all(i in self.streamed for i in indices):
            if step > self.outputs_through:
                self.collect(step, more=self.policy.collect_more_steps)
            have = self._values.get(step)
            if have is not None:
                stacked, row = have
                return [stacked[self.streamed.index(i)][row] for i in indices]
        return self._fetch(step, indices)

    def _fetch(self, step: int, indices: list) -> list:
        """Outputs ``indices`` of ``step``, in a call of their own (waits for the wafer)."""
        values, stats = self.driver.fetch(step, indices)
        self.add_stats(stats)
        self.wafer_done = max(self.wafer_done, step)
        return values

    def add_stats(self, stats) -> None:
        for s in stats:
            self.stats[s["step"]] = s

    def newest(self, step: int) -> Optional[dict]:
        """The wafer's newest per-step figures, collected now if ``step`` (the client's) is
        past what came back."""
        if step > self.outputs_through:
            self.collect(step)
        return self.stats[max(self.stats)] if self.stats else None
