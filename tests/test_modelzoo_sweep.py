"""``cstream sweep --modelzoo``: a Model Zoo params file's data processor swept over worker
counts against a paced wafer, on the release layouts of tests/modelzoo_releases and data files
in the Model Zoo's formats (tests/helpers/modelzoo_files.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cstream_tools.cli import main
from helpers.modelzoo_files import RELEASES, write_bert_csv, write_gpt_hdf5, write_mnist

GPT2_PARAMS = {
    "2.0.x": RELEASES / "Release_2.0.x/modelzoo/transformers/pytorch/gpt2/configs/params_gpt2_tiny.yaml",
    "2.2.x": RELEASES / "Release_2.2.x/src/cerebras/modelzoo/models/nlp/gpt2/configs/"
                        "params_gpt2_tiny.yaml",
}
MNIST_PARAMS = RELEASES / "Release_2.0.x/modelzoo/fc_mnist/pytorch/configs/params.yaml"
BERT_PARAMS = RELEASES / "Release_2.0.x/modelzoo/transformers/pytorch/bert/configs/params_bert_tiny.yaml"


def cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def edited(params_file: Path, folder: Path, **section) -> Path:
    """A copy of ``params_file`` with ``train_input`` keys changed, kept in the model's
    configs/ folder's place by naming the model folder with --modelzoo-model."""
    import yaml

    params = yaml.safe_load(params_file.read_text())
    for key, value in section.items():
        if value is None:
            params["train_input"].pop(key, None)
        else:
            params["train_input"][key] = value
    path = folder / params_file.name
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.mark.parametrize("release", ["2.0.x", "2.2.x"])
def test_the_sweep_finds_the_fewest_workers_for_a_gpt_hdf5_processor_of_known_cost(
        ray_session, tmp_path, capsys, release):
    import yaml

    params = yaml.safe_load(GPT2_PARAMS[release].read_text())["train_input"]
    latency_s, batch = params["simulated_read_latency_s"], params["batch_size"]
    write_gpt_hdf5(tmp_path / "gpt_hdf5" / "train", files=4, per_file=128)
    # one worker delivers at most batch / latency = 133 samples/s: 83% of the wafer's 160,
    # whatever the machine's load (its cost is a sleep, not CPU); two deliver 267. 80 steps:
    # batches a worker made before the wafer's first step (at most the buffers' depth, about
    # 8) cannot lift one worker's 80 steps to 95% (that would take 10 made ahead)
    wafer = 160.0
    grid = [1, 2, 4]
    expected = min(w for w in grid if w * batch / latency_s >= 0.95 * wafer)
    assert expected == math.ceil(0.95 * wafer * latency_s / batch) == 2

    rc, out, err = cli(capsys, "sweep", "--modelzoo", GPT2_PARAMS[release],
                       "--num-workers-per-csx", "1,2,4", "--wafer-samples-per-sec", wafer,
                       "--steps", 80, "--out", "sw", "--input-nodes", 2, "--cores-per-node", 4,
                       "--plan-num-csx", 4)
    assert rc == 0, err
    doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    rows = {r["num_workers_per_csx"]: r for r in doc["rows"]}
    assert sorted(rows) == grid
    assert rows[1]["utilisation"] < 0.95  # bounded by the sleep: at most 83%
    answer = doc["answer"]
    found = answer["fewest_workers_per_csx"]
    assert found is not None and grid.index(found) - grid.index(expected) in (0, 1)
    assert answer["wafer"] == {"samples_per_s": wafer, "source": "--wafer-samples-per-sec",
                               "caveat": None}
    worker = answer["worker"]
    assert worker["measured_at_workers_per_csx"] == 1
    assert worker["batches_per_s"] <= 1 / latency_s  # a worker cannot beat its sleep
    assert worker["cpu_s_per_batch"] is not None and worker["cpu_s_per_batch"] > 0
    assert answer["largest"]["workers_per_csx"] == 4
    assert answer["largest"]["by"] in ("wafer", "cores", "pipeline")
    e = answer["extrapolation"]
    assert (e["num_csx"], e["nodes"], e["cores_per_node_available"]) == (4, 2, 4)
    assert worker["extrapolation_batches_per_s"] == min(worker["batches_per_s"],
                                                        worker["delivered_batches_per_s"])
    assert e["workers_per_csx"] == math.ceil(
        0.95 * (wafer / batch) / worker["extrapolation_batches_per_s"])
    assert e["workers"] == 4 * e["workers_per_csx"]
    assert e["cores"] == pytest.approx(4 * (wafer / batch) * worker["cpu_s_per_batch"])
    assert e["fits"] == (e["cores_per_node"] <= 4)

    lines = out.splitlines()
    start = lines.index("answer (num_csx=1, wafer 160.0 samples/s per CS-X; speed from "
                        "--wafer-samples-per-sec):")
    said = lines[start + 1:]
    assert (f"  fewest workers per CS-X keeping the wafer >= 95% busy: {found} "
            f"({rows[found]['utilisation']:.1%} busy)") in said
    rate = worker["extrapolation_batches_per_s"]
    assert [ln for ln in said if ln.startswith(
        f"  extrapolation from one worker's rate ({rate:,.1f} batches/s, {rate * batch:,.1f} "
        f"samples/s) and cost (not measured): 4 CS-X need {e['workers_per_csx']} worker")]
    assert (tmp_path / "sw" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the workers built the processor from the params file: 30 steps of the file's batch
    assert all(r["samples"] == 80 * batch for r in doc["rows"])


def test_fc_mnist_idx_files_swept_with_the_wafer_rate_from_the_users_table(
        ray_session, tmp_path, capsys):
    write_mnist(tmp_path / "mnist", n_train=256)
    (tmp_path / "rates.yaml").write_text("# samples/s per CS-X measured on our system\n"
                                         "gpt2: 900\nfc_mnist: 2000\n")
    rc, out, err = cli(capsys, "sweep", "--modelzoo", MNIST_PARAMS, "--num-workers-per-csx",
                       "1,2", "--wafer-rates", "rates.yaml", "--steps", 12, "--out", "sw")
    assert rc == 0, err
    doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert doc["answer"]["wafer"]["source"] == "your measured rate for 'fc_mnist' in rates.yaml"
    assert doc["experiment"]["cs_config"]["wafer_samples_per_sec"] == 2000
    assert [r["samples"] for r in doc["rows"]] == [12 * 16, 12 * 16]
    assert "speed from your measured rate for 'fc_mnist' in rates.yaml" in out


def test_run_streams_a_bert_csv_processor_on_two_workers(ray_session, tmp_path, capsys):
    write_bert_csv(tmp_path / "bert_csv" / "train", files=2, per_file=64)
    rc, out, err = cli(capsys, "run", "--modelzoo", BERT_PARAMS, "--num-workers-per-csx", 2,
                       "--steps", 8, "--no-progress", "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert (report["name"], report["steps"], report["samples"]) == ("bert-train_input", 8, 64)
    assert sorted(w["worker"] for w in report["workers"]) == [0, 1]


def test_measure_step_runs_the_programs_model_and_paces_the_wafer_at_its_step(
        ray_session, tmp_path, capsys):
    write_mnist(tmp_path / "mnist", n_train=256)
    rc, out, err = cli(capsys, "sweep", "--modelzoo", MNIST_PARAMS, "--num-workers-per-csx", "1",
                       "--measure-step", "--steps", 8, "--out", "sw")
    assert rc == 0, err
    doc = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    wafer = doc["answer"]["wafer"]
    assert wafer["source"].startswith("measured: fc_mnist's run.py on the simulated wafer, ")
    assert "ms per step of 16 samples" in wafer["source"]
    assert wafer["caveat"].startswith("a CS-X runs this model much faster")
    assert doc["experiment"]["cs_config"]["wafer_samples_per_sec"] == wafer["samples_per_s"] > 0
    assert "  note: a CS-X runs this model much faster" in out


# -- mistakes in the params file, reported before any worker starts --------------------------------
GPT2_20 = GPT2_PARAMS["2.0.x"]
GPT2_MODEL = GPT2_20.parent.parent


@pytest.mark.parametrize("change, message", [
    ({"data_processor": "GptHDF5DataProcesor"},
     "train_input.data_processor: unknown processor 'GptHDF5DataProcesor'. "
     "modelzoo.transformers.pytorch.gpt2.data (which train_input_dataloader looks it up in) "
     "offers: GptHDF5DataProcessor. Did you mean 'GptHDF5DataProcessor'?"),
    ({"data_processor": None},
     "train_input.data_processor: missing; train_input_dataloader builds the processor this key "
     "names. modelzoo.transformers.pytorch.gpt2.data offers: GptHDF5DataProcessor."),
    ({"data_dir": None},
     "train_input.data_dir: missing; GptHDF5DataProcessor reads its data from the folder(s) this "
     "key names. Set it to your preprocessed data."),
    ({"data_dir": "./nowhere"},
     "train_input.data_dir: ./nowhere does not exist or is not a folder (relative paths are read "
     "from {cwd})."),
    ({"data_dir": "./empty"},
     "train_input.data_dir: no .h5 files in {cwd}/empty; GptHDF5DataProcessor reads HDF5 files "
     "written by the Model Zoo's preprocessing."),
    ({"data_dir": "./two_files"},
     "train_input.data_dir: 2 .h5 files for 4 input workers; GptHDF5DataProcessor gives each "
     "worker whole files (files[rank::num_workers]), so 2 workers would stream nothing. Write at "
     "least 4 files, or sweep at most 2 workers in all."),
])
def test_a_mistake_in_the_gpt2_section_names_the_key_before_any_worker_starts(
        tmp_path, capsys, change, message):
    (tmp_path / "empty").mkdir()
    write_gpt_hdf5(tmp_path / "two_files", files=2, per_file=8)
    params = edited(GPT2_20, tmp_path, **change)
    rc, out, err = cli(capsys, "sweep", "--modelzoo", params, "--modelzoo-model", GPT2_MODEL,
                       "--num-workers-per-csx", "1,4", "--wafer-samples-per-sec", 100,
                       "--out", "sw")
    assert rc == 2
    assert err.strip().splitlines()[-1] == \
        "cstream sweep: error: " + message.format(cwd=tmp_path)
    assert not (tmp_path / "sw").exists()  # nothing ran


def test_a_missing_mnist_idx_file_and_a_csv_file_meta_dat_lists_are_named(tmp_path, capsys):
    raw = write_mnist(tmp_path / "mnist")
    (raw / "train-labels-idx1-ubyte").unlink()
    rc, _, err = cli(capsys, "run", "--modelzoo", MNIST_PARAMS, "--steps", 2)
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        f"cstream run: error: train_input.data_dir: {tmp_path}/mnist/MNIST/raw/"
        "train-labels-idx1-ubyte does not exist; get_train_dataloader reads MNIST's idx files "
        "from <data_dir>/MNIST/raw (it would try to download them in every input worker).")

    files = write_bert_csv(tmp_path / "bert_csv" / "train", files=2, per_file=8)
    files[1].unlink()
    rc, _, err = cli(capsys, "run", "--modelzoo", BERT_PARAMS, "--steps", 2)
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        f"cstream run: error: train_input.data_dir: {tmp_path}/bert_csv/train/meta.dat lists "
        f"part-00001.csv, which does not exist in {tmp_path}/bert_csv/train.")


