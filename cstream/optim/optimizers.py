"""Traceable optimizers, numerically matching their ``torch.optim`` counterparts."""

from __future__ import annotations

import torch

import cstream
from cstream.optim.optimizer import Optimizer, group_tensors
from executor.engine.decompositions import fused_adam_stages_, fused_adamw_stages_


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
            for params in _buckets(group["params"]):
                self._update(group, params)
        return loss

    def _update(self, group, params):
        """One multi-tensor update of ``params`` (same dtype and device, all with gradients):
        torch's single-tensor arithmetic, one ``torch._foreach_*`` op per stage."""
        lr, wd, mom = group["lr"], group["weight_decay"], group["momentum"]
        damp, nesterov = group["dampening"], group["nesterov"]
        grads = [p.grad for p in params]
        if group["maximize"]:
            grads = torch._foreach_neg(grads)
        if wd != 0:
            grads = torch._foreach_add(grads, params, alpha=wd)
        if mom != 0:
            states = [self.state[p] for p in params]
            bufs = [st["momentum_buffer"] for st in states]
            seen = [st["initialized"] for st in states]
            # torch's rule: the first step copies the gradient into the buffer, later steps
            # make it buf * momentum + grad * (1 - dampening). With s = 1 once seen, else 0,
            # both are buf * (momentum * s) + grad * (1 - dampening * s) (the buffer starts at
            # zero), the factors rounded from float64 as torch rounds its Python floats
            s = torch.stack(seen).to(torch.float64)
            dtype = params[0].dtype
            keep = (s * mom).to(dtype).unbind()
            take = (1 - s * damp).to(dtype).unbind()
            torch._foreach_mul_(bufs, keep)
            torch._foreach_add_(bufs, torch._foreach_mul(grads, take))
            torch._foreach_zero_(seen)
            torch._foreach_add_(seen, 1.0)
            grads = torch._foreach_add(grads, torch._foreach_mul(bufs, mom)) if nesterov else bufs
        # one rounding, as torch's add_(alpha=-lr)
        torch._foreach_addcmul_(params, grads, [lr] * len(params), value=-1)


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
            for params in _buckets(group["params"]):
                self._update(group, params)
        return loss

    def _update(self, group, params):
        """One update of ``params`` (same dtype and device, all with gradients).

        Parameters the fused kernel suits (:func:`_fused_suits`) are updated by one
        ``torch._fused_adam_`` (``_fused_adamw_``) call: a traced step replays it as a single
        op, and inductor rewrites it into multi-tensor stages it fuses
        (:mod:`executor.engine.decompositions`). The others go through those stages here, one
        ``torch._foreach_*`` op each.
        """
        (beta1, beta2) = group["betas"]
        hyper = dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                     weight_decay=group["weight_decay"], amsgrad=group["amsgrad"],
                     maximize=group["maximize"])
        torch._foreach_add_([self.state[p]["step"] for p in params], 1)
        fused = [p for p in params if _fused_suits(p)]
        staged = [p for p in params if not _fused_suits(p)]
        kernels = ((torch._fused_adamw_, fused_adamw_stages_) if self.decoupled
                   else (torch._fused_adam_, fused_adam_stages_))
        for part, update in zip((fused, staged), kernels):
            if not part:
                continue
            states = [self.state[p] for p in part]
            update(part, [p.grad for p in part], [st["exp_avg"] for st in states],
                   [st["exp_avg_sq"] for st in states],
                   [st["max_exp_avg_sq"] for st in states] if group["amsgrad"] else [],
                   [st["step"] for st in states], **hyper)


FUSED_MIN_NUMEL_CPU = 32768
"""A CPU parameter with fewer elements is updated by multi-tensor stages, not the fused kernel:
the fused kernel starts a parallel region for every tensor however small, and each one stalls
the step when a thread waits for a core another process holds; a stage over small tensors runs
on the calling thread. torch's own grain size for splitting an op among threads."""


def _fused_suits(p: torch.Tensor) -> bool:
    if p.device.type == "cuda":
        return True
    return p.device.type == "cpu" and p.numel() >= FUSED_MIN_NUMEL_CPU


