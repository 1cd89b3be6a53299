"""The base class of cstream's traceable optimizers.

A Cerebras-compliant optimizer creates every state tensor in :meth:`Optimizer.preinitialize`
(with cstream's creation ops, so the state is lazy on the CSX backend) and updates state only in
place, with tensor ops: no Python branches on tensor values, no ``.item()``. Then the whole step
traces into a static graph.

A group's ``lr`` is the number the user gave (as in ``cerebras.pytorch``, and so in its
``state_dict()``) until a learning-rate scheduler sets it to a 0-d tensor; every optimizer's step
takes either (:meth:`Optimizer.lr_tensor` is the scheduler's side of that contract).
"""


import functools
from collections import defaultdict
from typing import Any, Callable, Dict, Iterable, Optional, Union

import torch

from cstream import creation
from workers.checks import did_you_mean
from workers.torch_compat import group_tensors_by_device_and_dtype


ParamsT = Union[Iterable[torch.Tensor], Iterable[Dict[str, Any]]]
"""What an optimizer takes as ``params``: tensors, or parameter groups (dicts)."""


def group_tensors(tensors: list) -> list[tuple[list, list[int]]]:
    """``tensors`` grouped by (device, dtype) as torch's multi-tensor code groups them (the
    group order decides a total norm's summation order), each group with its positions in
    ``tensors``: the unit of one multi-tensor (``foreach``) call."""
    if not tensors:
        return []
    grouped = group_tensors_by_device_and_dtype([list(tensors)], with_indices=True)
    return [(group, indices) for [group], indices in grouped.values()]


def with_grads(group: dict) -> list:
    """The group's parameters that have a gradient, in the group's order."""
    return [p for p in group["params"] if p.grad is not None]


def _wrap_step(step: Callable) -> Callable:
    @functools.wraps(step)
    def wrapper(self, *args, **kwargs):
        self.ensure_preinitialized()
        out = step(self, *args, **kwargs)
        self._check_state_keys()
        return out

    wrapper.__cstream_wrapped__ = True
    return wrapper


class _NumberLR(float):
    """A group's ``lr`` number that also takes a scheduler's in-place write: ``copy_(value)``
    puts the tensor of :meth:`Optimizer.lr_tensor` in the group and writes into it. A float in
    every other respect (``state_dict()`` gives a plain float)."""

    def __new__(cls, value, optimizer, group):
        self = super().__new__(cls, value)
        self._optimizer, self._group = optimizer, group
        return self

    def copy_(self, value):
        return self._optimizer.lr_tensor(self._group).copy_(value)

    def __reduce__(self):
        return float, (float(self),)

    def __deepcopy__(self, memo):
        return float(self)


