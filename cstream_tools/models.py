"""Small models that the tests, the benchmarks and experiment files train: standard PyTorch
modules, nothing of cstream in them.

>>> model = TinyLM()
>>> tuple(model(torch.zeros(2, 16, dtype=torch.long)).shape)
(2, 16, 64)
"""

from __future__ import annotations

import torch


class TinyLM(torch.nn.Module):
    """A small GPT-style language model: token and position embeddings, ``layers`` pre-norm
    blocks with causal ``scaled_dot_product_attention``, a head over the ``vocab``. Sequences
    are at most ``seq`` tokens long; the positions are made on the tokens' device."""

    def __init__(self, vocab=64, d=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.heads = heads
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.ModuleList(torch.nn.ModuleDict({
            "ln1": torch.nn.LayerNorm(d), "qkv": torch.nn.Linear(d, 3 * d),
            "proj": torch.nn.Linear(d, d), "ln2": torch.nn.LayerNorm(d),
            "fc1": torch.nn.Linear(d, 4 * d), "fc2": torch.nn.Linear(4 * d, d),
        }) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, idx):
        b, t = idx.shape
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).chunk(3, dim=-1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["fc2"](torch.nn.functional.gelu(blk["fc1"](blk["ln2"](x))))
        return self.head(self.ln(x))