def test_a_params_file_outside_a_model_folder_a_missing_section_and_no_wafer_speed(
        tmp_path, capsys):
    import yaml

    lone = tmp_path / "params.yaml"
    lone.write_text(GPT2_20.read_text())
    rc, _, err = cli(capsys, "sweep", "--modelzoo", lone, "--num-workers-per-csx", "1",
                     "--wafer-samples-per-sec", 100)
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        f"cstream sweep: error: --modelzoo {lone}: no Model Zoo run.py in its folder or the three "
        "above it, so the program it configures is unknown. Keep the file in the model's configs/ "
        "folder, or name the model's folder with --modelzoo-model (e.g. modelzoo/fc_mnist/pytorch).")

    no_eval = tmp_path / "no_eval.yaml"
    params = yaml.safe_load(GPT2_20.read_text())
    del params["eval_input"]
    no_eval.write_text(yaml.safe_dump(params))
    rc, _, err = cli(capsys, "sweep", "--modelzoo", no_eval, "--modelzoo-model", GPT2_MODEL,
                     "--section", "eval_input", "--num-workers-per-csx", "1",
                     "--wafer-samples-per-sec", 100)
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        "cstream sweep: error: no_eval.yaml: no eval_input section (a mapping of the data "
        "processor's settings); the file has train_input. Use --section train_input.")

    write_gpt_hdf5(tmp_path / "gpt_hdf5" / "train", files=1, per_file=8)
    rc, _, err = cli(capsys, "sweep", "--modelzoo", GPT2_20, "--num-workers-per-csx", "1")
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        "cstream sweep: error: --modelzoo: give the wafer's speed to sweep against: "
        "--wafer-samples-per-sec N, --wafer-rates YAML (your measured rates by model name) or "
        "--measure-step")

    rc, _, err = cli(capsys, "sweep", "--num-workers-per-csx", "1")
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        "cstream sweep: error: give an experiment file (CONFIG) or a Model Zoo params file "
        "(--modelzoo PARAMS)")
    rc, _, err = cli(capsys, "run", "small.yaml", "--modelzoo", GPT2_20)
    assert rc == 2
    assert err.strip().splitlines()[-1] == \
        "cstream run: error: give CONFIG (small.yaml) or --modelzoo, not both"

    (tmp_path / "rates.yaml").write_text("gpt3: 100\n")
    rc, _, err = cli(capsys, "sweep", "--modelzoo", GPT2_20, "--num-workers-per-csx", "1",
                     "--wafer-rates", "rates.yaml")
    assert rc == 2
    assert err.strip().splitlines()[-1] == (
        "cstream sweep: error: --wafer-rates rates.yaml: no entry for 'params_gpt2_tiny' or "
        "'gpt2'; it has gpt3. Did you mean 'gpt3'?")


