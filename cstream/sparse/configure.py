"""Which parameters sparsity applies to by default (``cerebras.pytorch.sparse.configure``)."""

from __future__ import annotations


def default_sparse_param_filter(name: str, param) -> bool:
    """True for a parameter of more than one dimension whose name (any case) has none of
    ``embedding``, ``norm``, ``lm_head``, ``pe_helper``.

    >>> import torch
    >>> [default_sparse_param_filter(n, torch.zeros(s)) for n, s in
    ...  (("fc.weight", (2, 2)), ("fc.bias", (2,)), ("LayerNorm.weight", (2, 2)))]
    [True, False, False]
    """
    if param is None or len(param.shape) <= 1:
        return False
    lowered = name.lower()
    return not any(word in lowered for word in ("embedding", "norm", "lm_head", "pe_helper"))
