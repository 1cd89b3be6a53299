"""``cstream.utils``: CSConfig and the data utilities."""

from workers.config import CSConfig
from cstream.utils import data

__all__ = ["CSConfig", "data"]
