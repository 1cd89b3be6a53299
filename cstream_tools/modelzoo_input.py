"""A Cerebras Model Zoo params file as the input side of ``cstream run`` / ``cstream sweep``.

``cstream sweep --modelzoo path/to/params.yaml --num-workers-per-csx 1,2,4,8`` profiles the
data processor of the file's ``train_input`` (or ``--section eval_input``) section the way the
Model Zoo runs it on a CS-X: each input worker imports the program's own modules and does what
its ``run.py`` and the cstorch flow do -- ``set_defaults(params)`` from the model's
``utils.py``, then the input function ``run.py`` hands to the flow (``train_input_dataloader``,
``get_train_dataloader``, ...) called with the params, inside the worker's context, so that
``cstorch.distributed`` gives the processor its streaming rank and batch size. The processor's
own ``num_workers``, ``prefetch_factor``, ``persistent_workers`` and ``shuffle_seed`` apply.

The program is found from the file, without importing the Model Zoo in this process:
:func:`locate` walks up from the params file to the model folder (the one holding ``run.py``),
reads ``run.py`` for its input functions and the import path of ``data.py``, and tells the
release layout from it: ``modelzoo.<...>`` (Release 2.0.x/2.1.x, the checkout's top folder on
``sys.path``) or ``cerebras.modelzoo.<...>`` (Release 2.2.x, ``src/`` on ``sys.path``).
:func:`check_section` then checks the section before any worker starts: the processor is one
``data.py`` offers, ``data_dir`` is given where the processor reads files, and the files it
reads exist (HDF5 files, MNIST's idx files, BERT's ``meta.dat`` and the CSV files it lists).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from workers.checks import did_you_mean

SECTIONS = ("train_input", "eval_input")
DEFAULT_STEPS = 60
"""Steps per run when the command line gives no --steps: enough for the wafer's steady state
after the input workers' start."""


class ModelZooError(ValueError):
    """The params file, or the Model Zoo program it belongs to, cannot be profiled as given."""


@dataclass(frozen=True)
class ModelZooProgram:
    """Where a params file's program lives and what its input workers run."""

    params_file: Path
    section: str
    """``train_input`` or ``eval_input``."""
    release: str
    """``"2.0.x"`` (``modelzoo/...``, imports ``cerebras_pytorch``) or ``"2.2.x"``
    (``src/cerebras/modelzoo/...``, the ``cerebras.modelzoo`` namespace)."""
    import_root: Path
    """The folder that goes on ``sys.path`` (the checkout, or its ``src/``)."""
    model_dir: Path
    """The folder holding the program's ``run.py``."""
    data_module: str
    """Import path of the program's ``data.py``."""
    input_fn: str
    """The function of ``data_module`` that ``run.py`` gives the flow for this section."""
    defaults_module: Optional[str]
    """Import path of the module whose ``set_defaults(params)`` ``run.py`` calls first."""
    params: dict
    """The whole params file (the input function reads ``params[section]`` and others)."""

    @property
    def model_name(self) -> str:
        """``model.name`` where the file has one, else the model folder's name (``gpt2``)."""
        name = (self.params.get("model") or {}).get("name")
        if isinstance(name, str) and name:
            return name
        return self.model_dir.parent.name if self.model_dir.name == "pytorch" else self.model_dir.name

    @property
    def processor(self) -> Optional[str]:
        """The section's ``data_processor``, where its input function picks one by name."""
        value = self.params[self.section].get("data_processor")
        return value if isinstance(value, str) else None

    @property
    def batch_size(self) -> Optional[int]:
        """The section's ``batch_size`` (the effective one, split across the CS-Xs)."""
        value = self.params[self.section].get("batch_size")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def worker_spec(self) -> dict:
        """What every input worker receives (plain values: it travels to Ray actors)."""
        return {"import_root": str(self.import_root), "data_module": self.data_module,
                "input_fn": self.input_fn, "defaults_module": self.defaults_module,
                "params": copy.deepcopy(self.params)}


