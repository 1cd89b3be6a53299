"""Names of a checkpoint's root attributes (see :mod:`cstream.checkpoint.h5`)."""

__VERSION__ = "__version__"
"""The attribute holding the checkpoint layout's version (0.5)."""
__CSTORCH_VERSION__ = "__cstorch_version__"
"""The attribute naming the program that wrote the checkpoint."""
