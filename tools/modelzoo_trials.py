"""Run a Cerebras Model Zoo program unmodified on cstream: train, resume and evaluate, on CPU and CSX.

Given an extracted Model Zoo release (its code is only read and run, never copied), this writes
the program's data offline (MNIST in the idx-ubyte format from ``examples/digits.npz``; GPT-2
token files in the Model Zoo's HDF5 format), a copy of the program's shipped configuration with
the steps, data folder and precision set, and then runs the program's own ``run.py`` with its
usual command line, each backend in its own process:

1. ``--mode train`` for ``--steps`` steps, a checkpoint every ``--steps // 3`` steps;
2. the same training resumed from the first checkpoint in a fresh model folder (the Model Zoo
   flow autoloads the latest checkpoint it finds there);
3. ``--mode eval`` of the last checkpoint.

It compares the per-step losses of CSX against CPU and of each resumed run against its
uninterrupted run, writes the figures to ``--out`` (JSON) and prints one line per comparison
(``--table FILE...`` prints the table of docs/modelzoo.md from such files)::

    PYTHONPATH=$PWD python tools/modelzoo_trials.py --release /tmp/mz/Release_2.0.2 \\
        --program fc_mnist --precision fp32 --out benchmarks/results/modelzoo_fc_mnist_2.0.2.json

``--pythonpath`` adds folders the Model Zoo's own imports need (torchvision for MNIST, the
registry's dependencies in Release 2.2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
LOSS = re.compile(r"Step=(\d+), Loss=([-\d.einfa]+)")
EVAL_LOSS = re.compile(r"Avg Eval Loss: ([-\d.einfa]+)")
METRIC = re.compile(r"Metric: (\S+) = ([-\d.einfa]+)")
PRECISIONS = {
    # name: (model.mixed_precision, model.use_bfloat16)
    "fp32": (False, False),
    "mixed-bf16": (True, True),
    "mixed-fp16": (True, False),
}


GPT_FAMILIES_2_2 = {  # family: the smallest shipped configuration of its folder
    "gpt2": "params_gpt2_small.yaml", "gpt3": "params_gpt3_111m.yaml",
    "gptj": "params_gpt_neox_small.yaml", "llama": "params_llama2_7b.yaml",
    "mistral": "params_mistral_7B.yaml", "falcon": "params_falcon_7b.yaml",
    "bloom": "params_bloom_7b.yaml", "mpt": "params_mpt_7B.yaml",
    "starcoder": "params_starcoder_15b.yaml", "santacoder": "params_santacoder_1b.yaml",
    "btlm": "params_btlm_2p7b_2k.yaml", "jais": "params_jais_30b.yaml",
}
"""Release 2.2's decoder language models: each reads the GPT HDF5 token files."""

FAMILIES_2_2 = [*GPT_FAMILIES_2_2, "bert", "bert_classifier", "bert_token_classifier",
                "bert_extractive_summarization", "t5", "transformer", "esm2", "dpr", "dpo",
                "dit", "llava", "vision_transformer", "fc_mnist"]
"""Release 2.2's 25 model families (bert counted with each of its fine-tuning heads)."""


def code_root(release: Path) -> tuple[Path, Path]:
    """(the folder to put on PYTHONPATH, the Model Zoo's package folder) of a checkout."""
    if (release / "src" / "cerebras" / "modelzoo").is_dir():
        return release / "src", release / "src" / "cerebras" / "modelzoo"
    return release, release / "modelzoo"


def program_paths(release: Path, program: str) -> tuple[Path, Path, Path]:
    """(run.py, shipped params.yaml, the folder to put on PYTHONPATH) of ``program``."""
    root, code = code_root(release)
    if program == "fc_mnist":
        folder, shipped = code / "fc_mnist" / "pytorch", "params.yaml"
    elif root.name != "src":  # Release 2.0/2.1
        folder, shipped = code / "transformers" / "pytorch" / "gpt2", "params_gpt2_small.yaml"
    else:
        folder, shipped = code / "models" / "nlp" / program, GPT_FAMILIES_2_2[program]
    return folder / "run.py", folder / "configs" / shipped, root


