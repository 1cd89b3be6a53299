"""Weight-decay schedulers: ``cerebras.pytorch.optim.weight_decay_scheduler``'s classes.

Each ``*WD`` class is the generic scheduler of :mod:`cstream.optim.scheduler` of the same name,
writing the group's ``"weight_decay"`` (so the arguments keep their generic names:
``initial_val``, ``end_val``, ``vals``, ...). The optimizer then reads ``weight_decay`` as a
0-d tensor.

>>> import torch, cstream
>>> opt = cstream.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1, weight_decay=0.1)
>>> wd = cstream.optim.weight_decay_scheduler.StepWD(opt, initial_val=0.1, step_size=2, gamma=0.5)
>>> for _ in range(4):
...     wd.step()
>>> round(float(opt.param_groups[0]["weight_decay"]), 4)
0.025
"""


from typing import List

import torch

from cstream.optim.scheduler import (
    ChainedScheduler, ConstantScheduler, CosineAnnealingScheduler,
    CosineAnnealingWarmRestartsScheduler, CosineDecayScheduler, CyclicScheduler,
    ExponentialScheduler, InverseExponentialTimeDecayScheduler, InverseSquareRootDecayScheduler,
    LambdaScheduler, LinearScheduler, MultiplicativeScheduler, MultiStepScheduler,
    OneCycleScheduler, PiecewiseConstantScheduler, PolynomialScheduler, ScalePerParamScheduler,
    Scheduler, SequentialScheduler, StepScheduler, Tags,
)


class WeightDecayScheduler(Scheduler):
    """A scheduler of the param groups' ``weight_decay``."""

    param_group_key = "weight_decay"


class ConstantWD(WeightDecayScheduler, ConstantScheduler):
    pass


class PolynomialWD(WeightDecayScheduler, PolynomialScheduler):
    pass


class LinearWD(WeightDecayScheduler, LinearScheduler):
    pass


class ExponentialWD(WeightDecayScheduler, ExponentialScheduler):
    pass


class InverseExponentialTimeDecayWD(WeightDecayScheduler, InverseExponentialTimeDecayScheduler):
    pass


class InverseSquareRootDecayWD(WeightDecayScheduler, InverseSquareRootDecayScheduler):
    pass


class CosineDecayWD(WeightDecayScheduler, CosineDecayScheduler):
    pass


class SequentialWD(WeightDecayScheduler, SequentialScheduler):
    pass


class PiecewiseConstantWD(WeightDecayScheduler, PiecewiseConstantScheduler):
    """``vals[i]`` from ``milestones[i-1]`` until ``milestones[i]``."""

    def __init__(self, optimizer: torch.optim.Optimizer, vals: List[float], milestones: List[int],
                 param_group_tags: Tags = None):
        super().__init__(optimizer, ConstantWD, vals=vals, milestones=milestones,
                         param_group_tags=param_group_tags)


class MultiStepWD(WeightDecayScheduler, MultiStepScheduler):
    pass


class StepWD(WeightDecayScheduler, StepScheduler):
    pass


class CosineAnnealingWD(WeightDecayScheduler, CosineAnnealingScheduler):
    pass


class LambdaWD(WeightDecayScheduler, LambdaScheduler):
    pass


class CosineAnnealingWarmRestartsWD(WeightDecayScheduler, CosineAnnealingWarmRestartsScheduler):
    pass


class MultiplicativeWD(WeightDecayScheduler, MultiplicativeScheduler):
    pass


class ChainedWD(WeightDecayScheduler, ChainedScheduler):
    pass


class CyclicWD(WeightDecayScheduler, CyclicScheduler):
    pass


class OneCycleWD(WeightDecayScheduler, OneCycleScheduler):
    pass


class ScalePerParamWD(WeightDecayScheduler, ScalePerParamScheduler):
    pass


__all__ = ["WeightDecayScheduler", *(name for name in dict(globals()) if name.endswith("WD"))]
