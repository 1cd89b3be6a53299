"""``cerebras.pytorch``: cstream's name for Cerebras programs (see ``cstream._aliases``)."""

from cstream._aliases import become

become(__name__)
