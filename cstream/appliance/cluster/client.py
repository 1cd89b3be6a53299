"""``TelemetryClient``: pushes a run's metrics to the cluster's telemetry service.

cstream has no cluster management service: the client keeps what is pushed, in order, in
``pushed`` (``(metrics, labels)`` pairs) and sends it nowhere; the settings are accepted without
effect.

>>> with TelemetryClient(None, max_buffer_size=2) as c:
...     c.push({"loss": 1.5}, labels={"step": "1"})
>>> c.pushed
[({'loss': 1.5}, {'step': '1'})]
"""

from __future__ import annotations

from typing import Optional


class TelemetryClient:
    def __init__(self, mgmt_client=None, max_buffer_size: int = 128,
                 max_buffer_seconds: int = 150):
        for name, value in (("max_buffer_size", max_buffer_size),
                            ("max_buffer_seconds", max_buffer_seconds)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TelemetryClient: {name} must be a positive integer, got "
                                 f"{value!r}.")
        self.mgmt_client = mgmt_client
        self.max_buffer_size = max_buffer_size
        self.max_buffer_seconds = max_buffer_seconds
        self.pushed: list[tuple[dict, dict]] = []

    def push(self, metrics: dict, labels: Optional[dict] = None) -> None:
        if not isinstance(metrics, dict):
            raise TypeError(f"TelemetryClient.push: metrics must be a dict of name to value, got "
                            f"{type(metrics).__name__}.")
        self.pushed.append((dict(metrics), dict(labels or {})))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
