"""``cstream run``, ``cstream sweep`` and ``cstream report`` driven as a user drives them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from executor.report import pct

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


def cstream(*args, cwd, timeout=240):
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")
    return subprocess.run([sys.executable, "-m", "cstream.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def table_rows(text):
    """{label: value} of the lines of a summary table."""
    rows = {}
    for line in text.splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2:
            rows[parts[0]] = parts[1]
    return rows


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
def test_help_of_each_command_lists_its_arguments(tmp_path, command, expected):
    out = cstream(command, "--help", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for text in expected:
        assert text in out.stdout, (command, text)


def test_run_shows_progress_a_summary_table_and_writes_profile_and_tensorboard(
        tmp_path, small_config):
    out = cstream("run", small_config, "--in-process", "--artifact-dir", "art", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("step 1/12  loss -  rate ")
    assert "step 12/12  loss -  rate " in out.stdout
    assert "small: 1 CS-X x 2 workers, wafer 5 ms/step" in lines
    rows = table_rows(out.stdout)
    assert rows["steps"] == "12" and rows["samples"] == "96"
    assert rows["warm-up steps (worker start-up)"] == "2"
    assert re.fullmatch(r"\d+\.\d%", rows["wafer utilisation"])
    assert re.fullmatch(r"[\d,]+\.\d \(wafer waited \d+\.\d{3} s\)",
                        rows["CS-X 0 worker 1 batches/s"])
    run_dir = tmp_path / "art" / "executors" / "000001"
    assert lines[-1] == "run directory: art/executors/000001"
    profile = json.loads((run_dir / "profile.json").read_text())
    assert rows["wafer utilisation"] == pct(profile["report"]["utilisation"])
    tags = scalar_tags(run_dir / "tensorboard")
    assert tags["rate"] == list(range(1, 13)) and tags["global_rate"] == list(range(1, 13))
    assert tags["wafer/utilisation"] == list(range(1, 13))
    assert tags["wafer/input_wait_s"] == list(range(1, 13))
    assert tags["summary/utilisation"] == [12]
    assert tags["summary/time_to_first_step_s"] == [12]
    assert tags["workers/csx0_w0/batches_per_s"] == [12]
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))

    rep = cstream("report", "art/executors/latest", cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr
    again = table_rows(rep.stdout)
    for label in ("steps", "samples", "wafer utilisation", "input-starved", "samples/s (wafer)",
                  "time to first step", "CS-X 0 worker 1 batches/s"):
        assert again[label] == rows[label], label
    assert rep.stdout.splitlines()[-1] == "plot: art/executors/latest/report.png"
    assert (run_dir / "report.png").read_bytes()[:8] == PNG


def test_run_of_a_model_experiment_shows_the_loss(tmp_path):
    out = cstream("run", REPO / "configs" / "synthetic_mlp.yaml", "--in-process", "--steps", "6",
                  "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    last_progress = [ln for ln in out.stdout.splitlines() if ln.startswith("step 6/6")][0]
    assert re.match(r"step 6/6  loss \d+\.\d{4}  rate ", last_progress)
    summary = json.loads(out.stdout.splitlines()[-1])
    assert summary["steps"] == 6 and summary["samples"] == 6 * 32
    assert summary["trace_s"] > 0
    assert Path(tmp_path, summary["run_dir"], "profile.json").is_file()


def test_sweep_on_ray_prints_a_table_writes_the_plot_and_report_reprints_it(
        tmp_path, small_config):
    out = cstream("sweep", small_config, "--num-workers-per-csx", "2,1", "--steps", "10",
                  "--out", "sw", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
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
        assert r["run_dir"] == f"sw/csx1-w{w}/executors/000001"
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
     "cstream sweep: error: argument --num-workers-per-csx: every value must be at least 1, "
     "got 0 in '0,2'"),
    (["sweep", "{cfg}", "--num-workers-per-csx", "two"],
     "cstream sweep: error: argument --num-workers-per-csx: expected a comma-separated list of "
     "positive ints such as 1,2,4,8, got 'two'"),
    (["sweep", "{cfg}"],
     "cstream sweep: error: the following arguments are required: --num-workers-per-csx"),
    (["run", "{cfg}", "--steps", "-3"],
     "cstream run: error: argument --steps: expected a positive int, got -3"),
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
                                                              message):
    out = cstream(*[a.format(cfg=small_config.name) for a in args], cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == message
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) <= 2  # argparse adds its usage line


def test_a_wrong_key_in_the_experiment_file_is_one_line_naming_the_key_and_the_valid_keys(
        tmp_path):
    (tmp_path / "bad.yaml").write_text(SMALL.replace("num_workers_per_csx", "num_worker_per_csx"))
    out = cstream("run", "bad.yaml", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == (
        "cstream run: error: bad.yaml: cs_config: unknown key 'num_worker_per_csx' (did you mean "
        "'num_workers_per_csx'?). Valid keys: num_csx, num_workers_per_csx, "
        "wafer_samples_per_sec, wafer_seconds_per_step, input_buffer_batches, "
        "batches_per_fetch, max_worker_restarts, straggler_timeout_s.\n")


def test_an_input_function_that_fails_ends_the_run_with_its_message_and_exit_status_1(
        tmp_path):
    (tmp_path / "fails.yaml").write_text(SMALL.replace("cost_ms: 0", "cost_ms: 0, cost_kind: gpu"))
    out = cstream("run", "fails.yaml", "--in-process", cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr == ("cstream run: error: synthetic_input_fn: cost_kind must be one of "
                          "('sleep', 'cpu'), got 'gpu'.\n")
