"""Tensor listeners (``cerebras.pytorch.experimental.listener``): probes that the Cerebras
compiler attaches to tensors of the compiled graph. Not simulated: a run configuration without
``listeners`` creates none (the DataExecutor accepts ``listeners=[]``); ``create_listener``
raises :class:`cstream.unsupported.UnsupportedFeatureError`, as does ``ListenerMode``.
:func:`register_traced_tensor_hook` keeps its hook, without effect."""

from cstream.unsupported import unsupported, unsupported_class

create_listener = unsupported("tensor listeners (cerebras.pytorch.experimental.listener."
                              "create_listener)")

_TRACED_TENSOR_HOOKS: dict = {}


def register_traced_tensor_hook(hook):
    """Register ``hook(tensor, name)`` for the tensors a traced step creates (listener
    callbacks). cstream does not name the tensors of its traced graph for listeners, so the
    hook is kept and never called; ``.remove()`` the returned handle to drop it."""
    from torch.utils.hooks import RemovableHandle

    if not callable(hook):
        raise TypeError(f"register_traced_tensor_hook: expected a callable hook(tensor, name), "
                        f"got {type(hook).__name__}.")
    handle = RemovableHandle(_TRACED_TENSOR_HOOKS)
    _TRACED_TENSOR_HOOKS[handle.id] = hook
    return handle


ListenerMode = unsupported_class("ListenerMode", "tensor listeners (cerebras.pytorch."
                                 "experimental.listener.ListenerMode)")
