"""Ray's private names, in one place: what cstream passes to Ray beyond its public API."""

from __future__ import annotations


def embedded_init_kwargs(metrics: bool) -> dict:
    """``ray.init`` arguments of the embedded cluster: every server on loopback, and (unless
    ``metrics``) the metrics exporter off, in the driver and in every process Ray starts."""
    kwargs: dict = {"_node_ip_address": "127.0.0.1"}
    if not metrics:
        kwargs["_system_config"] = {"enable_metrics_collection": False}
    return kwargs
