"""The sparsity algorithm classes of ``cerebras.pytorch.sparse``, with their constructor
signatures and class hierarchy, so that code which enumerates them (a Model Zoo Trainer builds a
config schema from every non-abstract subclass of :class:`SparsityAlgorithm`) finds them.

cstream's wafer computes dense steps, so constructing an algorithm raises
:class:`cstream.unsupported.UnsupportedFeatureError` naming the run configuration's
``sparsity`` setting to remove.
"""


from abc import ABC, abstractmethod
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch

from cstream.unsupported import unsupported


class HyperParameterSchedule(ABC):
    """A step-dependent value (sparsity level, drop fraction). Not simulated by cstream."""

    def __init__(self):
        unsupported(_feature(type(self).__name__))()


class ScoreShaper(ABC):
    """A reshaping of a parameter's scores before top-k. Not simulated by cstream."""

    def __init__(self):
        unsupported(_feature(type(self).__name__))()


def _feature(name: str) -> str:
    return (f"weight sparsity (cerebras.pytorch.sparse.{name}; the `sparsity` setting of a "
            f"Model Zoo run configuration)")


InitMethod = Union[
    str,
    Callable[[torch.nn.Parameter, torch.FloatTensor, Optional[ScoreShaper], Optional[torch.device]],
             torch.BoolTensor],
]
DropFraction = Union[
    int, float, List[int], List[float], Tuple, Dict,
    Callable[[torch.Tensor, torch.Tensor], torch.Tensor], HyperParameterSchedule,
]


class SparsityAlgorithm(ABC):
    """Base of the sparsity algorithms. Constructing one raises UnsupportedFeatureError."""

    def __init__(self, sparsity: Union[float, HyperParameterSchedule, None],
                 init_method: InitMethod = "random"):
        unsupported(_feature(type(self).__name__))()

    @abstractmethod
    def update(self, optimizer=None):
        """Update the sparsity masks after an optimizer step."""


class Static(SparsityAlgorithm):
    """A fixed sparsity pattern."""

    def __init__(self, sparsity: Optional[float] = None, **kwargs):
        super().__init__(sparsity=sparsity, **kwargs)

    def update(self, optimizer=None):
        """A static mask does not change."""


class DynamicSparsityAlgorithm(SparsityAlgorithm, ABC):
    """Base of the algorithms whose masks change on an update schedule."""

    def __init__(self, sparsity: Union[float, dict, None] = None,
                 update: Union[Dict, Callable[[torch.LongTensor], torch.BoolTensor], None] = None,
                 **kwargs):
        super().__init__(sparsity=sparsity, **kwargs)

    @abstractmethod
    def update_mask(self, p, mask, sparsity):
        """The new mask of parameter ``p``."""

    def update(self, optimizer=None):
        """Update every mask that the schedule selects at this step."""


class GMP(DynamicSparsityAlgorithm):
    """Gradual magnitude pruning."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def update_mask(self, p, mask, sparsity):
        """Keep the largest magnitudes."""


class SET(DynamicSparsityAlgorithm):
    """Sparse evolutionary training: drop the smallest weights, regrow at random."""

    def __init__(self, drop_fraction: DropFraction = 0.3, **kwargs):
        super().__init__(**kwargs)

    def update_mask(self, p, mask, sparsity):
        """Drop by magnitude, regrow at random."""


class RigL(DynamicSparsityAlgorithm):
    """Rigged lottery: drop the smallest weights, regrow by gradient magnitude."""

    def __init__(self, drop_fraction: DropFraction = 0.3, balance_in_groups: Optional[int] = None,
                 balance_out_groups: Optional[int] = None, **kwargs):
        super().__init__(**kwargs)

    def update_mask(self, p, mask, sparsity):
        """Drop by magnitude, regrow by gradient."""


class Group(SparsityAlgorithm):
    """Different algorithms for the parameters that name filters select."""

    def __init__(self, groups: Dict[str, SparsityAlgorithm] = None):
        super().__init__(sparsity=None)

    def update(self, optimizer=None):
        """Update every group's algorithm."""
