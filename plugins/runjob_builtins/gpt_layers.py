"""The ``gpt`` model's layers: a decoder-only transformer in plain torch. Imported only when a
``gpt`` is built (:mod:`runjob_builtins.gpt` declares the options without importing torch); the
classes live at module level so a pickled model (the MLflow model) loads them by reference."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn as nn
import torch.nn.functional as F

if TYPE_CHECKING:
    from runjob_builtins.gpt import GPTOptions


def _init(module: nn.Module) -> None:
    # GPT-2: normal(0, 0.02) weights, zero biases (LayerNorms keep ones and zeros)
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class CausalSelfAttention(nn.Module):
    def __init__(self, o: GPTOptions) -> None:
        super().__init__()
        self.heads, self.dropout = o.heads, o.dropout
        self.qkv = nn.Linear(o.width, 3 * o.width, bias=o.bias)
        self.proj = nn.Linear(o.width, o.width, bias=o.bias)
        self.proj_dropout = nn.Dropout(o.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = (
            t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
            for t in self.qkv(x).split(width, dim=2)
        )
        dropout = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        projected: torch.Tensor = self.proj_dropout(self.proj(y.transpose(1, 2).reshape(batch, length, width)))
        return projected


class Block(nn.Module):
    def __init__(self, o: GPTOptions) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(o.width, bias=o.bias)
        self.attention = CausalSelfAttention(o)
        self.norm2 = nn.LayerNorm(o.width, bias=o.bias)
        self.mlp = nn.Sequential(
            nn.Linear(o.width, 4 * o.width, bias=o.bias),
            nn.GELU(),
            nn.Linear(4 * o.width, o.width, bias=o.bias),
            nn.Dropout(o.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class GPT(nn.Module):
    def __init__(self, o: GPTOptions) -> None:
        super().__init__()
        if o.vocab_size is None or o.context is None:  # build_gpt fills both in from the data
            raise ValueError("gpt needs vocab_size and context")
        self.context: int = o.context
        self.tokens = nn.Embedding(o.vocab_size, o.width)
        self.positions = nn.Embedding(o.context, o.width)
        self.dropout = nn.Dropout(o.dropout)
        self.blocks = nn.ModuleList(Block(o) for _ in range(o.layers))
        self.norm = nn.LayerNorm(o.width, bias=o.bias)
        self.head = nn.Linear(o.width, o.vocab_size, bias=False)
        self.apply(_init)
        for name, parameter in self.named_parameters():
            # GPT-2: projections into the residual stream scaled by 1/sqrt(2 * layers), so the
            # stream's variance does not grow with depth
            if name.endswith(("attention.proj.weight", "mlp.2.weight")):
                nn.init.normal_(parameter, std=0.02 / math.sqrt(2 * o.layers))
        if o.tie_weights:
            self.head.weight = self.tokens.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.context:
            raise ValueError(
                f"gpt got sequences of {length} tokens, longer than model.context = {self.context}; "
                f"set model.context >= {length} (or dataset.context <= {self.context})"
            )
        positions = torch.arange(length, device=tokens.device)
        x = self.dropout(self.tokens(tokens) + self.positions(positions))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits
