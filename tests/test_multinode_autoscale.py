"""An autoscaled run on a Ray cluster of 3 nodes on this machine (tests/multinode_cluster.py,
run ``autoscaled``, in a process of its own): the workers it adds are spread over the nodes,
and a node lost mid-run is survived as in a fixed-count run, nothing lost or repeated."""

from __future__ import annotations

import pytest

from helpers.cli import multinode_runs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return multinode_runs(tmp_path_factory.mktemp("multinode_autoscale"), "autoscaled")["autoscaled"]


def test_the_workers_an_autoscaled_run_adds_are_spread_over_the_nodes(run):
    places = run["places_before_kill"]
    per_node: dict = {}
    for where in places.values():
        per_node[where["node_id"]] = per_node.get(where["node_id"], 0) + 1
    assert run["counts"][0] == 1
    assert len(places) >= 2, run["counts"][::20]  # it added workers before the kill
    # each new worker went to the node with the fewest of the CS-X's workers
    assert max(per_node.values()) - min(per_node.values()) <= 1 and len(per_node) == min(
        3, len(places)), per_node


def test_a_node_lost_mid_autoscaled_run_costs_no_batch_and_its_workers_come_back_elsewhere(run):
    # 900 steps of 2 samples: the exact single-process sequence, nothing lost or repeated
    assert run["seen"] == [float(i) for i in range(1800)]
    lost = {name for name, w in run["places_before_kill"].items()
            if w["node_id"] == run["killed_node"]}
    events = run["report"]["restart_events"]
    assert lost and len(events) >= len(lost)
    for e in events:
        assert e["died_on"].startswith(run["killed_node"][:12])
        assert not e["restarted_on"].startswith(run["killed_node"][:12])
    assert run["killed_node"] not in {w["node_id"] for w in run["workers"][0]["workers"]
                                      if not w.get("retired")}
