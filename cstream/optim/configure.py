"""Building optimizer parameter groups and checking optimizer and scheduler settings from a run
configuration's ``optimizer`` section (Release 2.0-2.2 Cerebras flows).

>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
>>> groups = configure_param_groups(m, {"weight_decay": 0.1, "adjust_learning_rate": {"0": 0.5}})
>>> [(g["weight_decay"], g["adjust_learning_rate"], g["param_names"]) for g in groups]
[(0.1, 0.5, ['0.weight']), (0.0, 0.5, ['0.bias']), (0.0, 1.0, ['1.weight', '1.bias'])]
"""

from __future__ import annotations

import torch

from cstream.optim.registry import check_kwargs, optimizer_class, scheduler_class
from workers.torch_compat import NormBase

_NORMS = (NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)


def _no_decay_names(model: torch.nn.Module) -> set[str]:
    """Biases and the parameters of normalisation layers: not weight-decayed."""
    names = set()
    for mod_name, module in model.named_modules():
        for p_name, _ in module.named_parameters(recurse=False):
            full = f"{mod_name}.{p_name}" if mod_name else p_name
            if isinstance(module, _NORMS) or p_name == "bias":
                names.add(full)
    return names


def configure_param_groups(model: torch.nn.Module, optimizer_params: dict) -> list[dict]:
    """The model's trainable parameters in groups: biases and normalisation parameters get
    ``weight_decay`` 0.0, the others ``optimizer_params["weight_decay"]`` (0.0 when unset);
    a parameter whose name contains a key of ``optimizer_params["adjust_learning_rate"]`` gets
    that factor as its group's ``adjust_learning_rate`` (1.0 otherwise: the learning-rate
    scheduler scales each group's rate by it). Groups keep the model's parameter order and
    carry ``param_names``."""
    weight_decay = float(optimizer_params.get("weight_decay", 0.0) or 0.0)
    adjust = dict(optimizer_params.get("adjust_learning_rate") or {})
    no_decay = _no_decay_names(model)
    groups: dict[tuple, dict] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        wd = 0.0 if name in no_decay else weight_decay
        factor = next((float(f) for key, f in adjust.items() if key in name), 1.0)
        group = groups.setdefault((wd, factor), {"params": [], "param_names": [],
                                                 "weight_decay": wd,
                                                 "adjust_learning_rate": factor})
        group["params"].append(param)
        group["param_names"].append(name)
    return list(groups.values())


def configure_optimizer_params(optimizer_type: str, kwargs: dict) -> dict:
    """Check that ``optimizer_type`` names a cstream optimizer and ``kwargs`` are its arguments
    (an error naming the wrong one otherwise); returns ``kwargs``."""
    check_kwargs(optimizer_class(optimizer_type), kwargs, "optimizer")
    return kwargs


def configure_scheduler_params(learning_rate) -> None:
    """Check a learning-rate setting: a number, or scheduler dicts whose ``scheduler`` names a
    cstream scheduler (an error naming the unknown one otherwise)."""
    if isinstance(learning_rate, (int, float)):
        return
    specs = learning_rate if isinstance(learning_rate, list) else [learning_rate]
    for spec in specs:
        if isinstance(spec, dict) and "scheduler" in spec:
            scheduler_class(spec["scheduler"])
        elif isinstance(spec, dict) and "schedulers" in spec:
            configure_scheduler_params(spec["schedulers"])
