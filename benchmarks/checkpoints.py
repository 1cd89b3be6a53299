"""Checkpoint save and load: cstream against the real ``cerebras.pytorch``, ``torch.save`` /
``torch.load``, h5py + hdf5plugin and safetensors, on states of mixed random and zero float32
tensors with bfloat16 ones.

Every save and every load runs in a process of its own (the real package in its own virtual
environment, ``--real-python``), in interleaved rounds (each round runs every writer, then every
reader, the order turned by one each round); the medians are printed and written to
``benchmarks/results/checkpoints.json``. A load reads the whole state and sums every tensor, so a
reader that maps the file or defers its reads pays for reading it too. Peak
memory is the process's high-water mark of resident memory during the save or load (reset just
before), above what it held before, as a multiple of the state's size.

Where the file is when a load starts decides much of its time (this machine reads its disk at
~100 MB/s, and its kernel reclaims pages it finds idle, so a file written a minute earlier may be
on disk only), so each load starts with its file in one state, for every reader alike:
``--cache warm`` (the default) reads the file through just before the load, so it is in the page
cache, as a checkpoint just written or read is; ``--cache cold`` writes it to disk and drops it
from this machine's page cache (``posix_fadvise(DONTNEED)``), as a checkpoint from an earlier day
is (a virtual machine's host may still hold it in its own cache).

    python -m benchmarks.checkpoints [--sizes 256 2048] [--rounds 3] [--cache warm|cold] [--dir DIR]
        [--real-python /work/venvs/cs210/bin/python]
    python -m benchmarks.checkpoints --table [RESULTS.json]   # the results as a markdown table
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TENSOR_MIB = 16

# name -> (file it writes / reads, which python runs it)
WRITERS = {
    "cstream": "cstream.h5",
    "cstream uncompressed": "cstream_uncompressed.h5",
    "cerebras.pytorch 2.10": "real.h5",
    "torch.save": "torch.pt",
    "h5py+hdf5plugin": "h5py.h5",
    "safetensors": "st.safetensors",
}
READERS = {  # reader, file (by its writer)
    "cstream": ("cstream", "cstream"),
    "cstream uncompressed": ("cstream", "cstream uncompressed"),
    "cstream, real package's file": ("cstream", "cerebras.pytorch 2.10"),
    "cerebras.pytorch 2.10": ("real", "cerebras.pytorch 2.10"),
    "cerebras.pytorch 2.10, cstream's file": ("real", "cstream"),
    "h5py+hdf5plugin, cstream's file": ("h5py", "cstream"),
    "h5py+hdf5plugin, real package's file": ("h5py", "cerebras.pytorch 2.10"),
    "torch.load": ("torch", "torch.save"),
    "safetensors": ("safetensors", "safetensors"),
}


# -- the child: one save or one load -----------------------------------------------------------
def make_state(mib: int) -> dict:
    """``mib`` MiB in tensors of 16 MiB: one in 8 bfloat16 (random), the others float32, random and
    zeros in turn (a young optimizer state is mostly zeros). The same numbers in every process."""
    import numpy as np
    import torch

    out = {}
    n = mib // TENSOR_MIB
    for i in range(n):
        if i % 8 == 7:
            values = np.random.default_rng(i).random(TENSOR_MIB << 18, dtype=np.float32) - 0.5
            t = torch.from_numpy(np.concatenate([values, values])).to(torch.bfloat16)
        elif i % 2:
            t = torch.zeros(TENSOR_MIB << 18)
        else:
            t = torch.from_numpy(np.random.default_rng(i).random(TENSOR_MIB << 18,
                                                                  dtype=np.float32) - 0.5)
        out[f"layer{i}.weight"] = t.reshape(1024, -1)
    return {"model": out, "step": 100}


def _rss_kib() -> tuple[int, int]:
    """(resident now, high-water mark) of this process, in KiB."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0])
    return fields["VmRSS"], fields["VmHWM"]


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size


def _touch(obj) -> float:
    """Sums every element of every tensor in ``obj``, in its own dtype: every value is read,
    whatever the reader returned (a tensor, a lazy tensor that loads on its first use, a
    subclass that reads only the elements an op asks for), with no copy of the state."""
    import torch

    if isinstance(obj, dict):
        return sum(_touch(v) for v in obj.values())
    if isinstance(obj, torch.Tensor):
        return float(obj.sum())
    return 0.0


