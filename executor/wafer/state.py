"""The wafer's resident state: every state tensor (weights, optimizer, scheduler, scaler, metric
state), keyed by the client's slot keys, on the execution device."""

from __future__ import annotations

import torch

from executor.engine.handles import LazyInit


class StateStore:
    def __init__(self, device: torch.device):
        self.device = device
        self.tensors: dict[int, torch.Tensor] = {}

    def put(self, items: dict) -> int:
        """Store values (tensors, or :class:`LazyInit` programs, materialised here)."""
        for key, v in items.items():
            if isinstance(v, LazyInit):
                v = v.materialize()
            self.tensors[key] = v.to(self.device) if v.device != self.device else v.clone()
        return len(items)

    def get(self, keys: list) -> dict:
        """Copies on the host of the values of ``keys``."""
        return {k: self.tensors[k].detach().to("cpu", copy=True) for k in keys}

    def missing(self, keys: list) -> list:
        return [k for k in keys if k not in self.tensors]

    def in_order(self, order: list) -> list:
        return [self.tensors[k] for k in order]

    def update(self, order: list, values: list) -> None:
        for k, v in zip(order, values):
            self.tensors[k] = v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    def __len__(self) -> int:
        return len(self.tensors)
