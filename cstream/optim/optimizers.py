"""Traceable optimizers with the update rules, defaults and state layout of ``cerebras.pytorch``
2.10.

Each optimizer gives its state (``initial_state``) and its update of one parameter (``update``;
SGD, Adam and AdamW update a bucket of parameters with multi-tensor ops): the loops over groups
and parameters are :class:`~cstream.optim.optimizer.Optimizer`'s. Each update follows the real
package's arithmetic op for op, in float32, so trajectories agree to the last bits
(``tests/test_reference_optim.py`` checks them against the reference run). Its
constants that the real package keeps as float32 tensors (``torch.tensor(beta2)``) are float32
here too: :func:`_f32` rounds a Python number the same way before it enters an op, so no value is
read from a tensor inside a step (tracing forbids it).
"""

from typing import Optional, Tuple

import numpy as np
import torch

from cstream import creation
from cstream.optim.optimizer import Optimizer, ParamsT, group_tensors, with_grads
from workers.torch_compat import foreach


def _check(name, value, low=0.0, high=None, owner="", high_inclusive=False):
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or value < low
    if high is not None and not bad:
        bad = value > high if high_inclusive else value >= high
    if bad:
        rng = f">= {low}" + ("" if high is None else
                             f" and {'<=' if high_inclusive else '<'} {high}")
        raise ValueError(f"{owner}: {name} must be a number {rng}, got {value!r}.")


def _check_betas(betas, owner):
    _check("betas[0]", betas[0], 0.0, 1.0, owner)
    _check("betas[1]", betas[1], 0.0, 1.0, owner)


def _f32(x: float) -> float:
    """``x`` rounded to float32 (the value ``torch.tensor(x)`` holds), as a Python float."""
    return float(np.float32(x))


def _one_minus_f32(x: float) -> float:
    """``1.0 - torch.tensor(x)`` computed in float32, as a Python float."""
    return float(np.float32(1.0) - np.float32(x))


def _signed_grad(p, maximize):
    return -p.grad if maximize else p.grad


class _ForeachOptimizer(Optimizer):
    """An optimizer whose update is multi-tensor: :meth:`update_bucket` takes the group's
    parameters that have gradients, one (device, dtype) bucket at a time (the unit of one
    multi-tensor (``foreach``) op), so a traced step has the same ops for any number of parameters."""

    def update_group(self, group):
        for params, _ in group_tensors(with_grads(group)):
            self.update_bucket(group, params)

    def update_bucket(self, group, params):
        raise NotImplementedError


class SGD(_ForeachOptimizer):
    """SGD with momentum, dampening, Nesterov and weight decay. The momentum buffer starts at zero
    and every step makes it ``buf * momentum + grad * (1 - dampening)`` (the first step too).

    >>> import torch, cstream
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = cstream.optim.SGD([w], lr=0.1, momentum=0.9)
    >>> w.sum().backward(); opt.step()
    >>> w.detach()
    tensor([0.9000, 0.9000])
    """

    def __init__(self, params: ParamsT, lr: float, momentum: float = 0, dampening: float = 0,
                 weight_decay: float = 0, nesterov: bool = False, maximize: bool = False):
        for n, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay),
                     ("dampening", dampening)):
            _check(n, v, owner="SGD")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                f"SGD: nesterov=True needs momentum > 0 and dampening = 0; momentum was "
                f"{momentum} and dampening {dampening}.")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def initial_state(self, group, p):
        return {"momentum_buffer": creation.zeros_like(p)} if group["momentum"] != 0 else {}

    def state_names_to_sparsify(self):
        return ["momentum_buffer"]

    def update_bucket(self, group, params):
        """2.10's per-parameter arithmetic as one multi-tensor (``foreach``) op per stage."""
        lr, momentum = group["lr"], group["momentum"]
        grads = [p.grad for p in params]
        if group["maximize"]:
            grads = foreach.neg(grads)
        grads = foreach.add(grads, foreach.mul(params, group["weight_decay"]))
        if momentum != 0:
            bufs = [self.state[p]["momentum_buffer"] for p in params]
            foreach.mul_(bufs, momentum)
            foreach.add_(bufs, grads, alpha=1.0 - group["dampening"])
            if group["nesterov"]:
                foreach.add_(grads, bufs, alpha=momentum)
            else:
                grads = bufs
        foreach.add_(params, foreach.mul(grads, -lr))


class _AdamBase(_ForeachOptimizer):
    """Adam and AdamW: bias correction through ``beta1_power`` / ``beta2_power`` state (``beta**t``
    kept by multiplying each step), ``eps`` added to ``sqrt(v)`` before the correction:
    ``p -= lr * (m / (sqrt(v) + eps) * sqrt(1 - beta2**t) / (1 - beta1**t) + wd * p)``."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, l2_regularization_rate: float = 0.0,
                 correct_bias: bool = True, amsgrad: bool = False):
        name = type(self).__name__
        _check("lr", lr, owner=name)
        _check_betas(betas, name)
        _check("eps", eps, owner=name)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      l2_regularization_rate=l2_regularization_rate,
                                      correct_bias=correct_bias, amsgrad=amsgrad))

    def initial_state(self, group, p):
        beta1, beta2 = group["betas"]
        st = {"exp_avg": creation.zeros_like(p), "exp_avg_sq": creation.zeros_like(p)}
        if group["amsgrad"]:
            st["max_exp_avg_sq"] = creation.zeros_like(p)
        if group["correct_bias"]:
            st["beta1_power"] = creation.full((), beta1, dtype=torch.float32)
            st["beta2_power"] = creation.full((), beta2, dtype=torch.float32)
        return st

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]

    def update_bucket(self, group, params):
        """2.10's per-parameter arithmetic as one multi-tensor (``foreach``) op per stage."""
        states = [self.state[p] for p in params]
        beta1, beta2 = group["betas"]
        grads = [p.grad for p in params]
        if group["l2_regularization_rate"] > 0.0:
            grads = foreach.add(grads, params, alpha=group["l2_regularization_rate"])
        exp_avgs = [st["exp_avg"] for st in states]
        exp_avg_sqs = [st["exp_avg_sq"] for st in states]
        foreach.mul_(exp_avgs, beta1)
        foreach.add_(exp_avgs, grads, alpha=1.0 - beta1)
        foreach.mul_(exp_avg_sqs, beta2)
        foreach.addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)
        if group["amsgrad"]:
            peaks = [st["max_exp_avg_sq"] for st in states]
            foreach.maximum_(peaks, exp_avg_sqs)
            denom = foreach.sqrt(peaks)
        else:
            denom = foreach.sqrt(exp_avg_sqs)
        foreach.add_(denom, group["eps"])
        update = foreach.div(exp_avgs, denom)
        if group["correct_bias"]:
            b1ps = [st["beta1_power"] for st in states]
            b2ps = [st["beta2_power"] for st in states]
            # 1 - x as -x + 1: the same float
            bias_correction1 = foreach.add(foreach.neg(b1ps), 1.0)
            bias_correction2 = foreach.add(foreach.neg(b2ps), 1.0)
            step_size = foreach.div(foreach.sqrt(bias_correction2),
                                           bias_correction1)
            foreach.mul_(update, step_size)
            foreach.mul_(b1ps, beta1)
            foreach.mul_(b2ps, beta2)
        foreach.add_(update, foreach.mul(params, group["weight_decay"]))
        foreach.mul_(update, group["lr"])
        foreach.sub_(params, update)

    def load_state_dict(self, state_dict):
        """Also takes a state saved by torch's or HuggingFace's Adam/AdamW (a ``step`` count
        instead of the beta powers): ``beta**step`` is what the count stands for."""
        groups = state_dict["param_groups"]
        for index, saved in state_dict["state"].items():
            if "step" not in saved or "beta1_power" in saved:
                continue
            saved = state_dict["state"][index] = dict(saved)
            step = float(saved.pop("step"))
            group = next((g for g in groups if index in g["params"]), None)
            if group is not None and group.get("correct_bias", True):
                beta1, beta2 = group["betas"]
                saved["beta1_power"] = torch.tensor(beta1 ** step, dtype=torch.float32)
                saved["beta2_power"] = torch.tensor(beta2 ** step, dtype=torch.float32)
        super().load_state_dict(state_dict)


