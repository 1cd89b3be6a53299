"""``configure_scheduler(optimizer, params)`` (Release 2.3's Trainer): one scheduler from a
``schedulers:`` entry of a params file, ``{"CosineDecayLR": {"initial_learning_rate": ...,
"end_learning_rate": ..., "total_iters": ...}}``. ``SequentialLR`` and ``ChainedLR`` take their
``schedulers`` as a list of such entries; SequentialLR's ``milestones``, when not given, are
where each scheduler's ``total_iters`` ends.

>>> import torch, cstream
>>> opt = cstream.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
>>> s = configure_scheduler(opt, {"SequentialLR": {"schedulers": [
...     {"LinearLR": {"initial_learning_rate": 0.0, "end_learning_rate": 0.1, "total_iters": 2}},
...     {"ConstantLR": {"learning_rate": 0.2, "total_iters": 3}}]}})
>>> lrs = []
>>> for _ in range(4):
...     lrs.append(round(float(opt.param_groups[0]["lr"]), 3)); opt.step(); s.step()
>>> type(s).__name__, lrs
('SequentialLR', [0.0, 0.05, 0.2, 0.2])
"""

from __future__ import annotations

from cstream.optim import lr_scheduler, scheduler
from workers.checks import did_you_mean


def _scheduler_class(name: str):
    for module in (lr_scheduler, scheduler):
        cls = getattr(module, name, None)
        if isinstance(cls, type) and issubclass(cls, scheduler.Scheduler):
            return cls
    known = sorted(n for n in dir(lr_scheduler) if n.endswith("LR"))
    raise ValueError(f"configure_scheduler: unknown scheduler {name!r}.{did_you_mean(name, known)} "
                     f"Choose one of {known}.")


def configure_scheduler(optimizer, params: dict):
    if not isinstance(params, dict) or len(params) != 1:
        raise ValueError(
            f"configure_scheduler: expected one scheduler as {{name: arguments}}, e.g. "
            f"{{'CosineDecayLR': {{'initial_learning_rate': 1e-4, 'end_learning_rate': 1e-5, "
            f"'total_iters': 100}}}}, got {params!r}.")
    ((name, kwargs),) = params.items()
    kwargs = dict(kwargs or {})
    cls = _scheduler_class(name)
    if issubclass(cls, (scheduler.SequentialScheduler, scheduler.ChainedScheduler)):
        subs = [configure_scheduler(optimizer, p) for p in kwargs.pop("schedulers", [])]
        if issubclass(cls, scheduler.ChainedScheduler):
            return cls(subs, **kwargs)
        if "milestones" not in kwargs:
            ends, total = [], 0
            for sub in subs[:-1]:
                total += int(sub.total_iters)
                ends.append(total)
            kwargs["milestones"] = ends
        return cls(optimizer, subs, **kwargs)
    return cls(optimizer, **kwargs)
