"""Environment variables the user's process sets for the input workers' processes.

``cerebras.appliance.environment.appliance_environ`` (cstream.appliance.environment) records the
keys set through it here. A :class:`workers.dataloader.DataLoader` sent to an input worker carries
the values of those keys as they are when it is sent, and the worker puts them into its
``os.environ`` before calling ``input_fn``, so the DataLoader worker processes that ``input_fn``
starts inherit them.
"""

from __future__ import annotations

import os

_KEYS: set[str] = set()


def track(key: str) -> None:
    _KEYS.add(key)


def untrack(key: str) -> None:
    _KEYS.discard(key)


def tracked() -> list[str]:
    """The tracked keys that are set in this process, sorted."""
    return sorted(k for k in _KEYS if k in os.environ)


def snapshot() -> dict[str, str]:
    """The tracked variables and their values in this process."""
    return {k: os.environ[k] for k in tracked()}


def apply(env: dict[str, str] | None) -> None:
    """Set ``env`` in this process's ``os.environ``."""
    for key, value in (env or {}).items():
        os.environ[key] = value
