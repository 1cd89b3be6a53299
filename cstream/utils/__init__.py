"""``cstream.utils``: CSConfig, the data utilities and the Cerebras API's helpers."""

from workers.config import Autoscale, CSConfig
from cstream.utils import (constant, data, kernel, nest, pol, step_closures, tensorboard,
                           tracker)

__all__ = ["Autoscale", "CSConfig", "constant", "data", "kernel", "nest", "pol", "step_closures",
           "tensorboard", "tracker"]
