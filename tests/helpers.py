"""What several test files share (imported as ``helpers``: pytest puts ``tests/`` on the path):
the ``cstream`` command in a subprocess and its summary table, the small models (the input
side's own are in ``input_helpers``)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def cstream(*args, cwd, timeout=240):
    """``cstream ARGS`` as a new process in ``cwd`` (100 columns wide)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="100")
    return subprocess.run([sys.executable, "-m", "cstream_tools.cli", *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def table_rows(text):
    """{label: value} of the lines of a summary table."""
    rows = {}
    for line in text.splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2:
            rows[parts[0]] = parts[1]
    return rows



class TinyLM(torch.nn.Module):
    """A small transformer language model: embeddings, 2 pre-norm blocks, causal attention."""

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
        x = self.tok(idx) + self.pos(torch.arange(t))
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).chunk(3, dim=-1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + blk["proj"](a.transpose(1, 2).reshape(b, t, -1))
            x = x + blk["fc2"](torch.nn.functional.gelu(blk["fc1"](blk["ln2"](x))))
        return self.head(self.ln(x))


def lm_input_fn(batch=4, seq=16, n=50):
    g = torch.Generator().manual_seed(5)
    text = torch.randint(0, 64, (n * batch * (seq + 1),), generator=g).view(n, batch, seq + 1)
    return [(chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()) for chunk in text]
