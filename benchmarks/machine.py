"""The machine a benchmark ran on and the revision it measured, the same keys in every result
file (``"machine"`` and ``"git"``), and the one line the docs print of a machine."""

from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name as the OS reports it (``/proc/cpuinfo``), else the platform's."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib():
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
        return round(kib / 2 ** 20, 1)
    except (OSError, StopIteration):
        return None


def _version(package: str):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # not installed: what needs it fails and says so
        return None


def describe(device: str = "cpu") -> dict:
    """The machine: the CPU (``cpu`` its model, ``nproc`` its cores, ``cpus_usable`` those this
    process may run on, ``cpu_capability`` ATen's kernels), ``memory_gib``, ``platform``, the
    ``python``, ``torch`` and ``ray`` versions, ``torch_threads``, the ``device`` measured on
    and, on a CUDA device, the ``gpu``'s name and the ``cuda`` version."""
    import torch

    info = {"cpu": cpu_model(), "nproc": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "memory_gib": _memory_gib(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "ray": _version("ray"), "torch_threads": torch.get_num_threads(), "device": device}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def revision() -> dict:
    """The checkout's ``commit`` (None outside a git checkout) and whether tracked files were
    changed (``dirty``)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"commit": git("rev-parse", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def label(machine) -> str:
    """One line for the docs: the GPU, else the CPU, with the cores and the memory. A result
    file written before the description had these keys held a line already: it is kept."""
    if isinstance(machine, str):
        return machine
    cores = machine.get("nproc") or machine.get("cpus") or machine.get("cpu_count")
    where = machine.get("gpu") or machine.get("card") or machine.get("cpu", "an unnamed CPU")
    memory = f", {machine['memory_gib']} GiB" if machine.get("memory_gib") else ""
    return f"{where}, {cores} CPUs{memory}"