def modelzoo_input_fn(program: dict):
    """Build the Model Zoo section's dataloader in this input worker, as ``run.py`` and the
    cstorch flow do on a CS-X: ``set_defaults(params)``, then the input function."""
    root = program["import_root"]
    if root not in sys.path:
        sys.path.insert(0, root)
    params = program["params"]
    if program["defaults_module"]:
        set_defaults = getattr(importlib.import_module(program["defaults_module"]),
                               "set_defaults", None)
        if set_defaults is not None:
            set_defaults(params)
    input_fn = getattr(importlib.import_module(program["data_module"]), program["input_fn"])
    return input_fn(params)


# -- finding the program ---------------------------------------------------------------------------
def load_params(path: Path) -> dict:
    import yaml

    if not path.is_file():
        raise ModelZooError(f"--modelzoo {path}: no such params file.")
    try:
        params = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        from cstream_tools.experiment import yaml_error_where

        where, problem = yaml_error_where(e)
        raise ModelZooError(f"{path.name}:{where}{':' if where else ''} not valid YAML: "
                            f"{problem}.") from None
    if not isinstance(params, dict):
        raise ModelZooError(f"{path.name}: expected a Model Zoo params file (a mapping with "
                            f"train_input, model, optimizer, runconfig), got {type(params).__name__}.")
    return params


def _find_model_dir(params_file: Path, model_dir: Optional[Path]) -> Path:
    if model_dir is not None:
        if not (model_dir / "run.py").is_file():
            raise ModelZooError(f"--modelzoo-model {model_dir}: holds no run.py; give the model's "
                                "folder, e.g. modelzoo/fc_mnist/pytorch.")
        return model_dir.resolve()
    folder = params_file.resolve().parent
    for candidate in (folder, *list(folder.parents)[:3]):
        if (candidate / "run.py").is_file():
            return candidate
    raise ModelZooError(
        f"--modelzoo {params_file}: no Model Zoo run.py in its folder or the three above it, so "
        "the program it configures is unknown. Keep the file in the model's configs/ folder, or "
        "name the model's folder with --modelzoo-model (e.g. modelzoo/fc_mnist/pytorch).")


def _read_run_py(run_py: Path) -> tuple[dict, list[str]]:
    """``({imported name: module}, [the names given to main(params, Model, train, eval)])``."""
    tree = ast.parse(run_py.read_text(), str(run_py))
    imported: dict[str, str] = {}
    main_args: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = node.module
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id == "main" and len(node.args) >= 4):
            main_args = [a.id if isinstance(a, ast.Name) else "" for a in node.args]
    return imported, main_args


def locate(params_file, section: str = "train_input", root=None, model_dir=None) -> ModelZooProgram:
    """The Model Zoo program of ``params_file`` and the input function of ``section``.

    ``root`` (``--modelzoo-root``) is the checkout; by default it is found from the model
    folder and the import path ``run.py`` uses. ``model_dir`` (``--modelzoo-model``) names the
    model's folder where the params file lives outside the checkout.
    """
    params_file = Path(params_file)
    if section not in SECTIONS:
        raise ModelZooError(f"--section: expected one of {', '.join(SECTIONS)}, got {section!r}.")
    params = load_params(params_file)
    if not isinstance(params.get(section), dict):
        present = [s for s in SECTIONS if isinstance(params.get(s), dict)]
        raise ModelZooError(
            f"{params_file.name}: no {section} section (a mapping of the data processor's "
            f"settings); the file has {', '.join(present) or 'neither train_input nor eval_input'}"
            + (f". Use --section {present[0]}." if present else "."))
    folder = _find_model_dir(params_file, None if model_dir is None else Path(model_dir))
    imported, main_args = _read_run_py(folder / "run.py")
    if not main_args:
        raise ModelZooError(f"{folder / 'run.py'}: no call main(params, Model, train_input_fn, "
                            "eval_input_fn), so its input functions are unknown.")
    fn = main_args[2 if section == "train_input" else 3]
    data_module = imported.get(fn)
    if not fn or data_module is None:
        raise ModelZooError(f"{folder / 'run.py'}: the {section} function given to main() is not "
                            "imported by name from the program's data module.")
    defaults_module = imported.get("set_defaults")
    if data_module.startswith("cerebras.modelzoo."):
        release = "2.2.x"
    elif data_module.startswith("modelzoo."):
        release = "2.0.x"
    else:
        raise ModelZooError(f"{folder / 'run.py'}: imports its input function from {data_module}, "
                            "not from modelzoo.* (Release 2.0/2.1) or cerebras.modelzoo.* "
                            "(Release 2.2).")
    package = data_module.split(".")[:-1]
    import_root = _import_root(folder, package, root)
    return ModelZooProgram(params_file=params_file, section=section, release=release,
                           import_root=import_root, model_dir=folder, data_module=data_module,
                           input_fn=fn, defaults_module=defaults_module, params=params)


