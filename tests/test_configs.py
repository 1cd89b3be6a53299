"""Experiment files: typed dataclasses filled from YAML, with errors that name the path."""

from __future__ import annotations

from pathlib import Path

import pytest

from cstream_tools.experiment import (
    BackendConfig,
    Experiment,
    ExperimentError,
    InputConfig,
    ModelConfig,
    experiment_from_dict,
    load_experiment,
    with_layout,
)
from executor.backends.options import CSXOptions
from workers.config import CSConfig

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted((REPO / "configs").glob("*.yaml"))

MINIMAL = {"input": {"fn": "synthetic"}, "steps": 5}


def load(tmp_path, text, name="exp.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return load_experiment(path)


def error_of(data) -> str:
    with pytest.raises(ExperimentError) as e:
        experiment_from_dict(data)
    return str(e.value)


def test_the_shipped_configs_are_valid_and_name_themselves_after_their_file():
    names = [p.stem for p in SHIPPED]
    assert {"input_sleep_20ms", "input_cpu_bound", "digits_input_only", "digits_mlp",
            "synthetic_mlp"} <= set(names)
    for path in SHIPPED:
        exp = load_experiment(path)
        assert exp.name == path.stem
        assert isinstance(exp.cs_config, CSConfig) and isinstance(exp.backend, BackendConfig)


def test_a_shipped_input_study_fills_the_typed_config():
    exp = load_experiment(REPO / "configs" / "input_sleep_20ms.yaml")
    assert exp.cs_config == CSConfig(num_csx=1, num_workers_per_csx=1, wafer_seconds_per_step=0.01)
    assert exp.input == InputConfig(fn="synthetic", kwargs={
        "batch_size": 32, "features": 64, "cost_ms": 20, "cost_kind": "sleep"})
    assert exp.model is None and exp.optimizer is None and exp.steps == 100
    assert exp.backend == BackendConfig(type="CSX", options={"lookahead": 8})


def test_the_digits_config_names_model_optimizer_and_scheduler_in_their_configure_forms():
    exp = load_experiment(REPO / "configs" / "digits_mlp.yaml")
    assert exp.model == ModelConfig(name="examples.data:MLP", kwargs={"hidden": 128},
                                    loss="cross_entropy")
    assert exp.optimizer == {"optimizer_type": "SGD", "lr": 0.1, "momentum": 0.9}
    assert [d["scheduler"] for d in exp.learning_rate] == ["Linear", "CosineDecay"]
    assert exp.checkpoint_steps == 100 and exp.backend.options == CSXOptions(max_checkpoints=2)


def test_a_wrong_type_names_its_path_the_rule_and_the_value(tmp_path):
    with pytest.raises(ExperimentError) as e:
        load(tmp_path, "input: synthetic\nsteps: 5\ncs_config:\n  num_workers_per_csx: four\n")
    assert str(e.value) == (
        "exp.yaml: cs_config.num_workers_per_csx: expected a positive int, got 'four'. Set "
        "num_workers_per_csx to 1 or more, e.g. CSConfig(num_workers_per_csx=1), or to \"auto\" "
        "to find it while the run runs.")


@pytest.mark.parametrize("data, message", [
    ({**MINIMAL, "steps": "ten"}, "steps: expected a positive int, got 'ten'. Set it to 1 or more."),
    ({**MINIMAL, "steps": 0}, "steps: expected a positive int, got 0. Set it to 1 or more."),
    ({**MINIMAL, "checkpoint_steps": 2.5},
     "checkpoint_steps: expected a positive int or None, got 2.5. Set it to 1 or more, or null "
     "for no checkpoints."),
    ({**MINIMAL, "input": {"fn": "synthetic", "kwargs": [1, 2]}},
     "input.kwargs: expected a mapping of names to values, got [1, 2]."),
    ({**MINIMAL, "input": 3}, "input: expected a mapping, got 3."),
    ({**MINIMAL, "model": {"name": "mlp", "loss": "hinge"}, "optimizer": {"optimizer_type": "SGD"}},
     'model.loss: expected one of cross_entropy, mse, got "hinge".'),
    ({**MINIMAL, "cs_config": {"wafer_samples_per_sec": -5}},
     "cs_config.wafer_samples_per_sec: expected a positive number or None, got -5."),
    ({**MINIMAL, "cs_config": {"wafer_samples_per_sec": 10, "wafer_seconds_per_step": 1}},
     "cs_config: set either wafer_samples_per_sec or wafer_seconds_per_step, not both "
     "(got 10 and 1)."),
    ({**MINIMAL, "backend": {"type": "TPU"}}, 'backend.type: expected one of CSX, CPU, GPU, got '
                                              '"TPU".'),
    ({**MINIMAL, "learning_rate": "fast"},
     'learning_rate: expected a number, a scheduler mapping (scheduler: ...) or a list of them, '
     'got "fast".'),
    ({**MINIMAL, "model": "mlp"},
     "optimizer: a model needs an optimizer, e.g. optimizer: {optimizer_type: SGD, lr: 0.1}; or "
     "set model: null to profile the input pipeline alone."),
    ({**MINIMAL, "optimizer": {"lr": 0.1}},
     "optimizer.optimizer_type: expected the optimizer's name (e.g. SGD, Adam), got null."),
])
def test_bad_values_are_named_by_their_path(data, message):
    assert error_of(data) == message


def test_a_wrong_key_names_itself_a_close_match_and_the_valid_keys():
    assert error_of({**MINIMAL, "stepz": 3}) == (
        "the experiment: unknown key 'stepz'. Did you mean 'steps'? Valid keys: name, "
        "cs_config, input, model, optimizer, learning_rate, steps, checkpoint_steps, backend, "
        "artifact_dir, seed.")
    assert error_of({**MINIMAL, "model": {"nme": "mlp"}, "optimizer": {"optimizer_type": "SGD"}}
                    ) == ("model: unknown key 'nme'. Did you mean 'name'? Valid keys: name, "
                          "kwargs, loss.")


def test_a_missing_key_and_an_unknown_backend_option_are_named():
    assert error_of({"input": "synthetic"}) == (
        "the experiment: missing required key 'steps'. Valid keys: name, cs_config, input, "
        "model, optimizer, learning_rate, steps, checkpoint_steps, backend, artifact_dir, seed.")
    assert error_of({**MINIMAL, "backend": {"type": "CSX", "options": {"lookahed": 2}}}) == (
        "backend.options: unknown CSX option 'lookahed'. Did you mean 'lookahead'? Valid "
        "options: artifact_dir, compile_dir, compile_only, validate_only, drop_data, "
        "max_checkpoints, retrace_every_iteration, in_process, address, device, compiler, "
        "lookahead, num_threads, cuda_graph.")


def test_shorthands_and_yaml_exponents_fill_the_same_dataclasses(tmp_path):
    exp = load(tmp_path, "input: synthetic\nmodel: mlp\noptimizer: {optimizer_type: SGD}\n"
                         "steps: 3\nbackend: CPU\ncs_config: {wafer_samples_per_sec: 2e4}\n")
    assert exp.input == InputConfig(fn="synthetic")
    assert exp.model == ModelConfig(name="mlp")
    assert exp.backend == BackendConfig(type="CPU")
    assert exp.cs_config.wafer_samples_per_sec == 20000.0  # PyYAML reads 2e4 as a string


def test_yaml_syntax_errors_and_empty_files_name_the_file_and_line(tmp_path):
    with pytest.raises(ExperimentError) as e:
        load(tmp_path, "steps: 3\ninput: [synthetic\n", name="broken.yaml")
    assert str(e.value).startswith("broken.yaml: line 3, column 1: not valid YAML: ")
    with pytest.raises(ExperimentError) as e:
        load(tmp_path, "# nothing\n", name="empty.yaml")
    assert str(e.value) == ("empty.yaml: the file is empty; an experiment needs at least input "
                            "and steps.")


def test_an_unimportable_input_function_is_named_when_the_run_builds_it():
    exp = experiment_from_dict({"input": "no_such_module_xyz:fn", "steps": 1, "backend": "CPU"})
    with pytest.raises(ExperimentError) as e:
        exp.input.build()
    assert str(e.value) == (
        "input.fn: cannot import module 'no_such_module_xyz' (No module named "
        "'no_such_module_xyz'). Run from the directory that holds it or add it to PYTHONPATH.")


def test_with_layout_changes_cs_config_through_its_own_checks():
    exp = experiment_from_dict(MINIMAL)
    assert with_layout(exp, num_workers_per_csx=4).cs_config.num_workers_per_csx == 4
    with pytest.raises(ExperimentError, match=r"^cs_config.num_csx: expected a positive int"):
        with_layout(exp, num_csx=0)


def test_the_dataclasses_check_themselves_without_yaml():
    with pytest.raises(ExperimentError, match=r"^steps: expected a positive int, got 0\. Set it "
                                              r"to 1 or more\.$"):
        Experiment(input=InputConfig(fn="synthetic"), steps=0)


def test_the_fixed_choices_are_literals_that_match_what_the_code_accepts():
    from typing import get_args, get_type_hints

    from cstream_tools.experiment import LOSSES
    from executor.backends.options import OPTIONS

    assert get_args(get_type_hints(ModelConfig)["loss"]) == tuple(LOSSES)
    assert get_args(get_type_hints(BackendConfig)["type"]) == tuple(OPTIONS)
