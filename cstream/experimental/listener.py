"""Tensor listeners (``cerebras.pytorch.experimental.listener``): probes that the Cerebras
compiler attaches to tensors of the compiled graph. Not simulated: a run configuration without
``listeners`` creates none (the DataExecutor accepts ``listeners=[]``); ``create_listener``
raises :class:`cstream.unsupported.UnsupportedFeatureError`, as does ``ListenerMode``.
:func:`register_traced_tensor_hook` keeps its hook, without effect."""

from cstream.unsupported import unsupported, unsupported_class

create_listener = unsupported("tensor listeners (cerebras.pytorch.experimental.listener."
                              "create_listener)")

from collections import OrderedDict  # noqa: E402

_TRACED_TENSOR_HOOKS: "OrderedDict[int, object]" = OrderedDict()


def register_traced_tensor_hook(hook):
    """Register ``hook(tensor, name)`` for the tensors a traced step creates (listener
    callbacks). cstream does not name the tensors of its traced graph for listeners, so the
    hook is kept and never called; ``.remove()`` the returned handle to drop it."""
    from executor.tensor_hooks import add_hook

    return add_hook(_TRACED_TENSOR_HOOKS, hook, "register_traced_tensor_hook(hook(tensor, name))")


ListenerMode = unsupported_class("ListenerMode", "tensor listeners (cerebras.pytorch."
                                 "experimental.listener.ListenerMode)")