def _import_root(folder: Path, package: list[str], root) -> Path:
    """The folder that makes ``package`` (the data module's package) importable."""
    relative = Path(*package)
    if root is None:
        found = folder.parents[len(package) - 1] if len(folder.parents) >= len(package) else None
        if found is None or (found / relative).resolve() != folder:
            raise ModelZooError(f"{folder}: not at {relative} inside a Model Zoo checkout; name "
                                "the checkout with --modelzoo-root.")
        return found
    root = Path(root).resolve()
    for candidate in (root, root / "src"):
        if (candidate / relative / "data.py").is_file() or (candidate / relative).is_dir():
            return candidate
    raise ModelZooError(f"--modelzoo-root {root}: holds neither {relative} nor src/{relative}; "
                        "give the Model Zoo checkout the params file belongs to.")


# -- checking the section --------------------------------------------------------------------------
def _module_file(root: Path, module: str) -> Optional[Path]:
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _sources(root: Path, module: str, depth: int = 2, seen: Optional[set] = None) -> str:
    """The text of ``module`` and of the Model Zoo modules it imports, ``depth`` levels down:
    what the checks read to learn which files a processor opens (never imported here)."""
    seen = set() if seen is None else seen
    path = _module_file(root, module)
    if path is None or module in seen:
        return ""
    seen.add(module)
    text = path.read_text()
    if depth > 0:
        prefix = module.split(".")[0] if module.startswith("modelzoo.") else "cerebras.modelzoo"
        for found in re.findall(r"^\s*from\s+(" + re.escape(prefix) + r"[\w.]*)\s+import",
                                text, re.M):
            text += "\n" + _sources(root, found, depth - 1, seen)
    return text


def processors_of(program: ModelZooProgram) -> dict[str, str]:
    """``{processor name: its module}``: the classes ``data.py`` imports or defines, the names
    its ``getattr(sys.modules[__name__], params[...]["data_processor"])`` can find."""
    path = _module_file(program.import_root, program.data_module)
    if path is None:
        raise ModelZooError(f"{program.data_module}: no such module under {program.import_root}.")
    tree = ast.parse(path.read_text(), str(path))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if alias.name[:1].isupper():
                    out[alias.asname or alias.name] = node.module
        elif isinstance(node, ast.ClassDef):
            out[node.name] = program.data_module
    return out


def _function_source(program: ModelZooProgram) -> str:
    path = _module_file(program.import_root, program.data_module)
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == program.input_fn:
            return ast.get_source_segment(path.read_text(), node) or ""
    raise ModelZooError(f"{program.data_module} has no function {program.input_fn!r} (run.py "
                        "gives it to the flow).")


def check_section(program: ModelZooProgram, total_workers: int = 1) -> dict:
    """Check the section before any worker starts; what was found (the processor, the data
    files). ``total_workers``: the largest ``num_csx * num_workers_per_csx`` to be run."""
    key = program.section
    section = program.params[key]
    fn_source = _function_source(program)
    found: dict = {"processor": None, "data_files": None}
    if "data_processor" in fn_source:
        valid = processors_of(program)
        name = section.get("data_processor")
        if not isinstance(name, str) or not name:
            raise ModelZooError(
                f"{key}.data_processor: missing; {program.input_fn} builds the processor this key "
                f"names. {program.data_module} offers: {', '.join(sorted(valid))}.")
        if name not in valid:
            raise ModelZooError(
                f"{key}.data_processor: unknown processor {name!r}. {program.data_module} "
                f"(which {program.input_fn} looks it up in) offers: {', '.join(sorted(valid))}."
                f"{did_you_mean(name, valid)}")
        found["processor"] = name
        source = _sources(program.import_root, valid[name])
    else:
        source = fn_source + "\n" + _sources(program.import_root, program.data_module, depth=1)
    if section.get("use_fake_data") or '"data_dir"' not in source and "'data_dir'" not in source:
        return found
    what = found["processor"] or program.input_fn
    if "data_dir" not in section:
        raise ModelZooError(f"{key}.data_dir: missing; {what} reads its data from the folder(s) "
                            "this key names. Set it to your preprocessed data.")
    dirs = section["data_dir"] if isinstance(section["data_dir"], list) else [section["data_dir"]]
    folders = []
    for d in dirs:
        folder = _resolve_dir(d)
        if not folder.is_dir():
            raise ModelZooError(f"{key}.data_dir: {d} does not exist or is not a folder"
                                + (f" (relative paths are read from {Path.cwd()})"
                                   if not Path(str(d)).is_absolute() else "") + ".")
        folders.append(folder)
    found["data_files"] = _check_files(key, what, source, folders, total_workers)
    return found