class AdamW(_AdamBase):
    """AdamW: decoupled weight decay (``weight_decay * p`` added to the update); ``correct_bias``
    False drops the bias correction (BERT's variant)."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, correct_bias: bool = True,
                 amsgrad: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         l2_regularization_rate=0.0, correct_bias=correct_bias,
                         amsgrad=amsgrad)

    def load_state_dict(self, state_dict):
        groups = [dict(g, l2_regularization_rate=0.0) for g in state_dict["param_groups"]]
        super().load_state_dict(dict(state_dict, param_groups=groups))


class Adam(_AdamBase):
    """Adam: ``weight_decay`` is an L2 penalty added to the gradient (kept in the group as
    ``l2_regularization_rate``; the group's ``weight_decay`` is 0.0)."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, amsgrad: bool = False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=0.0,
                         l2_regularization_rate=weight_decay, correct_bias=True,
                         amsgrad=amsgrad)
        for group in self.param_groups:
            self._as_l2(group)

    @staticmethod
    def _as_l2(group):
        """The group's ``weight_decay`` moved to ``l2_regularization_rate`` (in place)."""
        group.setdefault("l2_regularization_rate", group.pop("weight_decay", 0.0))
        group["weight_decay"] = 0.0
        group["correct_bias"] = True
        return group

    def load_state_dict(self, state_dict):
        groups = [self._as_l2(dict(g)) for g in state_dict["param_groups"]]
        super().load_state_dict(dict(state_dict, param_groups=groups))


class Adagrad(Optimizer):
    """Adagrad: ``p -= lr * g / (1 + (t - 1) * lr_decay) / (sqrt(sum g**2) + eps)``."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, lr_decay: float = 0,
                 weight_decay: float = 0, initial_accumulator_value: float = 0, eps: float = 1e-6,
                 maximize: bool = False):
        for n, v in (("lr", lr), ("lr_decay", lr_decay), ("weight_decay", weight_decay),
                     ("initial_accumulator_value", initial_accumulator_value), ("eps", eps)):
            _check(n, v, owner="Adagrad")
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, eps=eps,
                                      weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      maximize=maximize), enable_global_step=True)

    def initial_state(self, group, p):
        return {"sum": creation.full_like(p, group["initial_accumulator_value"])}

    def state_names_to_sparsify(self):
        return ["sum"]

    def update(self, group, p, st):
        state_sum = st["sum"]
        global_step = self.increment_global_step(p)
        grad = _signed_grad(p, group["maximize"])
        grad = grad + p * group["weight_decay"]
        state_sum.addcmul_(grad, grad, value=1.0)
        std = state_sum.sqrt().add_(group["eps"])
        grad.div_(1.0 + (global_step - 1.0) * group["lr_decay"])
        p.addcdiv_(-group["lr"] * grad, std)


class RMSprop(Optimizer):
    """RMSprop, with momentum and ``centered``."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, alpha: float = 0.99, eps: float = 1e-8,
                 weight_decay: float = 0, momentum: float = 0, centered: bool = False):
        for n, v in (("lr", lr), ("eps", eps), ("momentum", momentum),
                     ("weight_decay", weight_decay), ("alpha", alpha)):
            _check(n, v, owner="RMSprop")
        super().__init__(params, dict(lr=lr, momentum=momentum, alpha=alpha, eps=eps,
                                      centered=centered, weight_decay=weight_decay))

    def initial_state(self, group, p):
        st = {"square_avg": creation.zeros_like(p)}
        if group["momentum"] > 0:
            st["momentum_buffer"] = creation.zeros_like(p)
        if group["centered"]:
            st["grad_avg"] = creation.zeros_like(p)
        return st

    def state_names_to_sparsify(self):
        return ["square_avg", "momentum_buffer", "grad_avg"]

    def update(self, group, p, st):
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        grad = p.grad + p * group["weight_decay"]
        square_avg = st["square_avg"]
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1.0 - alpha)
        if group["centered"]:
            grad_avg = st["grad_avg"]
            grad_avg.mul_(alpha).add_(grad, alpha=1 - alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1.0).sqrt_().add_(eps)
        else:
            avg = square_avg.sqrt().add_(eps)
        if group["momentum"] > 0.0:
            buf = st["momentum_buffer"]
            buf.mul_(group["momentum"]).addcdiv_(grad, avg)
            p.add_(-lr * buf)
        else:
            p.addcdiv_(-lr * grad, avg)


