"""``cerebras.pytorch.storage`` (Release 2.5 on): the checkpoint format's constants and
serializer switches. ``save`` / ``load`` are :func:`cstream.save` / :func:`cstream.load`."""

from cstream.checkpoint.saving import load, save
from cstream.storage import constants, serializers

__all__ = ["constants", "load", "save", "serializers"]
