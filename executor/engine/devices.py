"""A captured step for the device it runs on: device-neutral dispatch and device arguments.

The client captures a step on CPU placeholders wherever the wafer runs it; it cannot capture on
the wafer's device, which the client may not have (fake CUDA tensors on a CPU-only torch abort
the process in the backward pass). What ties a CPU capture to the CPU is twofold:

* **Kernels torch picks by device.** Some ops are composites that choose an implementation
  from the device of their inputs: ``scaled_dot_product_attention`` becomes
  ``_scaled_dot_product_flash_attention_for_cpu`` on a CPU tensor, an LSTM becomes
  ``mkldnn_rnn_layer``. For a step that runs elsewhere, :func:`neutral_dispatch` is active
  while it is captured: attention takes torch's math path (matmul, softmax: ops every device
  has) and oneDNN is off, so no composite picks a CPU-only kernel.
* **Device arguments.** Factory ops of the step (``torch.arange(t)``, the causal mask's
  ``ones``, ``clip_grad_norm_``'s ``.to(device)``) record the CPU as their device;
  :func:`retarget` rewrites every such argument to the wafer's device.

A step for the CPU is captured exactly as before (no pass runs), so its numbers do not change.
:func:`device_bound_ops` lists what in a graph cannot run on a device; the run refuses such a
graph before it is shipped (:func:`check_device_clean`) and ``validate_only`` reports it.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator, Union

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from workers import torch_compat

Device = Union[str, torch.device]

# ops that exist for one device only, by the name torch gives them (the dispatcher cannot tell
# where a backend is not compiled in: a CPU-only torch has no CUDA kernels to look up)
_BOUND_BY_NAME = {
    "cpu": re.compile(r"_for_cpu|mkldnn|onednn|(^|_)mkl_|fbgemm|nnpack|(^|_)cpu(_|$)"),
    "cuda": re.compile(r"cudnn|miopen|(^|_)cuda(_|$)|_efficient_attention|^_flash_attention"),
    "mps": re.compile(r"(^|_)mps(_|$)"),
}
# dispatch keys whose kernel runs on any device
_COMPOSITE_KEYS = ("CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional",
                   "CompositeImplicitAutograd")
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA"}


class DeviceBoundError(RuntimeError):
    """A captured graph holds ops or device arguments another device's kernels are tied to."""


def _device(device: Device) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


@contextlib.contextmanager
def neutral_dispatch(target: Device) -> Iterator[None]:
    """While a step for ``target`` is captured on the CPU: composites take paths every device
    has (attention on torch's math path, oneDNN off). Nothing changes for a CPU target. The
    settings are torch's process-wide switches, restored on exit."""
    if _device(target).type == "cpu":
        yield
        return
    saved_mkldnn = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.backends.mkldnn.enabled = saved_mkldnn


def _retargeted(value, source: str, target: torch.device):
    if isinstance(value, torch.device) and value.type == source:
        return target
    if isinstance(value, (list, tuple)):
        return type(value)(_retargeted(v, source, target) for v in value)
    if isinstance(value, dict):
        return {k: _retargeted(v, source, target) for k, v in value.items()}
    return value


def retarget(gm: torch.fx.GraphModule, target: Device, source: str = "cpu") -> torch.fx.GraphModule:
    """``gm`` with every ``source`` device argument of its nodes made ``target``, in place. A
    step's tensors all live on the wafer (moving one to the host is refused while it is
    traced), so a ``source`` device in the graph is the capture's, not the user's."""
    target = _device(target)
    if target.type == source:
        return gm
    for node in gm.graph.nodes:
        node.args = _retargeted(node.args, source, target)
        node.kwargs = _retargeted(node.kwargs, source, target)
    gm.recompile()
    return gm


def _devices_in(value) -> Iterator[torch.device]:
    if isinstance(value, torch.device):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _devices_in(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _devices_in(v)


def op_runs_on(op, device: Device) -> bool:
    """Whether torch has a kernel of ``op`` for ``device``: from the dispatcher where torch
    was built with that device's backend, else from the op's name (:data:`_BOUND_BY_NAME`)."""
    device = _device(device)
    key = _BACKEND_KEYS.get(device.type)
    name = op.name()
    if key is not None and (device.type == "cpu" or torch.backends.cuda.is_built()):
        return any(torch_compat.has_kernel_for(name, k) for k in (key, *_COMPOSITE_KEYS))
    packet = name.split("::", 1)[-1].split(".", 1)[0]
    return not any(other != device.type and pattern.search(packet)
                   for other, pattern in _BOUND_BY_NAME.items())


def device_bound_ops(gm: torch.fx.GraphModule, device: Device) -> list[str]:
    """What in ``gm`` cannot run on ``device``, one line per node: an op without a kernel for
    it (``aten._scaled_dot_product_flash_attention_for_cpu`` on ``cuda``), or a device argument
    of another type (``aten.arange(..., device=cpu)``; ``meta`` is no device's: a meta tensor
    holds no data). Empty when the graph is clean. Tensors the graph holds as attributes are
    not listed: the wafer moves them to its device when it loads the graph."""
    device = _device(device)
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch_compat.OpOverload):
            continue
        op = node.target
        if not op_runs_on(op, device):
            found.append(f"{node.name}: {op} has no kernel for {device.type}")
        others = sorted({str(d) for d in _devices_in((node.args, node.kwargs))
                         if d.type not in (device.type, "meta")})
        if others:
            found.append(f"{node.name}: {op} is given device {', '.join(others)}")
    return found


def check_device_clean(gm: torch.fx.GraphModule, device: Device) -> None:
    """Raise :class:`DeviceBoundError` naming every node of ``gm`` that cannot run on
    ``device`` (:func:`device_bound_ops`); return None when there is none."""
    found = device_bound_ops(gm, device)
    if found:
        shown = "\n  ".join(found[:20]) + (f"\n  ... and {len(found) - 20} more"
                                          if len(found) > 20 else "")
        raise DeviceBoundError(
            f"the captured step cannot run on {_device(device)}: {len(found)} of its nodes are "
            f"tied to another device:\n  {shown}\nThe step is captured on the CPU with "
            "device-neutral dispatch for a non-CPU wafer; an op listed here was chosen by a "
            "library or called by name for one device. Write it with device-neutral torch "
            "calls (e.g. torch.nn.functional.scaled_dot_product_attention rather than a "
            "backend's own kernel)."
        )
