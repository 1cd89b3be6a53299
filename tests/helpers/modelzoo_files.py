"""Small data files in the Cerebras Model Zoo's own formats, written offline for the tests."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

RELEASES = Path(__file__).resolve().parents[1] / "modelzoo_releases"
"""The Model Zoo release layouts the tests use (see its README)."""


def write_gpt_hdf5(folder: Path, files: int = 4, per_file: int = 128, msl: int = 16,
                   vocab: int = 512, seed: int = 0) -> list[Path]:
    """Token files as the Model Zoo's HDF5 preprocessing writes them (``write_hdf5_file``):
    ``examples_<i>.h5`` holding dataset ``data`` of shape ``[n, 3, msl]`` int32 -- input ids,
    attention mask, labels (the ids shifted by one) -- chunked per example and gzip-compressed,
    and the attribute ``n_examples``."""
    import h5py

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(files):
        tokens = rng.integers(0, vocab, size=(per_file, msl + 1), dtype=np.int32)
        data = np.stack([tokens[:, :-1], np.ones((per_file, msl), np.int32), tokens[:, 1:]], 1)
        path = folder / f"examples_{i}.h5"
        with h5py.File(path, "w") as f:
            f.attrs["n_examples"] = per_file
            f.create_dataset("data", data=data, dtype="i4", chunks=(1, 3, msl),
                             compression="gzip")
        paths.append(path)
    return paths


def write_mnist(folder: Path, n_train: int = 256, n_test: int = 64, seed: int = 0) -> Path:
    """MNIST's idx-ubyte files (magic 0x803 images [n, 28, 28], 0x801 labels [n], big-endian
    sizes) under ``folder/MNIST/raw``, as torchvision's MNIST reads them."""
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def write(name, array, magic):
        with open(raw / name, "wb") as f:
            f.write(struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape))
            f.write(array.astype(np.uint8).tobytes())

    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write(f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)), 0x803)
        write(f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, n), 0x801)
    return raw


BERT_COLUMNS = ("input_ids", "masked_lm_positions", "masked_lm_weights", "attention_mask",
                "labels", "next_sentence_label", "token_type_ids")


def write_bert_csv(folder: Path, files: int = 2, per_file: int = 64, msl: int = 16,
                   max_predictions: int = 4, seed: int = 0) -> list[Path]:
    """BERT pre-training CSV files as the Model Zoo's CSV writer leaves them: one row per
    example, each feature a list literal, and ``meta.dat`` listing ``<file> <examples>``."""
    import csv

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(files):
        path = folder / f"part-{i:05d}.csv"
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=BERT_COLUMNS)
            writer.writeheader()
            for _ in range(per_file):
                writer.writerow({
                    "input_ids": rng.integers(0, 512, msl).tolist(),
                    "masked_lm_positions": sorted(rng.choice(msl, max_predictions, False).tolist()),
                    "masked_lm_weights": [1] * max_predictions,
                    "attention_mask": [1] * msl,
                    "labels": rng.integers(0, 512, max_predictions).tolist(),
                    "next_sentence_label": [int(rng.integers(0, 2))],
                    "token_type_ids": [0] * (msl // 2) + [1] * (msl - msl // 2),
                })
        paths.append(path)
    (folder / "meta.dat").write_text("".join(f"{p.name} {per_file}\n" for p in paths))
    return paths
