"""The autoscaling controller stepped by hand over recorded figures, and the autoscaling
settings' errors: no clock, no Ray."""

import json

import pytest

from cstream.utils import Autoscale, CSConfig
from executor.autoscale import (Action, Controller, CsxWindow, Observation, Phase,
                                WorkerWindow, observe)

CFG = Autoscale(min_workers_per_csx=1, max_workers_per_csx=8, window_steps=20,
                cooldown_steps=10)


def window(first, workers, *, step_s, wait_s=0.0, buffer=0.0, cpu=0.002, steps=20,
           batch_s=0.02, csx=0):
    """``steps`` steps of a wafer computing ``step_s`` each and waiting ``wait_s`` each for
    input, fed by ``workers`` workers that each produce a batch in ``batch_s`` using ``cpu``
    CPU seconds; the batches dealt evenly."""
    n = len(workers) if isinstance(workers, list) else workers
    batches = [steps // n + (1 if w < steps % n else 0) for w in range(n)]
    rates = workers if isinstance(workers, list) else [1 / batch_s] * n
    return CsxWindow(csx=csx, first_step=first, last_step=first + steps - 1,
                     wall_s=steps * (step_s + wait_s), compute_s=steps * step_s,
                     input_wait_s=steps * wait_s, mean_buffer_batches=buffer,
                     buffer_capacity=4,
                     workers=tuple(WorkerWindow(w, b, b / rates[w], b * cpu)
                                   for w, b in enumerate(batches)))


def one(c, first, workers, cpus=None, free=None, **kw):
    """The decision ``c`` makes over one :func:`window`, the cluster's CPUs as given."""
    w = window(first, workers, **kw)
    d, = c.step(Observation(step=w.last_step, csx=(w,), cluster_cpus=cpus, free_cpus=free))
    return d


def test_a_starving_wafer_gets_the_workers_that_produce_what_it_takes_in_one_decision():
    c = Controller(CFG, num_csx=1)
    # the wafer takes 1/0.007 = 142.9 batches/s, a worker makes 50/s: 3 are needed
    d = one(c, 1, 1, step_s=0.007, wait_s=0.013)
    assert (d.action, d.count, c.counts(), c.csx[0].phase) == (Action.ADD, 2, [3],
                                                                Phase.GROWING)
    assert d.reason == (
        "wafer 35.0% busy (target 95.0%), input wait 65.0%, buffer 0.0 of 4 batches over steps "
        "1-20: the wafer takes 142.9 batches/s and each worker produces 50.0/s, so 3 are "
        "needed; 1 worker -> 3")
    assert d.line().startswith("autoscale CS-X 0 at step 20: add 2 workers: wafer 35.0% busy")
    # 3 workers whose rate fell to 40/s each: 4 are needed
    d = one(c, 41, 3, step_s=0.007, wait_s=0.003, batch_s=0.025)
    assert (d.action, d.count, c.counts()) == (Action.ADD, 1, [4])


def test_a_window_inside_the_cool_down_decides_nothing():
    c = Controller(CFG, num_csx=1)
    one(c, 1, 1, step_s=0.007, wait_s=0.013)  # add at step 20: cool-down to step 30
    d = one(c, 21, 3, step_s=0.007, wait_s=0.013)
    assert (d.action, c.counts(), c.csx[0].phase) == (Action.HOLD, [3], Phase.COOLING_DOWN)
    assert d.reason == "cooling down: the figures from step 31 on decide"


def test_a_new_worker_that_delivered_nothing_yet_holds_the_decision():
    c = Controller(CFG, num_csx=1)
    one(c, 1, 1, step_s=0.007, wait_s=0.013)
    w = window(41, 2, step_s=0.007, wait_s=0.013)  # workers 0 and 1 delivered, 2 not yet
    w = CsxWindow(**{**w.__dict__, "workers": w.workers + (WorkerWindow(2, 0, 0.0, 0.0),)})
    d, = c.step(Observation(step=60, csx=(w,)))
    assert (d.action, c.counts()) == (Action.HOLD, [3])
    assert d.reason == ("waiting for 3 workers to deliver (worker 2 delivered nothing in "
                        "the window)")


def test_a_fed_wafer_with_a_buffer_not_full_holds_and_says_it_settled():
    c = Controller(CFG, num_csx=1, start=3)
    d = one(c, 1, 3, step_s=0.0194, wait_s=0.0006, buffer=1.5)
    assert (d.action, c.csx[0].phase, c.settled()[0]["settled_since"]) == (
        Action.HOLD, Phase.SETTLED, 1)
    assert d.reason == ("wafer 97.0% busy (target 95.0%), input wait 3.0%, buffer 1.5 of 4 "
                        "batches over steps 1-20: 3 workers keep it fed; the buffer is not "
                        "full, so no worker is spare")
    assert c.decisions == []


def test_a_full_buffer_retires_a_worker_the_others_can_carry():
    c = Controller(CFG, num_csx=1, start=4)
    # the wafer takes 1/0.01 = 100 batches/s; 3 workers make 150 >= 125 (25 % margin)
    d = one(c, 1, 4, step_s=0.01, buffer=3.8)
    assert (d.action, d.workers, c.counts(), c.csx[0].phase) == (
        Action.RETIRE, (3,), [3], Phase.SHRINKING)
    assert d.reason == (
        "wafer 100.0% busy (target 95.0%), input wait 0.0%, buffer 3.8 of 4 batches over steps "
        "1-20: the buffer stayed full and 3 workers produce 150.0 batches/s against the "
        "wafer's 100.0 (+25.0% margin: 125.0); 4 workers -> 3")
    # 2 workers would make 100 < 125: held
    d = one(c, 31, 3, step_s=0.01, buffer=3.8)
    assert (d.action, c.counts()) == (Action.HOLD, [3])
    assert d.reason.endswith("3 workers keep it fed; 2 workers would produce 100.0 batches/s, "
                             "under 125.0")


def test_a_retire_that_starved_the_wafer_is_undone_and_not_made_again():
    cfg = Autoscale(window_steps=20, cooldown_steps=10, retire_margin=0.1)
    c = Controller(cfg, num_csx=1, start=3)
    one(c, 1, 3, step_s=0.0185, buffer=3.9)  # 54/s taken, 2 make 100 >= 59.5: retire
    assert c.counts() == [2]
    d = one(c, 31, 2, step_s=0.0185, wait_s=0.005, batch_s=0.04)  # slower than thought
    assert (d.action, c.counts(), c.csx[0].floor["workers"]) == (Action.ADD, [3], 3)
    d = one(c, 61, 3, step_s=0.0185, buffer=3.9)
    assert (d.action, c.counts()) == (Action.HOLD, [3])
    assert d.reason.endswith("3 workers keep it fed; 2 workers starved it before")


def test_an_add_that_raised_no_production_is_undone_the_cores_are_the_limit():
    c = Controller(CFG, num_csx=1, start=2)
    d = one(c, 1, 2, step_s=0.005, wait_s=0.015, cpu=0.019)  # 200/s taken: 4 needed
    assert (d.action, c.counts()) == (Action.ADD, [4])
    # four workers on two cores produce what two did: 25/s each
    d = one(c, 31, 4, step_s=0.005, wait_s=0.015, batch_s=0.04, cpu=0.038)
    assert (d.action, d.workers, c.counts(), c.csx[0].phase) == (
        Action.RETIRE, (2, 3), [2], Phase.LIMITED)
    assert d.reason == (
        "the machine's cores are the limit: from 2 to 4 workers production went 100.0 -> 100.0 "
        "batches/s (+0.0, 100.0 expected); workers use 0.95 CPU each while producing. Keeping "
        "2 workers")
    d = one(c, 61, 2, step_s=0.005, wait_s=0.015, cpu=0.019)
    assert (d.action, c.counts(), c.csx[0].phase) == (Action.HOLD, [2], Phase.LIMITED)
    assert d.reason.endswith("the machine's cores are the limit: more than 2 workers did not "
                             "raise production")


def test_no_more_workers_than_the_cluster_has_cpus_free_for():
    c = Controller(CFG, num_csx=1)
    d = one(c, 1, 1, step_s=0.007, wait_s=0.013, cpu=0.018, cpus=2.0, free=0.3)
    assert (d.action, c.counts(), c.csx[0].phase) == (Action.HOLD, [1], Phase.LIMITED)
    assert d.reason.endswith("the cluster is the limit: another worker needs ~0.90 CPU and "
                             "0.30 of the cluster's 2.0 CPUs are free")
    c = Controller(CFG, num_csx=1, start=2)  # needs 3 more, room for 1
    d = one(c, 1, 2, step_s=0.005, wait_s=0.015, cpu=0.018, cpus=4.0, free=1.0)
    assert (d.action, d.count, c.counts()) == (Action.ADD, 1, [3])


def test_the_bounds_and_a_client_bound_wafer_hold():
    c = Controller(Autoscale(max_workers_per_csx=2, window_steps=20), num_csx=1, start=2)
    d = one(c, 1, 2, step_s=0.007, wait_s=0.013)
    assert (d.action, c.csx[0].phase) == (Action.HOLD, Phase.LIMITED)
    assert d.reason.endswith("at max_workers_per_csx=2; raise it, or make batches cheaper")
    c = Controller(CFG, num_csx=1)
    w = window(1, 1, step_s=0.007)
    w = CsxWindow(**{**w.__dict__, "wall_s": w.wall_s * 2})  # the other half: the client
    d, = c.step(Observation(step=20, csx=(w,)))
    assert (d.action, c.counts()) == (Action.HOLD, [1])
    assert d.reason.endswith("the wafer waited for the client, not for input; more workers "
                             "would not help")


def test_the_state_is_json_and_resumes_the_counts_and_what_was_learnt():
    c = Controller(CFG, num_csx=2, start=2)
    a, b = window(1, 2, step_s=0.007, wait_s=0.013), window(1, 2, step_s=0.03, buffer=3.9,
                                                              csx=1)
    c.step(Observation(step=20, csx=(a, b)))
    assert c.counts() == [3, 1] and len(c.decisions) == 2
    state = json.loads(json.dumps(c.state_dict()))
    d = Controller(CFG, num_csx=2)
    d.load_state_dict(state)
    assert d.counts() == [3, 1] and d.decisions == c.decisions
    assert [s.changed_at for s in d.csx] == [0, 0]  # the next run counts its own steps
    with pytest.raises(ValueError, match="saved with num_csx=2 and this run has num_csx=1"):
        Controller(CFG, num_csx=1).load_state_dict(state)


def test_the_observation_is_built_from_the_wafers_step_records():
    recs = [{"step": s, "compute_s": 0.007, "input_wait_s": 0.003, "wafer_t": 0.01 * s,
             "workers": [s % 2], "buffer_occupancy_per_csx": [float(s % 3)],
             "produce_start_unix": [0.0], "produce_end_unix": [0.02 if s % 2 else 0.04],
             "produce_cpu_s": [0.001]} for s in range(10, 31)]
    obs = observe(recs[1:], [[0, 1, 2]], 4, cluster_cpus=2.0, before=recs[0])
    w, = obs.csx
    assert (obs.step, w.first_step, w.last_step, w.steps) == (30, 11, 30, 20)
    assert [(x.worker, x.batches) for x in w.workers] == [(0, 10), (1, 10), (2, 0)]
    assert w.workers[0].rate == pytest.approx(25.0) and w.workers[1].rate == pytest.approx(50.0)
    assert w.busy == pytest.approx(0.7) and w.starved == pytest.approx(0.3)
    # 2 CPUs less 0.02 CPU-s of the workers and 0.14 s of compute over 0.2 s
    assert obs.free_cpus == pytest.approx(2.0 - 0.1 - 0.7)


# -- the settings' errors ----------------------------------------------------------------
def test_auto_yaml_and_zero_mean_found_while_the_run_runs_a_count_stays_fixed():
    for value in ("auto", 0, None):
        cfg = CSConfig(num_workers_per_csx=value)
        # 0 and None, the Cerebras "chosen automatically", fall back to a fixed count where the
        # input cannot change its workers; "auto" is refused there
        assert (cfg.autoscaling, cfg.num_workers_per_csx, cfg.autoscale) == (
            True, 1, Autoscale(required=value == "auto"))
    cfg = CSConfig(num_workers_per_csx="auto", autoscale={"min_workers_per_csx": 2})
    assert (cfg.num_workers_per_csx, cfg.autoscale.max_workers_per_csx) == (2, 16)
    fixed = CSConfig(num_workers_per_csx=3)
    assert (fixed.autoscaling, fixed.num_workers_per_csx, fixed.to_dict()["autoscale"]) == (
        False, 3, None)


def test_min_above_max_is_refused_with_the_rule_and_the_fix():
    with pytest.raises(ValueError) as e:
        Autoscale(min_workers_per_csx=4, max_workers_per_csx=2)
    assert str(e.value) == (
        "CSConfig.autoscale: min_workers_per_csx=4 is above max_workers_per_csx=2; the bounds "
        "must satisfy 1 <= min_workers_per_csx <= max_workers_per_csx. Raise "
        "max_workers_per_csx to 4 or lower min_workers_per_csx to 2.")


def test_max_below_one_is_refused_with_the_rule_and_the_fix():
    with pytest.raises(ValueError) as e:
        Autoscale(max_workers_per_csx=0)
    assert str(e.value) == (
        "CSConfig.autoscale.max_workers_per_csx: expected a positive int, got 0. An "
        "autoscaled CS-X needs room for at least one input worker: set it to 1 or more, e.g. "
        "Autoscale(max_workers_per_csx=16).")


@pytest.mark.parametrize("target", [0, 1.2, -0.5])
def test_a_target_outside_zero_to_one_is_refused_with_the_rule_and_the_fix(target):
    with pytest.raises(ValueError) as e:
        Autoscale(target_utilisation=target)
    assert str(e.value) == (
        f"CSConfig.autoscale.target_utilisation: expected a fraction in (0, 1], got {target!r}. "
        "It is the share of its time the wafer must compute (0.95 is 95 %); set it to e.g. "
        "0.95.")


def test_a_start_outside_the_bounds_is_refused():
    with pytest.raises(ValueError, match=r"num_workers_per_csx=5 is where the autoscaled run "
                                         r"starts, and it lies outside autoscale's bounds \[1, 4\]"):
        CSConfig(num_workers_per_csx=5, autoscale=Autoscale(max_workers_per_csx=4))


def test_yaml_auto_and_the_cli_flag_fill_the_same_config(tmp_path, monkeypatch):
    from cstream_tools.cli import build_parser
    from cstream_tools.cli_run import _experiment
    from cstream_tools.experiment import load_experiment

    f = tmp_path / "exp.yaml"
    f.write_text("input: synthetic\nsteps: 5\ncs_config:\n  num_workers_per_csx: auto\n"
                 "  autoscale: {max_workers_per_csx: 8}\n")
    cs = load_experiment(f).cs_config
    assert (cs.autoscaling, cs.num_workers_per_csx, cs.autoscale.max_workers_per_csx) == (
        True, 1, 8)
    monkeypatch.chdir(tmp_path)
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text("input: synthetic\nsteps: 5\ncs_config: {num_workers_per_csx: 2}\n")
    args = build_parser().parse_args(["run", str(fixed), "--num-workers-per-csx", "auto"])
    assert _experiment(args, "run").cs_config.autoscale == Autoscale()
    args = build_parser().parse_args(["run", str(f), "--num-workers-per-csx", "3"])
    cs = _experiment(args, "run").cs_config
    assert (cs.autoscaling, cs.num_workers_per_csx) == (False, 3)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", str(f), "--num-workers-per-csx", "some"])


# -- what the user sees, from a recorded profile -------------------------------------------
def _recorded_profile():
    """An autoscaled run's profile as the executor writes it: 1 worker to step 40, 2 after."""
    steps = []
    for s in range(1, 121):
        n = 1 if s <= 40 else 2
        w = 0 if n == 1 else s % 2
        end = 100.0 + 0.01 * s
        steps.append({"step": s, "samples": 4, "compute_s": 0.0097, "input_wait_s": 0.0003,
                      "wafer_t": 0.01 * s, "end_unix": end, "workers": [w],
                      "buffer_occupancy": 2.0, "num_workers": [n],
                      "produce_start_unix": [end - 0.03], "produce_end_unix": [end - 0.01]})
    decision = {"action": "add", "csx": 0, "step": 40, "count": 1, "workers": [],
                "reason": "wafer 50.0% busy ...", "decided_unix": 100.4}
    settled = [{"csx": 0, "workers": 2, "phase": "settled", "changed_at": 40,
                "settled_since": 61, "ceiling": None,
                "reason": "wafer 97.0% busy (target 95.0%): 2 workers keep it fed"}]
    return {"steps": steps, "summary": {"autoscale": {
        "config": Autoscale().to_dict(), "settled": settled, "decisions": [decision],
        "history": [{"from_step": 1, "workers": [1]}, {"from_step": 41, "workers": [2]}]}}}


def test_the_report_says_where_each_csx_settled_and_the_figures_it_rests_on():
    from executor.report import summarize_profile
    from executor.report_text import summary_lines

    report = summarize_profile(_recorded_profile())
    a = report["autoscale"]["csx"][0]
    assert a["sentence"] == ("settled at 2 workers per CS-X after 40 steps; wafer 97.0% busy "
                             "since step 61")
    rows = dict(summary_lines(report))
    assert rows["CS-X 0 input workers"] == a["sentence"]
    assert rows["CS-X 0 autoscale figures"] == ("wafer 97.0% busy (target 95.0%): 2 workers "
                                                "keep it fed")
    assert rows["autoscale decisions"].startswith("1 (each logged with its reason")


def test_the_timeline_shows_each_workers_life_the_count_and_the_decisions():
    from executor.timeline import WORKERS_PID, build_trace

    events = build_trace(_recorded_profile())["traceEvents"]
    lives = [e for e in events if e.get("name") == "alive"]
    assert [(e["pid"], e["tid"]) for e in lives] == [(WORKERS_PID, 0), (WORKERS_PID, 2)]
    w1 = lives[1]  # worker 1 produced from step 41 (its first batch, made 30 ms before)
    assert round(w1["dur"] / 1e3) == round((100.0 + 1.20 - 0.01 - (100.0 + 0.42 - 0.03)) * 1e3)
    counts = [e["args"]["CS-X 0"] for e in events if e.get("name") == "input workers"]
    assert counts[:40] == [1] * 40 and counts[40:] == [2] * 80
    marks = [e for e in events if e["ph"] == "i"]
    assert [(m["name"], m["args"]["step"]) for m in marks] == [("autoscale CS-X 0: add 1", 40)]


def test_tensorboard_gets_the_worker_count_per_csx_every_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from executor.report_writers import StepScalars

    writer = SummaryWriter(str(tmp_path))
    StepScalars(CSConfig(num_workers_per_csx="auto")).write_ready(
        writer, _recorded_profile()["steps"], None, final=True)
    writer.close()
    counts = EventAccumulator(str(tmp_path)).Reload().Scalars("workers/csx0_count")
    assert [(e.step, e.value) for e in counts][38:42] == [(39, 1.0), (40, 1.0), (41, 2.0),
                                                          (42, 2.0)]
    assert len(counts) == 120


def test_the_controllers_state_survives_a_checkpoint_file(tmp_path):
    import cstream

    c = Controller(CFG, num_csx=1, start=2)
    one(c, 1, 2, step_s=0.005, wait_s=0.015, cpu=0.019)
    one(c, 31, 4, step_s=0.005, wait_s=0.015, batch_s=0.04, cpu=0.038)  # learns a ceiling
    cstream.save({"dataloader": {"autoscale": c.state_dict()}}, tmp_path / "ckpt.h5")
    back = cstream.load(tmp_path / "ckpt.h5")["dataloader"]["autoscale"]
    d = Controller(CFG, num_csx=1)
    d.load_state_dict(back)
    assert (d.counts(), d.csx[0].ceiling, d.decisions) == ([2], 2, c.decisions)


def test_a_worker_that_delivered_nothing_while_the_others_kept_the_buffer_full_is_retired():
    c = Controller(CFG, num_csx=1, start=3)
    w = window(1, 2, step_s=0.01, buffer=3.8)
    w = CsxWindow(**{**w.__dict__, "workers": w.workers + (WorkerWindow(2, 0, 0.0, 0.0),)})
    d, = c.step(Observation(step=20, csx=(w,)))
    assert (d.action, d.workers, c.counts()) == (Action.RETIRE, (2,), [2])
    assert d.reason == ("wafer 100.0% busy (target 95.0%), buffer 3.8 of 4 batches over steps "
                        "1-20, and worker 2 delivered nothing: the others carry it; 3 workers "
                        "-> 2")