def test_locate_reads_run_py_for_the_input_function_and_tells_the_release_layout(tmp_path):
    from cstream_tools.modelzoo_input import ModelZooError, locate

    p = locate(GPT2_PARAMS["2.2.x"])
    assert (p.release, p.import_root, p.data_module, p.input_fn, p.defaults_module) == (
        "2.2.x", RELEASES / "Release_2.2.x" / "src", "cerebras.modelzoo.models.nlp.gpt2.data",
        "train_input_dataloader", "cerebras.modelzoo.models.nlp.gpt2.utils")
    assert (p.model_name, p.processor, p.batch_size) == ("gpt2", "GptHDF5DataProcessor", 8)
    # the checkout named by its top folder: the 2.2.x code lives under src/
    assert locate(GPT2_PARAMS["2.2.x"], root=RELEASES / "Release_2.2.x").import_root == \
        RELEASES / "Release_2.2.x" / "src"
    p = locate(MNIST_PARAMS, section="eval_input")
    assert (p.release, p.import_root, p.data_module, p.input_fn, p.model_name) == (
        "2.0.x", RELEASES / "Release_2.0.x", "modelzoo.fc_mnist.pytorch.data",
        "get_eval_dataloader", "fc_mnist")
    with pytest.raises(ModelZooError) as e:
        locate(MNIST_PARAMS, root=tmp_path)
    assert str(e.value) == (f"--modelzoo-root {tmp_path}: holds neither modelzoo/fc_mnist/pytorch "
                            "nor src/modelzoo/fc_mnist/pytorch; give the Model Zoo checkout the "
                            "params file belongs to.")
