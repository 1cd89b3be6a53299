"""``cstream.nn.functional``.

>>> import torch
>>> one_hot(torch.tensor([0, 2]), num_classes=3).tolist()
[[1, 0, 0], [0, 0, 1]]
"""

import torch


def one_hot(tensor: torch.Tensor, num_classes: int = -1) -> torch.Tensor:
    """``torch.nn.functional.one_hot`` (the Cerebras kernel computes the same values)."""
    return torch.nn.functional.one_hot(tensor, num_classes)


def sparse_matmul(input_values: torch.Tensor, input_indices: torch.Tensor,
                  weight: torch.Tensor) -> torch.Tensor:
    """The matmul of a sparse input and a dense weight, sparse out (the Model Zoo's MoE
    experts). The input is the dense ``(..., M, B, N)`` tensor whose rows ``input_indices``
    along B hold ``input_values`` (other rows 0; of repeated indices one row is kept); the
    output is ``einsum("...MBN,KBN->...MBK")`` of it with ``weight``, read back at the same
    rows.

    Shapes: input_values ``(..., M, C, N)``, input_indices ``(..., M, C)`` (C <= B), weight
    ``(K, B, N)``; out ``(..., M, C, K)``. The Cerebras kernel computes the same values from the
    compressed rows.
    """
    if weight.size(1) >= 2**16:
        raise ValueError(f"sparse_matmul: input_indices must fit in uint16, but weight's sparse "
                         f"dimension has {weight.size(1)} entries (at most 65535).")
    index = input_indices.long()[..., None]
    dense = torch.zeros((*input_values.shape[:-2], weight.shape[1], input_values.shape[-1]),
                        dtype=input_values.dtype, device=input_values.device)
    dense.scatter_(-2, index.broadcast_to(input_values.shape), input_values)
    out = torch.einsum("...mbn,kbn->...mbk", dense, weight)
    return out.gather(-2, index.broadcast_to((*input_values.shape[:-1], weight.shape[0])))


def sparse_act_matmul(input_value: torch.Tensor, input_mask: torch.Tensor,
                      weight: torch.Tensor, dense_capacity=None) -> torch.Tensor:
    """``input_value @ weight.T`` with the rows whose ``input_mask`` is 0 set to 0.

    Shapes: input_value ``(..., M, N)``, input_mask ``(..., M)``, weight ``(K, N)``; out
    ``(..., M, K)``. ``dense_capacity`` (how many rows the Cerebras kernel keeps dense) does not
    change the values and is accepted without effect.
    """
    if input_value.shape[:-1] != input_mask.shape:
        raise ValueError(
            f"sparse_act_matmul: input_value {tuple(input_value.shape)} and input_mask "
            f"{tuple(input_mask.shape)} must have the same shape except for input_value's last "
            "dimension.")
    out = torch.einsum("...mn,kn->...mk", input_value, weight)
    return out * input_mask.unsqueeze(-1).to(out.dtype)
