"""``cerebras.pytorch.saver.storage`` (Release 2.5): the serializer switches, named
:mod:`cstream.storage.serializers` from Release 2.6 on."""

from cstream.storage.serializers import cache_deferred_tensors, use_external_link

__all__ = ["cache_deferred_tensors", "use_external_link"]