def write_mnist(folder: Path, n_train: int = 1500) -> None:
    """MNIST idx-ubyte files from the 8x8 digits, upscaled x3 to 24x24 and padded to 28x28."""
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    digits = np.load(REPO / "examples" / "digits.npz")
    images = digits["images"].astype(np.float32) * (255.0 / max(1, digits["images"].max()))
    images = np.pad(np.kron(images, np.ones((3, 3), np.float32)), ((0, 0), (2, 2), (2, 2)))
    images, labels = images.astype(np.uint8), digits["labels"].astype(np.uint8)

    def write(name, array, magic):
        with open(raw / name, "wb") as f:
            f.write(struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape))
            f.write(array.tobytes())

    write("train-images-idx3-ubyte", images[:n_train], 0x803)
    write("train-labels-idx1-ubyte", labels[:n_train], 0x801)
    write("t10k-images-idx3-ubyte", images[n_train:], 0x803)
    write("t10k-labels-idx1-ubyte", labels[n_train:], 0x801)


def write_gpt_hdf5(folder: Path, files: int = 2, per_file: int = 64, msl: int = 64,
                   vocab: int = 512) -> None:
    """Token files as the Model Zoo's GPT HDF5 processor reads them: ``data`` [n, 3, msl]
    (input ids, attention mask, labels: the ids shifted by one) and the ``n_examples`` attribute."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(files):
        tokens = rng.integers(0, vocab, size=(per_file, msl + 1), dtype=np.int32)
        data = np.stack([tokens[:, :-1], np.ones((per_file, msl), np.int32), tokens[:, 1:]], 1)
        with h5py.File(folder / f"data-{i}.h5", "w") as f:
            f.attrs["n_examples"] = per_file
            f.create_dataset("data", data=data)


def checkpoint_every(steps: int) -> int:
    """Steps between checkpoints: a third of the run (the resumed run starts at the first)."""
    return max(1, steps // 3)


def params_for(program: str, shipped: Path, data: Path, steps: int, precision: str,
               release_2_2: bool) -> dict:
    """The shipped configuration with this trial's data, steps, precision and logging."""
    params = yaml.safe_load(shipped.read_text())
    mixed, bf16 = PRECISIONS[precision]
    params["model"]["mixed_precision"] = mixed
    if release_2_2:  # Release 2.2 names the half dtype and refuses the older flag
        params["model"]["fp16_type"] = "bfloat16" if bf16 else "float16"
    else:
        params["model"]["use_bfloat16"] = bf16
    run = params["runconfig"]
    run.update(max_steps=steps, log_steps=1, checkpoint_steps=checkpoint_every(steps), seed=1,
               save_initial_checkpoint=False)
    run.pop("eval_frequency", None)
    for key in ("train_input", "eval_input"):
        params[key]["data_dir"] = str(data)
        if program == "fc_mnist":  # its loader streams half images on CSX unless told not to
            params[key]["to_float16"] = mixed
    if program == "fc_mnist":
        run["steps_per_epoch"] = steps  # 2.0.x reads it; 1,500 images give 375 batches of 4
        run["eval_steps"] = 20
    else:
        tiny_decoder(params["model"])
        for key in ("train_input", "eval_input"):
            params[key].update(batch_size=8, shuffle=False,
                               num_workers=0 if release_2_2 else 1)
            params[key].pop("max_sequence_length", None)  # "sample" files fix the length
        run["eval_steps"] = 4
    return params


TINY_DECODER = {"hidden_size": 64, "num_heads": 4, "num_hidden_layers": 2, "filter_size": 256,
                "vocab_size": 512, "max_position_embeddings": 64}
"""A decoder small enough for two cores; the token files are written for its vocabulary and
sequence length (64)."""


