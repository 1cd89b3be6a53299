"""Which tasks stream inputs and which receive outputs (see :mod:`.cluster_resolver`)."""

from __future__ import annotations

from typing import List

from cstream.distributed.cluster_resolver import ClusterResolver, ClusterSpec, TaskRole


class ServiceResolver:
    """Streamers are the input workers; the receiver is the master (the client)."""

    def __init__(self):
        self._resolver = ClusterResolver()

    @property
    def cluster_resolver(self) -> ClusterResolver:
        return self._resolver

    @property
    def cluster_spec(self) -> ClusterSpec:
        return self._resolver.cluster_spec

    def streamer_ordinals(self) -> List[int]:
        return [t.rank for t in self.cluster_spec.filter_tasks_by_role(TaskRole.WORKER)]

    def receiver_ordinals(self) -> List[int]:
        return [t.rank for t in self.cluster_spec.filter_tasks_by_role(TaskRole.MASTER)]


_RESOLVER = ServiceResolver()


def service_resolver() -> ServiceResolver:
    return _RESOLVER
