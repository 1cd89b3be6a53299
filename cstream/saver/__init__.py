"""``cstream.saver``: the 2.0-era checkpoint class of ``cerebras.pytorch`` (``PyTorchH5Saver``)."""

from cstream.saver import storage
from cstream.saver.pt_h5_saver import PyTorchH5Saver

__all__ = ["PyTorchH5Saver", "storage"]
