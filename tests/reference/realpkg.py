"""What the generators share about the real package's process: its one CPU backend."""

import tempfile


def cpu_backend(cstorch):
    """The real package's CPU backend. It allows one backend per process, so the first
    generator that runs makes it and the later ones reuse it; its logs go to a temporary
    folder, not into the checkout."""
    current = cstorch.current_backend(raise_exception=False, raise_warning=False)
    if current is not None:
        return current
    return cstorch.backend("CPU", artifact_dir=tempfile.mkdtemp())