def tiny_decoder(model: dict) -> None:
    """Shrink a shipped decoder configuration in place, keeping its structure (position
    embedding, attention module, norms, nonlinearity, scaling): sizes from TINY_DECODER, the
    rotary dimension the head size, a sliding window half the sequence, at most 2 key-value
    groups, and no dropout, so CPU and CSX draw nothing random."""
    model.update(TINY_DECODER)
    head = TINY_DECODER["hidden_size"] // TINY_DECODER["num_heads"]
    if "rotary_dim" in model:
        model["rotary_dim"] = head
    if "attention_sliding_window_length" in model:
        model["attention_sliding_window_length"] = TINY_DECODER["max_position_embeddings"] // 2
    extra = model.get("extra_attention_params") or {}
    if "num_kv_groups" in extra:
        extra["num_kv_groups"] = min(2, extra["num_kv_groups"])
    for key, value in list(model.items()):
        if "dropout" in key and isinstance(value, (int, float)) and not isinstance(value, bool):
            model[key] = 0.0


def run_program(python: str, run_py: Path, backend: str, mode: str, params: Path,
                model_dir: Path, env: dict, log: Path, extra: tuple = (),
                timeout: int = 1200) -> dict:
    """Run ``run.py`` once; its exit code, losses by step, eval loss, metrics and seconds."""
    cmd = [python, str(run_py), backend, "--mode", mode, "--params", str(params),
           "--model_dir", str(model_dir), *extra]
    start = time.monotonic()
    with open(log, "w") as out:
        done = subprocess.run(cmd, cwd=params.parent, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout)
    text = log.read_text()
    found = {"rc": done.returncode, "seconds": round(time.monotonic() - start, 1),
             "losses": {int(s): float(v) for s, v in LOSS.findall(text)},
             "metrics": {k: float(v) for k, v in METRIC.findall(text)}, "log": str(log)}
    if m := EVAL_LOSS.search(text):
        found["eval_loss"] = float(m.group(1))
    if done.returncode != 0:
        found["error"] = text.strip().splitlines()[-1] if text.strip() else "no output"
    return found


def runnable(release: Path) -> list[str]:
    """The families of ``release`` this tool runs."""
    if code_root(release)[0].name == "src":
        return [f for f in FAMILIES_2_2 if f == "fc_mnist" or f in GPT_FAMILIES_2_2]
    return ["fc_mnist", "gpt2"]


def trial(args, program: str) -> dict:
    run_py, shipped, root = program_paths(args.release, program)
    work = args.work / f"{args.release.name}-{program}-{args.precision}"
    shutil.rmtree(work, ignore_errors=True)
    data = work / "data"
    (write_mnist if program == "fc_mnist" else write_gpt_hdf5)(data)
    params = work / "params.yaml"
    release_2_2 = root.name == "src"
    params.write_text(yaml.safe_dump(params_for(program, shipped, data, args.steps,
                                                args.precision, release_2_2)))
    path = [str(REPO), str(root), *args.pythonpath, os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p),
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    first = checkpoint_every(args.steps)
    runs = {}
    for backend in ("CPU", "CSX"):
        full, resumed = work / f"{backend}-full", work / f"{backend}-resumed"
        runs[f"{backend} train"] = run_program(args.python, run_py, backend, "train", params,
                                               full, env, work / f"{backend}-train.log")
        start, last = full / f"checkpoint_{first}.mdl", full / f"checkpoint_{args.steps}.mdl"
        if not start.exists() or not last.exists():
            skipped = {"rc": None, "losses": {}, "metrics": {}, "seconds": 0,
                       "error": f"not run: training wrote no {start.name} and {last.name}"}
            runs[f"{backend} resume"] = runs[f"{backend} eval"] = skipped
            continue
        resumed.mkdir()
        shutil.copy(start, resumed)
        runs[f"{backend} resume"] = run_program(args.python, run_py, backend, "train", params,
                                                resumed, env, work / f"{backend}-resume.log")
        runs[f"{backend} eval"] = run_program(
            args.python, run_py, backend, "eval", params, work / f"{backend}-eval", env,
            work / f"{backend}-eval.log", extra=("--checkpoint_path", str(last)))
    return {"release": args.release.name, "program": program, "precision": args.precision,
            "steps": args.steps, "resumed_from": first, "runs": runs,
            "compare": compare(runs)}


