"""``cerebras.pytorch.backend.ltc_backend``: hooks on the tensors that come back from the wafer.

>>> h = register_after_tensor_to_cpu(lambda tensor, name: None)
>>> h.remove()
"""

from executor.tensor_hooks import register_after_tensor_to_cpu

__all__ = ["register_after_tensor_to_cpu"]
