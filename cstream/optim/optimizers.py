"""Traceable optimizers, numerically matching their ``torch.optim`` counterparts."""

from __future__ import annotations

import torch

import cstream
from cstream.optim.optimizer import Optimizer


def _check(name, value, low=0.0, high=None, owner=""):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low or (
            high is not None and value >= high):
        rng = f">= {low}" + (f" and < {high}" if high is not None else "")
        raise ValueError(f"{owner}: {name} must be a number {rng}, got {value!r}.")


class SGD(Optimizer):
    """SGD with momentum, dampening, Nesterov and weight decay (``torch.optim.SGD``'s rule).

    >>> import torch, cstream
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = cstream.optim.SGD([w], lr=0.1, momentum=0.9)
    >>> w.sum().backward(); opt.step()
    >>> w.detach()
    tensor([0.9000, 0.9000])
    """

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False):
        for n, v in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay),
                     ("dampening", dampening)):
            _check(n, v, owner="SGD")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("SGD: nesterov=True needs momentum > 0 and dampening = 0.")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))

    def preinitialize(self):
        for group in self.param_groups:
            if group["momentum"] != 0:
                for p in group["params"]:
                    self.state[p]["momentum_buffer"] = cstream.zeros_like(p)
                    # the first step copies the gradient into the buffer (torch's rule)
                    self.state[p]["initialized"] = cstream.zeros((), dtype=torch.float32)

    def state_names_to_sparsify(self):
        return ["momentum_buffer"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, wd, mom = group["lr"], group["weight_decay"], group["momentum"]
            damp, nesterov = group["dampening"], group["nesterov"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                if wd != 0:
                    grad = grad.add(p, alpha=wd)
                if mom != 0:
                    st = self.state[p]
                    buf, seen = st["momentum_buffer"], st["initialized"]
                    updated = buf * mom + grad * (1 - damp)
                    buf.copy_(torch.where(seen > 0, updated, grad))
                    seen.fill_(1.0)
                    grad = grad + buf * mom if nesterov else buf
                p.addcmul_(grad, lr, value=-1)  # one rounding, as torch's add_(alpha=-lr)
        return loss


class Adam(Optimizer):
    """Adam (``torch.optim.Adam``'s rule), with ``amsgrad`` and L2 ``weight_decay``."""

    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, maximize=False):
        name = type(self).__name__
        _check("lr", lr, owner=name)
        _check("eps", eps, owner=name)
        _check("betas[0]", betas[0], 0.0, 1.0, name)
        _check("betas[1]", betas[1], 0.0, 1.0, name)
        _check("weight_decay", weight_decay, owner=name)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                st["step"] = cstream.zeros((), dtype=torch.float32)
                st["exp_avg"] = cstream.zeros_like(p)
                st["exp_avg_sq"] = cstream.zeros_like(p)
                if group["amsgrad"]:
                    st["max_exp_avg_sq"] = cstream.zeros_like(p)

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = (group["lr"], group["betas"], group["eps"],
                                           group["weight_decay"])
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = -p.grad if group["maximize"] else p.grad
                st = self.state[p]
                step_t, exp_avg, exp_avg_sq = st["step"], st["exp_avg"], st["exp_avg_sq"]
                step_t.add_(1)
                if wd != 0:
                    if self.decoupled:
                        p.mul_(1 - lr * wd)
                    else:
                        grad = grad.add(p, alpha=wd)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                # bias corrections in float64, as torch computes them in Python floats
                step_d = step_t.to(torch.float64)
                bias_correction1 = 1 - torch.pow(beta1, step_d)
                bias_correction2 = 1 - torch.pow(beta2, step_d)
                step_size = (lr.to(torch.float64) / bias_correction1).to(p.dtype)
                bias_correction2_sqrt = bias_correction2.sqrt().to(p.dtype)
                if group["amsgrad"]:
                    max_sq = st["max_exp_avg_sq"]
                    torch.maximum(max_sq, exp_avg_sq, out=max_sq)
                    denom = (max_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                else:
                    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                p.sub_(exp_avg / denom * step_size)
        return loss


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay (``torch.optim.AdamW``'s rule)."""

    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, maximize=False):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize)


class Adagrad(Optimizer):
    """Adagrad (``torch.optim.Adagrad``'s rule)."""

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10):
        for n, v in (("lr", lr), ("lr_decay", lr_decay), ("weight_decay", weight_decay),
                     ("eps", eps), ("initial_accumulator_value", initial_accumulator_value)):
            _check(n, v, owner="Adagrad")
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["step"] = cstream.zeros((), dtype=torch.float32)
                self.state[p]["sum"] = cstream.full_like(p, group["initial_accumulator_value"])

    def state_names_to_sparsify(self):
        return ["sum"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                clr = group["lr"] / (1 + (st["step"] - 1) * group["lr_decay"])
                st["sum"].addcmul_(grad, grad, value=1)
                std = st["sum"].sqrt().add_(group["eps"])
                p.addcmul_(grad / std, clr, value=-1)
        return loss


class RMSprop(Optimizer):
    """RMSprop (``torch.optim.RMSprop``'s rule), with momentum and ``centered``."""

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0,
                 centered=False):
        for n, v in (("lr", lr), ("alpha", alpha), ("eps", eps), ("weight_decay", weight_decay),
                     ("momentum", momentum)):
            _check(n, v, owner="RMSprop")
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay,
                                      momentum=momentum, centered=centered))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                st["step"] = cstream.zeros((), dtype=torch.float32)
                st["square_avg"] = cstream.zeros_like(p)
                if group["momentum"] > 0:
                    st["momentum_buffer"] = cstream.zeros_like(p)
                if group["centered"]:
                    st["grad_avg"] = cstream.zeros_like(p)

    def state_names_to_sparsify(self):
        return ["square_avg", "momentum_buffer", "grad_avg"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            alpha = group["alpha"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                sq = st["square_avg"]
                sq.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
                if group["centered"]:
                    ga = st["grad_avg"]
                    ga.lerp_(grad, 1 - alpha)
                    avg = sq.addcmul(ga, ga, value=-1).sqrt_().add_(group["eps"])
                else:
                    avg = sq.sqrt().add_(group["eps"])
                if group["momentum"] > 0:
                    buf = st["momentum_buffer"]
                    buf.mul_(group["momentum"]).addcdiv_(grad, avg)
                    p.addcmul_(buf, group["lr"], value=-1)
                else:
                    p.addcmul_(grad / avg, group["lr"], value=-1)
        return loss


class Lion(Optimizer):
    """Lion (Chen et al. 2023): ``p -= lr * (sign(b1*m + (1-b1)*g) + wd*p)``, then
    ``m = b2*m + (1-b2)*g``."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        _check("lr", lr, owner="Lion")
        _check("betas[0]", betas[0], 0.0, 1.0, "Lion")
        _check("betas[1]", betas[1], 0.0, 1.0, "Lion")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["exp_avg"] = cstream.zeros_like(p)

    def state_names_to_sparsify(self):
        return ["exp_avg"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr = group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m = self.state[p]["exp_avg"]
                update = torch.sign(m * beta1 + p.grad * (1 - beta1))
                if group["weight_decay"] != 0:
                    p.mul_(1 - lr * group["weight_decay"])
                p.sub_(update * lr)
                m.lerp_(p.grad, 1 - beta2)
        return loss