class Lion(Optimizer):
    """Lion (Chen et al. 2023): ``p *= 1 - lr * wd``; ``p -= lr * sign(b1*m + (1-b1)*g)``;
    then ``m = b2*m + (1-b2)*g``."""

    def __init__(self, params: ParamsT, lr: float = 1e-4, betas: Tuple[float, float] = (0.9, 0.99),
                 weight_decay: float = 0.0):
        _check("lr", lr, owner="Lion")
        _check_betas(betas, "Lion")
        _check("weight_decay", weight_decay, owner="Lion")
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    def initial_state(self, group, p):
        return {"exp_avg": creation.zeros_like(p)}

    def state_names_to_sparsify(self):
        return ["exp_avg"]

    def update(self, group, p, st):
        lr = group["lr"]
        beta1, beta2 = group["betas"]
        exp_avg = st["exp_avg"]
        p.mul_(1 - lr * group["weight_decay"])
        update = exp_avg.mul(beta1).add(p.grad, alpha=1 - beta1).sign_()
        p.add_(-lr * update)
        exp_avg.mul_(beta2).add_(p.grad, alpha=1 - beta2)


class Adadelta(Optimizer):
    """Adadelta."""

    def __init__(self, params: ParamsT, lr: float = 1.0, rho: float = 0.9, eps: float = 1e-6,
                 weight_decay: float = 0, maximize: bool = False):
        for n, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            _check(n, v, owner="Adadelta")
        _check("rho", rho, 0.0, 1.0, "Adadelta", high_inclusive=True)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))

    def initial_state(self, group, p):
        return {"square_avg": creation.zeros_like(p), "acc_delta": creation.zeros_like(p)}

    def state_names_to_sparsify(self):
        return ["square_avg", "acc_delta"]

    def update(self, group, p, st):
        rho, eps = group["rho"], group["eps"]
        square_avg, acc_delta = st["square_avg"], st["acc_delta"]
        grad = _signed_grad(p, group["maximize"])
        grad = grad + p * group["weight_decay"]
        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = square_avg.add(eps).sqrt_()
        delta = acc_delta.add(eps).sqrt_().div_(std).mul_(grad)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        p.add_(-group["lr"] * delta)


