"""The sweep's answer from its rows: the fewest workers, one worker's rate and cost, what limited
the largest count, and the cluster extrapolation."""

from __future__ import annotations

import pytest

from cstream_tools.sweep_answer import answer, answer_lines, extrapolate


def row(w, utilisation, cores, occupancy=0.2, samples_per_s=None):
    return {"num_csx": 1, "num_workers_per_csx": w, "utilisation": utilisation,
            "input_cpu_cores": cores, "machine_cpus": 2, "mean_buffer_occupancy": occupancy,
            "buffer_batches": 4, "samples_per_s": samples_per_s or 100.0 * utilisation,
            "samples_per_batch": 8.0, "worker_batches_per_s": 10.0 if w == 1 else 9.0,
            "worker_cpu_s_per_batch": 0.05}


EXPERIMENT = {"cs_config": {"wafer_samples_per_sec": 100.0}}


def test_the_fewest_count_and_one_workers_figures_come_from_the_rows():
    a = answer([row(1, 0.6, 0.5), row(2, 0.97, 1.0), row(4, 0.99, 1.0)], 0.95, EXPERIMENT)
    assert (a["fewest_workers_per_csx"], a["utilisation_at_fewest"]) == (2, 0.97)
    # one worker produced 10 batches/s but the starved wafer got 60 samples/s = 7.5 batches/s
    # from it: the extrapolation takes the smaller
    assert a["worker"] == {"measured_at_workers_per_csx": 1, "batches_per_s": 10.0,
                           "delivered_batches_per_s": 7.5, "extrapolation_batches_per_s": 7.5,
                           "samples_per_s": 60.0, "cpu_s_per_batch": 0.05}
    assert a["largest"]["by"] == "wafer"
    assert a["wafer"]["source"].startswith("the experiment's cs_config")


@pytest.mark.parametrize("last, by", [
    (row(4, 0.7, 1.6), "cores"),            # the workers used 80% of the 2 cores
    (row(4, 0.7, 0.4, occupancy=3.5), "cores"),  # the buffer was full, the wafer still waited
    (row(4, 0.7, 0.4), "pipeline"),         # cores free, buffer empty: more workers help
    (dict(row(4, 0.9, 0.4, occupancy=3.9), starved_fraction=0.02, client_bound_fraction=0.08),
     "client"),                             # the wafer waited for the client's steps
])
def test_what_limited_the_largest_count(last, by):
    a = answer([row(1, 0.3, 0.2), last], 0.95, EXPERIMENT)
    assert a["fewest_workers_per_csx"] is None
    assert a["largest"]["by"] == by
    assert answer_lines(a)[1] == "  no worker count in the sweep keeps the wafer >= 95% busy"


def test_the_extrapolation_is_stated_as_one_and_says_whether_the_cluster_fits():
    e = extrapolate(wafer_samples_per_s=100, samples_per_batch=8, worker_batches_per_s=10,
                    cpu_s_per_batch=0.05, num_csx=16, target=0.95, nodes=2, cores_per_node=4)
    # 12.5 batches/s per CS-X: 0.95 * 12.5 / 10 -> 2 workers; 16 * 12.5 * 0.05 = 10 cores
    assert (e["workers_per_csx"], e["workers"], e["cores"]) == (2, 32, 10.0)
    assert (e["cores_per_node"], e["fits"], e["nodes_needed"]) == (5.0, False, 3)
    a = answer([row(1, 0.6, 0.5), row(2, 0.97, 1.0)], 0.95, EXPERIMENT,
               {"samples_per_s": 100.0, "source": "--wafer-samples-per-sec", "caveat": None},
               {"num_csx": 16, "nodes": 2, "cores_per_node": 4})
    assert answer_lines(a)[-1] == (
        "  extrapolation from one worker's rate (7.5 batches/s, 60.0 samples/s) and cost (not "
        "measured): 16 CS-X need 2 workers "
        "per CS-X (32 in all) and 10.00 cores of input work; on 2 input nodes x 4 cores: 5.00 "
        "cores per node, does not fit (needs 3 such nodes)")


def test_a_wafer_slower_than_its_set_speed_and_the_notes_are_said():
    a = answer([row(1, 0.97, 0.5, samples_per_s=60.0)], 0.95, EXPERIMENT,
               notes=["train_input.num_workers is 2: ..."])
    lines = answer_lines(a)
    assert lines[1] == ("  note: the simulated wafer reached 60.0 samples/s per CS-X, 60% of its "
                        "set speed (its pacing shares this machine's cores); the counts hold for "
                        "the speed it reached")
    assert "  note: train_input.num_workers is 2: ..." in lines


def test_a_count_that_kept_the_buffer_full_below_the_fewest_is_noted():
    first = dict(row(1, 0.94, 0.2, occupancy=3.9), starved_fraction=0.015,
                 client_bound_fraction=0.045)
    a = answer([first, row(2, 0.93, 0.3, occupancy=3.9), row(4, 0.96, 0.4, occupancy=3.9)],
               0.95, EXPERIMENT)
    assert a["fewest_workers_per_csx"] == 4
    assert a["notes"] == [
        "at 1 worker per CS-X the input buffer already held 3.9 of its 4 batches when steps "
        "began, so the workers kept up (the wafer waited 1.5% of its time for input and 4.5% for "
        "the client, on this machine's shared cores); 1 per CS-X may suffice where the wafer and "
        "its client have cores of their own"]
    assert answer([row(1, 0.6, 0.2), row(2, 0.97, 0.3, occupancy=3.9)], 0.95,
                  EXPERIMENT)["notes"] == []
