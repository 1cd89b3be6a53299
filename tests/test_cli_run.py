"""``cstream run``, ``cstream sweep`` and ``cstream report`` driven as a user drives them."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from executor.report import pct
from helpers.cli import cstream, table_rows
from workers.config import CSConfig

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"

SMALL = """\
name: small
cs_config:
  num_workers_per_csx: 2
  wafer_seconds_per_step: 0.005
input:
  fn: synthetic
  kwargs: {batch_size: 8, features: 4, cost_ms: 0}
model: null
steps: 12
backend:
  type: CSX
"""


@pytest.fixture
def cstream_here(capsys, monkeypatch):
    """``cstream ARGS`` through :func:`cstream_tools.cli.main` in this process (no interpreter to
    start): ``(exit status, stdout, stderr)``. For what fails before any run starts; the
    subprocess of :func:`cstream` checks the command as installed."""
    from cstream_tools.cli import main

    monkeypatch.setenv("COLUMNS", "100")

    def call(*args, cwd):
        monkeypatch.chdir(cwd)
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:  # argparse's errors and --help
            rc = e.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(args, rc, out, err)
    return call


def scalar_tags(event_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(event_dir))
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture
def small_config(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


@pytest.mark.parametrize("command, expected", [
    ("run", ["CONFIG", "--steps", "--num-workers-per-csx", "--in-process", "--no-progress",
             "--json", "example:"]),
    ("sweep", ["--num-workers-per-csx LIST", "--num-csx LIST", "--out DIR", "--target U",
               "sweep.png", "95%"]),
    ("report", ["RUN_DIR", "report.png", "sweep.json", "--json"]),
])
def test_help_of_each_command_lists_its_arguments(tmp_path, cstream_here, command, expected):
    # `run --help` as installed (a new interpreter), the others through main()
    out = cstream(command, "--help", cwd=tmp_path) if command == "run" \
        else cstream_here(command, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for text in expected:
        assert text in out.stdout, (command, text)


def test_run_shows_progress_a_summary_table_and_writes_profile_and_tensorboard(
        tmp_path, small_config):
    out = cstream("run", small_config, "--in-process", "--artifact-dir", "art", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    # progress on stderr: the start-up phases with their times, then a line per tenth of the run
    progress = out.stderr.splitlines()
    assert re.fullmatch(r"starting 2 input workers: \d+\.\d\d s", progress[0]), progress
    assert any(re.fullmatch(r"first batch through the wafer: \d+\.\d\d s", ln) for ln in progress)
    assert [ln.split("  ")[0] for ln in progress if ln.startswith("step ")] == [
        f"step {k}/12" for k in range(1, 13)]
    # the rate shown is the wafer's: never above what 8 samples per 5 ms step allow
    rates = [float(m.replace(",", "")) for m in re.findall(r"rate ([\d,.]+) samples/s", out.stderr)]
    assert len(rates) == 11 and all(0 < r <= 1600 * 1.01 for r in rates), rates
    lines = out.stdout.splitlines()
    assert lines[0] == "small: 1 CS-X x 2 workers, wafer 5 ms/step"
    rows = table_rows(out.stdout)
    assert rows["steps"] == "12" and rows["samples"] == "96"
    assert rows["warm-up steps (worker start-up)"] == "2"
    assert re.fullmatch(r"\d+\.\d%", rows["wafer utilisation"])
    assert re.fullmatch(r"[\d,]+\.\d \(wafer waited \d+\.\d{3} s\); produces [\d,]+\.\d/s",
                        rows["CS-X 0 worker 1 batches/s"])
    run_dir = tmp_path / "art" / "executors" / "000001"
    assert lines[-1].startswith("run directory: ")
    assert Path(tmp_path, lines[-1].split(": ", 1)[1]).resolve() == run_dir.resolve()
    profile = json.loads((run_dir / "profile.json").read_text())
    assert rows["wafer utilisation"] == pct(profile["report"]["utilisation"])
    tags = scalar_tags(run_dir / "tensorboard")
    assert tags["rate"] == list(range(1, 13)) and tags["global_rate"] == list(range(1, 13))
    assert tags["wafer/utilisation"] == list(range(1, 13))
    assert tags["wafer/input_wait_s"] == list(range(1, 13))
    assert tags["summary/utilisation"] == [12]
    assert tags["summary/time_to_first_step_s"] == [12]
    assert tags["workers/csx0_w0/batches_per_s"] == list(range(1, 13))
    assert tags["workers/csx0_w1/batches_per_s"] == list(range(1, 13))
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))

    rep = cstream("report", "art/executors/latest", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    again = table_rows(rep.stdout)
    for label in ("steps", "samples", "wafer utilisation", "input-starved", "samples/s (wafer)",
                  "time to first step", "CS-X 0 worker 1 batches/s"):
        assert again[label] == rows[label], label
    assert rep.stdout.splitlines()[0] == "small (run 000001): 1 CS-X x 2 workers, wafer 5 ms/step"
    assert rep.stdout.splitlines()[-2:] == ["plot: art/executors/latest/report.png",
                                            "workers plot: art/executors/latest/workers.png"]
    assert (run_dir / "report.png").read_bytes()[:8] == PNG
    assert (run_dir / "workers.png").read_bytes()[:8] == PNG


def test_run_json_writes_only_json_to_stdout_and_the_loss_every_step_to_tensorboard(tmp_path):
    out = cstream("run", REPO / "configs" / "synthetic_mlp.yaml", "--in-process", "--steps", "6",
                  "--json", "--artifact-dir", "art", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)  # the whole of stdout is one JSON document
    assert summary["name"] == "synthetic_mlp"
    assert summary["steps"] == 6 and summary["samples"] == 6 * 32
    assert summary["trace_s"] > 0 and summary["interrupted"] is None
    assert Path(tmp_path, summary["run_dir"], "profile.json").is_file()
    # progress went to stderr, each line with the loss of the step it names
    last_progress = [ln for ln in out.stderr.splitlines() if ln.startswith("step 6/6")][0]
    assert re.match(r"step 6/6  loss \d+\.\d{4}  rate ", last_progress)
    assert [ln.split(":")[0] for ln in out.stderr.splitlines() if ln.endswith(" s")][:4] == [
        "starting 2 input workers", "tracing", "compiling", "first batch through the wafer"]
    # the step's loss (cstream.summarize_scalar in the experiment's step) every step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / summary["run_dir"] / "tensorboard"))
    acc.Reload()
    losses = acc.Scalars("loss")
    assert [e.step for e in losses] == [1, 2, 3, 4, 5, 6]
    assert float(last_progress.split()[3]) == pytest.approx(losses[-1].value, abs=1e-4)


def test_sweep_on_ray_prints_a_table_writes_the_plot_and_report_reprints_it(
        tmp_path, small_config):
    out = cstream("sweep", small_config, "--num-workers-per-csx", "2,1", "--steps", "10",
                  "--out", "sw", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Token authentication" not in out.stderr  # the embedded Ray's notice stays quiet
    lines = out.stdout.splitlines()
    assert "[1/2] num_csx=1 num_workers_per_csx=1 ..." in lines
    assert "[2/2] num_csx=1 num_workers_per_csx=2 ..." in lines
    header = next(i for i, ln in enumerate(lines) if ln.startswith("num_csx"))
    assert lines[header].split() == ["num_csx", "workers/CS-X", "samples/s", "utilisation",
                                     "input-starved", "buffer", "occ.", "worker", "spread"]
    body = [ln.split() for ln in lines[header + 2:header + 4]]
    assert [(r[0], r[1]) for r in body] == [("1", "1"), ("1", "2")]
    doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert [r["num_workers_per_csx"] for r in doc["rows"]] == [1, 2]
    for r, row in zip(doc["rows"], body):
        assert row[3] == pct(r["utilisation"])
        w = r["num_workers_per_csx"]
        assert (Path(tmp_path, r["run_dir"]).resolve()
                == (tmp_path / f"sw/csx1-w{w}/executors/000001").resolve())
        assert (tmp_path / r["run_dir"] / "profile.json").is_file()
        assert scalar_tags(tmp_path / r["run_dir"] / "tensorboard")["summary/utilisation"] == [10]
    assert lines[-2] == "plot: sw/sweep.png"
    assert (tmp_path / "sw" / "sweep.png").read_bytes()[:8] == PNG

    (tmp_path / "sw" / "sweep.png").unlink()
    rep = cstream("report", "sw", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    table = [ln for ln in lines[header:] if not ln.startswith(("plot:", "sweep folder:"))]
    assert rep.stdout.splitlines()[:-1] == table
    assert (tmp_path / "sw" / "sweep.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("args, message", [
    (["sweep", "{cfg}", "--num-workers-per-csx", "0,2"],
     "cstream sweep: error: argument --num-workers-per-csx: every value of '0,2': expected a "
     "positive int, got 0. Set it to 1 or more."),
    (["sweep", "{cfg}", "--num-workers-per-csx", "two"],
     "cstream sweep: error: argument --num-workers-per-csx: expected a comma-separated list of "
     "positive ints such as 1,2,4,8, got 'two'"),
    (["sweep", "{cfg}"],
     "cstream sweep: error: the following arguments are required: --num-workers-per-csx"),
    (["run", "{cfg}", "--steps", "-3"],
     "cstream run: error: --steps: expected a positive int, got -3. Set it to 1 or more."),
    (["run", "missing.yaml"], "cstream run: error: missing.yaml: no such experiment file."),
    (["run", "{cfg}", "--wafer-samples-per-sec", "10", "--wafer-seconds-per-step", "1"],
     "cstream run: error: give --wafer-samples-per-sec or --wafer-seconds-per-step, not both"),
    (["report", "nowhere"],
     "cstream report: error: nowhere: no such run directory. Give a run directory such as "
     "cstream_logs/executors/000001 (or .../executors/latest)."),
    (["report", "."],
     "cstream report: error: . holds no profile.json, so it is not a run directory (a run writes "
     "artifact_dir/executors/NNNNNN/profile.json when its DataExecutor finishes)."),
])
def test_bad_arguments_give_one_line_errors_and_exit_status_2(tmp_path, small_config, args,
                                                              message, cstream_here):
    args = [a.format(cfg=small_config.name) for a in args]
    # the first case as installed (a new interpreter's exit status), the others through main()
    first = ["sweep", small_config.name, "--num-workers-per-csx", "0,2"]
    run = cstream if args == first else cstream_here
    out = run(*args, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2  # argparse adds its usage line


def test_a_wrong_key_in_the_experiment_file_is_one_line_naming_the_key_and_the_valid_keys(
        tmp_path, cstream_here):
    (tmp_path / "bad.yaml").write_text(SMALL.replace("num_workers_per_csx", "num_worker_per_csx"))
    out = cstream_here("run", "bad.yaml", cwd=tmp_path)
    assert out.returncode == 2
    valid = ", ".join(f.name for f in dataclasses.fields(CSConfig) if f.init)
    assert out.stderr == (
        "cstream run: error: bad.yaml: cs_config: unknown key 'num_worker_per_csx'. Did you mean "
        f"'num_workers_per_csx'? Valid keys: {valid}.\n")


USER_DATA = """\
import torch