def _save(tool: str, state: dict, path: str) -> None:
    if tool in ("cstream", "cstream uncompressed"):
        import cstream

        cstream.save(state, path, compress=tool == "cstream")
    elif tool == "cerebras.pytorch 2.10":
        import cerebras.pytorch as cstorch

        cstorch.save(state, path)
    elif tool == "torch.save":
        import torch

        torch.save(state, path)
    elif tool == "h5py+hdf5plugin":
        import h5py
        import hdf5plugin
        import torch

        with h5py.File(path, "w") as f:
            for k, t in state["model"].items():
                array = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()
                f.create_dataset(k, data=array, chunks=True, **hdf5plugin.LZ4())
    elif tool == "safetensors":
        from safetensors.torch import save_file

        save_file(state["model"], path)
    else:
        raise ValueError(tool)


def _load(tool: str, path: str):
    if tool == "cstream":
        import cstream

        return cstream.load(path)
    if tool == "real":
        import cerebras.pytorch as cstorch

        return cstorch.load(path)
    if tool == "torch":
        import torch

        return torch.load(path)
    if tool == "h5py":
        import h5py
        import hdf5plugin  # noqa: F401  (registers the LZ4 filter)
        import torch

        with h5py.File(path, "r") as f:
            return {k: torch.from_numpy(f[k][()]) for k in f if f[k].shape}
    if tool == "safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    raise ValueError(tool)


_IMPORTS = {  # what a tool's save or load imports, imported before the clock starts
    "cstream": ["cstream"], "cstream uncompressed": ["cstream"],
    "cerebras.pytorch 2.10": ["cerebras.pytorch"], "real": ["cerebras.pytorch"],
    "h5py+hdf5plugin": ["hdf5plugin"], "h5py": ["hdf5plugin"],
    "safetensors": ["safetensors.torch"],
}


def child(action: str, tool: str, mib: int, path: str) -> None:
    for name in ["torch", "h5py", "numpy", *_IMPORTS.get(tool, [])]:  # imports are not timed
        __import__(name)
    if action == "save":
        state = make_state(mib)
        Path(path).unlink(missing_ok=True)
        before, _ = _rss_kib()
        _reset_peak()
        start = time.perf_counter()
        _save(tool, state, path)
        seconds = time.perf_counter() - start
    else:
        before, _ = _rss_kib()
        _reset_peak()
        start = time.perf_counter()
        state = _load(tool, path)
        touched = _touch(state)
        seconds = time.perf_counter() - start
        del touched
    _, peak = _rss_kib()
    print(json.dumps({"seconds": seconds, "peak_kib": peak - before,
                      "bytes": os.path.getsize(path)}))


