"""The Ray names and message texts cstream depends on beyond Ray's documented API, in one
place, each checked by ``tests/test_workers_compat.py`` against the installed Ray: a version
that changes one fails there, naming it.

>>> name_taken(ValueError("Actor with name 'x' already exists in the namespace y"))
True
>>> name_taken(ValueError("bad option"))
False
"""

from __future__ import annotations

from ray.exceptions import RayActorError

NAME_TAKEN_WORDS = ("already", "taken")
"""Words of the ValueError Ray raises when a named actor's name is in use (Ray has no error
class for it)."""


def name_taken(e: ValueError) -> bool:
    """Whether Ray refused to create a named actor because the name is in use."""
    return any(word in str(e) for word in NAME_TAKEN_WORDS)


def actor_init_failed(e: BaseException) -> bool:
    """Whether ``e`` (a :class:`ray.exceptions.RayActorError`) says the actor's constructor
    raised, rather than its process dying later."""
    return isinstance(e, RayActorError) and bool(e.actor_init_failed)


def embedded_init_kwargs(metrics: bool) -> dict:
    """``ray.init``'s private arguments for the embedded cluster: every server on loopback, and
    (unless ``metrics``) the metrics exporter off, in the driver and in every process Ray
    starts."""
    kwargs: dict = {"_node_ip_address": "127.0.0.1"}
    if not metrics:
        kwargs["_system_config"] = {"enable_metrics_collection": False}
    return kwargs