class Adamax(Optimizer):
    """Adamax, its bias correction through a ``beta1_power`` state (``beta1**t``)."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, maximize: bool = False):
        _check("lr", lr, owner="Adamax")
        _check_betas(betas, "Adamax")
        _check("eps", eps, owner="Adamax")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      maximize=maximize))

    def initial_state(self, group, p):
        return {"exp_avg": creation.zeros_like(p), "exp_inf": creation.zeros_like(p),
                "beta1_power": creation.full((), group["betas"][0], dtype=torch.float32)}

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_inf"]

    def update(self, group, p, st):
        beta1, beta2 = group["betas"]
        grad = _signed_grad(p, group["maximize"])
        grad = grad + p * group["weight_decay"]
        exp_avg, exp_inf = st["exp_avg"], st["exp_inf"]
        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        exp_inf.copy_(torch.maximum(exp_inf.mul(beta2), grad.abs().add_(group["eps"])))
        update = exp_avg / exp_inf
        update.div_(1.0 - st["beta1_power"])
        st["beta1_power"] *= beta1
        update *= group["lr"]
        p.sub_(update)


class ASGD(Optimizer):
    """Averaged SGD: ``eta`` (the step's rate), ``mu`` (the averaging weight) and ``ax`` (the
    average) as state, all updated by tensor ops."""

    def __init__(self, params: ParamsT, lr: float = 1e-2, lambd: float = 1e-4, alpha: float = 0.75,
                 t0: float = 1e6, weight_decay: float = 0, maximize: bool = False):
        _check("lr", lr, owner="ASGD")
        _check("weight_decay", weight_decay, owner="ASGD")
        super().__init__(params, dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                                      weight_decay=weight_decay, maximize=maximize),
                         enable_global_step=True)

    def initial_state(self, group, p):
        return {"eta": creation.full((), float(group["lr"]), dtype=torch.float32),
                "mu": creation.ones((), dtype=torch.float32),
                "ax": creation.zeros_like(p)}

    def state_names_to_sparsify(self):
        return ["ax"]

    def update(self, group, p, st):
        lambd, lr, t0 = group["lambd"], group["lr"], group["t0"]
        grad = _signed_grad(p, group["maximize"])
        mu, ax, eta = st["mu"], st["ax"], st["eta"]
        step = self.increment_global_step(p)
        grad = grad + p * group["weight_decay"]
        p.mul_(1 - lambd * eta)
        p.add_(grad * eta.neg())
        ax.copy_(torch.where(mu == 1, p, ax.add(p.sub(ax).mul(mu))))
        alpha = torch.full_like(step, group["alpha"])
        eta.copy_(lr / torch.pow(1 + lambd * lr * step, alpha))
        mu.copy_(1 / torch.clamp(step - t0, min=1.0))


class NAdam(Optimizer):
    """NAdam (momentum decay ``mu_t = b1 * (1 - 0.5 * 0.96**(t * momentum_decay))``), with
    ``mu_product`` state. As 2.10 does, the momentum term divides by
    ``1 - mu_product * mu_t * mu_{t+1}`` (``mu_product`` already holds ``mu_t``)."""

    def __init__(self, params: ParamsT, lr: float = 2e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0, momentum_decay: float = 4e-3):
        for n, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay),
                     ("momentum_decay", momentum_decay)):
            _check(n, v, owner="NAdam")
        _check_betas(betas, "NAdam")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      momentum_decay=momentum_decay), enable_global_step=True)

    def initial_state(self, group, p):
        return {"mu_product": creation.ones((), dtype=torch.float32),
                "exp_avg": creation.zeros_like(p), "exp_avg_sq": creation.zeros_like(p)}

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_avg_sq"]

    def update(self, group, p, st):
        beta1, beta2 = group["betas"]
        decay, eps, lr = group["momentum_decay"], group["eps"], group["lr"]
        exp_avg, exp_avg_sq, mu_product = st["exp_avg"], st["exp_avg_sq"], st["mu_product"]
        global_step = self.increment_global_step(p)
        bias_correction2 = 1 - torch.full_like(global_step, beta2).pow(global_step)
        grad = p.grad + p * group["weight_decay"]
        base = torch.full_like(global_step, 0.96)
        mu = beta1 * (1.0 - 0.5 * base.pow(global_step * decay))
        mu_next = beta1 * (1.0 - 0.5 * base.pow((global_step + 1) * decay))
        mu_product *= mu
        mu_product_next = mu_product * mu * mu_next
        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        exp_avg_sq.mul_(_f32(beta2)).addcmul_(grad, grad, value=_one_minus_f32(beta2))
        denom = exp_avg_sq.div(bias_correction2).sqrt().add_(eps)
        update = ((mu_next * exp_avg) / (1.0 - mu_product_next)
                  + (grad * (1.0 - mu)) / (1.0 - mu_product))
        update *= -lr
        p.addcdiv_(update, denom)


class RAdam(Optimizer):
    """RAdam: the rectified adaptive step where ``rho_t > 5``, plain momentum SGD before."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0):
        for n, v in (("lr", lr), ("weight_decay", weight_decay), ("eps", eps)):
            _check(n, v, owner="RAdam")
        _check_betas(betas, "RAdam")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
                         enable_global_step=True)

    def initial_state(self, group, p):
        return {"exp_avg": creation.zeros_like(p), "exp_avg_sq": creation.zeros_like(p)}

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_avg_sq"]

    def update(self, group, p, st):
        beta1, beta2 = (_f32(b) for b in group["betas"])
        # 2 / (1 - beta2) - 1 with beta2 a float32 tensor, as 2.10 computes it
        rho_inf = np.float32(2) / (np.float32(1) - np.float32(beta2)) - np.float32(1)
        rho_den = float((rho_inf - np.float32(4)) * (rho_inf - np.float32(2)))
        rho_inf = float(rho_inf)
        global_step = self.increment_global_step(p)
        grad = p.grad + p * group["weight_decay"]
        beta2t = torch.full_like(global_step, beta2).pow(global_step)
        bias_correction1 = 1 - torch.full_like(global_step, beta1).pow(global_step)
        bias_correction2 = 1 - beta2t
        st["exp_avg"].mul_(beta1).add_(grad, alpha=_one_minus_f32(beta1))
        st["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=_one_minus_f32(beta2))
        update = st["exp_avg"] / bias_correction1
        rho_t = rho_inf - 2 * global_step * beta2t / bias_correction2
        rectified = rho_t > 5.0
        one = torch.ones_like(rho_t)
        rect = torch.where(rectified, torch.sqrt(
            (rho_t - 4.0) * (rho_t - 2.0) * rho_inf
            / (rho_den * rho_t)), one)
        adaptive = torch.where(rectified, torch.sqrt(bias_correction2)
                               / st["exp_avg_sq"].sqrt().add_(group["eps"]), one)
        update *= rect
        update *= adaptive
        update *= group["lr"]
        p.sub_(update)


class Rprop(Optimizer):
    """Rprop: each element's step size grows by ``etas[1]`` while its gradient keeps its sign and
    shrinks by ``etas[0]`` when it flips (that element then skips the step), within
    ``step_sizes``; the step is ``sign(grad) * step_size``."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, etas: Tuple[float, float] = (0.5, 1.2),
                 step_sizes: Tuple[float, float] = (1e-6, 50.0)):
        _check("lr", lr, owner="Rprop")
        super().__init__(params, dict(lr=lr, etas=etas, step_sizes=step_sizes))

    def initial_state(self, group, p):
        return {"prev": creation.zeros_like(p),
                "step_size": creation.full_like(p, float(group["lr"]))}

    def state_names_to_sparsify(self):
        return ["prev", "step_size"]

    def update(self, group, p, st):
        lo, hi = (_f32(s) for s in group["step_sizes"])
        etaminus, etaplus = (_f32(e) for e in group["etas"])
        prev, prev_step_size = st["prev"], st["step_size"]
        multiplier = p.grad.mul(prev)
        multiplier = torch.where(multiplier > 0, etaplus, multiplier)
        multiplier = torch.where(multiplier < 0, etaminus, multiplier)
        multiplier = torch.where(multiplier == 0, 1.0, multiplier)
        step_size = torch.clamp(prev_step_size.mul(multiplier), min=lo, max=hi)
        grad = p.grad.mul(torch.where(multiplier == etaminus, 0.0, 1.0))
        p.sub_(torch.sign(grad).mul(step_size))
        prev.copy_(grad)
        prev_step_size.copy_(step_size)


class Lamb(Optimizer):
    """LAMB (You et al. 2019) as 2.10 runs it: no bias correction; the Adam step
    ``m / (sqrt(v) + eps) + wd * p`` scaled by the trust ratio ``min(||p||, 10) / ||step||``
    (1 where either norm is 0, or always with ``adam=True``)."""

    def __init__(self, params: ParamsT, lr: float = 1e-3, betas: Tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0, adam: bool = False):
        _check("lr", lr, owner="Lamb")
        _check("eps", eps, owner="Lamb")
        _check_betas(betas, "Lamb")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      adam=adam))

    def initial_state(self, group, p):
        return {"exp_avg": creation.zeros_like(p), "exp_avg_sq": creation.zeros_like(p)}

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_avg_sq"]

    def update(self, group, p, st):
        beta1, beta2 = group["betas"]
        st["exp_avg"].mul_(beta1).add_(p.grad, alpha=1 - beta1)
        st["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
        weight_norm = p.pow(2).sum().sqrt().clamp(0, 10).to(torch.float)
        adam_step = st["exp_avg"] / st["exp_avg_sq"].sqrt().add(group["eps"])
        adam_step = adam_step + p * group["weight_decay"]
        if group["adam"]:
            trust_ratio = 1
        else:
            adam_norm = adam_step.pow(2).sum().sqrt().to(torch.float)
            one = torch.ones_like(weight_norm)
            trust_ratio = torch.where(
                weight_norm > 0,
                torch.where(adam_norm > 0, weight_norm / adam_norm, one), one)
        p.sub_(adam_step.mul(trust_ratio) * group["lr"])


class Adafactor(Optimizer):
    """Adafactor (Shazeer & Stern 2018): factored second moments for matrices,
    ``beta2_t = 1 - t ** decay_rate``, update clipping by RMS, the rate scaled by the weights'
    RMS (``scale_parameter``). ``lr`` is required: 2.10 has no relative step
    (``relative_step=True`` and ``warmup_init=True`` are refused, as there)."""

    def __init__(self, params: ParamsT, lr: float, eps: Tuple[float, float] = (1e-30, 1e-3),
                 clip_threshold: float = 1.0, decay_rate: float = -0.8,
                 beta1: Optional[float] = None, weight_decay: float = 0.0,
                 scale_parameter: bool = True, relative_step: bool = False,
                 warmup_init: bool = False):
        if lr is not None and relative_step:
            raise ValueError("Adafactor: cannot combine a manual lr with relative_step=True; "
                             "relative steps are not supported: give lr.")
        if warmup_init and not relative_step:
            raise ValueError("Adafactor: warmup_init=True is not supported (it needs "
                             "relative_step=True, which is not supported either).")
        if relative_step:
            raise ValueError("Adafactor: relative_step=True is not supported; give lr.")
        if (not isinstance(eps, (tuple, list)) or len(eps) != 2
                or not all(isinstance(x, float) for x in eps)):
            raise ValueError(f"Adafactor: eps must be a tuple or list of two floats, got {eps!r}.")
        _check("clip_threshold", clip_threshold, owner="Adafactor")
        if beta1 is not None:
            _check("beta1", beta1, 0.0, 1.0, "Adafactor")
        super().__init__(params, dict(lr=lr, eps=eps, clip_threshold=clip_threshold,
                                      decay_rate=decay_rate, beta1=beta1,
                                      weight_decay=weight_decay, scale_parameter=scale_parameter,
                                      relative_step=relative_step, warmup_init=warmup_init),
                         enable_global_step=True)

    def initial_state(self, group, p):
        st = {}
        if group["beta1"] is not None:
            st["exp_avg"] = creation.zeros_like(p)
        if p.dim() >= 2:
            st["exp_avg_sq_row"] = creation.zeros(p.shape[:-1])
            st["exp_avg_sq_col"] = creation.zeros(p.shape[:-2] + p.shape[-1:])
        else:
            st["exp_avg_sq"] = creation.zeros_like(p)
        return st

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_avg_sq"]

    @staticmethod
    def _rms(tensor):
        return tensor.square().mean().sqrt()

    @staticmethod
    def _lr(group, rms):
        if group["lr"] is None:
            raise ValueError("Adafactor: the group has no learning rate; pass lr to the "
                             "constructor or set it with a learning rate scheduler.")
        scale = 1.0
        if group["scale_parameter"]:
            scale = torch.maximum(rms, torch.full_like(rms, group["eps"][1]))
        return scale * group["lr"]

    def update(self, group, p, st):
        grad = p.grad
        global_step = self.increment_global_step(p)
        lr = self._lr(group, self._rms(p))
        beta2t = 1.0 - torch.pow(global_step, torch.full_like(global_step, group["decay_rate"]))
        update = grad ** 2 + group["eps"][0]
        if "exp_avg_sq_row" in st:
            row, col = st["exp_avg_sq_row"], st["exp_avg_sq_col"]
            row.mul_(beta2t).add_(update.mean(dim=-1).mul(1.0 - beta2t))
            col.mul_(beta2t).add_(update.mean(dim=-2).mul(1.0 - beta2t))
            r_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
            update = torch.mul(r_factor, col.rsqrt().unsqueeze(-2))
            update.mul_(grad)
        else:
            v = st["exp_avg_sq"]
            v.mul_(beta2t).add_(update.mul(1.0 - beta2t))
            update = v.rsqrt().mul_(grad)
        rms = self._rms(update) / group["clip_threshold"]
        update.div_(torch.maximum(rms, torch.ones_like(rms)))
        update.mul_(lr)
        if "exp_avg" in st:
            st["exp_avg"].mul_(group["beta1"]).add_(update.mul(1 - group["beta1"]))
            update = st["exp_avg"]
        p.sub_(p.mul(group["weight_decay"] * lr))
        p.sub_(update)
