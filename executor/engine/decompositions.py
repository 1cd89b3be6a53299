"""Multi-tensor stages of the fused Adam kernels, for inductor and for small parameters.

``cstream.optim.Adam`` and ``AdamW`` update a group's large CPU parameters (and all CUDA ones)
with one ``aten._fused_adam_`` / ``aten._fused_adamw_`` call (the ``tensor_lr`` overload: the
learning rate is the 0-d tensor the schedulers write). The fx replay and the CPU backend run that
kernel as is: one pass over the parameters and their state instead of a dozen multi-tensor
stages, each its own parallel region per large tensor. Small parameters go through
:func:`adam_multi_tensor_`: the fused kernel would start a parallel region for each of them.

Inductor cannot take the fused op: its ``tensor_lr`` overloads have no meta kernel, and as an
opaque fallback the functional op would copy every state tensor each step. The inductor graph is
therefore traced through :func:`decomposed`'s copy of it, which runs each fused op as the same
stages; inductor fuses them into its own loops.
"""

from __future__ import annotations

import copy

import torch

aten = torch.ops.aten


def adam_multi_tensor_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *,
                       lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, decoupled,
                       grad_scale=None, found_inf=None):
    """One Adam (``decoupled``: AdamW) update of ``params`` and their state, in place, as
    ``torch._foreach_*`` stages: the fused kernels' effect and contract (``state_steps``
    already count this step; ``lr`` is a 0-d tensor).

    The same arithmetic as torch's single-tensor Adam, with the bias corrections of all
    parameters computed in one float64 vector, as torch computes them in Python floats."""
    if grad_scale is not None or found_inf is not None:
        raise NotImplementedError("fused Adam with grad_scale/found_inf has no multi-tensor form")
    if maximize:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        if decoupled:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
    step_d = torch.stack(list(state_steps)).to(torch.float64)
    bias_correction1 = 1 - torch.pow(beta1, step_d)
    bias_correction2 = 1 - torch.pow(beta2, step_d)
    dtype = params[0].dtype
    neg_step_size = (-(lr.to(torch.float64) / bias_correction1)).to(dtype).unbind()
    bias_correction2_sqrt = bias_correction2.sqrt().to(dtype).unbind()
    if amsgrad:
        torch._foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs)
        denom = torch._foreach_sqrt(max_exp_avg_sqs)
    else:
        denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, bias_correction2_sqrt)
    torch._foreach_add_(denom, eps)
    # p - (exp_avg / denom) * step_size, rounded as torch rounds it
    torch._foreach_addcmul_(params, torch._foreach_div(exp_avgs, denom), neg_step_size)


def fused_adam_stages_(*args, **kwargs) -> None:
    """``aten._fused_adam_`` as :func:`adam_multi_tensor_` stages."""
    adam_multi_tensor_(*args, decoupled=False, **kwargs)


def fused_adamw_stages_(*args, **kwargs) -> None:
    """``aten._fused_adamw_`` as :func:`adam_multi_tensor_` stages."""
    adam_multi_tensor_(*args, decoupled=True, **kwargs)


#: fused in-place op -> the same update from multi-tensor stages
IN_PLACE = {
    aten._fused_adam_.tensor_lr: fused_adam_stages_,
    aten._fused_adamw_.tensor_lr: fused_adamw_stages_,
}


def decomposed(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, or where it has fused optimizer ops a copy of it that runs each as its
    multi-tensor stages (:data:`IN_PLACE`): traced through it, the graph has nothing inductor
    cannot lower. ``gm`` itself is left as it is."""
    if not any(n.op == "call_function" and n.target in IN_PLACE for n in gm.graph.nodes):
        return gm
    gm = copy.deepcopy(gm)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in IN_PLACE:
            node.target = IN_PLACE[node.target]
    gm.recompile()
    return gm
