"""The run modes that Cerebras flows switch on.

>>> is_valid("train"), is_valid("predict"), get_modes()
(True, False, ('train', 'eval', 'train_and_eval', 'inference', 'eval_all'))
"""

TRAIN = "train"
EVAL = "eval"
TRAIN_AND_EVAL = "train_and_eval"
INFERENCE = "inference"
EVAL_ALL = "eval_all"


def get_modes():
    return (TRAIN, EVAL, TRAIN_AND_EVAL, INFERENCE, EVAL_ALL)


def is_valid(mode) -> bool:
    return mode in get_modes()