def _max_gap(a: dict, b: dict):
    steps = sorted(set(a) & set(b))
    return (max(abs(a[s] - b[s]) for s in steps), len(steps)) if steps else (None, 0)


def compare(runs: dict) -> dict:
    """Largest loss gaps: CSX against CPU (train and eval) and each resumed run against its
    uninterrupted run over the steps both logged."""
    out = {}
    for name, (a, b) in {"CSX vs CPU, train": ("CSX train", "CPU train"),
                         "CPU resumed vs uninterrupted": ("CPU resume", "CPU train"),
                         "CSX resumed vs uninterrupted": ("CSX resume", "CSX train")}.items():
        gap, n = _max_gap(runs[a]["losses"], runs[b]["losses"])
        out[name] = {"max_abs_loss_gap": gap, "steps_compared": n}
    cpu, csx = runs["CPU eval"].get("eval_loss"), runs["CSX eval"].get("eval_loss")
    out["CSX vs CPU, eval loss"] = {"CPU": cpu, "CSX": csx,
                                    "gap": None if cpu is None or csx is None else abs(cpu - csx)}
    return out


def table(paths: list[Path]) -> str:
    """A markdown table of trial results (JSON files written with ``--out``)."""
    rows = ["| release, program, precision | runs (exit 0 of 6) | CSX vs CPU: largest train loss gap "
            "(steps) | resumed vs uninterrupted, CPU / CSX | eval loss CPU / CSX |",
            "| --- | --- | --- | --- | --- |"]
    for path in paths:
        r = json.loads(path.read_text())
        c = r["compare"]
        ok = sum(run["rc"] == 0 for run in r["runs"].values())

        def gap(name):
            g = c[name]["max_abs_loss_gap"]
            return "not run" if g is None else f"{g:.2g}"

        ev = c["CSX vs CPU, eval loss"]
        rows.append(
            f"| {r['release']} {r['program']}, {r['precision']} | {ok} | "
            f"{gap('CSX vs CPU, train')} ({c['CSX vs CPU, train']['steps_compared']}) | "
            f"{gap('CPU resumed vs uninterrupted')} / {gap('CSX resumed vs uninterrupted')} "
            f"(from step {r['resumed_from']}) | {ev['CPU']:.5f} / {ev['CSX']:.5f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--table"]:
        print(table([Path(p) for p in argv[1:]]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", type=Path, required=True,
                        help="an extracted Model Zoo release (Release_2.0.2, Release_2.2.1, ...)")
    parser.add_argument("--program", action="append", required=True,
                        help="a model family (repeatable; 'all' for every family the release "
                        f"has that this tool runs: Release 2.2 {', '.join(FAMILIES_2_2)})")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--work", type=Path, default=Path("/tmp/cstream-modelzoo-trials"))
    parser.add_argument("--pythonpath", action="append", default=[],
                        help="a folder the Model Zoo's imports need (repeatable)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter that runs the programs (a venv with the Model "
                        "Zoo's requirements)")
    parser.add_argument("--out", type=Path,
                        help="write the figures here as JSON (a folder with several programs: "
                        "PROGRAM_RELEASE_PRECISION.json in it)")
    args = parser.parse_args(argv)
    programs = [p for name in args.program for p in (runnable(args.release)
                                                       if name == "all" else [name])]
    failed = 0
    for program in programs:
        result = trial(args, program)
        print(f"== {program} ({args.release.name}, {args.precision})")
        for name, run in result["runs"].items():
            status = "ok" if run["rc"] == 0 else f"FAILED ({run.get('error')})"
            print(f"{name}: {status}, {len(run['losses'])} losses logged, {run['seconds']} s"
                  + (f", eval loss {run['eval_loss']}" if "eval_loss" in run else ""))
        for name, figures in result["compare"].items():
            print(f"{name}: {figures}")
        if args.out:
            out = args.out
            if len(programs) > 1 or out.is_dir():
                out = out / f"{program}_{args.release.name.removeprefix('Release_')}_" \
                    f"{args.precision}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")
        failed += not all(run["rc"] == 0 for run in result["runs"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
