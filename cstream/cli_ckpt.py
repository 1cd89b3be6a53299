"""``cstream ckpt``: inspect and convert checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("ckpt", help="inspect or convert cstream checkpoints",
                              description="Inspect or convert cstream (HDF5) checkpoints.")
    sub = p.add_subparsers(dest="ckpt_command", metavar="ACTION", parser_class=type(p))
    sub.required = True
    ins = sub.add_parser("inspect", help="list a checkpoint's entries",
                         description="Print every entry of a checkpoint: key path, dtype, shape "
                                     "and size of tensors, and the non-tensor values.")
    ins.add_argument("file", help="a checkpoint written by cstream.save")
    ins.set_defaults(func=inspect)
    conv = sub.add_parser("convert", help="convert to PyTorch's torch.save format",
                          description="Load a cstream checkpoint on the CPU and write it with "
                                      "torch.save (pickle format, loadable with torch.load).")
    conv.add_argument("src", help="a checkpoint written by cstream.save (.h5)")
    conv.add_argument("dst", help="the torch.save file to write (.pt)")
    conv.set_defaults(func=convert)


def _walk(obj, path=""):
    import torch

    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}/{k}" if path else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")
    elif isinstance(obj, torch.Tensor):
        yield path, obj
    else:
        yield path, obj


def inspect(args: argparse.Namespace) -> int:
    import torch

    from cstream.saving import load

    state = load(args.file)
    rows, total = [], 0
    for key, value in _walk(state):
        if isinstance(value, torch.Tensor):
            nbytes = value.numel() * value.element_size()
            total += nbytes
            rows.append((key, str(value.dtype).replace("torch.", ""), str(tuple(value.shape)),
                         _size(nbytes)))
        else:
            rows.append((key, type(value).__name__, "", repr(value)[:40]))
    widths = [max(len(r[i]) for r in rows + [("key", "dtype", "shape", "size")]) for i in range(4)]
    header = ("key", "dtype", "shape", "size/value")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    n = sum(1 for _, v in _walk(state) if isinstance(v, torch.Tensor))
    print(f"{n} tensors, {_size(total)} in {Path(args.file)}")
    return 0


def convert(args: argparse.Namespace) -> int:
    import torch

    from cstream.saving import load, to_eager

    state = to_eager(load(args.src, map_location="cpu"))
    torch.save(state, args.dst)
    print(f"wrote {args.dst} (torch.save format)")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