def _buckets(params) -> list[list]:
    """The parameters that have gradients, grouped by (device, dtype)."""
    return [group for group, _ in group_tensors([p for p in params if p.grad is not None])]


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


class Adadelta(Optimizer):
    """Adadelta (``torch.optim.Adadelta``'s rule)."""

    def __init__(self, params, lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0):
        for n, v in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            _check(n, v, owner="Adadelta")
        _check("rho", rho, 0.0, 1.0000001, "Adadelta")
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["square_avg"] = cstream.zeros_like(p)
                self.state[p]["acc_delta"] = cstream.zeros_like(p)

    def state_names_to_sparsify(self):
        return ["square_avg", "acc_delta"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            rho, eps = group["rho"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                sq, acc = st["square_avg"], st["acc_delta"]
                sq.mul_(rho).addcmul_(grad, grad, value=1 - rho)
                std = sq.add(eps).sqrt_()
                delta = acc.add(eps).sqrt_().div_(std).mul_(grad)
                acc.mul_(rho).addcmul_(delta, delta, value=1 - rho)
                p.addcmul_(delta, group["lr"], value=-1)
        return loss


class Adamax(Optimizer):
    """Adamax (``torch.optim.Adamax``'s rule)."""

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        _check("lr", lr, owner="Adamax")
        _check("betas[0]", betas[0], 0.0, 1.0, "Adamax")
        _check("betas[1]", betas[1], 0.0, 1.0, "Adamax")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                st["step"] = cstream.zeros((), dtype=torch.float32)
                st["exp_avg"] = cstream.zeros_like(p)
                st["exp_inf"] = cstream.zeros_like(p)

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_inf"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                st["exp_avg"].lerp_(grad, 1 - beta1)
                norm_buf = torch.cat([st["exp_inf"].mul(beta2).unsqueeze(0),
                                      grad.abs().add(group["eps"]).unsqueeze(0)], 0)
                st["exp_inf"].copy_(torch.amax(norm_buf, 0))
                bias_correction = 1 - torch.pow(beta1, st["step"].to(torch.float64))
                clr = (group["lr"].to(torch.float64) / bias_correction).to(p.dtype)
                p.addcmul_(st["exp_avg"] / st["exp_inf"], clr, value=-1)
        return loss


class ASGD(Optimizer):
    """Averaged SGD (``torch.optim.ASGD``'s rule)."""

    def __init__(self, params, lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0):
        _check("lr", lr, owner="ASGD")
        super().__init__(params, dict(lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                                      weight_decay=weight_decay))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                st["step"] = cstream.zeros((), dtype=torch.float32)
                st["eta"] = cstream.full((), float(group["lr"]), dtype=torch.float32)
                st["mu"] = cstream.ones((), dtype=torch.float32)
                st["ax"] = cstream.zeros_like(p)

    def state_names_to_sparsify(self):
        return ["ax"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            lambd, alpha, t0 = group["lambd"], group["alpha"], group["t0"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                eta = st["eta"]
                p.mul_(1 - lambd * eta)
                p.addcmul_(grad, eta, value=-1)
                mu = st["mu"]
                ax = st["ax"]
                ax.copy_(torch.where(mu != 1, ax + (p - ax) * mu, p))
                step = st["step"].to(torch.float64)
                lr = group["lr"].to(torch.float64)
                eta.copy_((lr / torch.pow(1 + lambd * lr * step, alpha)).to(torch.float32))
                mu.copy_((1 / torch.clamp(step - t0, min=1.0)).to(torch.float32))
        return loss


class _MomentsOptimizer(Optimizer):
    """Shared by the Adam-like optimizers: a step counter and first and second moments."""

    def __init__(self, params, lr, betas, eps, weight_decay, **extra):
        name = type(self).__name__
        _check("lr", lr, owner=name)
        _check("betas[0]", betas[0], 0.0, 1.0, name)
        _check("betas[1]", betas[1], 0.0, 1.0, name)
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps,
                                      weight_decay=weight_decay, **extra))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                st["step"] = cstream.zeros((), dtype=torch.float32)
                st["exp_avg"] = cstream.zeros_like(p)
                st["exp_avg_sq"] = cstream.zeros_like(p)

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_avg_sq"]


class NAdam(_MomentsOptimizer):
    """NAdam (``torch.optim.NAdam``'s rule)."""

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 momentum_decay=4e-3):
        super().__init__(params, lr, betas, eps, weight_decay, momentum_decay=momentum_decay)

    def preinitialize(self):
        super().preinitialize()
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["mu_product"] = cstream.ones((), dtype=torch.float64)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                step = st["step"].to(torch.float64)
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                bias_correction2 = 1 - torch.pow(beta2, step)
                mu = beta1 * (1.0 - 0.5 * torch.pow(0.96, step * group["momentum_decay"]))
                mu_next = beta1 * (1.0 - 0.5 * torch.pow(0.96, (step + 1)
                                                         * group["momentum_decay"]))
                st["mu_product"].mul_(mu)
                mu_product = st["mu_product"]
                st["exp_avg"].lerp_(grad, 1 - beta1)
                st["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = st["exp_avg_sq"].div(bias_correction2.to(p.dtype)).sqrt().add_(group["eps"])
                lr = group["lr"].to(torch.float64)
                c1 = (lr * (1.0 - mu) / (1.0 - mu_product)).to(p.dtype)
                c2 = (lr * mu_next / (1.0 - mu_product * mu_next)).to(p.dtype)
                p.addcmul_(grad / denom, c1, value=-1)
                p.addcmul_(st["exp_avg"] / denom, c2, value=-1)
        return loss


class RAdam(_MomentsOptimizer):
    """RAdam (``torch.optim.RAdam``'s rule): the rectification chosen with ``torch.where``."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr, betas, eps, weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                step = st["step"].to(torch.float64)
                if group["weight_decay"] != 0:
                    grad = grad.add(p, alpha=group["weight_decay"])
                st["exp_avg"].lerp_(grad, 1 - beta1)
                st["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                bias_correction1 = 1 - torch.pow(beta1, step)
                bias_correction2 = 1 - torch.pow(beta2, step)
                bias_corrected_exp_avg = st["exp_avg"] / bias_correction1.to(p.dtype)
                rho_inf = 2 / (1 - beta2) - 1
                rho_t = rho_inf - 2 * step * torch.pow(beta2, step) / bias_correction2
                rect = torch.sqrt(torch.clamp((rho_t - 4) * (rho_t - 2) * rho_inf, min=0.0)
                                  / ((rho_inf - 4) * (rho_inf - 2) * rho_t))
                adaptive = (st["exp_avg_sq"].sqrt().add_(group["eps"])).reciprocal_().mul_(
                    bias_correction2.sqrt().to(p.dtype))
                rectified = bias_corrected_exp_avg * group["lr"] * adaptive * rect.to(p.dtype)
                plain = bias_corrected_exp_avg * group["lr"]
                p.sub_(torch.where(rho_t > 5.0, rectified, plain))
        return loss


class Rprop(Optimizer):
    """Rprop (``torch.optim.Rprop``'s rule), sign logic with ``torch.where``."""

    def __init__(self, params, lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0)):
        _check("lr", lr, owner="Rprop")
        super().__init__(params, dict(lr=lr, etas=tuple(etas), step_sizes=tuple(step_sizes)))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                st["step"] = cstream.zeros((), dtype=torch.float32)
                st["prev"] = cstream.zeros_like(p)
                st["step_size"] = cstream.zeros_like(p)
                st["initialized"] = cstream.zeros((), dtype=torch.float32)

    def state_names_to_sparsify(self):
        return ["prev", "step_size"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            etaminus, etaplus = group["etas"]
            lo, hi = group["step_sizes"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                # the first step starts every step size at lr (torch fills it on first use)
                first = st["initialized"] == 0
                st["step_size"].copy_(torch.where(first, torch.zeros_like(p) + group["lr"],
                                                  st["step_size"]))
                st["initialized"].fill_(1.0)
                sign = (grad * st["prev"]).sign()
                factor = torch.where(sign > 0, torch.full_like(p, etaplus),
                                     torch.where(sign < 0, torch.full_like(p, etaminus),
                                                 torch.ones_like(p)))
                st["step_size"].mul_(factor).clamp_(lo, hi)
                grad = torch.where(sign < 0, torch.zeros_like(grad), grad)
                p.addcmul_(grad.sign(), st["step_size"], value=-1)
                st["prev"].copy_(grad)
        return loss


class Lamb(_MomentsOptimizer):
    """LAMB (You et al. 2019): Adam's update scaled by the trust ratio ``||w|| / ||update||``."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        super().__init__(params, lr, betas, eps, weight_decay)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                step = st["step"]
                st["exp_avg"].mul_(beta1).add_(grad * (1 - beta1))
                st["exp_avg_sq"].mul_(beta2).add_(grad * grad * (1 - beta2))
                m_hat = st["exp_avg"] / (1 - torch.pow(beta1, step))
                v_hat = st["exp_avg_sq"] / (1 - torch.pow(beta2, step))
                update = m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * p
                w_norm, u_norm = p.norm(), update.norm()
                trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm,
                                    torch.ones_like(w_norm))
                p.sub_(update * (group["lr"] * trust))
        return loss


class Adafactor(Optimizer):
    """Adafactor (Shazeer & Stern 2018) with factored second moments for matrices, relative
    step size off: ``lr`` given, ``beta2_t = 1 - t ** decay_rate``, update clipping by RMS."""

    def __init__(self, params, lr=1e-2, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                 beta1=None, weight_decay=0.0, scale_parameter=True):
        _check("lr", lr, owner="Adafactor")
        super().__init__(params, dict(lr=lr, eps=tuple(eps), clip_threshold=clip_threshold,
                                      decay_rate=decay_rate, beta1=beta1,
                                      weight_decay=weight_decay, scale_parameter=scale_parameter))

    def preinitialize(self):
        for group in self.param_groups:
            for p in group["params"]:
                st = self.state[p]
                st["step"] = cstream.zeros((), dtype=torch.float32)
                if p.dim() >= 2:
                    st["exp_avg_sq_row"] = cstream.zeros(p.shape[:-1], dtype=p.dtype)
                    st["exp_avg_sq_col"] = cstream.zeros(p.shape[:-2] + p.shape[-1:],
                                                         dtype=p.dtype)
                else:
                    st["exp_avg_sq"] = cstream.zeros_like(p)
                if group["beta1"] is not None:
                    st["exp_avg"] = cstream.zeros_like(p)

    def state_names_to_sparsify(self):
        return ["exp_avg", "exp_avg_sq"]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            eps1, eps2 = group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad, st = p.grad, self.state[p]
                st["step"].add_(1)
                beta2t = 1.0 - torch.pow(st["step"], group["decay_rate"])
                sq = grad * grad + eps1
                if p.dim() >= 2:
                    row, col = st["exp_avg_sq_row"], st["exp_avg_sq_col"]
                    row.mul_(beta2t).add_(sq.mean(-1) * (1 - beta2t))
                    col.mul_(beta2t).add_(sq.mean(-2) * (1 - beta2t))
                    r = (row / row.mean(-1, keepdim=True)).rsqrt().unsqueeze(-1)
                    c = col.unsqueeze(-2).rsqrt()
                    update = grad * r * c
                else:
                    v = st["exp_avg_sq"]
                    v.mul_(beta2t).add_(sq * (1 - beta2t))
                    update = grad * v.rsqrt()
                rms = update.pow(2).mean().sqrt()
                update = update / torch.clamp(rms / group["clip_threshold"], min=1.0)
                lr = group["lr"]
                if group["scale_parameter"]:
                    lr = lr * torch.clamp(p.pow(2).mean().sqrt(), min=eps2)
                if group["beta1"] is not None:
                    m = st["exp_avg"]
                    m.mul_(group["beta1"]).add_(update * (1 - group["beta1"]))
                    update = m
                if group["weight_decay"] != 0:
                    p.mul_(1 - group["weight_decay"] * lr)
                p.sub_(update * lr)
        return loss
