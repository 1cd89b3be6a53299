"""The examples' data: the UCI handwritten digits (1,797 8x8 images, pixel values 0..16, as
scikit-learn's ``load_digits`` returns them), shipped beside this file in ``digits.npz`` (45 KB),
so nothing is downloaded and scikit-learn is not needed; as input functions for
cstream.DataLoader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, TensorDataset

import cstream as cstorch

NUM_FEATURES = 64
NUM_CLASSES = 10
TEST_SIZE = 297  # the last 297 images are held out for evaluation


DIGITS_FILE = Path(__file__).with_name("digits.npz")


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 images as rows of 64 pixel values (0..16, float64) and their labels, in the
    order of scikit-learn's ``load_digits(return_X_y=True)``."""
    with np.load(DIGITS_FILE) as f:
        images, labels = f["images"], f["labels"]
    return (torch.from_numpy(images.reshape(len(images), -1).astype(np.float64)),
            torch.from_numpy(labels.astype(np.int64)))


def digits(split: str) -> TensorDataset:
    x, y = load_digits()
    x = x.to(torch.float32) / 16.0  # pixel values are 0..16
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # mix the writers
    x, y = x[order], y[order]
    if split == "train":
        x, y = x[:-TEST_SIZE], y[:-TEST_SIZE]
    elif split == "test":
        x, y = x[-TEST_SIZE:], y[-TEST_SIZE:]
    else:
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    return TensorDataset(x, y)


def train_input_fn(batch_size: int = 64, seed: int = 0):
    """Shuffled global batches; every input worker streams its own shard of each."""
    dataset = digits("train")
    order = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    batches = BatchSampler(order, batch_size=batch_size, drop_last=True)
    return torch.utils.data.DataLoader(dataset, batch_sampler=cstorch.utils.data.ShardedSampler(batches))


def eval_input_fn(batch_size: int = 99):
    dataset = digits("test")
    batches = BatchSampler(SequentialSampler(dataset), batch_size=batch_size, drop_last=True)
    return torch.utils.data.DataLoader(dataset, batch_sampler=cstorch.utils.data.ShardedSampler(batches))


class MLP(torch.nn.Module):
    def __init__(self, hidden: int = 128):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(NUM_FEATURES, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
            torch.nn.Linear(hidden, NUM_CLASSES),
        )

    def forward(self, x):
        return self.net(x)
