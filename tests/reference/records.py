"""A checkpoint's contents as plain JSON data, so two programs can compare what they read.

Used by ``gen_ckpt.py`` (under the real ``cerebras.pytorch``) and by the test suite (under cstream);
it imports neither. :func:`record` lists every entry of a loaded object in order: its key path, its
type and, for tensors, dtype, shape and the bytes of its values in hex (bit for bit, so bfloat16,
float16, NaNs and -0.0 compare exactly; beyond 256 bytes their SHA-256 instead); for other values
the value (floats as ``repr`` text).
"""

from __future__ import annotations

import hashlib

import torch


def _where(path: str, key) -> str:
    if isinstance(key, str):
        return f"{path}/{key}" if path else key
    return f"{path}[{key}]"


def _plain_tensor(t: torch.Tensor) -> torch.Tensor:
    # the real package hands out DeferredTorchTensor: copying into a new tensor reads its values
    return torch.empty_like(t, device="cpu").copy_(t).as_subclass(torch.Tensor)


def _value(v):
    if type(v).__name__ == "DeferredObject":  # how the real package returns a pickled value
        v = v.value
    if isinstance(v, float):
        return "float", repr(v)
    if isinstance(v, (bytes, bytearray)):
        return "bytes", bytes(v).hex()
    if isinstance(v, complex):
        return "complex", [repr(v.real), repr(v.imag)]
    if isinstance(v, torch.dtype):
        return "dtype", str(v)
    if v is None or isinstance(v, (bool, int, str)):
        return type(v).__name__, v
    raise TypeError(f"records.py does not record {type(v).__name__}")


def record(obj, path: str = "") -> list[dict]:
    """Every entry of ``obj`` (nested dicts, lists, tuples) in order, as JSON-ready dicts."""
    out: list[dict] = []
    if isinstance(obj, torch.Tensor):
        t = _plain_tensor(obj).contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        entry = {"key": path or "/", "type": "tensor", "dtype": str(t.dtype)[6:],
                 "shape": list(t.shape)}
        if len(data) <= 256:
            entry["bits"] = data.hex()
        else:
            entry["sha256"] = hashlib.sha256(data).hexdigest()
        return [entry]
    if isinstance(obj, dict):
        if not obj:
            return [{"key": path or "/", "type": "dict", "value": {}}]
        for k, v in obj.items():
            out += record(v, _where(path, k))
        return out
    if isinstance(obj, (list, tuple)):
        kind = "tuple" if isinstance(obj, tuple) else "list"
        if not obj:
            return [{"key": path or "/", "type": kind, "value": []}]
        for i, v in enumerate(obj):
            out += record(v, f"{path}[{i}]")
        # a container's own kind matters (a tuple must load as a tuple)
        out.append({"key": path or "/", "type": kind, "length": len(obj)})
        return out
    kind, value = _value(obj)
    return [{"key": path or "/", "type": kind, "value": value}]
