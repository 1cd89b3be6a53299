"""One small class per backend behind the :class:`Backend` interface."""

from executor.backends.base import Backend, CompiledModel
from executor.backends.cpu import CPUBackend, GPUBackend

__all__ = ["Backend", "CompiledModel", "CPUBackend", "GPUBackend"]
