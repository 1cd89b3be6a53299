"""cstream on a Ray cluster of 3 nodes on this machine, losing an input node and the wafer
driver's node.

The rest of the suite shares one embedded Ray per session (tests/conftest.py); a cluster needs
its own, so ``tests/multinode_cluster.py`` builds it, runs both scenarios and shuts it down in a
process of its own (this module never touches the session's Ray). Every node is a real Ray node
on 127.0.0.1 (raylet, object store, worker processes); "losing a node" is SIGKILL of its input
workers and of the node's own processes, as a machine that dies.
"""

from __future__ import annotations

import pytest

from helpers.cli import multinode_runs


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory):
    return multinode_runs(tmp_path_factory.mktemp("multinode"))


def _per_node(places: dict) -> dict:
    count: dict = {}
    for where in places.values():
        count[where["node_id"]] = count.get(where["node_id"], 0) + 1
    return count


def test_input_workers_are_spread_over_the_nodes_and_the_profile_names_each_ones_node(
        cluster_runs):
    run = cluster_runs["input_node"]
    assert sorted(_per_node(run["places_before"]).values()) == [2, 2, 2]
    profile_nodes = {w["node_id"] for w in run["workers"][0]["workers"]}
    assert len(run["workers"][0]["workers"]) == 6 and None not in profile_nodes
    assert all(w["node_ip"] == "127.0.0.1" for w in run["workers"][0]["workers"])
    # the process of each worker never restarted, as it said (a replacement still starting
    # when the run ended is shown where it was placed)
    assert all(w["pid"] for w in run["workers"][0]["workers"] if not w["restarts"])
    # the report names them too: 3 on each of the 2 nodes left
    assert sorted(n["node_id"] for n in run["report"]["worker_nodes"]) == sorted(
        w["node_id"] for w in run["workers"][0]["workers"])
    assert "input workers per node" in run["summary"]


def test_an_input_node_lost_mid_run_costs_no_batch_and_the_report_says_when(cluster_runs):
    run = cluster_runs["input_node"]
    # 150 steps of 2 samples: the exact single-process sequence, nothing lost or repeated
    assert run["seen"] == [float(i) for i in range(300)]
    events = run["report"]["restart_events"]
    lost = sorted(name for name, w in run["places_before"].items()
                  if w["node_id"] == run["killed_node"])
    assert sorted(f"cstream-csx0-w{e['local_worker_id']}" for e in events) == lost
    assert run["report"]["worker_restarts"] == 2  # once each: no replacement died again
    for e in events:
        assert e["died_on"].startswith(run["killed_node"][:12])
        assert not e["restarted_on"].startswith(run["killed_node"][:12])
        assert e["t_unix"] >= run["killed_unix"] and e["step"] >= run["killed_at_step"] - 1
        assert e["cause"]
        row = f"CS-X 0 worker {e['local_worker_id']} restart 1"
        assert row in run["summary"] and f"died on node {e['died_on']}" in run["summary"]
    assert run["killed_node"] not in {w["node_id"] for w in run["workers"][0]["workers"]}


def test_the_numbers_a_lost_worker_owed_go_to_the_workers_still_running(cluster_runs):
    events = cluster_runs["input_node"]["report"]["restart_events"]
    assert sum(e["numbers_owed"] for e in events) > 0
    assert [e["handed_to_live_workers"] for e in events] == [e["numbers_owed"] for e in events]


def test_losing_the_drivers_node_raises_the_first_failure_naming_node_and_checkpoint(
        cluster_runs):
    run = cluster_runs["driver_node"]
    assert run["driver_node"] != run["head"]
    error = run["error"]
    assert error is not None and error["type"] == "DriverError"
    msg = error["message"]
    assert msg.startswith("the wafer driver actor died during ")
    assert not msg.startswith("the wafer driver actor died during finish")
    assert f"on node {run['driver_node'][:12]} (127.0.0.1)" in msg
    assert "The newest checkpoint step of this run is step 20" in msg
    assert error["cause"] is not None and error["cause"] != "DriverError"
    assert error["context"] != "DriverError"  # no second failure raised over the first
    assert run["steps_seen"] >= 25


def test_losing_the_drivers_node_stops_the_input_workers_on_the_other_nodes(cluster_runs):
    run = cluster_runs["driver_node"]
    assert run["survivors"] == 4
    # started by the client, they would live as long as it: cstream killed them
    assert run["survivors_gone_after_s"] is not None
    assert "cstream stopped the " in run["error"]["message"]
