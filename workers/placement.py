"""Where input workers run on a Ray cluster: spread over its live nodes, and a replacement
away from the node its predecessor died on.

Ray keeps listing a node whose raylet was killed as alive until its health checks fail (about
15 s here), and a worker placed there meanwhile dies too. So a node on which a worker just died
is *suspect* for :data:`SUSPECT_NODE_S` and gets no new worker while another node can take it.
Workers are placed with a soft ``NodeAffinitySchedulingStrategy``: where the chosen node is gone
by the time Ray schedules the actor, Ray places it elsewhere.
"""

from __future__ import annotations

import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

__all__ = ["NodePlacer", "SUSPECT_NODE_S", "live_nodes", "where"]

SUSPECT_NODE_S = 30.0
"""A node on which a worker died gets no replacement for this long (Ray needs ~15 s to
declare a killed node dead), unless no other node can take it."""


def live_nodes(min_cpus: float) -> list[dict]:
    """``{"node_id", "node_ip"}`` of the cluster's nodes that Ray lists alive and that have at
    least ``min_cpus`` CPUs, ordered by node id (the same order in every process)."""
    nodes = [{"node_id": n["NodeID"], "node_ip": n.get("NodeManagerAddress", "")}
             for n in ray.nodes()
             if n.get("Alive") and float(n.get("Resources", {}).get("CPU", 0)) >= min_cpus]
    return sorted(nodes, key=lambda n: n["node_id"])


def where() -> dict:
    """The node and process of the caller (an actor's method answers where the actor runs)."""
    import os

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
            "pid": os.getpid()}


class NodePlacer:
    """Chooses a node for each input worker: round-robin over the live nodes at the start
    (worker ``k`` of the run on node ``k % n``), and for a replacement the live node holding
    the fewest workers, leaving out suspect nodes (:meth:`suspect`) while another is live.

    Args:
        min_cpus: the CPUs an input worker reserves (a node with fewer cannot take one).
    """

    def __init__(self, min_cpus: float):
        self.min_cpus = min_cpus
        self._suspect: dict[str, float] = {}  # node id -> when a worker died there

    def suspect(self, node_id: str | None) -> None:
        """A worker died on ``node_id``: give it no new worker for :data:`SUSPECT_NODE_S`."""
        if node_id:
            self._suspect[node_id] = time.monotonic()

    def suspects(self) -> list[str]:
        now = time.monotonic()
        return [n for n, t in self._suspect.items() if now - t < SUSPECT_NODE_S]

    def initial(self, count: int, first: int = 0) -> list[dict | None]:
        """The nodes of the run's workers ``first`` to ``first + count - 1`` (counted over
        every CS-X): round-robin over the live nodes; None where Ray lists no node with room."""
        nodes = live_nodes(self.min_cpus)
        return [nodes[k % len(nodes)] if nodes else None for k in range(first, first + count)]

    def replacement(self, load: dict[str, int]) -> dict | None:
        """The node for a worker started again: the live, unsuspected node with the fewest
        workers (``load``: node id -> workers there); a suspect one only when no other node
        is live; None when Ray lists none."""
        nodes = live_nodes(self.min_cpus)
        bad = set(self.suspects())
        healthy = [n for n in nodes if n["node_id"] not in bad] or nodes
        if not healthy:
            return None
        return min(healthy, key=lambda n: load.get(n["node_id"], 0))

    @staticmethod
    def options(node: dict | None) -> dict:
        """Actor options that place it on ``node`` (soft: elsewhere if it is gone)."""
        if node is None:
            return {"scheduling_strategy": "SPREAD"}
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node["node_id"],
                                                                      soft=True)}
