"""Weight sparsity (``cerebras.pytorch.sparse``): not simulated by cstream.

On a CS-X, sparsity skips the zero weights' work; cstream's wafer computes dense steps. The
names import (Cerebras flows import them unconditionally; the algorithm classes of
:mod:`cstream.sparse.algorithms` keep the real constructor signatures and hierarchy, which a Model
Zoo Trainer enumerates to build its config schema) and using one raises
:class:`cstream.unsupported.UnsupportedFeatureError` naming the feature and docs/modelzoo.md.
A run configuration without ``sparsity`` never calls them. ``configure`` is the function;
``cerebras.pytorch.sparse.configure`` imported as a module gives
:func:`~cstream.sparse.configure.default_sparse_param_filter`, which computes its answer.
"""

from cstream.sparse import configure as _configure_module  # noqa: F401  (before the function)
from cstream.sparse.algorithms import (
    GMP, SET, DynamicSparsityAlgorithm, Group, RigL, SparsityAlgorithm, Static)
from cstream.unsupported import unsupported, unsupported_class

_FEATURE = "weight sparsity (cerebras.pytorch.sparse.{})"

configure = unsupported(_FEATURE.format("configure"))
configure_sparsity_optimizer = unsupported(_FEATURE.format("configure_sparsity_optimizer"))
configure_sparsity_wrapper = unsupported(_FEATURE.format("configure_sparsity_wrapper"))
map_sparsity_algorithm = unsupported(_FEATURE.format("map_sparsity_algorithm"))
SparsityWrapperOptimizer = unsupported_class(
    "SparsityWrapperOptimizer", _FEATURE.format("SparsityWrapperOptimizer"))

__all__ = ["GMP", "SET", "DynamicSparsityAlgorithm", "Group", "RigL", "SparsityAlgorithm", "Static",
           "SparsityWrapperOptimizer", "configure", "configure_sparsity_optimizer",
           "configure_sparsity_wrapper", "map_sparsity_algorithm"]
