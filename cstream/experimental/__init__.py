"""``cstream.experimental``: the same names as the top level (Cerebras' porting guide imports
this path). ``cstream/__init__.py`` copies them in once it has bound them all, so this module
imports nothing of the top level's.

>>> import cstream.experimental as cstorch
>>> import cstream.experimental.metrics as metrics
>>> metrics is cstorch.metrics
True
"""

from cstream.experimental import listener
from cstream.unsupported import unsupported as _unsupported
from cstream.unsupported import unsupported_class as _unsupported_class

_LOOP = "the on-device autoregressive generation loop (cerebras.pytorch.experimental.{})"
run_implicit_autoregressive_loop = _unsupported(_LOOP.format("run_implicit_autoregressive_loop"))
start_implicit_loop = _unsupported(_LOOP.format("start_implicit_loop"))
update_implicit_loop = _unsupported(_LOOP.format("update_implicit_loop"))
Compression = _unsupported_class(
    "Compression", "weight and activation compression formats (cerebras.pytorch.experimental."
    "Compression: mx8, mx9, mx10)")


def get_loop_iteration_slice(input_tensor, index_tensor):
    """The slice of ``input_tensor`` at ``index_tensor`` along the loop dimension, the last of
    ``index_tensor``'s (``L = index_tensor.dim() - 1``): ``out[..., j, rest] =
    input_tensor[..., index_tensor[..., j], rest]`` gathered along ``L``.

    >>> import torch
    >>> get_loop_iteration_slice(torch.tensor([[5, 6, 7], [8, 9, 10]]),
    ...                          torch.tensor([[2], [0]])).tolist()
    [[7], [8]]
    """
    index_shape = list(index_tensor.shape)
    input_shape = list(input_tensor.shape)
    loop_dim = len(index_shape) - 1
    index = index_tensor.reshape(index_shape + [1] * (len(input_shape) - len(index_shape)))
    index = index.broadcast_to(index_shape + input_shape[len(index_shape):]).long()
    return input_tensor.gather(loop_dim, index)


__all__ = ["Compression", "get_loop_iteration_slice", "listener",
           "run_implicit_autoregressive_loop", "start_implicit_loop",
           "update_implicit_loop"]  # the top level's names are added