def input_fn(batch_size=4, fail_after=0):
    return Rows(batch_size, fail_after)


class Rows:
    def __init__(self, batch_size, fail_after):
        self.batch_size, self.fail_after = batch_size, fail_after

    def __iter__(self):
        for i in range(1000):
            if i >= self.fail_after:
                check_columns(i)
            yield torch.full((self.batch_size, 3), float(i))


def check_columns(i):
    raise ValueError(f"column 'lable' not found in rows.csv (batch {i})")
"""

USER_RUN = """\
name: {name}
cs_config: {{num_workers_per_csx: 1, wafer_seconds_per_step: {wafer_s}}}
input: {{fn: "mydata:input_fn", kwargs: {kwargs}}}
model: null
steps: {steps}
backend: {{type: CSX, options: {{in_process: {in_process}}}}}
"""


def user_experiment(tmp_path, name, kwargs, in_process=True, steps=8, wafer_s=0.005):
    (tmp_path / "mydata.py").write_text(USER_DATA)
    (tmp_path / f"{name}.yaml").write_text(USER_RUN.format(
        name=name, kwargs=kwargs, in_process=str(in_process).lower(), steps=steps,
        wafer_s=wafer_s))
    return f"{name}.yaml"


def test_a_failing_input_function_shows_the_users_exception_and_frame_keeps_the_partial_run(
        tmp_path):
    cfg = user_experiment(tmp_path, "fails", "{batch_size: 4, fail_after: 3}")
    out = cstream("run", cfg, "--artifact-dir", "art", cwd=tmp_path)
    assert out.returncode == 1
    err = out.stderr.splitlines()
    i = err.index("cstream run: error: ValueError: column 'lable' not found in rows.csv (batch 3)")
    frame = err.index(f'  File "{tmp_path / "mydata.py"}", line 20, in check_columns')
    assert i < frame <= i + 2  # after the headline (and the line saying where it happened)
    assert err[frame + 1] == '    raise ValueError(f"column \'lable\' not found in rows.csv (batch {i})")'
    assert err[-1] == "(run again with --debug for the whole traceback)"
    assert "Traceback" not in out.stderr and "\x1b[" not in out.stderr
    # the steps that ran are kept: a partial summary, a profile marked as interrupted
    rows = table_rows(out.stdout)
    assert rows["INTERRUPTED"].startswith("after 3 of 8 steps: ")  # the wafer ran 3 steps
    assert "ValueError: column 'lable' not found" in rows["INTERRUPTED"]
    assert rows["steps"] == "3" and rows["samples"] == "12"
    profile = json.loads((tmp_path / "art/executors/000001/profile.json").read_text())
    assert profile["interrupted"]["steps_run"] == 3
    assert "column 'lable' not found" in profile["interrupted"]["reason"]
    rep = cstream("report", "art/executors/latest", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert table_rows(rep.stdout)["INTERRUPTED"] == rows["INTERRUPTED"]
    assert (tmp_path / "art/executors/000001/report.png").read_bytes()[:8] == PNG

    debug = cstream("run", cfg, "--artifact-dir", "art", "--debug", cwd=tmp_path)
    assert debug.returncode == 1
    assert "the whole chain (--debug):" in debug.stderr
    assert "Traceback (most recent call last)" in debug.stderr
    assert 'mydata.py", line 15, in __iter__' in debug.stderr  # every frame, not only the last


def test_a_misspelled_input_keyword_on_ray_shows_the_type_error_not_rays_wrapper(tmp_path):
    cfg = user_experiment(tmp_path, "typo", "{batch_sise: 4}", in_process=False)
    out = cstream("run", cfg, "--artifact-dir", "art", cwd=tmp_path)
    assert out.returncode == 1
    assert ("cstream run: error: TypeError: input_fn() got an unexpected keyword argument "
            "'batch_sise'") in out.stderr.splitlines()
    assert "(in the input function, CS-X 0 input worker 0 while building its dataloader)" \
        in out.stderr
    assert "ray::" not in out.stderr and "\x1b[" not in out.stderr
    # the start-up phases were shown as they ended, with their times
    phases = [ln.split(":")[0] for ln in out.stderr.splitlines() if re.search(r": \d+\.\d\d s$", ln)]
    assert phases[:3] == ["starting Ray", "starting the wafer driver", "starting 1 input worker"]


def _wait_for_line(proc, stream, pattern, timeout=240):
    import select
    import time

    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stream], [], [], 1.0)
        if ready:
            line = stream.readline()
            if not line:
                break
            seen.append(line)
            if re.search(pattern, line):
                return seen
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s: {seen}")


def deliverable_ctrl_c():
    """In the child, before it starts: Ctrl-C's default action. A test runner started in the
    background of a non-interactive shell (``make test &``) runs with SIGINT ignored, its
    children inherit that, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _communicate(proc, timeout):
    """``proc.communicate``; if the process is still running after ``timeout`` s, the test fails
    with every thread's stack (the CLI dumps them on SIGUSR1) instead of a bare timeout."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(3)
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"still running {timeout} s after Ctrl-C; its threads:\n{stderr}\n"
                             f"stdout:\n{stdout}") from None


def _popen(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "cstream_tools.cli", *map(str, args)], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=deliverable_ctrl_c)


def test_ctrl_c_keeps_the_profile_prints_the_partial_summary_and_report_shows_it(tmp_path):

    cfg = user_experiment(tmp_path, "slow", "{batch_size: 4, fail_after: 100000}", steps=400,
                          wafer_s=0.05)
    proc = _popen("run", cfg, "--artifact-dir", "art", cwd=tmp_path)
    try:
        _wait_for_line(proc, proc.stderr, r"^step 41/400")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = _communicate(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.splitlines()[-1] == "cstream run: interrupted (Ctrl-C)"
    rows = table_rows(stdout)
    assert re.fullmatch(r"after \d+ of 400 steps: KeyboardInterrupt \(Ctrl-C\)",
                        rows["INTERRUPTED"]), stdout
    ran = int(rows["steps"])
    assert 41 <= ran < 400
    profile = json.loads((tmp_path / "art/executors/000001/profile.json").read_text())
    assert profile["interrupted"]["reason"] == "KeyboardInterrupt (Ctrl-C)"
    assert profile["steps_run"] == ran
    rep = cstream("report", "art/executors/latest", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    assert table_rows(rep.stdout)["INTERRUPTED"] == rows["INTERRUPTED"]
    assert re.fullmatch(r"\d+\.\d%", table_rows(rep.stdout)["wafer utilisation"])


def test_an_interrupted_sweep_keeps_its_points_and_resume_runs_only_the_missing_ones(tmp_path):

    cfg = user_experiment(tmp_path, "sw", "{batch_size: 4, fail_after: 100000}", steps=60,
                          wafer_s=0.05)
    args = ("sweep", cfg, "--num-workers-per-csx", "1,2", "--out", "sw")
    proc = _popen(*args, cwd=tmp_path)
    try:
        _wait_for_line(proc, proc.stdout, r"^\[2/2\] num_csx=1 num_workers_per_csx=2 \.\.\.")
        proc.send_signal(signal.SIGINT)
        stdout, stderr = _communicate(proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert doc["complete"] is False
    assert [r["num_workers_per_csx"] for r in doc["rows"]] == [1]
    assert "sweep interrupted after 1 of 2 points" in stdout
    assert "--out sw --resume" in stdout

    again = cstream(*args, cwd=tmp_path)
    assert again.returncode == 2
    assert "already holds a sweep" in again.stderr and "--resume" in again.stderr

    resumed = cstream(*args, "--resume", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "[1/2] num_csx=1 num_workers_per_csx=1: measured earlier (sweep.json)" in resumed.stdout
    assert "[2/2] num_csx=1 num_workers_per_csx=2 ..." in resumed.stdout
    doc2 = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert doc2["complete"] is True
    assert [r["num_workers_per_csx"] for r in doc2["rows"]] == [1, 2]
    assert doc2["rows"][0] == doc["rows"][0]  # the finished point was not run again


def test_trace_prints_where_the_timeline_is_and_the_file_follows_the_trace_event_format(
        tmp_path, small_config):
    out = cstream("run", small_config, "--in-process", "--artifact-dir", "art", "--no-progress",
                  cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    tr = cstream("trace", "art/executors/latest", "--png", "0.5", cwd=tmp_path)
    assert tr.returncode == 0, tr.stderr
    lines = tr.stdout.splitlines()
    assert lines.pop() == "timeline plot: art/executors/latest/timeline.png"
    assert (tmp_path / "art/executors/latest/timeline.png").read_bytes()[:8] == PNG
    assert lines[0] == "trace: art/executors/latest/trace.json"
    assert lines[1] == "  2 input workers: 12 batch productions, 12 transfers"
    assert lines[2] == "  wafer: 12 steps, 12 input waits"
    assert "https://ui.perfetto.dev" in lines[-1] and "chrome://tracing" in lines[-1]
    trace = json.loads((tmp_path / "art/executors/latest/trace.json").read_text())
    events = trace["traceEvents"]
    for e in events:  # the trace-event format's required fields, per phase type
        assert e["ph"] in ("X", "C", "M") and isinstance(e["pid"], int) and e["name"]
        if e["ph"] == "X":
            assert isinstance(e["tid"], int) and e["ts"] >= 0 and e["dur"] >= 0
        if e["ph"] == "C":
            assert e["ts"] >= 0 and all(isinstance(v, (int, float)) for v in e["args"].values())
    names = {(e["args"]["name"]) for e in events if e["ph"] == "M" and "name" in e["args"]}
    assert {"client (the training script)", "wafer (driver)", "input workers, CS-X 0",
            "worker 0: produce", "worker 1: transfer"} <= names
    spans = [e for e in events if e["ph"] == "X"]
    by_step = {}
    for e in spans:
        by_step.setdefault((e["name"], e["args"].get("step")), []).append(e)
    for step in range(1, 13):
        (produce,), (transfer,), (compute,) = (by_step[(n, step)]
                                               for n in ("produce", "transfer", "compute"))
        assert produce["tid"] == 2 * ((step - 1) % 2)  # round robin over the two workers
        # causality on one clock: produced, then transferred, then computed on the wafer
        assert produce["ts"] + produce["dur"] <= transfer["ts"] + 1
        assert transfer["ts"] + transfer["dur"] <= compute["ts"] + 1
    assert sum(1 for e in spans if e["name"].startswith("step ")) == 12  # the client's steps