class Optimizer:
    """Base class: ``Optimizer(params, defaults, enable_global_step=False)``.

    The base class runs the loops over the groups and their parameters; a subclass gives what
    differs: :meth:`initial_state` (one parameter's state tensors, by name, with their initial
    values), :meth:`update` (one parameter's update, in place) and
    :meth:`state_names_to_sparsify`. One that updates a whole group at once (multi-tensor
    multi-tensor (``foreach``) ops) overrides :meth:`update_group` instead of :meth:`update`. A
    subclass may also override :meth:`preinitialize` (create state) and :meth:`step` (update in
    place) whole, as ``cerebras.pytorch``'s contract has it. With ``enable_global_step`` every
    parameter gets a float32 ``"step"`` state tensor (after the state :meth:`preinitialize`
    creates), which :meth:`increment_global_step` advances.
    """

    #: Whether ``step(closure)`` runs the closure with autograd on (it runs under ``no_grad``
    #: otherwise, as the step does).
    closure_enables_grad = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        step = cls.__dict__.get("step")
        if step is not None and not getattr(step, "__cstream_wrapped__", False):
            cls.step = _wrap_step(step)

    def __init__(self, params: Iterable, defaults: dict, enable_global_step: bool = False):
        if isinstance(params, torch.Tensor):
            raise TypeError(
                f"{type(self).__name__}: params should be an iterable of tensors or of dicts "
                f"(param groups), got a single {type(params).__name__}; pass model.parameters()."
            )
        self.defaults = dict(defaults)
        self.enable_global_step = enable_global_step
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list[dict] = []
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list.")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)
        self._preinitialized = False
        self._state_keys: Optional[dict] = None
        from executor import runtime

        backend = runtime.current_backend()
        if backend is not None:
            backend.register_stateful(self)

    def add_param_group(self, group: dict) -> None:
        group = dict(group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        for name, value in self.defaults.items():
            group.setdefault(name, value)
        lr = group.get("lr")
        if lr is not None and not isinstance(lr, torch.Tensor) and (
                isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0):
            raise ValueError(f"{type(self).__name__}: lr must be a number >= 0, got {lr!r}.")
        if lr is not None and not isinstance(lr, torch.Tensor):
            group["lr"] = _NumberLR(lr, self, group)
        self.param_groups.append(group)

    def lr_tensor(self, group: dict) -> torch.Tensor:
        """The group's ``lr`` as a float32 0-d tensor that stays in the group: a number is
        replaced by a tensor (made with cstream's creation ops) holding it. A scheduler calls
        this once and writes each new rate into the tensor in place."""
        lr = group["lr"]
        if not isinstance(lr, torch.Tensor):
            lr = group["lr"] = creation.full((), float(lr), dtype=torch.float32)
        return lr

    def increment_global_step(self, p: torch.Tensor) -> torch.Tensor:
        """Add one to ``p``'s ``"step"`` state and return it (float32)."""
        if "step" not in self.state[p]:
            raise RuntimeError(
                f"{type(self).__name__}: no global step in the state; pass "
                "enable_global_step=True to Optimizer.__init__ to create it.")
        self.state[p]["step"].add_(1.0)
        return self.state[p]["step"]

    # -- the contract -------------------------------------------------------------------------
    def preinitialize(self) -> None:
        """Create every state tensor: :meth:`initial_state` of each parameter, in order."""
        for group in self.param_groups:
            for p in group["params"]:
                initial = self.initial_state(group, p)
                if initial:
                    self.state[p].update(initial)

    def initial_state(self, group: dict, p: torch.Tensor) -> dict:
        """``p``'s state tensors by name, made with cstream's creation ops
        (``{"exp_avg": cstream.zeros_like(p)}``); none by default."""
        return {}

    @_wrap_step
    @torch.no_grad()
    def step(self, closure=None):
        """Update the parameters in place, with tensor ops only: :meth:`update_group` for each
        group, after the closure (if given) computes the loss this returns."""
        loss = None
        if closure is not None:
            with torch.set_grad_enabled(self.closure_enables_grad):
                loss = closure()
        for group in self.param_groups:
            self.update_group(group)
        return loss

    def update_group(self, group: dict) -> None:
        """Update the group's parameters: :meth:`update` for each one that has a gradient."""
        for p in with_grads(group):
            self.update(group, p, self.state[p])

    def update(self, group: dict, p: torch.Tensor, state: dict) -> None:
        """Update ``p`` (which has a gradient) and its ``state`` in place, with tensor ops."""
        raise NotImplementedError(
            f"{type(self).__name__} defines neither step() nor update(); define update(group, "
            "p, state) to update one parameter, or step() to update them all.")

    def state_names_to_sparsify(self) -> list[str]:
        """Names of state tensors shaped like their parameter (sparsified with it)."""
        return []

    def ensure_preinitialized(self) -> None:
        """Run :meth:`preinitialize` once (the backend calls it before a step is captured)."""
        if self._preinitialized:
            return
        self._preinitialized = True
        self.preinitialize()
        if self.enable_global_step:
            for group in self.param_groups:
                for p in group["params"]:
                    self.state[p]["step"] = creation.zeros((), dtype=torch.float32)
        self._state_keys = {id(p): set(s) for p, s in self.state.items()}

    def _check_state_keys(self) -> None:
        for p, s in self.state.items():
            known = self._state_keys.get(id(p), set())
            extra = set(s) - known
            if extra:
                name = sorted(extra)[0]
                raise RuntimeError(
                    f"{type(self).__name__}.step created the state tensor {name!r}, but optimizer "
                    "state must be created in preinitialize(): on the wafer the state is "
                    "resident and fed from one step to the next, so a tensor created inside the "
                    "step would be re-initialised every step. Create it in preinitialize() with "
                    f"cstream's creation ops, e.g. self.state[p][{name!r}] = cstream.zeros_like(p)."
                )

    # -- torch-compatible helpers ---------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()

    def state_dict(self) -> dict:
        """torch's layout: ``{"state": {index: {...}}, "param_groups": [{..., "params": [...]}]}``."""
        self.ensure_preinitialized()
        index, groups = {}, []
        for group in self.param_groups:
            packed = {k: float(v) if isinstance(v, _NumberLR) else v
                      for k, v in group.items() if k != "params"}
            packed["params"] = []
            for p in group["params"]:
                index.setdefault(id(p), len(index))
                packed["params"].append(index[id(p)])
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Write a saved state into this optimizer's (already created) state tensors in place."""
        self.ensure_preinitialized()
        groups = state_dict.get("param_groups")
        if groups is None or "state" not in state_dict:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict expects a dict with 'state' and "
                "'param_groups' (what state_dict() returns)."
            )
        if len(groups) != len(self.param_groups):
            raise ValueError(
                f"loaded state has {len(groups)} parameter groups, the optimizer has "
                f"{len(self.param_groups)}.")
        params = [p for g in self.param_groups for p in g["params"]]
        saved_ids = [i for g in groups for i in g["params"]]
        if len(saved_ids) != len(params):
            raise ValueError(
                f"loaded state has {len(saved_ids)} parameters, the optimizer has {len(params)}.")
        by_id = dict(zip(saved_ids, params))
        self._check_loaded_state_names(state_dict["state"], by_id, saved_ids)
        with torch.no_grad():
            for group, saved in zip(self.param_groups, groups):
                for k, v in saved.items():
                    if k == "params":
                        continue
                    if isinstance(group.get(k), torch.Tensor):
                        group[k].copy_(torch.as_tensor(v, dtype=group[k].dtype))
                    elif k == "lr" and isinstance(v, (int, float)) and not isinstance(v, bool):
                        group[k] = _NumberLR(v, self, group)
                    else:
                        group[k] = v
            for i, saved in state_dict["state"].items():
                current = self.state[by_id[int(i)]]
                for name, value in saved.items():
                    current[name].copy_(torch.as_tensor(value, dtype=current[name].dtype))

    def _check_loaded_state_names(self, saved_state: dict, by_id: dict, saved_ids: list) -> None:
        for i, saved in saved_state.items():
            p = by_id.get(int(i))
            if p is None:
                raise ValueError(
                    f"loaded state has an entry for parameter {i}, which none of its "
                    f"param_groups lists (they list {saved_ids}).")
            have = set(self.state.get(p, {}))
            if set(saved) != have:
                position = saved_ids.index(int(i))
                raise ValueError(
                    f"{type(self).__name__}.load_state_dict: the state of parameter {position} "
                    f"holds {sorted(saved)}, this optimizer keeps {sorted(have)} for it; load "
                    f"a state saved by the same optimizer class with the same options.")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        hint = did_you_mean(name, [n for n in dir(type(self)) if not n.startswith("_")])
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}.{hint}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.param_groups)} groups)"

