"""``cstream.metrics``: evaluation metrics whose ``update`` traces into the static graph.

The names, constructor and ``update`` signatures, and values are those of
``cerebras.pytorch.metrics`` 2.10 (``tests/test_reference_metrics.py`` checks them against
figures from the real package). A metric's state lives in tensors registered with
:meth:`Metric.register_state` (state tensors of the backend: on CSX their values live with the
engine); ``update`` changes them in place with tensor ops only, so it runs inside a
``@cstream.trace`` step; ``compute`` (outside the step: after the run, or in a
``@cstream.step_closure``) turns them into the value, and ``float(metric)`` calls it.
``reset()`` starts a new accumulation. :func:`get_all_metrics` lists every metric by name.

Shape mistakes are known while tracing and raise ``ValueError``. Values cannot be checked inside
a traced step: labels outside the valid range are left out of the result and counted, and
``compute`` warns how many there were.

>>> import torch, cstream
>>> acc = cstream.metrics.AccuracyMetric("accuracy")
>>> acc(labels=torch.tensor([1, 2, 3]), predictions=torch.tensor([1, 2, 0]))
>>> round(float(acc), 4)
0.6667
"""

from cstream.metrics.auc import AUCMetric
from cstream.metrics.basic import AccuracyMetric, MeanMetric, PerplexityMetric
from cstream.metrics.confusion import (
    DiceCoefficientMetric,
    FBetaScoreMetric,
    MeanIOUMetric,
    MeanPerClassAccuracyMetric,
)
from cstream.metrics.metric import Metric, compute_all_metrics, get_all_metrics  # noqa: F401
from cstream.metrics.ranking import PrecisionAtKMetric, RecallAtKMetric

# cerebras.pytorch.metrics' __all__ (which names compute_all_metrics without defining it);
# get_all_metrics is importable by name, as there
__all__ = [
    "AccuracyMetric", "AUCMetric", "DiceCoefficientMetric", "MeanMetric", "MeanIOUMetric",
    "MeanPerClassAccuracyMetric", "Metric", "PerplexityMetric", "PrecisionAtKMetric",
    "RecallAtKMetric", "compute_all_metrics", "FBetaScoreMetric",
]
