"""Tensor listeners (``cerebras.pytorch.experimental.listener``): probes that the Cerebras
compiler attaches to tensors of the compiled graph. Not simulated: a run configuration without
``listeners`` creates none (the DataExecutor accepts ``listeners=[]``); ``create_listener``
raises :class:`cstream.unsupported.UnsupportedFeatureError`."""

from cstream.unsupported import unsupported

create_listener = unsupported("tensor listeners (cerebras.pytorch.experimental.listener."
                              "create_listener)")
