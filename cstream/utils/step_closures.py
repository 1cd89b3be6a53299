"""``cerebras.pytorch.utils.step_closures``: where the Cerebras package defines the closures."""

from cstream.closures import checkpoint_closure, step_closure

__all__ = ["checkpoint_closure", "step_closure"]
