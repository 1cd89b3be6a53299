"""``cstream.utils``: CSConfig, the data utilities and the Cerebras API's helpers."""

from workers.config import Autoscale, CSConfig
from cstream.utils import (benchmark, call_once, constant, data, kernel, nest, num_kv_groups, pol,
                           step_closures, tensorboard, tracker, utils)

__all__ = ["Autoscale", "CSConfig", "benchmark", "call_once", "constant", "data", "kernel",
           "nest", "num_kv_groups", "pol", "step_closures", "tensorboard", "tracker", "utils"]
