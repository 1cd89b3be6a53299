"""``cerebras.appliance.cluster``: the cluster management client's names (see :mod:`.client`)."""

from cstream.appliance.cluster import client

__all__ = ["client"]
