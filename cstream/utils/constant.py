"""``make_constant``: on a CS-X, makes a tensor a constant of the compiled graph. cstream's
graph already captures tensors created in the step as constants, so the tensor is returned as is.
"""

import torch


def make_constant(tensor: torch.Tensor) -> torch.Tensor:
    return tensor
