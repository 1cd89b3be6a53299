"""``cerebras.pytorch.utils.data.data_executor``: the DataExecutor and its setting types."""

from typing import Dict, Literal, Union

from executor.data_executor import DataExecutor

MbsSetting = Union[None, int, Literal["explore", "auto"], Dict[str, Dict[str, int]]]
"""The values ``micro_batch_size`` takes (accepted without effect, see DataExecutor)."""

__all__ = ["DataExecutor", "MbsSetting"]
