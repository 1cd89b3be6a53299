"""``cstream ckpt``: inspect and convert checkpoints."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from cstream_tools.cli_errors import CLIError


# names that mark a checkpoint, damaged or not: cstream's and the real package's (.h5), the seed's
# and the Model Zoo's (checkpoint_{step}.mdl)
CHECKPOINT_SUFFIXES = (".h5", ".hdf5", ".mdl")
# what `convert --to` writes, and what it picks from the output's name
_TARGETS = ("torch", "compressed", "uncompressed")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("ckpt", help="inspect or convert cstream checkpoints",
                              description="Inspect or convert checkpoints (HDF5) written by "
                                          "cstream.save or cerebras.pytorch.save, or by cstream's "
                                          "earlier releases.")
    sub = p.add_subparsers(dest="ckpt_command", metavar="ACTION", parser_class=type(p))
    sub.required = True
    ins = sub.add_parser("inspect", help="list a checkpoint's entries, or a folder's checkpoints",
                         description="Print every entry of a checkpoint: key path, dtype, shape "
                                     "and size of tensors, the other values, and the total size of "
                                     "the tensors, and the file's layout. Reads no tensor "
                                     "values. Given a folder, list its checkpoints (files named "
                                     f"{', '.join('*' + s for s in CHECKPOINT_SUFFIXES)}, and any "
                                     "other that starts as a checkpoint), oldest first, and "
                                     "whether each is intact or why it is not.")
    ins.add_argument("file", help="a checkpoint written by cstream.save or cerebras.pytorch.save, "
                                  "or a folder of them")
    ins.set_defaults(func=inspect)
    conv = sub.add_parser("convert", help="convert to torch.save's format or between the "
                                          "compressed and uncompressed layouts",
                          description="Load a checkpoint on the CPU and write it again: with "
                                      "torch.save (pickle format, loadable with torch.load), or "
                                      "with cstream.save, its tensors LZ4-compressed (the real "
                                      "package's layout and size) or uncompressed (larger, "
                                      "loaded without decoding). The output appears only when "
                                      "complete.")
    conv.add_argument("src", help="a checkpoint written by cstream.save or cerebras.pytorch.save")
    conv.add_argument("dst", help="the file to write")
    conv.add_argument("--to", choices=_TARGETS, default=None,
                      help="what to write: torch.save's format, or cstream.save's compressed or "
                           f"uncompressed layout (default: compressed for a name ending in "
                           f"{', '.join(CHECKPOINT_SUFFIXES)}, else torch)")
    conv.set_defaults(func=convert)


def inspect(args: argparse.Namespace) -> int:
    from cstream.checkpoint.saving import describe_and_layout

    if os.path.isdir(args.file):
        return _inspect_folder(Path(args.file))
    entries, layout = describe_and_layout(args.file)
    rows, total, tensors = [], 0, 0
    for e in entries:
        if e["type"] == "tensor":
            total += e["nbytes"]
            tensors += 1
            rows.append((e["key"], e["dtype"], str(e["shape"]), _size(e["nbytes"])))
        else:
            text = repr(e["value"])
            rows.append((e["key"], e["type"], "", text if len(text) <= 60 else text[:57] + "..."))
    header = ("key", "dtype/type", "shape", "size/value")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    for r in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    print(f"{tensors} tensors, {_size(total)} ({total} bytes) in {Path(args.file)}")
    print(f"layout: {layout}")
    return 0


def _inspect_folder(folder: Path) -> int:
    """One line per checkpoint in ``folder``, oldest first: intact (and its layout) or damaged."""
    from cstream.checkpoint import guard
    from cstream.checkpoint.saving import CheckpointError, layout, looks_like_checkpoint

    files = sorted((p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                    and (p.suffix in CHECKPOINT_SUFFIXES or looks_like_checkpoint(p))),
                   key=lambda p: (p.stat().st_mtime, p.name))
    if not files:
        raise CLIError(f"{folder} holds no checkpoints (files named "
                       f"{', '.join('*' + s for s in CHECKPOINT_SUFFIXES)}, or any other that "
                       "starts as a checkpoint)")
    rows = []
    for path in files:
        try:
            written = layout(path)
            with open(path, "rb") as f:
                sealed = guard.is_sealed(f.read(len(guard.TAG)))
            state = (f"intact (its checksum matches): {written}" if sealed else
                     f"readable (it has no checksum; its tensors are not checked): {written}")
        except CheckpointError as e:
            reason = str(e).removeprefix(f"{path} is not a readable checkpoint: ")
            state = "DAMAGED: " + reason.split(" Load an earlier checkpoint instead")[0]
        modified = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))
        rows.append((path.name, _size(path.stat().st_size), modified, state))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for r in rows:
        print("  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[3]]))
    damaged = sum(r[3].startswith("DAMAGED") for r in rows)
    print(f"{len(rows) - damaged} of {len(rows)} checkpoints in {folder} can be loaded")
    return 0


def convert(args: argparse.Namespace) -> int:
    import torch

    from cstream.checkpoint.saving import load, save, to_eager

    src, dst = Path(args.src), Path(args.dst)
    target = args.to or ("compressed" if dst.suffix in CHECKPOINT_SUFFIXES else "torch")
    if dst.exists() and src.exists() and dst.resolve() == src.resolve():
        example = src.with_suffix(".pt" if target == "torch" else f".{target}{src.suffix}")
        raise CLIError(f"the output {dst} is the input checkpoint; name another file, e.g. {example}")
    if not dst.parent.is_dir():
        raise CLIError(f"the output directory {dst.parent} does not exist; create it first")
    state = load(src, map_location="cpu")
    if target != "torch":
        save(state, dst, compress=target == "compressed")
        print(f"wrote {dst} (cstream.save's {target} layout; load it with cstream.load or "
              "cerebras.pytorch.load)")
        return 0
    state = to_eager(state)
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.tmp"
    try:
        torch.save(state, tmp)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    print(f"wrote {dst} (torch.save format; load it with torch.load)")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)
