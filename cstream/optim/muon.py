"""Muon: SGD with momentum whose matrix updates are orthogonalised by Newton-Schulz iterations."""

import torch

from cstream import creation
from cstream.optim.optimizer import Optimizer, ParamsT

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def zeropower_via_newtonschulz5(G: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The orthogonal matrix nearest ``G`` (``U V^T`` of its SVD), approximated by ``steps``
    quintic Newton-Schulz iterations in bfloat16; returns a bfloat16 tensor shaped like ``G``."""
    if G.ndim < 2:
        raise ValueError(f"Newton-Schulz needs a matrix: G has {G.ndim} dimensions, it needs 2 "
                         "or more.")
    a, b, c = NS_COEFFICIENTS
    X = G.bfloat16()
    transposed = G.size(-2) > G.size(-1)
    if transposed:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    return X.mT if transposed else X


class Muon(Optimizer):
    """Muon (https://kellerjordan.github.io/posts/muon/): the momentum buffer
    ``buf = momentum * buf + (1 - momentum) * grad``, the update ``grad + momentum * buf``
    (Nesterov) or ``buf``, orthogonalised by ``ns_steps`` Newton-Schulz iterations (4-D updates
    as ``(out, -1)`` matrices), applied with the rate ``lr * 0.2 * sqrt(max(A, B))`` for an
    ``A x B...`` parameter and decoupled weight decay. Every parameter must have 2 or more
    dimensions: give biases and norms to another optimizer.
    """

    closure_enables_grad = True

    def __init__(self, params: ParamsT, lr: float = 0.02, weight_decay: float = 0.01,
                 momentum: float = 0.95, nesterov: bool = True, ns_steps: int = 5):
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr < 0.0:
            raise ValueError(f"Muon: lr must be a number >= 0, got {lr!r}.")
        if not 0.0 <= weight_decay < 1.0:
            raise ValueError(f"Muon: weight_decay must be in [0, 1), got {weight_decay!r}.")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muon: momentum must be in [0, 1), got {momentum!r}.")
        if ns_steps < 0:
            raise ValueError(f"Muon: ns_steps must be >= 0, got {ns_steps!r}.")
        super().__init__(params, dict(lr=lr, weight_decay=weight_decay, momentum=momentum,
                                      nesterov=nesterov, ns_steps=ns_steps))
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.dim() < 2:
                    raise ValueError(
                        f"Muon: parameter {pi} of group {gi} has shape {tuple(p.shape)}; Muon "
                        "orthogonalises matrix updates and needs 2 or more dimensions. Put 1-D "
                        "parameters (biases, norms) in a group of another optimizer, e.g. AdamW.")

    def initial_state(self, group, p):
        return {"momentum_buffer": creation.zeros_like(p)} if group["momentum"] != 0 else {}

    def state_names_to_sparsify(self):
        return ["momentum_buffer"]

    @staticmethod
    def adjusted_lr(lr, shape):
        """``lr * 0.2 * sqrt(max(A, B))`` for a parameter shaped ``(A, B, ...)``."""
        return lr * (0.2 * (max(shape[0], shape[1]) ** 0.5))

    def update(self, group, p, st):
        momentum = group["momentum"]
        grad = p.grad
        if momentum != 0:
            buf = st["momentum_buffer"]
            buf.copy_(buf * momentum + grad * (1 - momentum))
        else:
            buf = grad
        update = grad + buf * momentum if group["nesterov"] else buf
        if update.ndim == 4:
            update = update.view(len(update), -1)
        update = zeropower_via_newtonschulz5(update, steps=group["ns_steps"])
        update = update.contiguous().view_as(p)
        lr = self.adjusted_lr(group["lr"], p.shape)
        p.mul_(1 - lr * group["weight_decay"])
        p.add_(-lr * update)