def _resolve_dir(d) -> Path:
    """A data folder as the workers will read it: relative paths from this process's folder."""
    return Path(str(d)).expanduser().absolute()


def _absolute_data_dirs(program: ModelZooProgram) -> ModelZooProgram:
    """``program`` with its section's ``data_dir`` made absolute: the input workers read the
    files that were checked, whatever folder they run in."""
    params = copy.deepcopy(program.params)
    section = params[program.section]
    if isinstance(section.get("data_dir"), str):
        section["data_dir"] = str(_resolve_dir(section["data_dir"]))
    elif isinstance(section.get("data_dir"), list):
        section["data_dir"] = [str(_resolve_dir(d)) for d in section["data_dir"]]
    return dataclasses.replace(program, params=params)


MNIST_FILES = {"train_input": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "eval_input": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _check_files(key: str, what: str, source: str, folders: list[Path],
                 total_workers: int) -> int:
    """The data files of the format ``source`` reads exist in ``folders``; their count."""
    if "datasets.MNIST" in source:  # torchvision's MNIST: <data_dir>/MNIST/raw/<idx files>
        count = 0
        for folder in folders:
            for name in MNIST_FILES[key]:
                if not (folder / "MNIST" / "raw" / name).is_file():
                    raise ModelZooError(
                        f"{key}.data_dir: {folder / 'MNIST' / 'raw' / name} does not exist; "
                        f"{what} reads MNIST's idx files from <data_dir>/MNIST/raw (it would try "
                        "to download them in every input worker).")
                count += 1
        return count
    if "meta.dat" in source:  # BERT CSV: meta.dat lists "<file> <examples>" per line
        count = 0
        for folder in folders:
            meta = folder / "meta.dat"
            if not meta.is_file():
                raise ModelZooError(f"{key}.data_dir: {meta} does not exist; {what} reads the "
                                    "list of its CSV files and their example counts from it.")
            for line in meta.read_text().splitlines():
                if line.strip() and not (folder / line.split()[0]).is_file():
                    raise ModelZooError(f"{key}.data_dir: {meta} lists {line.split()[0]}, which "
                                        f"does not exist in {folder}.")
                count += bool(line.strip())
        return count
    if "h5py" in source or ".h5" in source:
        files = [f for folder in folders for f in sorted(folder.glob("*.h5"))]
        if not files:
            raise ModelZooError(f"{key}.data_dir: no .h5 files in {', '.join(map(str, folders))}; "
                                f"{what} reads HDF5 files written by the Model Zoo's "
                                "preprocessing.")
        if "num_tasks]" in source and len(files) < total_workers:
            raise ModelZooError(
                f"{key}.data_dir: {len(files)} .h5 files for {total_workers} input workers; {what} "
                "gives each worker whole files (files[rank::num_workers]), so "
                f"{total_workers - len(files)} workers would stream nothing. Write at least "
                f"{total_workers} files, or sweep at most {len(files)} workers in all.")
        return len(files)
    return 0


# -- the experiment --------------------------------------------------------------------------------
def add_arguments(p) -> None:
    """``--modelzoo`` and its companions, on ``cstream run`` / ``cstream sweep``."""
    g = p.add_argument_group("a Cerebras Model Zoo params file instead of CONFIG")
    g.add_argument("--modelzoo", metavar="PARAMS",
                   help="profile the data processor of this Model Zoo params file (Release "
                        f"2.0.x or 2.2.x layout) against the simulated wafer; no model is run; "
                        f"{DEFAULT_STEPS} steps per run unless --steps")
    g.add_argument("--modelzoo-root", metavar="CHECKOUT",
                   help="the Model Zoo checkout (default: found from PARAMS' folder)")
    g.add_argument("--modelzoo-model", metavar="DIR",
                   help="the model's folder (the one with run.py) where PARAMS lives elsewhere")
    g.add_argument("--section", default="train_input", choices=SECTIONS,
                   help="which input section to profile (default train_input)")
    g.add_argument("--wafer-rates", metavar="YAML",
                   help="a table of your own measured samples/s per CS-X by model name "
                        "(name: rate); the model's entry paces the wafer")
    g.add_argument("--measure-step", action="store_true",
                   help="run the params file's model on the simulated wafer for a few steps "
                        "and pace the wafer at its measured step time (a CS-X is faster)")


def _most_workers(requested) -> int:
    """The most input workers per CS-X a ``cstream run --num-workers-per-csx`` value starts:
    the count; for ``auto``, autoscaling's default bound; 1 when not given."""
    from workers.config import Autoscale

    if requested == "auto":
        return Autoscale().max_workers_per_csx
    return requested or 1


def experiment(args, command: str):
    """The experiment that runs the Model Zoo section of ``args.modelzoo`` (checked first).

    Sets ``args.wafer_speed`` to how the wafer's speed was chosen (:class:`WaferSpeed`).
    """
    from cstream_tools.experiment import Experiment, ExperimentError, InputConfig, with_layout

    if args.config is not None:
        raise ExperimentError(f"give CONFIG ({args.config}) or --modelzoo, not both")
    try:
        program = locate(args.modelzoo, args.section, args.modelzoo_root, args.modelzoo_model)
        csx = (args.num_csx or [1]) if command == "sweep" else [args.num_csx or 1]
        workers = (args.num_workers_per_csx if command == "sweep"
                   else [_most_workers(args.num_workers_per_csx)])
        check_section(program, total_workers=max(csx) * max(workers))
        program = _absolute_data_dirs(program)
        speed = _wafer_speed(args, program)
    except ModelZooError as e:
        raise ExperimentError(str(e)) from None
    args.wafer_speed = None if speed is None else dataclasses.asdict(speed)
    loader_workers = program.params[program.section].get("num_workers") or 0
    args.answer_notes = [] if not loader_workers else [
        f"{program.section}.num_workers is {loader_workers}: the processor's own DataLoader "
        "worker processes do the reading, and their CPU time is not in the per-batch CPU cost "
        "(it counts the input worker's producing thread); set num_workers: 0 to measure all of "
        "it in the input worker"]
    name = f"{program.model_name}-{program.section}"
    exp = Experiment(name=name, input=InputConfig(fn="cstream_tools.modelzoo_input:modelzoo_input_fn",
                                                  kwargs={"program": program.worker_spec()}),
                     model=None, steps=DEFAULT_STEPS)
    if speed is not None and args.wafer_samples_per_sec is None and speed.samples_per_s:
        exp = with_layout(exp, wafer_samples_per_sec=speed.samples_per_s)
    return exp


def _wafer_speed(args, program: ModelZooProgram):
    given = [n for n, v in (("--wafer-samples-per-sec", args.wafer_samples_per_sec),
                            ("--wafer-seconds-per-step", args.wafer_seconds_per_step),
                            ("--wafer-rates", args.wafer_rates),
                            ("--measure-step", args.measure_step)) if v]
    if len(given) > 1:
        raise ModelZooError(f"give one way to set the wafer's speed, not {' and '.join(given)}.")
    if args.wafer_samples_per_sec is not None:
        return WaferSpeed(args.wafer_samples_per_sec, "--wafer-samples-per-sec")
    if args.wafer_seconds_per_step is not None:
        return None  # the experiment's override applies; the answer reads it from cs_config
    if args.wafer_rates:
        return rate_from_table(Path(args.wafer_rates), program)
    if args.measure_step:
        return measured_rate(program)
    return None


# -- the wafer's speed -----------------------------------------------------------------------------
@dataclass
class WaferSpeed:
    """The wafer's speed the sweep paces to, and where it came from."""

    samples_per_s: Optional[float]
    """Samples/s per CS-X."""
    source: str
    """How it was chosen, as the report says it."""
    caveat: Optional[str] = None


def rate_from_table(path: Path, program) -> WaferSpeed:
    """The entry of ``program``'s model in a YAML table ``{model name: samples/s per CS-X}``;
    the params file's stem (``params_gpt2_small``) is looked up first, then the model's name
    (``model.name``, else its folder: ``gpt2``)."""
    import yaml

    if not path.is_file():
        raise ModelZooError(f"--wafer-rates {path}: no such file.")
    try:
        table = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ModelZooError(f"--wafer-rates {path}: not valid YAML ({e}).") from None
    if not isinstance(table, dict) or not table:
        raise ModelZooError(f"--wafer-rates {path}: expected a mapping of model names to measured "
                            "samples/s per CS-X, e.g. 'gpt2: 240'.")
    names = [program.params_file.stem, program.model_name]
    for name in names:
        if name in table:
            rate = table[name]
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
                raise ModelZooError(f"--wafer-rates {path}: {name}: expected a positive number "
                                    f"of samples/s per CS-X, got {rate!r}.")
            return WaferSpeed(float(rate), f"your measured rate for {name!r} in {path}")
    raise ModelZooError(
        f"--wafer-rates {path}: no entry for {' or '.join(map(repr, names))}; it has "
        f"{', '.join(map(str, table))}.{did_you_mean(names[-1], [str(k) for k in table])}")


MEASURE_STEPS = 8


def measured_rate(program, steps: int = MEASURE_STEPS, timeout_s: float = 900) -> WaferSpeed:
    """Run the program's own ``run.py`` on the simulated wafer (``CSX --mode train``, the params
    file with ``max_steps`` set to ``steps`` and no checkpoints, one input worker) and take
    the wafer's compute time per step after its warm-up."""
    import yaml

    from executor.report import summarize_profile
    from executor.report_writers import load_run

    params = dict(program.params)
    run = dict(params.get("runconfig") or {})
    run.update(max_steps=steps, checkpoint_steps=10 ** 9, save_initial_checkpoint=False,
               log_steps=1)
    run.pop("num_epochs", None)  # max_steps alone sets the length
    run.pop("steps_per_epoch", None)
    params["runconfig"] = run
    with tempfile.TemporaryDirectory(prefix="cstream-measure-") as tmp:
        tmp = Path(tmp)
        params_file = tmp / program.params_file.name
        params_file.write_text(yaml.safe_dump(params))
        model_dir = tmp / "model_dir"
        repo = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [repo, str(program.import_root)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        cmd = [sys.executable, str(program.model_dir / "run.py"), "CSX", "--mode", "train",
               "--params", str(params_file), "--model_dir", str(model_dir)]
        print(f"measuring the wafer's step: {program.model_name}'s run.py CSX, {steps} steps",
              flush=True)
        try:
            done = subprocess.run(cmd, cwd=str(Path.cwd()), env=env, capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise ModelZooError(f"--measure-step: {program.model_dir / 'run.py'} did not finish "
                                f"{steps} steps in {timeout_s:.0f} s.") from None
        profiles = sorted(model_dir.rglob("profile.json"))
        if done.returncode != 0 or not profiles:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-6:])
            raise ModelZooError(f"--measure-step: {' '.join(cmd[1:3])} ... exited with "
                                f"{done.returncode}" + ("" if profiles else " and wrote no "
                                                        "profile") + f":\n{tail}")
        report = summarize_profile(load_run(profiles[-1].parent))
    timed = report["steps"] - (report.get("warmup_steps") or 0)
    if not timed or not report.get("compute_s"):
        raise ModelZooError("--measure-step: the run recorded no timed step after its warm-up; "
                            f"try more steps than {steps}.")
    step_s = report["compute_s"] / timed
    batch = report["samples"] / report["steps"]
    return WaferSpeed(batch / step_s,
                      f"measured: {program.model_name}'s run.py on the simulated wafer, "
                      f"{1000 * step_s:.1f} ms per step of {batch:g} samples (mean of {timed} "
                      "steps after warm-up, on this machine's CPU)",
                      caveat="a CS-X runs this model much faster than the simulated wafer on "
                             "this machine; plan with your system's measured rate "
                             "(--wafer-rates or --wafer-samples-per-sec)")
