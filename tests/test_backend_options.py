"""A backend's options are one typed dataclass, filled alike by the Python call, an experiment
file and the ``cstream run`` command line."""

from __future__ import annotations

import dataclasses
from typing import get_args

import pytest

import cstream
from cstream_tools.cli import build_parser
from cstream_tools.cli_run import _experiment
from cstream_tools.experiment import ExperimentError, experiment_from_dict, load_experiment
from executor.backends.options import Compiler, CPUOptions, CSXOptions, GPUOptions
from executor.engine.compiler import COMPILERS

CSX_FILE = """\
input: synthetic
steps: 2
backend:
  type: CSX
  options: {lookahead: 8, compiler: fx, num_threads: 2, max_checkpoints: 3, drop_data: true}
"""
CSX_KWARGS = dict(lookahead=8, compiler="fx", num_threads=2, max_checkpoints=3, drop_data=True)


@pytest.fixture(autouse=True)
def _no_ray_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def created_options(backend_type, **kwargs):
    """``backend.options`` of a backend created by the Python call."""
    b = cstream.backend(backend_type, **kwargs)
    try:
        return b.options
    finally:
        b.shutdown()


def test_the_file_the_command_line_and_the_python_call_build_equal_csx_options(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(CSX_FILE)
    from_file = load_experiment(path).backend.options
    args = build_parser().parse_args(["run", str(path), "--in-process"])
    from_cli = _experiment(args, "run").backend.options
    from_python = created_options("CSX", in_process=True, **CSX_KWARGS)

    expected = CSXOptions(in_process=True, lookahead=8, compiler="fx", num_threads=2,
                          max_checkpoints=3, drop_data=True)
    assert from_cli == from_python == expected
    assert from_file == dataclasses.replace(expected, in_process=False)
    # run_experiment creates its backend from the file's options: the same object again
    assert from_cli.given() == {"in_process": True, **CSX_KWARGS}
    assert created_options("CSX", **from_cli.given()) == from_cli


def test_the_cpu_backend_and_an_experiment_build_equal_cpu_options():
    exp = experiment_from_dict({"input": "synthetic", "steps": 1,
                                "backend": {"type": "cpu", "options": {"max_checkpoints": 2}}})
    assert exp.backend.options == CPUOptions(max_checkpoints=2)
    assert created_options("CPU", max_checkpoints=2) == exp.backend.options
    assert created_options("CPU", **exp.backend.options.given()) == exp.backend.options


def test_the_options_are_checked_once_with_the_same_message_on_every_path(tmp_path):
    with pytest.raises(ValueError) as python:
        cstream.backend("CSX", in_process=True, lookahead=0)
    assert str(python.value) == "lookahead: expected a positive int, got 0. Set it to 1 or more " \
                                "(steps the wafer may run ahead of the client)."
    with pytest.raises(ExperimentError) as from_file:
        experiment_from_dict({"input": "synthetic", "steps": 1,
                              "backend": {"type": "CSX", "options": {"lookahead": 0}}})
    assert str(from_file.value) == f"backend.options.{python.value}"
    with pytest.raises(ExperimentError) as compiler:
        experiment_from_dict({"input": "synthetic", "steps": 1,
                              "backend": {"options": {"compiler": "tvm"}}})
    assert str(compiler.value) == (
        "backend.options: cstream.backend(\"CSX\", compiler='tvm'): choose one of "
        "('auto', 'fx', 'inductor').")
    with pytest.raises(TypeError, match=r"in_process='no'\): expected True or False"):
        CSXOptions(in_process="no")
    with pytest.raises(ValueError, match="num_threads: expected a positive int or None, got 0"):
        CSXOptions(num_threads=0)
    with pytest.raises(ValueError, match=r"device='tpu'\): the wafer driver executes on"):
        CSXOptions(device="tpu")
    with pytest.raises(ValueError, match="device_index: expected an int of 0 or more"):
        GPUOptions(device_index=-1)
    with pytest.raises(ExperimentError, match="artifact_dir is set by the experiment's"):
        experiment_from_dict({"input": "synthetic", "steps": 1,
                              "backend": {"options": {"artifact_dir": "x"}}})


def test_the_compiler_choices_are_the_engines():
    assert get_args(Compiler) == COMPILERS
    assert CSXOptions.names()[:7] == ("artifact_dir", "compile_dir", "compile_only",
                                      "validate_only", "drop_data", "max_checkpoints",
                                      "retrace_every_iteration")
