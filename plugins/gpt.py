"""Built-in model ``gpt``: a decoder-only transformer for next-token prediction, in plain torch.

Token and learned position embeddings, ``layers`` pre-LayerNorm blocks (causal self-attention
through ``scaled_dot_product_attention``, a 4x GELU MLP), a final LayerNorm and an output head
tied to the token embedding. ``forward(tokens (B, T) int64) -> logits (B, T, vocab_size)``.

The module classes (``GPT``, ``Block``, ``CausalSelfAttention``) are attributes of this module,
created on first use, so torch is imported by building a model, not by loading plugins, and a
pickled model (``mlflow.pytorch``) loads back by name.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from runjob import Options, hookimpl

_CLASSES = ("GPT", "Block", "CausalSelfAttention")


class GPTOptions(Options):
    vocab_size: int = Field(256, ge=2)
    """Token ids 0 .. vocab_size - 1 (256: bytes, as the text_files dataset gives)."""
    context: int = Field(128, ge=1)
    """The longest sequence the model takes (its learned positions); at least dataset.context."""
    layers: int = Field(4, ge=1)
    width: int = Field(128, ge=1)
    """Channels of the residual stream (the embedding size)."""
    heads: int = Field(4, ge=1)
    """Attention heads; width must be a multiple of heads."""
    dropout: float = Field(0.0, ge=0, lt=1)
    bias: bool = True
    """Biases in the linear layers and LayerNorms."""
    tie_weights: bool = True
    """The output head shares the token embedding's weights (GPT-2 does)."""

    @field_validator("heads")
    @classmethod
    def _width_divides(cls, heads: int, info: ValidationInfo) -> int:
        width = info.data.get("width")
        if width is not None and width % heads:
            lower, upper = (width // heads) * heads, (width // heads + 1) * heads
            suggest = f"{lower} or {upper}" if lower else f"{upper}"
            raise ValueError(f"width = {width} is not a multiple of heads = {heads}; set width to e.g. {suggest}")
        return heads


@functools.cache
def _classes() -> dict[str, type]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

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
            return self.proj_dropout(self.proj(y.transpose(1, 2).reshape(batch, length, width)))

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
            return x + self.mlp(self.norm2(x))

    class GPT(nn.Module):
        def __init__(self, o: GPTOptions) -> None:
            super().__init__()
            self.context = o.context
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
            return self.head(self.norm(x))

    classes = {"GPT": GPT, "Block": Block, "CausalSelfAttention": CausalSelfAttention}
    for name, cls in classes.items():
        cls.__qualname__ = name  # pickled by reference as runjob.plugins.gpt.<name>
    return classes


def __getattr__(name: str) -> Any:
    if name in _CLASSES:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_gpt(options: GPTOptions) -> Any:
    """A randomly initialised GPT (GPT-2's initialisation)."""
    return _classes()["GPT"](options)


@hookimpl
def runjob_register_models(register):
    """Register gpt."""
    register(
        "gpt",
        build_gpt,
        options=GPTOptions,
        description="decoder-only transformer for next-token prediction (tokens (B, T) -> logits (B, T, vocab))",
    )
