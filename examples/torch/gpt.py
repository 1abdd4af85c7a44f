"""A GPT-2-like model in plain PyTorch for graphalloc's graph front ends: the parity tests
(tests/torch/graphed_parity_test.py) and the benchmarks (bench/torch/graphed_bench.py).

Attention is written out (matmul, mask, softmax) rather than through a fused kernel, so that eager and
graphed runs use the same deterministic kernels and can be compared bit for bit. `checkpoint=True` wraps
each block in non-reentrant activation checkpointing."""
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    vocab: int = 50304
    seq: int = 128
    layers: int = 12
    heads: int = 12
    dim: int = 768
    dropout: float = 0.1
    checkpoint: bool = False


class Block(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c = c
        self.ln1 = nn.LayerNorm(c.dim)
        self.qkv = nn.Linear(c.dim, 3 * c.dim)
        self.proj = nn.Linear(c.dim, c.dim)
        self.ln2 = nn.LayerNorm(c.dim)
        self.fc = nn.Linear(c.dim, 4 * c.dim)
        self.out = nn.Linear(4 * c.dim, c.dim)
        self.register_buffer("mask", torch.tril(torch.ones(c.seq, c.seq, dtype=torch.bool)), persistent=False)

    def attention(self, x):
        b, t, d = x.shape
        h = self.c.heads
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
        att = F.dropout(att, self.c.dropout, self.training)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        return F.dropout(self.proj(y), self.c.dropout, self.training)

    def body(self, x):
        x = x + self.attention(self.ln1(x))
        return x + F.dropout(self.out(F.gelu(self.fc(self.ln2(x)))), self.c.dropout, self.training)

    def forward(self, x):
        if self.c.checkpoint and self.training:
            return torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False, preserve_rng_state=True)
        return self.body(x)


class GPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c = c
        self.tok = nn.Embedding(c.vocab, c.dim)
        self.pos = nn.Embedding(c.seq, c.dim)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = F.dropout(self.tok(idx) + self.pos(torch.arange(t, device=idx.device)), self.c.dropout, self.training)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def batches(c: GPTConfig, n: int, batch: int, seed: int = 0, device: str = "cuda"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [(torch.randint(0, c.vocab, (batch, c.seq), generator=g).to(device),
             torch.randint(0, c.vocab, (batch, c.seq), generator=g).to(device)) for _ in range(n)]
