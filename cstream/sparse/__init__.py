"""Weight sparsity (``cerebras.pytorch.sparse``): not simulated by cstream.

On a CS-X, sparsity skips the zero weights' work; cstream's wafer computes dense steps. The
names import (Cerebras flows import them unconditionally) and using one raises
:class:`cstream.unsupported.UnsupportedFeatureError` naming the feature and docs/modelzoo.md.
A run configuration without ``sparsity`` never calls them. ``configure`` is the function;
``cerebras.pytorch.sparse.configure`` imported as a module gives
:func:`~cstream.sparse.configure.default_sparse_param_filter`, which computes its answer.
"""

from cstream.sparse import configure as _configure_module  # noqa: F401  (before the function)
from cstream.unsupported import unsupported, unsupported_class

_FEATURE = "weight sparsity (cerebras.pytorch.sparse.{})"

configure = unsupported(_FEATURE.format("configure"))
configure_sparsity_optimizer = unsupported(_FEATURE.format("configure_sparsity_optimizer"))
configure_sparsity_wrapper = unsupported(_FEATURE.format("configure_sparsity_wrapper"))
map_sparsity_algorithm = unsupported(_FEATURE.format("map_sparsity_algorithm"))
SparsityWrapperOptimizer = unsupported_class(
    "SparsityWrapperOptimizer", _FEATURE.format("SparsityWrapperOptimizer"))
SparsityAlgorithm = unsupported_class("SparsityAlgorithm", _FEATURE.format("SparsityAlgorithm"))
Group = unsupported_class("Group", _FEATURE.format("Group"))

__all__ = ["Group", "SparsityAlgorithm", "SparsityWrapperOptimizer", "configure",
           "configure_sparsity_optimizer", "configure_sparsity_wrapper", "map_sparsity_algorithm"]
