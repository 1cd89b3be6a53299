"""Names of Cerebras features that cstream does not simulate: they import, and a call raises
:class:`UnsupportedFeatureError` naming the feature and the docs page."""

from __future__ import annotations

DOCS = "docs/modelzoo.md (section \"Not simulated\")"


class UnsupportedFeatureError(NotImplementedError):
    """A Cerebras feature that cstream does not simulate was used."""


def unsupported(feature: str):
    """A callable standing for ``feature``: calling it raises :class:`UnsupportedFeatureError`."""

    def call(*args, **kwargs):
        raise UnsupportedFeatureError(
            f"{feature} is a Cerebras feature that cstream does not simulate. Remove it from the "
            f"run's configuration to run on cstream; see {DOCS}."
        )

    call.__doc__ = f"Not simulated by cstream: {feature}. Calling it raises UnsupportedFeatureError."
    return call


def unsupported_class(name: str, feature: str) -> type:
    """A class standing for ``feature``: creating one raises :class:`UnsupportedFeatureError`
    (``isinstance`` checks against it work and are False)."""
    return type(name, (), {"__init__": unsupported(feature), "__doc__": unsupported(feature).__doc__})
