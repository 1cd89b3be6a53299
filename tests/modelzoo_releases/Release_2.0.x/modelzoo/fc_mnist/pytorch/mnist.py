"""MNIST from its idx-ubyte files under ``<root>/MNIST/raw``, as ``torchvision.datasets.MNIST``
reads them (the same constructor arguments; it never downloads here)."""

import os

import numpy as np
import torch

FILES = {True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
         False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def read_idx(path):
    with open(path, "rb") as f:
        magic = int.from_bytes(f.read(4), "big")
        dims = [int.from_bytes(f.read(4), "big") for _ in range(magic & 0xFF)]
        return np.frombuffer(f.read(), dtype=np.uint8).reshape(dims)


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root, train=True, download=False, transform=None, target_transform=None):
        raw = os.path.join(root, "MNIST", "raw")
        images, labels = FILES[train]
        self.data = torch.from_numpy(read_idx(os.path.join(raw, images)).copy())
        self.targets = torch.from_numpy(read_idx(os.path.join(raw, labels)).astype(np.int64))
        self.transform, self.target_transform = transform, target_transform

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        image = self.data[index].float().div(255).unsqueeze(0)
        target = int(self.targets[index])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return image, target
