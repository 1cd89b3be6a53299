"""Checkpoint files: :func:`cstream.save` and :func:`cstream.load` (``saving``), in the layouts of
``cerebras.pytorch``.

``saving`` is what users call (``save``, ``load``, ``describe``, ``layout``); ``opener`` tells a
file's layout from its first bytes and its layout version, read once, and gives the reader of that
layout: ``h5`` (which also writes) for the real package's layout 0.5, ``h5_legacy`` for its layouts
0.1 to 0.4, ``v2`` for cstream's own earlier layout; ``guard`` seals the files cstream writes and
checks a file before HDF5 reads it (``_h5_probe`` is the child process it reads an unsealed file
in); ``safe_pickle`` unpickles the few pickled values without running code; ``lazy`` holds the
values read when first touched and :class:`CheckpointError`.
"""
