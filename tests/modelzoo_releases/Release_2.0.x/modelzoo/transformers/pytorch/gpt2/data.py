import sys

from modelzoo.transformers.pytorch.gpt2.input.GptHDF5DataProcessor import (  # noqa: F401
    GptHDF5DataProcessor,
)


def train_input_dataloader(params):
    return getattr(
        sys.modules[__name__], params["train_input"]["data_processor"]
    )(params["train_input"]).create_dataloader()


def eval_input_dataloader(params):
    return getattr(
        sys.modules[__name__], params["eval_input"]["data_processor"]
    )(params["eval_input"]).create_dataloader()