# -- the driver --------------------------------------------------------------------------------
def _place(path: Path, cache: str) -> None:
    """Put the file ``path`` in the page cache (``warm``) or on disk only (``cold``)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if cache == "warm":
            while os.read(fd, 64 << 20):
                pass
        else:
            os.fsync(fd)  # pages still to be written cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _run(python: str, action: str, tool: str, mib: int, path: Path, env: dict) -> dict:
    done = subprocess.run([python, str(Path(__file__).resolve()), "--child", action, tool, str(mib),
                           str(path)], capture_output=True, text=True, env=env, cwd="/",
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{action} {tool} ({mib} MiB) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    # here, not at the top: a child runs this file under the real package's Python, where
    # the repository is not importable
    from benchmarks.machine import describe

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 2048], help="states, in MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cache", choices=["warm", "cold"], default="warm",
                        help="where each file is as its load starts: the page cache, or disk only")
    parser.add_argument("--dir", default=None, help="where the files go (default: a temporary folder)")
    parser.add_argument("--real-python", default="/work/venvs/cs210/bin/python",
                        help="a python with cerebras-pytorch 2.10 installed (skipped if missing)")
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/checkpoints.json"))
    args = parser.parse_args()
    ours = {**os.environ, "PYTHONPATH": str(REPO)}
    theirs = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    have_real = Path(args.real_python).exists()
    try:
        import safetensors  # noqa: F401
        have_st = True
    except ImportError:
        have_st = False
    writers = [w for w in WRITERS if (have_real or w != "cerebras.pytorch 2.10")
               and (have_st or w != "safetensors")]
    readers = [r for r, (tool, file) in READERS.items() if file in writers
               and (have_real or tool != "real")]
    results = {"machine": describe(), "load_average_at_start": os.getloadavg(),
               "rounds": args.rounds, "cache": args.cache, "states": {}}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        for mib in args.sizes:
            runs = {("save", w): [] for w in writers} | {("load", r): [] for r in readers}
            for rnd in range(args.rounds):
                turn = rnd % len(writers)
                for w in writers[turn:] + writers[:turn]:
                    python = args.real_python if w == "cerebras.pytorch 2.10" else sys.executable
                    runs["save", w].append(_run(python, "save", w, mib, Path(folder) / WRITERS[w],
                                                theirs if python == args.real_python else ours))
                turn = rnd % len(readers)
                for r in readers[turn:] + readers[:turn]:
                    tool, file = READERS[r]
                    python = args.real_python if tool == "real" else sys.executable
                    _place(Path(folder) / WRITERS[file], args.cache)
                    runs["load", r].append(_run(python, "load", tool, mib,
                                                Path(folder) / WRITERS[file],
                                                theirs if tool == "real" else ours))
                    print(f"{mib} MiB round {rnd + 1}: load {r}: {runs['load', r][-1]}", flush=True)
                print(f"{mib} MiB round {rnd + 1}: saves " + json.dumps(
                    {w: runs["save", w][-1] for w in writers}), flush=True)
            state_bytes = mib << 20
            table = {}
            for (action, name), rs in runs.items():
                table.setdefault(name, {})[action] = {
                    "median_s": statistics.median(r["seconds"] for r in rs),
                    "runs_s": [round(r["seconds"], 3) for r in rs],
                    "peak_over_state": statistics.median(r["peak_kib"] * 1024 / state_bytes
                                                         for r in rs),
                    "file_bytes": rs[-1]["bytes"]}
            results["states"][f"{mib} MiB, {args.cache} cache"] = table
            results["load_average_at_end"] = os.getloadavg()
            _print(mib, table)
            _write(Path(args.out), results)


def _write(out: Path, results: dict) -> None:
    """Writes ``results`` to ``out``, keeping the states of an earlier run that this one did not
    measure (each with the machine, rounds and load average it was measured with)."""
    kept = json.loads(out.read_text()).get("states", {}) if out.exists() else {}
    kept = {name: table for name, table in kept.items() if name.endswith(" cache")}
    runs = {name: {**table, "_run": {k: results[k] for k in ("machine", "rounds", "cache",
                                                               "load_average_at_start",
                                                               "load_average_at_end")}}
            for name, table in results["states"].items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"states": {**kept, **runs}}, indent=1) + "\n")
    print(f"wrote {out}")


def _print(mib: int, table: dict) -> None:
    print(f"\n{mib} MiB state | save s | load s | file MB | peak memory of the load / state")
    for name, row in table.items():
        if name.startswith("_"):
            continue
        save, load = row.get("save"), row.get("load")
        file_bytes = (save or load)["file_bytes"]
        print(f"{name} | {save['median_s']:.2f}" if save else f"{name} | -", end="")
        print(f" | {load['median_s']:.2f} | " if load else " | - | ", end="")
        print(f"{file_bytes / 1e6:.0f} | " + (f"{load['peak_over_state']:.2f}" if load else "-"))


def markdown(path: Path) -> str:
    """The results at ``path`` as the table of docs/checkpoints.md."""
    states = json.loads(path.read_text())["states"]
    lines = ["| state | tool | save s | load s | file MB | peak memory of the load / state |",
             "| --- | --- | --- | --- | --- | --- |"]
    for state, table in states.items():
        for name, row in table.items():
            if name.startswith("_"):
                continue
            save, load = row.get("save"), row.get("load")
            lines.append(f"| {state} | {name} | " + (f"{save['median_s']:.2f}" if save else "") +
                         " | " + (f"{load['median_s']:.2f}" if load else "") +
                         f" | {(save or load)['file_bytes'] / 1e6:.0f} | " +
                         (f"{load['peak_over_state']:.2f}" if load else "") + " |")
        run = table["_run"]
        lines.append(f"| {state}: {run['rounds']} round(s); load average "
                     f"{run['load_average_at_start'][0]:.0f} at the start, "
                     f"{run['load_average_at_end'][0]:.0f} at the end | | | | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    elif len(sys.argv) > 1 and sys.argv[1] == "--table":
        print(markdown(Path(sys.argv[2]) if len(sys.argv) > 2 else
                       REPO / "benchmarks/results/checkpoints.json"))
    else:
        main()
